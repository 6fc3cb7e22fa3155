// Host dispatch of the token-serial KDA kernel: DecodeParams / PrefillParams ->
// RecurrentKernelParams, and the one place where runtime values become template arguments
// (state storage type, state layout, head dim). Everything else (activation dtypes, gate
// mode, flags, token counts) stays a runtime value: it only touches the per-token
// preprocessing, not the inner loop over the state.
#include <cuda_bf16.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/common/device_setup.cuh"
#include "cuda/sm90/decode/config.h"
#include "cuda/sm90/decode/dispatch.h"
#include "cuda/sm90/decode/launch.h"

namespace kdakit::sm90 {
namespace {

using recurrent::RecurrentKernelParams;

// Supported features (checked before any launch).
constexpr const char* kSupportedHeadDims = "K = V = 128 or K = V = 64";
constexpr const char* kSupportedStateDtypes = "float32 or bfloat16";

// NOTE: read on every call (like KDAKIT_DECODE_VARIANT), so that a test can turn it on after
// earlier calls; one getenv per call is nothing next to a launch.
bool print_configs() {
  const char* v = std::getenv("KDAKIT_PRINT_CONFIGS");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
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

// ------------------------------------------------------------------------------------------
// Fast kernel (direct.cuh): what it accepts, and its parameter block
// ------------------------------------------------------------------------------------------

bool fits_int32(int64_t x) { return x >= INT32_MIN && x <= INT32_MAX; }
bool aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0; }

// Fills `f` when the call fits the fast kernels: V-first, one index column, dense T = 1 or
// packed, K = V in {64, 128}, a 16-byte aligned pool, every index and stride in 32 bits, HV
// < 2^16 (fast_qk_head), and kE-element aligned q, k, g and dt_bias (their vector loads).
bool make_fast_params(const DecodeParams& p, recurrent::FastDecodeParams& f) {
  using recurrent::FastFlags;
  if (p.state_layout != StateLayout::kVFirst || p.num_index_cols != 1) return false;
  const bool packed = p.cu_seqlens != nullptr;
  if (!packed && p.seqlen != 1) return false;
  const int kE = p.head_dim_k / 32;
  const int64_t stride_slot_bytes = (p.num_state_slots > 1 ? p.stride_state_slot : 0) * state_elem_bytes(p.dtype_state);
  if (!aligned(p.state, 16) || stride_slot_bytes % 16 != 0) return false;
  if (p.num_seqs >= INT32_MAX || !fits_int32(p.seqlen) || !fits_int32(p.stride_state_indices_n)) return false;
  if (p.num_v_heads >= 65536 || p.num_qk_heads <= 0 || p.num_v_heads % p.num_qk_heads != 0) return false;
  auto tok = [&](int64_t stride_b, int64_t stride_t) { return packed ? stride_t : stride_b; };
  const int64_t strides[] = {tok(p.stride_q_b, p.stride_q_t), p.stride_q_h, tok(p.stride_k_b, p.stride_k_t),
                             p.stride_k_h, tok(p.stride_v_b, p.stride_v_t), p.stride_v_h,
                             tok(p.stride_g_b, p.stride_g_t), p.stride_g_h, tok(p.stride_beta_b, p.stride_beta_t),
                             p.stride_beta_h, tok(p.stride_o_b, p.stride_o_t), p.stride_o_h};
  for (int64_t x : strides) {
    if (!fits_int32(x)) return false;
  }
  const int64_t qkv_vec = kE * int64_t(dtype_size(p.dtype_qkv));
  if (!aligned(p.q, qkv_vec) || !aligned(p.k, qkv_vec) || strides[0] % kE || strides[1] % kE || strides[2] % kE ||
      strides[3] % kE) {
    return false;
  }
  if (!p.scalar_gate && (!aligned(p.g, kE * int64_t(dtype_size(p.dtype_g))) || strides[6] % kE || strides[7] % kE)) {
    return false;
  }
  if (!p.scalar_gate && p.dt_bias != nullptr && !aligned(p.dt_bias, kE * int64_t(sizeof(float)))) return false;

  f = recurrent::FastDecodeParams{};
  f.state_indices = p.state_indices;
  f.pool = p.state;
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.g = p.g;
  f.beta = p.beta;
  f.o = p.o;
  f.A_log = p.A_log;
  f.dt_bias = p.dt_bias;
  f.cu_seqlens = p.cu_seqlens;
  f.stride_pool_slot = p.stride_state_slot;
  const uint64_t group = uint64_t(p.num_v_heads / p.num_qk_heads);
  f.qk_group_magic = ((uint64_t{1} << 32) + group - 1) / group;
  f.num_seqs = int32_t(p.num_seqs);
  f.num_tokens = packed ? int32_t(p.seqlen) : 1;
  f.num_pool_slots = int32_t(std::min<int64_t>(p.num_state_slots, INT32_MAX));
  f.stride_state_indices_n = int32_t(p.stride_state_indices_n);
  f.num_v_heads = p.num_v_heads;
  f.flags = FastFlags::pack(p.dtype_qkv, p.dtype_g, p.dtype_beta, p.gate) |
            (p.dtype_cu_seqlens == DType::kInt64 ? FastFlags::kCuInt64 : 0u) |
            (p.use_qk_l2norm ? FastFlags::kL2Norm : 0u) | (p.use_beta_sigmoid ? FastFlags::kBetaSigmoid : 0u) |
            (p.allow_neg_eigval ? FastFlags::kNegEigval : 0u) | (p.scalar_gate ? FastFlags::kScalarGate : 0u) |
            (p.null_slot_is_padding ? FastFlags::kNullSlotIsPadding : 0u);
  f.stride_q_tok = int32_t(strides[0]), f.stride_q_h = int32_t(strides[1]);
  f.stride_k_tok = int32_t(strides[2]), f.stride_k_h = int32_t(strides[3]);
  f.stride_v_tok = int32_t(strides[4]), f.stride_v_h = int32_t(strides[5]);
  f.stride_g_tok = int32_t(strides[6]), f.stride_g_h = int32_t(strides[7]);
  f.stride_beta_tok = int32_t(strides[8]), f.stride_beta_h = int32_t(strides[9]);
  f.stride_o_tok = int32_t(strides[10]), f.stride_o_h = int32_t(strides[11]);
  f.scale = p.scale;
  f.lower_bound = p.lower_bound;
  return true;
}

// Multiprocessors of the current device, read once per device (0 when it cannot be read).
int num_sms() { return kdakit::cuda::current_device_sm_count(0); }

// ------------------------------------------------------------------------------------------
// Variants
// ------------------------------------------------------------------------------------------

// Which kernel serves a call (the one place that decides; KDAKIT_DECODE_VARIANT overrides it
// where the forced variant fits, KDAKIT_DECODE_PDL=0/1 and KDAKIT_DECODE_PREFETCH=0/1 override
// the launch options):
//   - single-column V-first decode that fits the fast kernels (make_fast_params) and is dense
//     T = 1 or packed with T <= N: the direct kernel (32-row CTAs) for small grids (up to
//     kDirectMaxSlicesPerSm 32-row slices per SM: PDL and the L2 prefetch before the wait), and
//     with an fp32 pool up to kDirectFp32MaxSlicesPerSm (PDL);
//   - otherwise the staged kernel (V-first one-column decode, 16-byte aligned pool, dense
//     T = 1 or packed T <= N; 64-row slices beyond kWideMinCtas 32-row CTAs at dense K = 128),
//     with PDL;
//   - otherwise the register kernel (several tokens per sequence, speculative decoding,
//     K-first, short prefill, pools not 16-byte aligned).
enum class Variant {
  kRegisters,
  kStagedSingle,
  kStagedSingleWide,
  kStagedSingleWidePasses,  // the 64-row kernel running a whole 128-row head per CTA in two passes
  kStagedMulti,
  kDirect32,
  kDirect16,
};

// KDAKIT_DECODE_VARIANT names (decode_variant_names()); "staged" is single or multi by shape.
const char* variant_env_name(Variant v) {
  switch (v) {
    case Variant::kRegisters: return "registers";
    case Variant::kStagedSingle: return "staged";
    case Variant::kStagedSingleWide: return "staged64";
    case Variant::kStagedSingleWidePasses: return "staged64x2";
    case Variant::kStagedMulti: return "staged";
    case Variant::kDirect32: return "direct32";
    case Variant::kDirect16: return "direct16";
  }
  return "?";
}

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kRegisters: return "kernel";
    case Variant::kStagedSingle: return "staged_kernel (single token)";
    case Variant::kStagedSingleWide: return "staged_kernel (single token, 64 rows per CTA)";
    case Variant::kStagedSingleWidePasses: return "staged_kernel (single token, 2 x 64 rows per CTA)";
    case Variant::kStagedMulti: return "staged_kernel (token loop)";
    case Variant::kDirect32: return "direct_kernel (32 rows per CTA)";
    case Variant::kDirect16: return "direct_kernel (16 rows per CTA)";
  }
  return "?";
}

// NOTE: 64-row slices win once the 32-row grid is more than about one wave (8 CTAs x 132 SMs):
// H200, docs/design/20261129-decode.md run 4: 32-row CTAs = 128 and 384 (B = 1): 32 rows
// faster by 6-15 %; 1024 (H = 32, B = 8): equal within 1 %; 3072 and more: 64 rows faster by
// 3-13 %. The switch point between 1024 and 3072 was not measured more finely.
constexpr int64_t kWideMinCtas = 1024;

// NOTE: a whole 128-row head per CTA (staged64x2, two 64-row passes through one buffer) beats one
// 64-row slice per CTA once its grid is several waves (6 CTAs x 132 SMs): H200 2026-12-01, same
// process (us, staged64x2+pdl against staged64+pdl): fp32 H32 B128 147.1 / 149.8, H32 B512 556.3 /
// 562.8, H96 B128 415.7 / 425.2, H96 B512 1630.6 / 1663.3; bf16 H32 B32 22.3 / 23.8, H32 B512 306.4
// / 356.2, H96 B512 892.8 / 1029.9 (one slot index and one token preprocessing per head, the second
// pass's rows copied as soon as a warp has stored the first's). At 3072 slices (H96 B8 bf16) 18.7 /
// 19.3; at 1024 (H32 B8 bf16, 256 x2 CTAs) it loses, 9.4 / 8.1; 2048 was not measured. fp32 grids up
// to kDirectFp32MaxSlicesPerSm slices per SM (16896 on 132 SMs) go to the direct kernel.
constexpr int64_t kWidePassesMinSlices = 3072;

// NOTE: the direct kernel has the shortest chain per CTA and wins while the whole grid is about
// one wave of loads (B = 1: 128 / 384 slices at H = 32 / 96). The ring kernels of
// docs/design/20261130-decode-fast.md (persistent, 192 KB of bulk copies per SM in flight) lost
// to the staged 64-row kernel on every row with B >= 32 (H32 B512 fp32 875 vs 577 us) and were
// removed.
constexpr int64_t kDirectMaxSlicesPerSm = 4;

// NOTE: with an fp32 pool the direct kernel (with PDL, no prefetch) also beats the staged kernels on
// mid-sized grids, H200 2026-12-01 (us, direct32+pdl against the best staged spec): H32 B8 11.82 vs
// 12.63, H32 B32 39.45 vs 41.65, H96 B8 29.49 vs 30.29, H96 B32 108.3 vs 115.6 (12288 slices), H96
// B128 469.5 vs 433.3. With a bf16 pool it loses at B >= 8 (8 rows of bf16 are half the bytes per
// warp in flight). At 5 CTAs per SM (config.h) it also takes H32 B128 (16384 slices, 124 per SM):
// 143.10 against staged64x2's 147.66 us (H32 B512, 65536 slices: 606.4 against 555.1; H96 B128,
// 49152: 444.0 against 414.3).
constexpr int64_t kDirectFp32MaxSlicesPerSm = 128;

// NOTE: PDL (each call may start during the previous kernel's tail,
// src/cuda/common/pdl_launch.cuh; results are identical either way) is on by default for the
// direct and staged kernels: measured 4.49 against 5.04 us at H32 B1 fp32, 5.62 against 5.87 at
// H96 B1 bf16 (direct); staged64 0-6% faster with it (without the prefetch), e.g. H32 B8 bf16
// 8.33 against 8.87 us.
constexpr bool kDefaultPdl = true;

// NOTE: with PDL, the direct and staged kernels can read their slot index at GPU scope and
// prefetch their state rows into L2 before griddepcontrol.wait (direct.cuh, kernel.cuh), so the
// state's DRAM latency overlaps the previous kernel. Measured on the H200 (2026-12-01,
// docs/design/20261130-decode-fast.md): a gain only while the grid is one wave of the direct
// kernel (H32 B1 fp32 3.50 against 3.71 us without it, bf16 3.50 against 4.01), a loss beyond
// (H32 B8 fp32 12.64 against 11.82; B128 210.8 against 155.3: every CTA of a later wave pays the
// index round trip twice). So it is on by default only there (choose_variant);
// KDAKIT_DECODE_PREFETCH=0 / 1 forces it.

// NOTE: staged64x2's L2 prefetch of its second pass right after the first pass's copy (the whole
// head requested from DRAM at once; KDAKIT_DECODE_PREFETCH_NEXT=0 / 1 forces it) is on by default
// for bf16 pools only. H200 2026-12-01, same process (us, with / without): bf16 H32 B128 80.5 /
// 83.3, H32 B512 291.7 / 304.2, H96 B128 217.7 / 228.2, H96 B512 834.8 / 887.0; fp32 H32 B128
// 147.3 / 146.9, H32 B512 556.5 / 554.3, H96 B128 414.6 / 414.8, H96 B512 1623.5 / 1625.2 (a wash).
bool default_prefetch_next(DType dtype_state) { return dtype_state != DType::kFloat32; }

bool is_fast(Variant v) { return v == Variant::kDirect32 || v == Variant::kDirect16; }
bool is_staged(Variant v) {
  return v == Variant::kStagedSingle || v == Variant::kStagedSingleWide || v == Variant::kStagedSingleWidePasses ||
         v == Variant::kStagedMulti;
}
// Variants launched through launch_pdl_kernel (everything but the register kernel).
bool pdl_capable(Variant v) { return is_fast(v) || is_staged(v); }

// What each variant can run (checked before the choice, also for a forced variant).
bool staged_fits(const RecurrentKernelParams& k, DType dtype_state, StateLayout layout) {
  if (k.mode != recurrent::Mode::kDecode || layout != StateLayout::kVFirst || k.num_index_cols != 1) return false;
  const int64_t stride_bytes = (k.num_pool_slots > 1 ? k.stride_pool_slot : 0) * state_elem_bytes(dtype_state);
  return reinterpret_cast<uintptr_t>(k.pool) % 16 == 0 && stride_bytes % 16 == 0;
}
bool single_token(const RecurrentKernelParams& k) { return k.cu_seqlens == nullptr && k.seqlen == 1; }
bool few_tokens(const RecurrentKernelParams& k) {
  return single_token(k) || (k.cu_seqlens != nullptr && k.seqlen <= k.num_seqs);
}
bool wide_fits(const RecurrentKernelParams& k, DType dtype_state, StateLayout layout, int head_dim) {
  return staged_fits(k, dtype_state, layout) && single_token(k) && head_dim == 128;
}

struct Choice {
  Variant variant = Variant::kRegisters;
  bool pdl = false;
  bool prefetch = false;  // with pdl: the L2 prefetch before griddepcontrol.wait (direct, staged)
  bool prefetch_next = false;  // staged64x2: the L2 prefetch of the second pass's rows
};

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  return v[0] != '0';
}

// fast: make_fast_params succeeded (decode calls only).
Choice choose_variant(const RecurrentKernelParams& k, bool fast, DType dtype_state, StateLayout layout, int head_dim) {
  const int64_t slices32 = k.num_seqs * k.num_v_heads * (head_dim / recurrent::kValuesPerCta);
  const bool direct_ok = fast && k.num_seqs <= recurrent::kDirectMaxSeqs;
  const bool small = slices32 <= kDirectMaxSlicesPerSm * std::max(num_sms(), 1);  // one direct wave
  Choice c;
  bool chosen = false;
  if (fast && few_tokens(k)) {
    const bool mid_fp32 = dtype_state == DType::kFloat32 && slices32 <= kDirectFp32MaxSlicesPerSm * std::max(num_sms(), 1);
    if (direct_ok && (small || mid_fp32)) {
      c.variant = Variant::kDirect32;
      chosen = true;
    }
  }
  if (!chosen && staged_fits(k, dtype_state, layout)) {
    if (single_token(k)) {
      const bool wide = wide_fits(k, dtype_state, layout, head_dim) && slices32 > kWideMinCtas;
      c.variant = !wide                            ? Variant::kStagedSingle
                  : slices32 >= kWidePassesMinSlices ? Variant::kStagedSingleWidePasses
                                                    : Variant::kStagedSingleWide;
    } else if (k.cu_seqlens != nullptr && k.seqlen <= k.num_seqs) {
      c.variant = Variant::kStagedMulti;
    }
  }

  // KDAKIT_DECODE_VARIANT forces a variant where it fits (read on every call, so that one
  // process can test and time each); an unknown name or one that does not fit keeps the choice.
  if (const char* v = std::getenv("KDAKIT_DECODE_VARIANT"); v != nullptr && v[0] != '\0') {
    const std::string name(v);
    if (name == "registers") {
      c.variant = Variant::kRegisters;
    } else if (name == "staged" && staged_fits(k, dtype_state, layout) && few_tokens(k)) {
      c.variant = single_token(k) ? Variant::kStagedSingle : Variant::kStagedMulti;
    } else if (name == "staged64" && wide_fits(k, dtype_state, layout, head_dim)) {
      c.variant = Variant::kStagedSingleWide;
    } else if (name == "staged64x2" && wide_fits(k, dtype_state, layout, head_dim)) {
      c.variant = Variant::kStagedSingleWidePasses;
    } else if ((name == "direct32" || name == "direct16") && direct_ok) {
      c.variant = name == "direct32" ? Variant::kDirect32 : Variant::kDirect16;
    }
  }
  // NOTE: the prefetch is only ever set with PDL (without it the wait is a no-op and the prefetch
  // would sit on the chain); the launchers rely on that.
  c.pdl = pdl_capable(c.variant) && env_flag("KDAKIT_DECODE_PDL", kDefaultPdl);
  c.prefetch = c.pdl && env_flag("KDAKIT_DECODE_PREFETCH", small && is_fast(c.variant));
  c.prefetch_next = c.variant == Variant::kStagedSingleWidePasses && env_flag("KDAKIT_DECODE_PREFETCH_NEXT", default_prefetch_next(dtype_state));
  return c;
}

Status launch_fast(const recurrent::FastDecodeParams& f, Variant variant, bool pdl, DType dtype_state, int head_dim,
                   cudaStream_t stream) {
  using recurrent::launch_direct;
  auto by_dtype = [&]<class StateT>() -> Status {
    switch (variant) {
      case Variant::kDirect32:
        return head_dim == 128 ? launch_direct<StateT, 128, 8>(f, stream, pdl) : launch_direct<StateT, 64, 8>(f, stream, pdl);
      case Variant::kDirect16:
        return head_dim == 128 ? launch_direct<StateT, 128, 4>(f, stream, pdl) : launch_direct<StateT, 64, 4>(f, stream, pdl);
      default: return Status(StatusCode::kInternal, "decode: launch_fast called for a non-fast variant");
    }
  };
  if (dtype_state == DType::kFloat32) return by_dtype.template operator()<float>();
  return by_dtype.template operator()<__nv_bfloat16>();
}

// The one runtime -> template switch. fast: the fast kernels' parameters (nullptr when the
// call does not fit them).
Status launch(const RecurrentKernelParams& k, const recurrent::FastDecodeParams* fast, DType dtype_state,
              StateLayout layout, int head_dim, cudaStream_t stream) {
  const Choice choice = choose_variant(k, fast != nullptr, dtype_state, layout, head_dim);
  const Variant variant = choice.variant;
  if (print_configs()) {
    std::fprintf(stderr,
                 "kdakit: kda_decode_sm90_%s variant=%s pdl=%d state=%s layout=%s K=V=%d mode=%s seqs=%lld heads=%d "
                 "token_group=%d items=%lld\n",
                 variant_name(variant), variant_env_name(variant), choice.pdl ? 1 : 0,
                 to_string(dtype_state), to_string(layout), head_dim,
                 k.mode == recurrent::Mode::kDecode ? "decode" : "prefill", (long long)k.num_seqs, k.num_v_heads,
                 k.token_group, (long long)(k.num_seqs * k.num_v_heads * (head_dim / recurrent::kValuesPerCta)));
  }
  const bool pdl = choice.pdl;
  if (is_fast(variant)) {
    recurrent::FastDecodeParams f = *fast;
    if (choice.prefetch) f.flags |= recurrent::FastFlags::kPrefetchBeforeWait;
    return launch_fast(f, variant, pdl, dtype_state, head_dim, stream);
  }
  RecurrentKernelParams ks = k;
  ks.prefetch_before_wait = choice.prefetch;
  ks.prefetch_next_pass = choice.prefetch_next;
  auto staged = [&]<class StateT, bool kSingle>() -> Status {
    if (head_dim == 128) return recurrent::launch_staged<StateT, 128, kSingle, 1>(ks, stream, pdl);
    return recurrent::launch_staged<StateT, 64, kSingle, 1>(ks, stream, pdl);
  };
  if (variant == Variant::kStagedSingleWide) {
    if (dtype_state == DType::kFloat32) return recurrent::launch_staged<float, 128, true, 2>(ks, stream, pdl);
    return recurrent::launch_staged<__nv_bfloat16, 128, true, 2>(ks, stream, pdl);
  }
  if (variant == Variant::kStagedSingleWidePasses) {
    if (dtype_state == DType::kFloat32) return recurrent::launch_staged<float, 128, true, 2, 2>(ks, stream, pdl);
    return recurrent::launch_staged<__nv_bfloat16, 128, true, 2, 2>(ks, stream, pdl);
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

// RecurrentKernelParams of a decode call (also what decode_variant inspects).
RecurrentKernelParams decode_kernel_params(const DecodeParams& p) {
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
  return k;
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
  const RecurrentKernelParams k = decode_kernel_params(p);
  recurrent::FastDecodeParams f;
  const bool fast = make_fast_params(p, f);
  return launch(k, fast ? &f : nullptr, p.dtype_state, p.state_layout, p.head_dim_k, stream);
}

std::string decode_variant(const DecodeParams& p) {
  const RecurrentKernelParams k = decode_kernel_params(p);
  recurrent::FastDecodeParams f;
  const bool fast = make_fast_params(p, f);
  const Choice c = choose_variant(k, fast, p.dtype_state, p.state_layout, p.head_dim_k);
  return std::string(variant_env_name(c.variant)) + (c.pdl ? "+pdl" : "");
}

std::vector<std::string> decode_variant_names() {
  return {"registers", "staged", "staged64", "staged64x2", "direct32", "direct16"};
}

Status run_recurrent_prefill(const PrefillParams& p, cudaStream_t stream) {
  if (Status s = check_shape(p.head_dim_k, p.head_dim_v, p.dtype_state); !s.ok()) return s;
  // NOTE: chunk states go densely, in the state dtype, from this kernel; pool rows, another row
  // stride or dtype are the chunked kernels' (the dispatcher then takes those).
  if (p.chunk_states != nullptr &&
      (p.chunk_state_indices != nullptr || chunk_states_dtype(p) != p.dtype_state ||
       (p.num_chunk_states > 1 && p.stride_chunk_states_n != 0 &&
        p.stride_chunk_states_n != int64_t{p.num_v_heads} * p.head_dim_k * p.head_dim_v)))
    return Status(StatusCode::kUnsupported,
                  "token-serial prefill: chunk states only dense and in the state dtype (chunk_state_indices, "
                  "stride_chunk_states_n, dtype_chunk_states)");
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
  return launch(k, nullptr, p.dtype_state, p.state_layout, p.head_dim_k, stream);
}

}  // namespace kdakit::sm90
