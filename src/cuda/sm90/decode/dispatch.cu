// Host dispatch of the token-serial KDA kernel: DecodeParams / PrefillParams ->
// RecurrentKernelParams, and the one place where runtime values become template arguments
// (state storage type, state layout, head dim). Everything else (activation dtypes, gate
// mode, flags, token counts) stays a runtime value: it only touches the per-token
// preprocessing, not the inner loop over the state.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/sm90/decode/config.h"
#include "cuda/sm90/decode/dispatch.h"
#include "cuda/sm90/decode/launch.h"

namespace kdakit::sm90 {
namespace {

using recurrent::RecurrentKernelParams;

// Supported features (checked before any launch).
constexpr const char* kSupportedHeadDims = "K = V = 128 or K = V = 64";
constexpr const char* kSupportedStateDtypes = "float32 or bfloat16";

bool print_configs() {
  static const bool enabled = [] {
    const char* v = std::getenv("KDAKIT_PRINT_CONFIGS");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return enabled;
}

int64_t state_elem_bytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Bytes of one vector access to the state: kVFirst reads K/32 consecutive key channels per
// lane, kKFirst reads kColsPerThread consecutive value channels per thread.
int64_t state_vector_bytes(const char*, DType dtype, StateLayout layout, int head_dim) {
  const int64_t elems = layout == StateLayout::kVFirst ? head_dim / 32 : recurrent::kColsPerThread;
  return elems * state_elem_bytes(dtype);
}

// The kernel moves the state with aligned vector accesses: the base pointer and the stride
// between states must keep every access aligned.
Status check_state_alignment(const char* name, const void* ptr, int64_t stride_elems, DType dtype,
                             StateLayout layout, int head_dim) {
  if (ptr == nullptr) return Status::Ok();
  const int64_t vec = state_vector_bytes(name, dtype, layout, head_dim);
  const int64_t stride_bytes = stride_elems * state_elem_bytes(dtype);
  if (reinterpret_cast<uintptr_t>(ptr) % uintptr_t(vec) != 0 || stride_bytes % vec != 0) {
    return Status(StatusCode::kUnsupported,
                  std::string(name) + ": the recurrent kernel needs a " + std::to_string(vec) +
                      "-byte aligned base pointer and a stride between states that is a multiple of " +
                      std::to_string(vec) + " bytes, got pointer " +
                      std::to_string(reinterpret_cast<uintptr_t>(ptr)) + " and stride " +
                      std::to_string(stride_elems) + " elements");
  }
  return Status::Ok();
}

Status check_shape(int32_t head_dim_k, int32_t head_dim_v, DType dtype_state) {
  if (head_dim_k != head_dim_v || (head_dim_k != 128 && head_dim_k != 64)) {
    return Status(StatusCode::kUnsupported, std::string("head_dim: the recurrent kernel supports ") +
                                                kSupportedHeadDims + ", got K = " + std::to_string(head_dim_k) +
                                                ", V = " + std::to_string(head_dim_v));
  }
  if (dtype_state != DType::kFloat32 && dtype_state != DType::kBFloat16) {
    return Status(StatusCode::kUnsupported, std::string("state dtype: the recurrent kernel supports ") +
                                                kSupportedStateDtypes + ", got " + to_string(dtype_state));
  }
  return Status::Ok();
}

template <class Params>
void copy_common(const Params& p, RecurrentKernelParams& k) {
  k.num_seqs = p.num_seqs;
  k.seqlen = p.seqlen;
  k.num_qk_heads = p.num_qk_heads;
  k.num_v_heads = p.num_v_heads;
  k.token_group = int32_t(std::min<int64_t>(std::max<int64_t>(p.seqlen, 1), recurrent::kMaxTokenGroup));
  k.q = p.q;
  k.k = p.k;
  k.v = p.v;
  k.g = p.g;
  k.beta = p.beta;
  k.A_log = p.A_log;
  k.dt_bias = p.dt_bias;
  k.cu_seqlens = p.cu_seqlens;
  k.o = p.o;
  k.stride_q_b = p.stride_q_b, k.stride_q_t = p.stride_q_t, k.stride_q_h = p.stride_q_h;
  k.stride_k_b = p.stride_k_b, k.stride_k_t = p.stride_k_t, k.stride_k_h = p.stride_k_h;
  k.stride_v_b = p.stride_v_b, k.stride_v_t = p.stride_v_t, k.stride_v_h = p.stride_v_h;
  k.stride_g_b = p.stride_g_b, k.stride_g_t = p.stride_g_t, k.stride_g_h = p.stride_g_h;
  k.stride_beta_b = p.stride_beta_b, k.stride_beta_t = p.stride_beta_t, k.stride_beta_h = p.stride_beta_h;
  k.stride_o_b = p.stride_o_b, k.stride_o_t = p.stride_o_t, k.stride_o_h = p.stride_o_h;
  k.dtype_qkv = p.dtype_qkv;
  k.dtype_g = p.dtype_g;
  k.dtype_beta = p.dtype_beta;
  k.dtype_cu_seqlens = p.dtype_cu_seqlens;
  k.gate = p.gate;
  k.scale = p.scale;
  k.lower_bound = p.lower_bound;
  k.use_qk_l2norm = p.use_qk_l2norm;
  k.use_beta_sigmoid = p.use_beta_sigmoid;
  k.allow_neg_eigval = p.allow_neg_eigval;
  k.scalar_gate = p.scalar_gate;
}

// Which kernel serves a call:
//   - the staged variant (kernel.cuh: one CTA per slice, cp.async into shared memory) for
//     V-first one-column decodes with at most one token per sequence on average (dense T = 1,
//     packed batches with T <= N) and a 16-byte aligned pool; dense T = 1 at K = 128 with more
//     than kWideMinCtas 32-row CTAs takes 64-row slices (two row groups per CTA);
//   - the register kernel otherwise (several tokens per sequence, speculative decoding,
//     K-first, short prefill, pools not 16-byte aligned).
enum class Variant { kRegisters, kStagedSingle, kStagedSingleWide, kStagedMulti };

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kRegisters: return "kernel";
    case Variant::kStagedSingle: return "staged_kernel (single token)";
    case Variant::kStagedSingleWide: return "staged_kernel (single token, 64 rows per CTA)";
    case Variant::kStagedMulti: return "staged_kernel (token loop)";
  }
  return "?";
}

// NOTE: 64-row slices win once the 32-row grid is more than about one wave (8 CTAs x 132 SMs):
// H200, docs/design/20261129-decode.md run 4: 32-row CTAs = 128 and 384 (B = 1): 32 rows
// faster by 6-15 %; 1024 (H = 32, B = 8): equal within 1 %; 3072 and more: 64 rows faster by
// 3-13 %. The switch point between 1024 and 3072 was not measured more finely.
constexpr int64_t kWideMinCtas = 1024;

// What each variant can run (checked before the choice, also for a forced variant).
bool staged_fits(const RecurrentKernelParams& k, DType dtype_state, StateLayout layout) {
  if (k.mode != recurrent::Mode::kDecode || layout != StateLayout::kVFirst || k.num_index_cols != 1) return false;
  const int64_t stride_bytes = (k.num_pool_slots > 1 ? k.stride_pool_slot : 0) * state_elem_bytes(dtype_state);
  return reinterpret_cast<uintptr_t>(k.pool) % 16 == 0 && stride_bytes % 16 == 0;
}
bool single_token(const RecurrentKernelParams& k) { return k.cu_seqlens == nullptr && k.seqlen == 1; }
bool wide_fits(const RecurrentKernelParams& k, DType dtype_state, StateLayout layout, int head_dim) {
  return staged_fits(k, dtype_state, layout) && single_token(k) && head_dim == 128;
}

#if defined(KDAKIT_DECODE_VARIANT_SELECT)
// Timing and test builds (CMake option KDAKIT_DECODE_VARIANT_SELECT): KDAKIT_DECODE_VARIANT
// forces a variant where it fits; read on every call so that one process can time each.
Variant forced_variant(Variant chosen, const RecurrentKernelParams& k, DType dtype_state, StateLayout layout,
                       int head_dim) {
  const char* v = std::getenv("KDAKIT_DECODE_VARIANT");
  if (v == nullptr) return chosen;
  const std::string name(v);
  if (name == "registers") return Variant::kRegisters;
  if (name == "staged" && staged_fits(k, dtype_state, layout)) {
    return single_token(k) ? Variant::kStagedSingle
           : k.cu_seqlens != nullptr && k.seqlen <= k.num_seqs ? Variant::kStagedMulti
                                                                 : chosen;
  }
  if (name == "staged64" && wide_fits(k, dtype_state, layout, head_dim)) return Variant::kStagedSingleWide;
  return chosen;
}
#endif

Variant choose_variant(const RecurrentKernelParams& k, DType dtype_state, StateLayout layout, int head_dim) {
  Variant chosen = Variant::kRegisters;
  if (staged_fits(k, dtype_state, layout)) {
    if (single_token(k)) {
      const int64_t ctas = k.num_seqs * k.num_v_heads * (head_dim / recurrent::kValuesPerCta);
      chosen = wide_fits(k, dtype_state, layout, head_dim) && ctas > kWideMinCtas ? Variant::kStagedSingleWide
                                                                                  : Variant::kStagedSingle;
    } else if (k.cu_seqlens != nullptr && k.seqlen <= k.num_seqs) {
      chosen = Variant::kStagedMulti;
    }
  }
#if defined(KDAKIT_DECODE_VARIANT_SELECT)
  chosen = forced_variant(chosen, k, dtype_state, layout, head_dim);
#endif
  return chosen;
}

// The one runtime -> template switch.
Status launch(const RecurrentKernelParams& k, DType dtype_state, StateLayout layout, int head_dim,
              cudaStream_t stream) {
  const Variant variant = choose_variant(k, dtype_state, layout, head_dim);
  if (print_configs()) {
    std::fprintf(stderr,
                 "kdakit: kda_decode_sm90_%s state=%s layout=%s K=V=%d mode=%s seqs=%lld heads=%d "
                 "token_group=%d items=%lld\n",
                 variant_name(variant),
                 to_string(dtype_state), to_string(layout), head_dim,
                 k.mode == recurrent::Mode::kDecode ? "decode" : "prefill", (long long)k.num_seqs, k.num_v_heads,
                 k.token_group, (long long)(k.num_seqs * k.num_v_heads * (head_dim / recurrent::kValuesPerCta)));
  }
  auto staged = [&]<class StateT, bool kSingle>() -> Status {
    if (head_dim == 128) return recurrent::launch_staged<StateT, 128, kSingle, 1>(k, stream);
    return recurrent::launch_staged<StateT, 64, kSingle, 1>(k, stream);
  };
  if (variant == Variant::kStagedSingleWide) {
    if (dtype_state == DType::kFloat32) return recurrent::launch_staged<float, 128, true, 2>(k, stream);
    return recurrent::launch_staged<__nv_bfloat16, 128, true, 2>(k, stream);
  }
  if (variant != Variant::kRegisters) {
    const bool single = variant == Variant::kStagedSingle;
    if (dtype_state == DType::kFloat32) {
      return single ? staged.template operator()<float, true>() : staged.template operator()<float, false>();
    }
    return single ? staged.template operator()<__nv_bfloat16, true>()
                  : staged.template operator()<__nv_bfloat16, false>();
  }
  auto by_dim = [&]<class StateT, StateLayout kLayout>() -> Status {
    if (head_dim == 128) return recurrent::launch_recurrent<StateT, kLayout, 128>(k, stream);
    return recurrent::launch_recurrent<StateT, kLayout, 64>(k, stream);
  };
  auto by_layout = [&]<class StateT>() -> Status {
    if (layout == StateLayout::kVFirst) return by_dim.template operator()<StateT, StateLayout::kVFirst>();
    return by_dim.template operator()<StateT, StateLayout::kKFirst>();
  };
  if (dtype_state == DType::kFloat32) return by_layout.template operator()<float>();
  return by_layout.template operator()<__nv_bfloat16>();
}

}  // namespace

Status run_decode(const DecodeParams& p, cudaStream_t stream) {
  if (Status s = check_shape(p.head_dim_k, p.head_dim_v, p.dtype_state); !s.ok()) return s;
  if (Status s = check_state_alignment("state", p.state, p.num_state_slots > 1 ? p.stride_state_slot : 0,
                                       p.dtype_state, p.state_layout, p.head_dim_k);
      !s.ok()) {
    return s;
  }
  if (p.num_seqs == 0 || p.seqlen == 0) return Status::Ok();
  RecurrentKernelParams k;
  copy_common(p, k);
  k.mode = recurrent::Mode::kDecode;
  k.pool = p.state;
  k.num_pool_slots = p.num_state_slots;
  k.stride_pool_slot = p.stride_state_slot;
  k.state_indices = p.state_indices;
  k.stride_state_indices_n = p.stride_state_indices_n;
  k.num_index_cols = p.num_index_cols;
  k.num_accepted_tokens = p.num_accepted_tokens;
  k.null_slot_is_padding = p.null_slot_is_padding;
  return launch(k, p.dtype_state, p.state_layout, p.head_dim_k, stream);
}

Status run_recurrent_prefill(const PrefillParams& p, cudaStream_t stream) {
  if (Status s = check_shape(p.head_dim_k, p.head_dim_v, p.dtype_state); !s.ok()) return s;
  const int64_t block = int64_t(p.head_dim_k) * p.head_dim_v;
  const int64_t num_initial = p.initial_state_indices != nullptr ? p.num_state_slots : p.num_seqs;
  const int64_t num_final = p.final_state_indices != nullptr ? p.num_state_slots : p.num_seqs;
  if (Status s = check_state_alignment("initial_state", p.initial_state, num_initial > 1 ? p.stride_initial_state_n : 0,
                                       p.dtype_state, p.state_layout, p.head_dim_k);
      !s.ok()) {
    return s;
  }
  if (Status s = check_state_alignment("final_state", p.final_state, num_final > 1 ? p.stride_final_state_n : 0,
                                       p.dtype_state, p.state_layout, p.head_dim_k);
      !s.ok()) {
    return s;
  }
  if (Status s = check_state_alignment("chunk_states", p.chunk_states, p.num_v_heads * block, p.dtype_state,
                                       p.state_layout, p.head_dim_k);
      !s.ok()) {
    return s;
  }
  if (p.num_seqs == 0) return Status::Ok();
  RecurrentKernelParams k;
  copy_common(p, k);
  k.mode = recurrent::Mode::kPrefill;
  k.initial_state = p.initial_state;
  k.initial_state_indices = p.initial_state_indices;
  k.stride_initial_state_n = p.stride_initial_state_n;
  k.num_initial_slots = num_initial;
  k.final_state = p.final_state;
  k.final_state_indices = p.final_state_indices;
  k.stride_final_state_n = p.stride_final_state_n;
  k.num_final_slots = num_final;
  k.chunk_states = p.chunk_states;
  k.num_chunk_states = p.chunk_states != nullptr ? p.num_chunk_states : 0;
  k.chunk_state_interval = p.chunk_states != nullptr ? p.chunk_state_interval : 0;
  return launch(k, p.dtype_state, p.state_layout, p.head_dim_k, stream);
}

}  // namespace kdakit::sm90
