// Host-side validation of PrefillParams and DecodeParams (CONTRACT.md section 5, restated in
// docs/contract.md): every rule that can be checked from sizes, strides, dtypes, flags and
// pointer values alone. No device memory is read; the same checks guard the CUDA entry points
// and the CPU backend.
//
// Checks run in groups, each group relying on the ones before it:
//   1. sizes and shape consistency (batch, tokens, sequences, heads, head dims)
//   2. enums and dtypes
//   3. gate and preprocessing flags
//   4. required tensors and per-tensor layout (strides, alignment) of every view
//   5. state buffers (pool slots, state strides, chunk states)
//   6. aliasing between the written buffers and everything else
//   7. plan (prefill: plan_ready needs the workspace holding the plan)
// Messages name the argument as the Python package (and FLA) spells it, what was expected and
// what was given.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "api/check.h"
#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

using detail::cat;
using detail::error;

// Head dims the host layer accepts (the CPU backend runs all of them); the CUDA dispatchers
// check their own, smaller supported set.
constexpr int32_t kMaxHeadDim = 256;

// Lower-bound gate range: gamma = lb * sigmoid(.) must stay a decay (lb < 0), and FlashKDA's
// and Kimi K3's bound of -5 keeps exp(gamma) >= exp(-5) representable per token.
constexpr float kMinLowerBound = -5.f;

// Largest byte span of one view: byte offsets are int64 in the kernels.
constexpr __int128 kMaxViewBytes = static_cast<__int128>(INT64_MAX);

// Chunk states are taken at chunk boundaries of the 64-token chunked algorithm.
constexpr int32_t kChunkStateGranule = 64;

bool is_float_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}

bool valid_gate(GateMode g) {
  return g == GateMode::kPrecomputed || g == GateMode::kSoftplus || g == GateMode::kLowerBound;
}

bool valid_layout(StateLayout l) { return l == StateLayout::kVFirst || l == StateLayout::kKFirst; }

// NOTE: 1 for an invalid dtype (reported by the dtype checks) keeps the span and alignment
// arithmetic below free of a division by zero.
size_t dtype_bytes(DType d) { return dtype_size(d) ? dtype_size(d) : 1; }

// One dimension of a tensor view: its size, its stride in elements and the name of the
// params field that holds the stride (null for a contiguous last dim).
struct Dim {
  int64_t size = 0;
  int64_t stride = 1;
  const char* stride_name = nullptr;
};

// A tensor as the params describe it: pointer, dtype, up to four dims. `name` is the
// argument's user-facing name, used in every message about it.
struct View {
  const char* name = "";
  const void* ptr = nullptr;
  DType dtype = DType::kFloat32;
  int rank = 0;
  Dim dims[4] = {};

  // Whether the view has no element (some dim of size 0).
  bool empty() const {
    for (int i = 0; i < rank; ++i) {
      if (dims[i].size == 0) return true;
    }
    return false;
  }
};

// [begin, end) bytes from the first to one past the last element of a view; empty for a
// null or empty view.
struct ByteRange {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const ByteRange& o) const {
    if (begin == end || o.begin == o.end) return false;
    return begin < o.end && o.begin < end;
  }
};

ByteRange byte_range(const View& t) {
  if (t.ptr == nullptr || t.empty()) return ByteRange{};
  uint64_t last = 0;  // offset of the last element, in elements
  for (int i = 0; i < t.rank; ++i) {
    last += static_cast<uint64_t>(t.dims[i].size - 1) * static_cast<uint64_t>(t.dims[i].stride);
  }
  const auto begin = reinterpret_cast<uintptr_t>(t.ptr);
  return ByteRange{begin, begin + static_cast<uintptr_t>((last + 1) * dtype_bytes(t.dtype))};
}

// --- 1. sizes -----------------------------------------------------------------------------

// The longest-sequence hint (prefill only).
Status check_max_seqlen(const PrefillParams& p) {
  KDAKIT_CHECK(p.max_seqlen >= 0 && p.max_seqlen <= p.seqlen, kInvalidArgument,
               "max_seqlen: expected the longest sequence's length in [0, T = ", p.seqlen,
               "] (0: unknown), got ", p.max_seqlen);
  return Status::Ok();
}
Status check_max_seqlen(const DecodeParams&) { return Status::Ok(); }

// Batch, tokens and sequences: the part of the sizes that the prefill workspace and plan use.
template <typename P>
Status check_batch_sizes(const P& c) {
  KDAKIT_CHECK(c.batch >= 0, kInvalidArgument, "batch: expected a batch size >= 0, got ", c.batch);
  KDAKIT_CHECK(c.seqlen >= 0, kInvalidArgument,
               "seqlen: expected a token count T >= 0 (dim 1 of q), got ", c.seqlen);
  KDAKIT_CHECK(c.num_seqs >= 0, kInvalidArgument,
               "num_seqs: expected a sequence count N >= 0, got ", c.num_seqs);
  if (c.cu_seqlens != nullptr) {
    KDAKIT_CHECK(c.batch == 1, kInvalidArgument,
                 "cu_seqlens: expected batch size 1 with cu_seqlens (packed sequences share one "
                 "row), got batch size ",
                 c.batch);
  } else {
    KDAKIT_CHECK(c.num_seqs == c.batch, kInvalidArgument, "num_seqs: expected N = batch size (",
                 c.batch, ") without cu_seqlens, got ", c.num_seqs);
  }
  return check_max_seqlen(c);
}

template <typename P>
Status check_sizes(const P& c) {
  KDAKIT_RETURN_IF_ERROR(check_batch_sizes(c));
  KDAKIT_CHECK(c.num_qk_heads > 0, kInvalidArgument, "q, k: expected a number of heads H > 0, got ",
               c.num_qk_heads);
  KDAKIT_CHECK(c.num_v_heads > 0, kInvalidArgument,
               "v: expected a number of value heads HV > 0, got ", c.num_v_heads);
  KDAKIT_CHECK(c.num_v_heads % c.num_qk_heads == 0, kInvalidArgument,
               "v: expected a number of value heads HV that is a multiple of the q/k heads H = ",
               c.num_qk_heads, " (GVA), got HV = ", c.num_v_heads);
  KDAKIT_CHECK(c.head_dim_k >= 1, kInvalidArgument, "q, k: expected a head dim K >= 1, got ",
               c.head_dim_k);
  KDAKIT_CHECK(c.head_dim_v >= 1, kInvalidArgument, "v: expected a head dim V >= 1, got ",
               c.head_dim_v);
  KDAKIT_CHECK(c.head_dim_k <= kMaxHeadDim, kUnsupported, "q, k: head dim K = ", c.head_dim_k,
               " is not supported; supported: 1 to ", kMaxHeadDim);
  KDAKIT_CHECK(c.head_dim_v <= kMaxHeadDim, kUnsupported, "v: head dim V = ", c.head_dim_v,
               " is not supported; supported: 1 to ", kMaxHeadDim);
  return Status::Ok();
}

// --- 2. enums and dtypes ------------------------------------------------------------------

// Chunk states may have their own dtype (prefill only).
Status check_chunk_states_dtype(const PrefillParams& p) {
  const DType d = chunk_states_dtype(p);
  KDAKIT_CHECK(d == DType::kFloat32 || d == DType::kBFloat16, kInvalidType,
               "chunk_states: expected dtype float32 or bfloat16, got ", to_string(d));
  return Status::Ok();
}
Status check_chunk_states_dtype(const DecodeParams&) { return Status::Ok(); }

template <typename P>
Status check_dtypes(const P& c) {
  KDAKIT_CHECK(is_float_dtype(c.dtype_qkv), kInvalidType,
               "q, k, v, o: expected dtype float32, bfloat16 or float16, got ",
               to_string(c.dtype_qkv));
  KDAKIT_CHECK(is_float_dtype(c.dtype_g), kInvalidType,
               "g: expected dtype float32, bfloat16 or float16, got ", to_string(c.dtype_g));
  KDAKIT_CHECK(is_float_dtype(c.dtype_beta), kInvalidType,
               "beta: expected dtype float32, bfloat16 or float16, got ", to_string(c.dtype_beta));
  KDAKIT_CHECK(c.dtype_state == DType::kFloat32 || c.dtype_state == DType::kBFloat16, kInvalidType,
               "state: expected dtype float32 or bfloat16, got ", to_string(c.dtype_state));
  if (c.cu_seqlens != nullptr) {
    KDAKIT_CHECK(c.dtype_cu_seqlens == DType::kInt32 || c.dtype_cu_seqlens == DType::kInt64,
                 kInvalidType, "cu_seqlens: expected dtype int32 or int64, got ",
                 to_string(c.dtype_cu_seqlens));
  }
  KDAKIT_RETURN_IF_ERROR(check_chunk_states_dtype(c));
  KDAKIT_CHECK(valid_gate(c.gate), kInvalidArgument,
               "gate: expected precomputed, softplus or lower_bound, got value ",
               static_cast<int>(c.gate));
  KDAKIT_CHECK(valid_layout(c.state_layout), kInvalidArgument,
               "state_layout: expected V-first or K-first, got value ",
               static_cast<int>(c.state_layout));
  return Status::Ok();
}

// --- 3. gate and preprocessing ------------------------------------------------------------

template <typename P>
Status check_gate(const P& c) {
  if (c.gate == GateMode::kSoftplus) {
    KDAKIT_CHECK(c.A_log != nullptr, kInvalidArgument,
                 "A_log: required by the softplus gate (gamma = -exp(A_log) * softplus(g + "
                 "dt_bias)), got None");
  }
  if (c.gate == GateMode::kLowerBound) {
    KDAKIT_CHECK(c.lower_bound >= kMinLowerBound && c.lower_bound < 0.f, kInvalidArgument,
                 "lower_bound: expected a value in [-5, 0) for the lower-bound gate, got ",
                 c.lower_bound);
  } else {
    KDAKIT_CHECK(c.lower_bound == 0.f, kInvalidArgument, "lower_bound: given (", c.lower_bound,
                 ") but the gate is ", to_string(c.gate),
                 "; a lower bound selects the lower-bound gate");
  }
  if (c.gate == GateMode::kPrecomputed) {
    KDAKIT_CHECK(c.A_log == nullptr, kInvalidArgument,
                 "A_log: given but the gate is precomputed (gamma = g); it is only read by the "
                 "softplus and lower-bound gates");
    KDAKIT_CHECK(c.dt_bias == nullptr, kInvalidArgument,
                 "dt_bias: given but the gate is precomputed (gamma = g); it is only read by "
                 "the softplus and lower-bound gates");
  }
  KDAKIT_CHECK(!c.allow_neg_eigval || c.use_beta_sigmoid, kInvalidArgument,
               "allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True (beta <- 2 * "
               "sigmoid(beta)), got use_beta_sigmoid_in_kernel=False");
  KDAKIT_CHECK(std::isfinite(c.scale) && c.scale > 0.f, kInvalidArgument,
               "scale: expected a finite value > 0 (default K ** -0.5), got ", c.scale);
  return Status::Ok();
}

// --- 4. required tensors and layout of each view ------------------------------------------

Status check_required(const View& t) {
  KDAKIT_CHECK(t.ptr != nullptr || t.empty(), kInvalidArgument, t.name,
               ": required, got a null pointer");
  return Status::Ok();
}

std::string shape_string(const View& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) s += cat(i ? ", " : "", t.dims[i].size);
  return s + "]";
}

// Strides are non-negative, every element of the view has its own address (sorting the
// dims of size > 1 by stride, each stride steps past the span of the faster dims), the byte
// span fits in int64 and the pointer is aligned to its element size. This accepts any
// permutation and any padding: q/k/v as slices of a fused projection buffer, head-major
// buffers viewed token-major, padded batch rows.
Status check_view(const View& t) {
  for (int i = 0; i < t.rank; ++i) {
    const Dim& d = t.dims[i];
    if (d.stride_name == nullptr) continue;
    KDAKIT_CHECK(d.stride >= 0, kInvalidArgument, t.name, ": expected non-negative strides, got ",
                 d.stride_name, " = ", d.stride);
  }
  std::vector<Dim> dims;
  for (int i = 0; i < t.rank; ++i) {
    if (t.dims[i].size > 1) dims.push_back(t.dims[i]);
  }
  std::stable_sort(dims.begin(), dims.end(),
                   [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  __int128 span = 1;  // elements covered by the faster dims, as an exclusive bound
  for (const Dim& d : dims) {
    if (d.stride < span) {
      std::string strides;
      for (int i = 0; i < t.rank; ++i) {
        if (t.dims[i].stride_name == nullptr) continue;
        strides += cat(strides.empty() ? "" : ", ", t.dims[i].stride_name, " = ", t.dims[i].stride);
      }
      return error(StatusCode::kInvalidArgument, t.name,
                   ": expected strides that give every element its own address (the last dim "
                   "contiguous), got ",
                   strides, " for shape ", shape_string(t));
    }
    // NOTE: both factors are below 2^63 and span stays below 2^63 / element size after each
    // step, so the sum cannot overflow 128 bits.
    span += static_cast<__int128>(d.size - 1) * d.stride;
    KDAKIT_CHECK(span * static_cast<__int128>(dtype_bytes(t.dtype)) <= kMaxViewBytes,
                 kInvalidArgument, t.name, ": the view of shape ", shape_string(t),
                 " spans more bytes than an int64 can count");
  }
  const auto addr = reinterpret_cast<uintptr_t>(t.ptr);
  KDAKIT_CHECK(addr % dtype_bytes(t.dtype) == 0, kInvalidArgument, t.name,
               ": expected a pointer aligned to ", dtype_bytes(t.dtype), " bytes for ",
               to_string(t.dtype), ", got address ", reinterpret_cast<const void*>(t.ptr));
  return Status::Ok();
}

Status check_views(const std::vector<View>& views, bool required) {
  for (const View& t : views) {
    if (required) KDAKIT_RETURN_IF_ERROR(check_required(t));
    if (t.ptr != nullptr) KDAKIT_RETURN_IF_ERROR(check_view(t));
  }
  return Status::Ok();
}

// --- 6. aliasing --------------------------------------------------------------------------

// A written buffer must share no byte with any other buffer of the call.
Status check_disjoint(const View& written, const std::vector<View>& others) {
  const ByteRange w = byte_range(written);
  for (const View& t : others) {
    KDAKIT_CHECK(!w.overlaps(byte_range(t)), kInvalidArgument, written.name,
                 ": expected a buffer that shares no memory with ", t.name,
                 " (it is written by this call), got overlapping byte ranges");
  }
  return Status::Ok();
}

// --- views of the two operations ----------------------------------------------------------

View activation(const char* name, const void* ptr, DType dtype, int64_t B, int64_t T, int64_t heads,
                int64_t dim, const char* sb, int64_t stride_b, const char* st, int64_t stride_t,
                const char* sh, int64_t stride_h) {
  View t{name, ptr, dtype, 4, {}};
  t.dims[0] = Dim{B, stride_b, sb};
  t.dims[1] = Dim{T, stride_t, st};
  t.dims[2] = Dim{heads, stride_h, sh};
  t.dims[3] = Dim{dim, 1, nullptr};
  return t;
}

View per_token_head(const char* name, const void* ptr, DType dtype, int64_t B, int64_t T,
                    int64_t heads, const char* sb, int64_t stride_b, const char* st,
                    int64_t stride_t, const char* sh, int64_t stride_h) {
  View t{name, ptr, dtype, 3, {}};
  t.dims[0] = Dim{B, stride_b, sb};
  t.dims[1] = Dim{T, stride_t, st};
  t.dims[2] = Dim{heads, stride_h, sh};
  return t;
}

View vector_view(const char* name, const void* ptr, DType dtype, int64_t n) {
  View t{name, ptr, dtype, 1, {}};
  t.dims[0] = Dim{n, 1, nullptr};
  return t;
}

// rows x (HV * K * V) states, rows `stride` elements apart.
View state_view(const char* name, const void* ptr, DType dtype, int64_t rows, int64_t state_elems,
                const char* stride_name, int64_t stride) {
  View t{name, ptr, dtype, 2, {}};
  t.dims[0] = Dim{rows, stride, stride_name};
  t.dims[1] = Dim{state_elems, 1, nullptr};
  return t;
}

// The views every operation has: q, k, v, g, beta, o and the small per-head / per-sequence
// vectors. Sizes are those of check_sizes (already validated).
struct CommonViews {
  View q, k, v, g, beta, o, A_log, dt_bias, cu_seqlens;
};

template <typename P>
CommonViews make_common_views(const P& c) {
  const int64_t B = c.batch, T = c.seqlen, H = c.num_qk_heads, HV = c.num_v_heads;
  CommonViews w{};
  w.q = activation("q", c.q, c.dtype_qkv, B, T, H, c.head_dim_k, "stride_q_b", c.stride_q_b,
                   "stride_q_t", c.stride_q_t, "stride_q_h", c.stride_q_h);
  w.k = activation("k", c.k, c.dtype_qkv, B, T, H, c.head_dim_k, "stride_k_b", c.stride_k_b,
                   "stride_k_t", c.stride_k_t, "stride_k_h", c.stride_k_h);
  w.v = activation("v", c.v, c.dtype_qkv, B, T, HV, c.head_dim_v, "stride_v_b", c.stride_v_b,
                   "stride_v_t", c.stride_v_t, "stride_v_h", c.stride_v_h);
  w.o = activation("o", c.o, c.dtype_qkv, B, T, HV, c.head_dim_v, "stride_o_b", c.stride_o_b,
                   "stride_o_t", c.stride_o_t, "stride_o_h", c.stride_o_h);
  if (c.scalar_gate) {
    w.g = per_token_head("g", c.g, c.dtype_g, B, T, HV, "stride_g_b", c.stride_g_b, "stride_g_t",
                         c.stride_g_t, "stride_g_h", c.stride_g_h);
  } else {
    w.g = activation("g", c.g, c.dtype_g, B, T, HV, c.head_dim_k, "stride_g_b", c.stride_g_b,
                     "stride_g_t", c.stride_g_t, "stride_g_h", c.stride_g_h);
  }
  w.beta = per_token_head("beta", c.beta, c.dtype_beta, B, T, HV, "stride_beta_b", c.stride_beta_b,
                          "stride_beta_t", c.stride_beta_t, "stride_beta_h", c.stride_beta_h);
  w.A_log = vector_view("A_log", c.A_log, DType::kFloat32, HV);
  w.dt_bias =
      vector_view("dt_bias", c.dt_bias, DType::kFloat32, c.scalar_gate ? HV : HV * c.head_dim_k);
  w.cu_seqlens = vector_view("cu_seqlens", c.cu_seqlens, c.dtype_cu_seqlens, c.num_seqs + 1);
  return w;
}

// Groups 1 to 4 for the fields both operations share.
template <typename P>
Status check_common(const P& c, CommonViews& w) {
  KDAKIT_RETURN_IF_ERROR(check_sizes(c));
  KDAKIT_RETURN_IF_ERROR(check_dtypes(c));
  KDAKIT_RETURN_IF_ERROR(check_gate(c));
  w = make_common_views(c);
  KDAKIT_RETURN_IF_ERROR(check_views({w.q, w.k, w.v, w.g, w.beta, w.o}, true));
  KDAKIT_RETURN_IF_ERROR(check_views({w.A_log, w.dt_bias, w.cu_seqlens}, false));
  return Status::Ok();
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Prefill
// ------------------------------------------------------------------------------------------

Status validate(const PrefillParams& p) {
  CommonViews w;
  KDAKIT_RETURN_IF_ERROR(check_common(p, w));

  // --- 5. state buffers
  const int64_t HV = p.num_v_heads;
  const int64_t state_elems = HV * p.head_dim_k * p.head_dim_v;
  const bool indexed = p.initial_state_indices != nullptr || p.final_state_indices != nullptr;
  KDAKIT_CHECK(p.initial_state_indices == nullptr || p.initial_state != nullptr, kInvalidArgument,
               "initial_state: required with initial_state_indices (the pool they index), got "
               "None");
  KDAKIT_CHECK(p.final_state_indices == nullptr || p.final_state != nullptr, kInvalidArgument,
               "final_state: required with final_state_indices (the pool they index), got None");
  if (indexed) {
    KDAKIT_CHECK(p.num_state_slots >= 1, kInvalidArgument,
                 "num_state_slots: expected >= 1 slots in the state pool with state indices, "
                 "got ",
                 p.num_state_slots);
  }
  const int64_t init_rows = p.initial_state_indices ? p.num_state_slots : p.num_seqs;
  const int64_t final_rows = p.final_state_indices ? p.num_state_slots : p.num_seqs;
  if (p.initial_state != nullptr) {
    KDAKIT_CHECK(init_rows <= 1 || p.stride_initial_state_n >= state_elems, kInvalidArgument,
                 "initial_state: expected a stride between states (stride_initial_state_n) "
                 ">= HV*K*V = ",
                 state_elems, ", got ", p.stride_initial_state_n);
  }
  if (p.final_state != nullptr) {
    KDAKIT_CHECK(final_rows <= 1 || p.stride_final_state_n >= state_elems, kInvalidArgument,
                 "final_state: expected a stride between states (stride_final_state_n) >= "
                 "HV*K*V = ",
                 state_elems, ", got ", p.stride_final_state_n);
  }
  const View initial_state =
      state_view("initial_state", p.initial_state, p.dtype_state, init_rows, state_elems,
                 "stride_initial_state_n", p.stride_initial_state_n);
  const View final_state = state_view("final_state", p.final_state, p.dtype_state, final_rows,
                                      state_elems, "stride_final_state_n", p.stride_final_state_n);
  const View initial_indices =
      vector_view("initial_state_indices", p.initial_state_indices, DType::kInt32, p.num_seqs);
  const View final_indices =
      vector_view("final_state_indices", p.final_state_indices, DType::kInt32, p.num_seqs);
  KDAKIT_RETURN_IF_ERROR(
      check_views({initial_state, final_state, initial_indices, final_indices}, false));

  const bool has_chunk_states = p.chunk_states != nullptr;
  const bool chunk_indexed = p.chunk_state_indices != nullptr;
  KDAKIT_CHECK(p.chunk_state_interval >= 0, kInvalidArgument,
               "chunk_state_interval: expected >= 0 (0 = no chunk states), got ",
               p.chunk_state_interval);
  KDAKIT_CHECK(!chunk_indexed || has_chunk_states, kInvalidArgument,
               "chunk_states: required with chunk_state_indices (the buffer or pool they index), "
               "got None");
  if (has_chunk_states) {
    KDAKIT_CHECK(p.chunk_state_interval > 0 && p.chunk_state_interval % kChunkStateGranule == 0,
                 kInvalidArgument,
                 "chunk_state_interval: expected a positive multiple of 64 with chunk_states, "
                 "got ",
                 p.chunk_state_interval);
    KDAKIT_CHECK(p.num_chunk_states >= 0, kInvalidArgument,
                 "num_chunk_states: expected the capacity of chunk_states in states (>= 0), got ",
                 p.num_chunk_states);
    if (p.cu_seqlens == nullptr) {
      const int64_t needed =
          p.batch * ((p.seqlen + p.chunk_state_interval - 1) / p.chunk_state_interval);
      KDAKIT_CHECK(p.num_chunk_states >= needed, kInvalidArgument,
                   chunk_indexed ? "chunk_state_indices" : "chunk_states",
                   ": expected room for B * ceil(T / chunk_state_interval) = ", needed,
                   " states, got num_chunk_states = ", p.num_chunk_states);
    }
    if (chunk_indexed) {
      KDAKIT_CHECK(p.num_chunk_state_slots >= 1, kInvalidArgument,
                   "num_chunk_state_slots: expected >= 1 rows in chunk_states with "
                   "chunk_state_indices, got ",
                   p.num_chunk_state_slots);
    }
  } else {
    KDAKIT_CHECK(p.chunk_state_interval == 0, kInvalidArgument,
                 "chunk_states: required when chunk_state_interval is set (got ",
                 p.chunk_state_interval, "), got None");
  }
  const int64_t chunk_rows = chunk_indexed ? p.num_chunk_state_slots : p.num_chunk_states;
  if (has_chunk_states) {
    KDAKIT_CHECK(chunk_rows <= 1 || p.stride_chunk_states_n >= state_elems, kInvalidArgument,
                 "chunk_states: expected a stride between states (stride_chunk_states_n) >= "
                 "HV*K*V = ",
                 state_elems, ", got ", p.stride_chunk_states_n);
  }
  const DType chunk_dtype = chunk_states_dtype(p);
  const View chunk_states =
      state_view("chunk_states", p.chunk_states, chunk_dtype, chunk_rows, state_elems,
                 "stride_chunk_states_n", p.stride_chunk_states_n);
  const View chunk_indices =
      vector_view("chunk_state_indices", p.chunk_state_indices, DType::kInt32, p.num_chunk_states);
  KDAKIT_RETURN_IF_ERROR(check_views({chunk_states, chunk_indices}, false));

  // --- 6. aliasing: o, final_state and chunk_states are written
  const std::vector<View> inputs = {w.q,           w.k,          w.v,
                                    w.g,           w.beta,       w.A_log,
                                    w.dt_bias,     w.cu_seqlens, initial_indices,
                                    final_indices, chunk_indices};
  const ByteRange init_range = byte_range(initial_state);
  const ByteRange final_range = byte_range(final_state);
  if (init_range.overlaps(final_range)) {
    // NOTE: one pool read and written through two index arrays is exact under the caller
    // guarantee (kdakit.h): each sequence reads its state before writing any, and no sequence
    // writes a slot another one reads. Mixing indexed and dense access to one buffer is not.
    const bool same_rows = p.initial_state == p.final_state &&
                           (init_rows <= 1 || p.stride_initial_state_n == p.stride_final_state_n);
    const bool same_indexing =
        (p.initial_state_indices == nullptr) == (p.final_state_indices == nullptr);
    KDAKIT_CHECK(same_rows && same_indexing, kInvalidArgument,
                 "final_state: partial state aliasing with initial_state; expected either "
                 "disjoint buffers or the same buffer (same pointer and stride, read and written "
                 "both densely or both through state indices) for an update in place");
  }
  // chunk_states may be a state pool itself: the same pointer, stride and dtype, indexed on
  // both sides.
  for (const View* state : {&initial_state, &final_state}) {
    if (!byte_range(chunk_states).overlaps(byte_range(*state))) continue;
    const bool state_indexed = state == &initial_state ? p.initial_state_indices != nullptr
                                                       : p.final_state_indices != nullptr;
    const int64_t state_stride =
        state == &initial_state ? p.stride_initial_state_n : p.stride_final_state_n;
    const bool same_pool = chunk_indexed && state_indexed && p.chunk_states == state->ptr &&
                           p.stride_chunk_states_n == state_stride && chunk_dtype == p.dtype_state;
    KDAKIT_CHECK(same_pool, kInvalidArgument,
                 "chunk_states: expected a buffer that shares no memory with ", state->name,
                 ", or the same state pool (same pointer, stride and dtype, with "
                 "chunk_state_indices and ",
                 state == &initial_state ? "initial_state_indices" : "final_state_indices",
                 "), got overlapping byte ranges");
  }
  std::vector<View> others = inputs;
  others.push_back(initial_state);
  others.push_back(final_state);
  others.push_back(chunk_states);
  KDAKIT_RETURN_IF_ERROR(check_disjoint(w.o, others));
  KDAKIT_RETURN_IF_ERROR(check_disjoint(final_state, inputs));
  KDAKIT_RETURN_IF_ERROR(check_disjoint(chunk_states, inputs));

  // The workspace is scratch the kernels overwrite: [workspace, workspace + workspace_bytes)
  // must not hold any tensor of the call.
  if (p.workspace != nullptr && p.workspace_bytes > 0) {
    const auto ws_begin = reinterpret_cast<uintptr_t>(p.workspace);
    const ByteRange ws{ws_begin, ws_begin + p.workspace_bytes};
    for (const View& t : others) {
      KDAKIT_CHECK(!ws.overlaps(byte_range(t)), kInvalidArgument,
                   "workspace: expected scratch memory that shares no memory with ", t.name,
                   ", got overlapping byte ranges");
    }
    KDAKIT_CHECK(!ws.overlaps(byte_range(w.o)), kInvalidArgument,
                 "workspace: expected scratch memory that shares no memory with o, got "
                 "overlapping byte ranges");
  }

  // --- 7. plan
  KDAKIT_CHECK(!p.plan_ready || p.workspace != nullptr, kInvalidArgument,
               "plan_ready: needs the workspace that prefill_plan wrote the plan into, got "
               "workspace None");
  return Status::Ok();
}

namespace detail {

Status validate_batch(const PrefillParams& p) {
  KDAKIT_RETURN_IF_ERROR(check_batch_sizes(p));
  KDAKIT_CHECK(p.num_v_heads > 0, kInvalidArgument,
               "v: expected a number of value heads HV > 0, got ", p.num_v_heads);
  if (p.cu_seqlens != nullptr) {
    KDAKIT_CHECK(p.dtype_cu_seqlens == DType::kInt32 || p.dtype_cu_seqlens == DType::kInt64,
                 kInvalidType, "cu_seqlens: expected dtype int32 or int64, got ",
                 to_string(p.dtype_cu_seqlens));
    KDAKIT_RETURN_IF_ERROR(
        check_view(vector_view("cu_seqlens", p.cu_seqlens, p.dtype_cu_seqlens, p.num_seqs + 1)));
  }
  return Status::Ok();
}

}  // namespace detail

// ------------------------------------------------------------------------------------------
// Decode
// ------------------------------------------------------------------------------------------

Status validate(const DecodeParams& p) {
  CommonViews w;
  KDAKIT_RETURN_IF_ERROR(check_common(p, w));

  // --- 5. state pool and slot indices
  const int64_t state_elems = int64_t{p.num_v_heads} * p.head_dim_k * p.head_dim_v;
  KDAKIT_CHECK(p.state != nullptr, kInvalidArgument,
               "state: required (the state pool decode updates in place), got None");
  KDAKIT_CHECK(p.num_state_slots >= 1, kInvalidArgument,
               "num_state_slots: expected >= 1 slots in the state pool, got ", p.num_state_slots);
  KDAKIT_CHECK(p.num_state_slots <= 1 || p.stride_state_slot >= state_elems, kInvalidArgument,
               "state: expected a stride between slots (stride_state_slot) >= HV*K*V = ",
               state_elems, ", got ", p.stride_state_slot);
  KDAKIT_CHECK(p.num_index_cols >= 1, kInvalidArgument,
               "state_indices: expected >= 1 columns (1, or 1 + S for speculative decoding), "
               "got num_index_cols = ",
               p.num_index_cols);
  KDAKIT_CHECK(p.state_indices != nullptr || p.num_seqs == 0, kInvalidArgument,
               "state_indices: required (the pool slot of each sequence), got None");
  KDAKIT_CHECK(p.num_seqs <= 1 || p.stride_state_indices_n >= p.num_index_cols, kInvalidArgument,
               "state_indices: expected a row stride (stride_state_indices_n) >= "
               "num_index_cols = ",
               p.num_index_cols, ", got ", p.stride_state_indices_n);
  const View state = state_view("state", p.state, p.dtype_state, p.num_state_slots, state_elems,
                                "stride_state_slot", p.stride_state_slot);
  View state_indices{"state_indices", p.state_indices, DType::kInt32, 2, {}};
  state_indices.dims[0] = Dim{p.num_seqs, p.stride_state_indices_n, "stride_state_indices_n"};
  state_indices.dims[1] = Dim{p.num_index_cols, 1, nullptr};
  const View accepted =
      vector_view("num_accepted_tokens", p.num_accepted_tokens, DType::kInt32, p.num_seqs);
  KDAKIT_RETURN_IF_ERROR(check_views({state, state_indices, accepted}, false));

  // --- 6. aliasing: o and state are written
  const std::vector<View> inputs = {w.q,     w.k,       w.v,          w.g,           w.beta,
                                    w.A_log, w.dt_bias, w.cu_seqlens, state_indices, accepted};
  std::vector<View> others = inputs;
  others.push_back(state);
  KDAKIT_RETURN_IF_ERROR(check_disjoint(w.o, others));
  KDAKIT_RETURN_IF_ERROR(check_disjoint(state, inputs));
  return Status::Ok();
}

}  // namespace kdakit
