// Host validation (docs/contract.md, "Bad input"): a valid baseline of each operation passes,
// and each named mutation of it triggers one rule, checked by status code and by the argument
// name in the message. Validation reads no memory, so the "tensors" are plain host buffers
// carved out of one arena; only their addresses, sizes and strides matter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

// Small sizes that still exercise GVA (HV = 2 H) and K != V.
constexpr int64_t kB = 2, kT = 5;
constexpr int32_t kH = 2, kHV = 4, kK = 8, kV = 16;
constexpr int64_t kSlots = 6;
constexpr int64_t kStateElems = int64_t{kHV} * kK * kV;

// Hands out disjoint, 64-byte aligned host regions of one buffer.
class Arena {
 public:
  Arena() : bytes_(1 << 22) {}
  template <typename T = void>
  T* take(size_t nbytes) {
    const size_t off = used_;
    used_ += (nbytes + 63) / 64 * 64;
    EXPECT_LE(used_, bytes_.size());
    return reinterpret_cast<T*>(base() + off);
  }
  unsigned char* base() {
    const auto addr = reinterpret_cast<uintptr_t>(bytes_.data());
    return bytes_.data() + ((64 - addr % 64) % 64);
  }

 private:
  std::vector<unsigned char> bytes_;
  size_t used_ = 0;
};

// Row-major contiguous strides for [B, T, heads, dim] activations.
template <typename P>
void set_contiguous_strides(P& p) {
  const int64_t H = p.num_qk_heads, HV = p.num_v_heads, K = p.head_dim_k, V = p.head_dim_v;
  const int64_t T = p.seqlen;
  p.stride_q_h = K, p.stride_q_t = H * K, p.stride_q_b = T * H * K;
  p.stride_k_h = K, p.stride_k_t = H * K, p.stride_k_b = T * H * K;
  p.stride_v_h = V, p.stride_v_t = HV * V, p.stride_v_b = T * HV * V;
  p.stride_o_h = V, p.stride_o_t = HV * V, p.stride_o_b = T * HV * V;
  p.stride_g_h = K, p.stride_g_t = HV * K, p.stride_g_b = T * HV * K;
  p.stride_beta_h = 1, p.stride_beta_t = HV, p.stride_beta_b = T * HV;
}

// Lower-bound gate with A_log and dt_bias, all flags on, bf16 activations, dense fp32
// initial and final state.
PrefillParams valid_prefill(Arena& a) {
  PrefillParams p{
      .batch = kB,
      .seqlen = kT,
      .num_seqs = kB,
      .num_qk_heads = kH,
      .num_v_heads = kHV,
      .head_dim_k = kK,
      .head_dim_v = kV,
      .q = a.take(kB * kT * kH * kK * 2),
      .k = a.take(kB * kT * kH * kK * 2),
      .v = a.take(kB * kT * kHV * kV * 2),
      .g = a.take(kB * kT * kHV * kK * 2),
      .beta = a.take(kB * kT * kHV * 2),
      .A_log = a.take<float>(kHV * 4),
      .dt_bias = a.take<float>(kHV * kK * 4),
      .o = a.take(kB * kT * kHV * kV * 2),
      .initial_state = a.take(kB * kStateElems * 4),
      .final_state = a.take(kB * kStateElems * 4),
      .stride_initial_state_n = kStateElems,
      .stride_final_state_n = kStateElems,
      .stride_chunk_states_n = kStateElems,
      .gate = GateMode::kLowerBound,
      .scale = 1.f / std::sqrt(float(kK)),
      .lower_bound = -5.f,
      .use_qk_l2norm = true,
      .use_beta_sigmoid = true,
      .allow_neg_eigval = true,
  };
  set_contiguous_strides(p);
  return p;
}

// Three tokens per sequence (speculative decoding, 1 + S = 3 index columns), pool of kSlots.
DecodeParams valid_decode(Arena& a) {
  constexpr int64_t T = 3;
  DecodeParams p{
      .batch = kB,
      .seqlen = T,
      .num_seqs = kB,
      .num_state_slots = kSlots,
      .num_index_cols = 3,
      .num_qk_heads = kH,
      .num_v_heads = kHV,
      .head_dim_k = kK,
      .head_dim_v = kV,
      .q = a.take(kB * T * kH * kK * 2),
      .k = a.take(kB * T * kH * kK * 2),
      .v = a.take(kB * T * kHV * kV * 2),
      .g = a.take(kB * T * kHV * kK * 2),
      .beta = a.take(kB * T * kHV * 2),
      .A_log = a.take<float>(kHV * 4),
      .dt_bias = a.take<float>(kHV * kK * 4),
      .state_indices = a.take<int32_t>(kB * 3 * 4),
      .num_accepted_tokens = a.take<int32_t>(kB * 4),
      .o = a.take(kB * T * kHV * kV * 2),
      .state = a.take(kSlots * kStateElems * 4),
      .stride_state_slot = kStateElems,
      .stride_state_indices_n = 3,
      .gate = GateMode::kSoftplus,
      .scale = 1.f / std::sqrt(float(kK)),
      .use_qk_l2norm = true,
      .use_beta_sigmoid = true,
  };
  set_contiguous_strides(p);
  return p;
}

std::string code_name(StatusCode c) {
  switch (c) {
    case StatusCode::kOk:
      return "kOk";
    case StatusCode::kInvalidArgument:
      return "kInvalidArgument";
    case StatusCode::kInvalidType:
      return "kInvalidType";
    case StatusCode::kUnsupported:
      return "kUnsupported";
    case StatusCode::kCudaError:
      return "kCudaError";
    case StatusCode::kInternal:
      return "kInternal";
  }
  return "?";
}

// A named change to a valid baseline and what validate() must answer: kOk, or the code and
// a piece of the message (the argument's name, usually with what was given).
template <typename P>
struct Case {
  std::string name;
  std::function<void(P&, Arena&)> mutate;
  StatusCode code;
  std::string needle;
};

template <typename P>
void PrintTo(const Case<P>& c, std::ostream* os) {
  *os << c.name;
}

template <typename P>
void expect_case(const Case<P>& c, P (*make)(Arena&)) {
  Arena arena;
  P p = make(arena);
  c.mutate(p, arena);
  const Status s = validate(p);
  EXPECT_EQ(code_name(s.code()), code_name(c.code)) << c.name << ": " << s.message();
  if (c.code != StatusCode::kOk) {
    EXPECT_NE(s.message().find(c.needle), std::string::npos)
        << c.name << ": message \"" << s.message() << "\" lacks \"" << c.needle << "\"";
  }
}

using PC = Case<PrefillParams>;
using DC = Case<DecodeParams>;
constexpr auto kOk = StatusCode::kOk;
constexpr auto kArg = StatusCode::kInvalidArgument;
constexpr auto kType = StatusCode::kInvalidType;
constexpr auto kUnsup = StatusCode::kUnsupported;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

template <typename P>
void to_packed(P& p, Arena& a, int64_t num_seqs) {
  p.batch = 1;
  p.num_seqs = num_seqs;
  p.cu_seqlens = a.take(8 * (num_seqs + 1));
  p.dtype_cu_seqlens = DType::kInt64;
  set_contiguous_strides(p);
}

// q, k, v as slices of one fused projection buffer [B, T, H*K + H*K + HV*V] (bf16).
template <typename P>
void to_fused_qkv(P& p, Arena& a) {
  const int64_t width = 2 * kH * kK + kHV * kV;
  auto* buf = a.take<uint16_t>(p.batch * p.seqlen * width * 2);
  p.q = buf, p.k = buf + kH * kK, p.v = buf + 2 * kH * kK;
  p.stride_q_t = p.stride_k_t = p.stride_v_t = width;
  p.stride_q_b = p.stride_k_b = p.stride_v_b = p.seqlen * width;
}

// One pool of kSlots slots read and written in place through two index arrays (the
// prefix-caching pattern).
void to_shared_pool(PrefillParams& p, Arena& a) {
  p.num_state_slots = kSlots;
  p.initial_state = p.final_state = a.take(kSlots * kStateElems * 4);
  p.initial_state_indices = a.take<int32_t>(kB * 4);
  p.final_state_indices = a.take<int32_t>(kB * 4);
}

// Chunk states every 64 tokens (one entry per sequence), written through chunk_state_indices
// into rows of their own pool of kSlots rows, padded apart.
void to_chunk_pool(PrefillParams& p, Arena& a) {
  p.chunk_state_interval = 64, p.num_chunk_states = kB, p.num_chunk_state_slots = kSlots;
  p.chunk_state_indices = a.take<int32_t>(kB * 4);
  p.chunk_states = a.take(kSlots * (kStateElems + 16) * 4);
  p.stride_chunk_states_n = kStateElems + 16;
}

// --- prefill ------------------------------------------------------------------------------

const std::vector<PC>& prefill_cases() {
  static const std::vector<PC> cases = {
      // valid variants
      {"baseline", [](PrefillParams&, Arena&) {}, kOk, ""},
      {"in_place_dense",
       [](PrefillParams& p, Arena&) { p.final_state = const_cast<void*>(p.initial_state); }, kOk,
       ""},
      {"in_place_pool",
       [](PrefillParams& p, Arena& a) {
         auto* idx = a.take<int32_t>(kB * 4);
         p.num_state_slots = kSlots;
         p.initial_state = p.final_state = a.take(kSlots * kStateElems * 4);
         p.initial_state_indices = p.final_state_indices = idx;
       },
       kOk, ""},
      {"pool_padded_slot_stride",
       [](PrefillParams& p, Arena& a) {
         p.num_state_slots = kSlots;
         p.initial_state = a.take(kSlots * (kStateElems + 32) * 4);
         p.initial_state_indices = a.take<int32_t>(kB * 4);
         p.stride_initial_state_n = kStateElems + 32;
       },
       kOk, ""},
      {"fused_projection_views", [](PrefillParams& p, Arena& a) { to_fused_qkv(p, a); }, kOk, ""},
      {"head_major_viewed_token_major",
       [](PrefillParams& p, Arena&) {
         p.stride_q_h = kT * kK, p.stride_q_t = kK;
         p.stride_k_h = kT * kK, p.stride_k_t = kK;
       },
       kOk, ""},
      {"q_and_k_share_memory", [](PrefillParams& p, Arena&) { p.k = p.q; }, kOk, ""},
      {"packed_batch",
       [](PrefillParams& p, Arena& a) {
         to_packed(p, a, 3);
         p.initial_state = a.take(3 * kStateElems * 4);
         p.final_state = a.take(3 * kStateElems * 4);
       },
       kOk, ""},
      {"packed_no_sequences",
       [](PrefillParams& p, Arena& a) {
         to_packed(p, a, 0);
         p.initial_state = p.final_state = nullptr;
       },
       kOk, ""},
      {"empty_tokens_null_activations",
       [](PrefillParams& p, Arena&) {
         p.seqlen = 0;
         p.q = p.k = p.v = p.g = p.beta = nullptr;
         p.o = nullptr;
       },
       kOk, ""},
      {"batch_of_one_any_batch_stride",
       [](PrefillParams& p, Arena&) {
         p.batch = p.num_seqs = 1;
         p.stride_q_b = 0, p.stride_o_b = 12345;
       },
       kOk, ""},
      {"scalar_gate_gdn",
       [](PrefillParams& p, Arena&) {
         p.scalar_gate = true;
         p.stride_g_h = 1, p.stride_g_t = kHV, p.stride_g_b = kT * kHV;
       },
       kOk, ""},
      {"lower_bound_without_A_log", [](PrefillParams& p, Arena&) { p.A_log = nullptr; }, kOk, ""},
      {"softplus_gate",
       [](PrefillParams& p, Arena&) { p.gate = GateMode::kSoftplus, p.lower_bound = 0.f; }, kOk,
       ""},
      {"precomputed_gate",
       [](PrefillParams& p, Arena&) {
         p.gate = GateMode::kPrecomputed, p.lower_bound = 0.f, p.A_log = p.dt_bias = nullptr;
       },
       kOk, ""},
      {"fp32_everything_bf16_state",
       [](PrefillParams& p, Arena& a) {
         p.dtype_qkv = p.dtype_g = p.dtype_beta = DType::kFloat32;
         p.dtype_state = DType::kBFloat16;
         p.q = a.take(kB * kT * kH * kK * 4), p.k = a.take(kB * kT * kH * kK * 4);
         p.v = a.take(kB * kT * kHV * kV * 4), p.o = a.take(kB * kT * kHV * kV * 4);
         p.g = a.take(kB * kT * kHV * kK * 4), p.beta = a.take(kB * kT * kHV * 4);
       },
       kOk, ""},
      {"chunk_states_fixed_batch",
       [](PrefillParams& p, Arena& a) {
         p.chunk_state_interval = 64, p.num_chunk_states = kB;
         p.chunk_states = a.take(kB * kStateElems * 4);
       },
       kOk, ""},
      {"chunk_states_packed",
       [](PrefillParams& p, Arena& a) {
         to_packed(p, a, 2);
         p.chunk_state_interval = 128, p.num_chunk_states = 2;
         p.chunk_states = a.take(2 * kStateElems * 4);
       },
       kOk, ""},
      {"no_state_at_all",
       [](PrefillParams& p, Arena&) { p.initial_state = p.final_state = nullptr; }, kOk, ""},
      {"same_pool_different_indices", [](PrefillParams& p, Arena& a) { to_shared_pool(p, a); },
       kOk, ""},
      {"chunk_states_into_own_pool", [](PrefillParams& p, Arena& a) { to_chunk_pool(p, a); }, kOk,
       ""},
      {"chunk_states_into_the_state_pool",
       [](PrefillParams& p, Arena& a) {
         to_shared_pool(p, a);
         to_chunk_pool(p, a);
         p.chunk_states = p.final_state, p.stride_chunk_states_n = kStateElems;
       },
       kOk, ""},
      {"chunk_states_bf16_with_fp32_state",
       [](PrefillParams& p, Arena& a) {
         p.chunk_state_interval = 64, p.num_chunk_states = kB;
         p.chunk_states = a.take(kB * kStateElems * 2);
         p.dtype_chunk_states = DType::kBFloat16;
       },
       kOk, ""},
      {"chunk_pool_of_one_row_any_stride",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.num_chunk_state_slots = 1, p.stride_chunk_states_n = 0;
       },
       kOk, ""},

      // sizes
      {"negative_batch", [](PrefillParams& p, Arena&) { p.batch = p.num_seqs = -1; }, kArg,
       "batch: "},
      {"negative_seqlen", [](PrefillParams& p, Arena&) { p.seqlen = -2; }, kArg, "seqlen: "},
      {"num_seqs_not_batch", [](PrefillParams& p, Arena&) { p.num_seqs = 3; }, kArg, "num_seqs: "},
      {"negative_max_seqlen", [](PrefillParams& p, Arena&) { p.max_seqlen = -1; }, kArg, "max_seqlen: "},
      {"max_seqlen_past_T", [](PrefillParams& p, Arena&) { p.max_seqlen = p.seqlen + 1; }, kArg,
       "max_seqlen: expected the longest sequence's length in [0, T = "},
      {"max_seqlen_T", [](PrefillParams& p, Arena&) { p.max_seqlen = p.seqlen; }, kOk, ""},
      {"cu_seqlens_with_batch_2", [](PrefillParams& p, Arena& a) { p.cu_seqlens = a.take(8 * 3); },
       kArg, "cu_seqlens: expected batch size 1"},
      {"zero_qk_heads", [](PrefillParams& p, Arena&) { p.num_qk_heads = 0; }, kArg, "q, k: "},
      {"zero_v_heads", [](PrefillParams& p, Arena&) { p.num_v_heads = 0; }, kArg, "v: "},
      {"v_heads_not_multiple", [](PrefillParams& p, Arena&) { p.num_v_heads = 3; }, kArg, "HV = 3"},
      {"zero_head_dim_k", [](PrefillParams& p, Arena&) { p.head_dim_k = 0; }, kArg, "q, k: "},
      {"zero_head_dim_v", [](PrefillParams& p, Arena&) { p.head_dim_v = 0; }, kArg, "v: "},
      {"head_dim_k_too_big", [](PrefillParams& p, Arena&) { p.head_dim_k = 300; }, kUnsup,
       "K = 300"},
      {"head_dim_v_too_big", [](PrefillParams& p, Arena&) { p.head_dim_v = 257; }, kUnsup,
       "V = 257"},

      // dtypes and enums
      {"qkv_int32", [](PrefillParams& p, Arena&) { p.dtype_qkv = DType::kInt32; }, kType,
       "q, k, v, o: "},
      {"g_int64", [](PrefillParams& p, Arena&) { p.dtype_g = DType::kInt64; }, kType, "g: "},
      {"beta_int32", [](PrefillParams& p, Arena&) { p.dtype_beta = DType::kInt32; }, kType,
       "beta: "},
      {"state_fp16", [](PrefillParams& p, Arena&) { p.dtype_state = DType::kFloat16; }, kType,
       "state: "},
      {"cu_seqlens_float",
       [](PrefillParams& p, Arena& a) {
         to_packed(p, a, 2);
         p.dtype_cu_seqlens = DType::kFloat32;
       },
       kType, "cu_seqlens: "},
      {"gate_out_of_enum", [](PrefillParams& p, Arena&) { p.gate = static_cast<GateMode>(7); },
       kArg, "gate: "},
      {"layout_out_of_enum",
       [](PrefillParams& p, Arena&) { p.state_layout = static_cast<StateLayout>(5); }, kArg,
       "state_layout: "},

      // gate and preprocessing flags
      {"softplus_without_A_log",
       [](PrefillParams& p, Arena&) {
         p.gate = GateMode::kSoftplus, p.lower_bound = 0.f, p.A_log = nullptr;
       },
       kArg, "A_log: "},
      {"lower_bound_positive", [](PrefillParams& p, Arena&) { p.lower_bound = 0.5f; }, kArg,
       "lower_bound: expected a value in [-5, 0) for the lower-bound gate, got 0.5"},
      {"lower_bound_zero", [](PrefillParams& p, Arena&) { p.lower_bound = 0.f; }, kArg,
       "lower_bound: "},
      {"lower_bound_below_minus_5", [](PrefillParams& p, Arena&) { p.lower_bound = -5.5f; }, kArg,
       "lower_bound: "},
      {"lower_bound_nan", [](PrefillParams& p, Arena&) { p.lower_bound = kNaN; }, kArg,
       "lower_bound: "},
      {"lower_bound_with_softplus", [](PrefillParams& p, Arena&) { p.gate = GateMode::kSoftplus; },
       kArg, "lower_bound: "},
      {"A_log_with_precomputed",
       [](PrefillParams& p, Arena&) {
         p.gate = GateMode::kPrecomputed, p.lower_bound = 0.f, p.dt_bias = nullptr;
       },
       kArg, "A_log: "},
      {"dt_bias_with_precomputed",
       [](PrefillParams& p, Arena&) {
         p.gate = GateMode::kPrecomputed, p.lower_bound = 0.f, p.A_log = nullptr;
       },
       kArg, "dt_bias: "},
      {"neg_eigval_without_sigmoid", [](PrefillParams& p, Arena&) { p.use_beta_sigmoid = false; },
       kArg, "allow_neg_eigval: "},
      {"scale_zero", [](PrefillParams& p, Arena&) { p.scale = 0.f; }, kArg, "scale: "},
      {"scale_negative", [](PrefillParams& p, Arena&) { p.scale = -1.f; }, kArg, "scale: "},
      {"scale_inf", [](PrefillParams& p, Arena&) { p.scale = kInf; }, kArg, "scale: "},
      {"scale_nan", [](PrefillParams& p, Arena&) { p.scale = kNaN; }, kArg, "scale: "},

      // required tensors
      {"q_null", [](PrefillParams& p, Arena&) { p.q = nullptr; }, kArg, "q: required"},
      {"k_null", [](PrefillParams& p, Arena&) { p.k = nullptr; }, kArg, "k: required"},
      {"v_null", [](PrefillParams& p, Arena&) { p.v = nullptr; }, kArg, "v: required"},
      {"g_null", [](PrefillParams& p, Arena&) { p.g = nullptr; }, kArg, "g: required"},
      {"beta_null", [](PrefillParams& p, Arena&) { p.beta = nullptr; }, kArg, "beta: required"},
      {"o_null", [](PrefillParams& p, Arena&) { p.o = nullptr; }, kArg, "o: required"},

      // strides and alignment
      {"q_negative_stride", [](PrefillParams& p, Arena&) { p.stride_q_t = -1; }, kArg,
       "stride_q_t = -1"},
      {"q_head_stride_below_head_dim", [](PrefillParams& p, Arena&) { p.stride_q_h = kK - 1; },
       kArg, "q: expected strides"},
      {"k_token_stride_below_heads_times_dim", [](PrefillParams& p, Arena&) { p.stride_k_t = kK; },
       kArg, "k: expected strides"},
      {"v_batch_stride_overlaps", [](PrefillParams& p, Arena&) { p.stride_v_b = kHV * kV; }, kArg,
       "v: expected strides"},
      {"g_broadcast_heads", [](PrefillParams& p, Arena&) { p.stride_g_h = 0; }, kArg,
       "g: expected strides"},
      {"beta_broadcast_tokens", [](PrefillParams& p, Arena&) { p.stride_beta_t = 0; }, kArg,
       "beta: expected strides"},
      {"o_overlapping_rows", [](PrefillParams& p, Arena&) { p.stride_o_t = kV; }, kArg,
       "o: expected strides"},
      {"q_span_past_int64", [](PrefillParams& p, Arena&) { p.stride_q_b = int64_t{1} << 62; }, kArg,
       "q: the view of shape [2, 5, 2, 8] spans more bytes than an int64 can count"},
      {"q_misaligned", [](PrefillParams& p, Arena&) { p.q = static_cast<const char*>(p.q) + 1; },
       kArg, "q: expected a pointer aligned to 2 bytes"},
      {"A_log_misaligned",
       [](PrefillParams& p, Arena&) {
         p.A_log = reinterpret_cast<const float*>(reinterpret_cast<const char*>(p.A_log) + 2);
       },
       kArg, "A_log: expected a pointer aligned"},

      // state buffers
      {"initial_indices_without_state",
       [](PrefillParams& p, Arena& a) {
         p.num_state_slots = kSlots, p.initial_state = nullptr;
         p.initial_state_indices = a.take<int32_t>(kB * 4);
       },
       kArg, "initial_state: required"},
      {"final_indices_without_state",
       [](PrefillParams& p, Arena& a) {
         p.num_state_slots = kSlots, p.final_state = nullptr;
         p.final_state_indices = a.take<int32_t>(kB * 4);
       },
       kArg, "final_state: required"},
      {"indexed_without_slots",
       [](PrefillParams& p, Arena& a) { p.initial_state_indices = a.take<int32_t>(kB * 4); }, kArg,
       "num_state_slots: "},
      {"initial_state_stride_small",
       [](PrefillParams& p, Arena&) { p.stride_initial_state_n = kStateElems - 1; }, kArg,
       "stride_initial_state_n"},
      {"final_state_stride_small", [](PrefillParams& p, Arena&) { p.stride_final_state_n = 0; },
       kArg, "stride_final_state_n"},
      {"chunk_states_without_interval",
       [](PrefillParams& p, Arena& a) {
         p.chunk_states = a.take(kB * kStateElems * 4), p.num_chunk_states = kB;
       },
       kArg, "chunk_state_interval: "},
      {"chunk_interval_not_multiple_of_64",
       [](PrefillParams& p, Arena& a) {
         p.chunk_states = a.take(kB * kStateElems * 4), p.num_chunk_states = kB;
         p.chunk_state_interval = 100;
       },
       kArg, "chunk_state_interval: "},
      {"chunk_interval_negative", [](PrefillParams& p, Arena&) { p.chunk_state_interval = -64; },
       kArg, "chunk_state_interval: "},
      {"chunk_interval_without_buffer",
       [](PrefillParams& p, Arena&) { p.chunk_state_interval = 64; }, kArg,
       "chunk_states: required"},
      {"chunk_states_too_small",
       [](PrefillParams& p, Arena& a) {
         p.chunk_states = a.take(kStateElems * 4), p.num_chunk_states = 1;
         p.chunk_state_interval = 64;
       },
       kArg, "chunk_states: expected room"},
      {"chunk_state_indices_too_short",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.num_chunk_states = kB - 1;
       },
       kArg, "chunk_state_indices: expected room for B * ceil(T / chunk_state_interval) = 2"},
      {"chunk_state_indices_without_chunk_states",
       [](PrefillParams& p, Arena& a) {
         p.chunk_state_indices = a.take<int32_t>(kB * 4), p.num_chunk_states = kB;
       },
       kArg, "chunk_states: required with chunk_state_indices"},
      {"chunk_state_indices_without_slots",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.num_chunk_state_slots = 0;
       },
       kArg, "num_chunk_state_slots: expected >= 1"},
      {"chunk_states_stride_small",
       [](PrefillParams& p, Arena& a) {
         p.chunk_states = a.take(kB * kStateElems * 4), p.num_chunk_states = kB;
         p.chunk_state_interval = 64, p.stride_chunk_states_n = kStateElems - 1;
       },
       kArg, "stride_chunk_states_n) >= HV*K*V = 512, got 511"},
      {"chunk_pool_stride_zero",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.stride_chunk_states_n = 0;
       },
       kArg, "stride_chunk_states_n"},
      {"chunk_states_fp16",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.dtype_chunk_states = DType::kFloat16;
       },
       kType, "chunk_states: expected dtype float32 or bfloat16, got float16"},
      {"chunk_state_indices_misaligned",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.chunk_state_indices = reinterpret_cast<const int32_t*>(
             reinterpret_cast<const char*>(p.chunk_state_indices) + 2);
       },
       kArg, "chunk_state_indices: expected a pointer aligned to 4 bytes"},

      // aliasing
      {"same_state_buffer_different_stride",
       [](PrefillParams& p, Arena&) {
         p.final_state = const_cast<void*>(p.initial_state);
         p.stride_final_state_n = kStateElems + 8;
       },
       kArg, "partial state aliasing"},
      {"state_buffers_shifted",
       [](PrefillParams& p, Arena&) {
         p.final_state = static_cast<char*>(const_cast<void*>(p.initial_state)) + 64;
       },
       kArg, "partial state aliasing"},
      {"pool_read_dense_same_buffer_written_through_indices",
       [](PrefillParams& p, Arena& a) {
         p.num_state_slots = kSlots;
         p.initial_state = p.final_state = a.take(kSlots * kStateElems * 4);
         p.final_state_indices = a.take<int32_t>(kB * 4);
       },
       kArg, "partial state aliasing"},
      {"shared_pool_shifted_by_one_slot",
       [](PrefillParams& p, Arena& a) {
         to_shared_pool(p, a);
         p.final_state = static_cast<float*>(p.final_state) + kStateElems;
         p.num_state_slots = kSlots - 1;
       },
       kArg, "partial state aliasing"},
      {"pool_read_dense_write_same_buffer",
       [](PrefillParams& p, Arena& a) {
         p.num_state_slots = kSlots;
         p.initial_state = p.final_state = a.take(kSlots * kStateElems * 4);
         p.initial_state_indices = a.take<int32_t>(kB * 4);
       },
       kArg, "partial state aliasing"},
      {"o_overlaps_v", [](PrefillParams& p, Arena&) { p.o = const_cast<void*>(p.v); }, kArg,
       "o: expected a buffer that shares no memory with v"},
      {"o_overlaps_initial_state",
       [](PrefillParams& p, Arena&) { p.o = const_cast<void*>(p.initial_state); }, kArg,
       "shares no memory with initial_state"},
      {"o_overlaps_final_state", [](PrefillParams& p, Arena&) { p.o = p.final_state; }, kArg,
       "shares no memory with final_state"},
      {"final_state_overlaps_q",
       [](PrefillParams& p, Arena&) { p.q = static_cast<const char*>(p.final_state) + 16; }, kArg,
       "final_state: expected a buffer that shares no memory with q"},
      {"chunk_states_overlap_final_state",
       [](PrefillParams& p, Arena&) {
         p.chunk_states = p.final_state, p.num_chunk_states = kB, p.chunk_state_interval = 64;
       },
       kArg, "chunk_states: expected a buffer that shares no memory with final_state"},
      {"chunk_states_into_the_state_pool_without_indices",
       [](PrefillParams& p, Arena& a) {
         to_shared_pool(p, a);
         p.chunk_states = p.final_state, p.num_chunk_states = kB, p.chunk_state_interval = 64;
       },
       kArg, "chunk_states: expected a buffer that shares no memory with initial_state"},
      {"chunk_states_into_the_state_pool_other_stride",
       [](PrefillParams& p, Arena& a) {
         to_shared_pool(p, a);
         to_chunk_pool(p, a);
         p.chunk_states = p.final_state;
       },
       kArg, "or the same state pool (same pointer, stride and dtype"},
      {"chunk_states_into_the_state_pool_other_dtype",
       [](PrefillParams& p, Arena& a) {
         to_shared_pool(p, a);
         to_chunk_pool(p, a);
         p.chunk_states = p.final_state, p.stride_chunk_states_n = kStateElems;
         p.dtype_chunk_states = DType::kBFloat16;
       },
       kArg, "chunk_states: expected a buffer that shares no memory with initial_state"},
      {"chunk_pool_over_a_dense_initial_state",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.chunk_states = const_cast<void*>(p.initial_state);
         p.num_chunk_state_slots = kB, p.stride_chunk_states_n = kStateElems;
       },
       kArg, "with chunk_state_indices and initial_state_indices"},
      {"o_overlaps_chunk_state_indices",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.chunk_state_indices = static_cast<const int32_t*>(p.o);
       },
       kArg, "o: expected a buffer that shares no memory with chunk_state_indices"},
      {"chunk_states_overlap_chunk_state_indices",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.chunk_state_indices = static_cast<const int32_t*>(p.chunk_states) + 8;
       },
       kArg, "chunk_states: expected a buffer that shares no memory with chunk_state_indices"},
      {"final_state_overlaps_chunk_state_indices",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.chunk_state_indices = static_cast<const int32_t*>(p.final_state);
       },
       kArg, "final_state: expected a buffer that shares no memory with chunk_state_indices"},
      {"workspace_overlaps_chunk_state_indices",
       [](PrefillParams& p, Arena& a) {
         to_chunk_pool(p, a);
         p.workspace = const_cast<int32_t*>(p.chunk_state_indices), p.workspace_bytes = 8;
       },
       kArg, "workspace: expected scratch memory that shares no memory with chunk_state_indices"},
      {"o_overlaps_cu_seqlens",
       [](PrefillParams& p, Arena& a) {
         to_packed(p, a, 1);
         p.cu_seqlens = p.o;
       },
       kArg, "shares no memory with cu_seqlens"},
      {"workspace_overlaps_o",
       [](PrefillParams& p, Arena&) { p.workspace = p.o, p.workspace_bytes = 64; }, kArg,
       "workspace: expected scratch memory that shares no memory with o"},
      {"workspace_overlaps_initial_state",
       [](PrefillParams& p, Arena&) {
         p.workspace = static_cast<char*>(const_cast<void*>(p.initial_state)) + 128;
         p.workspace_bytes = 4096;
       },
       kArg, "shares no memory with initial_state"},
      {"workspace_separate",
       [](PrefillParams& p, Arena& a) { p.workspace = a.take(4096), p.workspace_bytes = 4096; },
       kOk, ""},
      // --- 7. plan
      {"plan_ready_with_workspace",
       [](PrefillParams& p, Arena& a) {
         p.workspace = a.take(4096), p.workspace_bytes = 4096, p.plan_ready = true;
       },
       kOk, ""},
      {"plan_ready_without_workspace", [](PrefillParams& p, Arena&) { p.plan_ready = true; }, kArg,
       "plan_ready: needs the workspace that prefill_plan wrote the plan into, got workspace "
       "None"},
  };
  return cases;
}

class PrefillValidation : public ::testing::TestWithParam<PC> {};
TEST_P(PrefillValidation, Rule) { expect_case(GetParam(), &valid_prefill); }
INSTANTIATE_TEST_SUITE_P(Cases, PrefillValidation, ::testing::ValuesIn(prefill_cases()),
                         [](const auto& info) { return info.param.name; });

// --- decode -------------------------------------------------------------------------------

const std::vector<DC>& decode_cases() {
  static const std::vector<DC> cases = {
      // valid variants
      {"baseline", [](DecodeParams&, Arena&) {}, kOk, ""},
      {"one_token_one_column",
       [](DecodeParams& p, Arena&) {
         p.seqlen = 1, p.num_index_cols = 1, p.stride_state_indices_n = 1;
         p.num_accepted_tokens = nullptr;
         set_contiguous_strides(p);
       },
       kOk, ""},
      {"packed_batch", [](DecodeParams& p, Arena& a) { to_packed(p, a, 2); }, kOk, ""},
      {"fused_projection_views", [](DecodeParams& p, Arena& a) { to_fused_qkv(p, a); }, kOk, ""},
      {"padded_index_rows",
       [](DecodeParams& p, Arena& a) {
         p.state_indices = a.take<int32_t>(kB * 8 * 4), p.stride_state_indices_n = 8;
       },
       kOk, ""},
      {"single_slot_any_stride",
       [](DecodeParams& p, Arena&) { p.num_state_slots = 1, p.stride_state_slot = 0; }, kOk, ""},
      {"no_sequences_no_indices",
       [](DecodeParams& p, Arena& a) {
         to_packed(p, a, 0);
         p.state_indices = nullptr, p.num_accepted_tokens = nullptr;
       },
       kOk, ""},
      {"bf16_state_k_first",
       [](DecodeParams& p, Arena&) {
         p.dtype_state = DType::kBFloat16, p.state_layout = StateLayout::kKFirst;
       },
       kOk, ""},

      // shared rules, as decode reports them
      {"cu_seqlens_with_batch_2", [](DecodeParams& p, Arena& a) { p.cu_seqlens = a.take(8 * 3); },
       kArg, "cu_seqlens: expected batch size 1"},
      {"v_heads_not_multiple", [](DecodeParams& p, Arena&) { p.num_v_heads = 5; }, kArg, "v: "},
      {"head_dim_too_big", [](DecodeParams& p, Arena&) { p.head_dim_v = 512; }, kUnsup, "v: "},
      {"state_int32", [](DecodeParams& p, Arena&) { p.dtype_state = DType::kInt32; }, kType,
       "state: "},
      {"softplus_without_A_log", [](DecodeParams& p, Arena&) { p.A_log = nullptr; }, kArg,
       "A_log: "},
      {"lower_bound_out_of_range",
       [](DecodeParams& p, Arena&) { p.gate = GateMode::kLowerBound, p.lower_bound = -6.f; }, kArg,
       "lower_bound: "},
      {"neg_eigval_without_sigmoid",
       [](DecodeParams& p, Arena&) { p.allow_neg_eigval = true, p.use_beta_sigmoid = false; }, kArg,
       "allow_neg_eigval: "},
      {"scale_nan", [](DecodeParams& p, Arena&) { p.scale = kNaN; }, kArg, "scale: "},
      {"beta_null", [](DecodeParams& p, Arena&) { p.beta = nullptr; }, kArg, "beta: required"},
      {"q_token_stride_overlaps", [](DecodeParams& p, Arena&) { p.stride_q_t = 1; }, kArg,
       "q: expected strides"},

      // state pool and slot indices
      {"state_null", [](DecodeParams& p, Arena&) { p.state = nullptr; }, kArg, "state: required"},
      {"no_slots", [](DecodeParams& p, Arena&) { p.num_state_slots = 0; }, kArg,
       "num_state_slots: "},
      {"slot_stride_small", [](DecodeParams& p, Arena&) { p.stride_state_slot = kStateElems / 2; },
       kArg, "stride_state_slot"},
      {"state_indices_null", [](DecodeParams& p, Arena&) { p.state_indices = nullptr; }, kArg,
       "state_indices: required"},
      {"zero_index_cols", [](DecodeParams& p, Arena&) { p.num_index_cols = 0; }, kArg,
       "state_indices: "},
      {"index_row_stride_small", [](DecodeParams& p, Arena&) { p.stride_state_indices_n = 2; },
       kArg, "stride_state_indices_n"},
      {"state_indices_misaligned",
       [](DecodeParams& p, Arena&) {
         p.state_indices =
             reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(p.state_indices) + 1);
       },
       kArg, "state_indices: expected a pointer aligned"},

      // aliasing
      {"o_overlaps_state", [](DecodeParams& p, Arena&) { p.o = p.state; }, kArg,
       "o: expected a buffer that shares no memory with state"},
      {"o_overlaps_q", [](DecodeParams& p, Arena&) { p.o = const_cast<void*>(p.q); }, kArg,
       "shares no memory with q"},
      {"state_overlaps_indices",
       [](DecodeParams& p, Arena&) { p.state_indices = static_cast<const int32_t*>(p.state) + 4; },
       kArg, "state: expected a buffer that shares no memory with state_indices"},
      {"state_overlaps_g",
       [](DecodeParams& p, Arena&) { p.g = static_cast<char*>(p.state) + 4 * kStateElems; }, kArg,
       "state: expected a buffer that shares no memory with g"},
  };
  return cases;
}

class DecodeValidation : public ::testing::TestWithParam<DC> {};
TEST_P(DecodeValidation, Rule) { expect_case(GetParam(), &valid_decode); }
INSTANTIATE_TEST_SUITE_P(Cases, DecodeValidation, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return info.param.name; });

// --- entry points and enum names ----------------------------------------------------------

TEST(EntryPoints, ValidationComesFirst) {
  Arena a;
  PrefillParams p = valid_prefill(a);
  p.lower_bound = 0.5f;
  const Status s = prefill(p, nullptr);
  EXPECT_EQ(code_name(s.code()), "kInvalidArgument");
  EXPECT_NE(s.message().find("lower_bound"), std::string::npos) << s.message();
  DecodeParams d = valid_decode(a);
  d.state = nullptr;
  const Status t = decode(d, nullptr);
  EXPECT_EQ(code_name(t.code()), "kInvalidArgument");
  EXPECT_NE(t.message().find("state: required"), std::string::npos) << t.message();
}

TEST(EntryPoints, WithoutCudaValidInputIsUnsupported) {
  if (built_with_cuda()) GTEST_SKIP() << "CUDA build: the kernels would run on host buffers";
  Arena a;
  const Status s = prefill(valid_prefill(a), nullptr);
  EXPECT_EQ(code_name(s.code()), "kUnsupported");
  EXPECT_NE(s.message().find("without CUDA"), std::string::npos) << s.message();
  const Status t = decode(valid_decode(a), nullptr);
  EXPECT_EQ(code_name(t.code()), "kUnsupported");
  EXPECT_EQ(prefill_workspace_size(valid_prefill(a)), 0u);
}

TEST(EnumNames, AreTheUserFacingSpellings) {
  EXPECT_STREQ(to_string(DType::kFloat32), "float32");
  EXPECT_STREQ(to_string(DType::kBFloat16), "bfloat16");
  EXPECT_STREQ(to_string(DType::kFloat16), "float16");
  EXPECT_STREQ(to_string(DType::kInt32), "int32");
  EXPECT_STREQ(to_string(DType::kInt64), "int64");
  EXPECT_STREQ(to_string(GateMode::kPrecomputed), "precomputed");
  EXPECT_STREQ(to_string(GateMode::kSoftplus), "softplus");
  EXPECT_STREQ(to_string(GateMode::kLowerBound), "lower_bound");
  EXPECT_NE(std::string(to_string(StateLayout::kVFirst)), to_string(StateLayout::kKFirst));
}

}  // namespace
}  // namespace kdakit
