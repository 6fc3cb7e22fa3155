// kdakit: Kimi Delta Attention (KDA) kernels for inference.
//
// The one header a C++ caller includes. It declares the parameter structs of the two
// operations (chunked prefill, token-serial decode), the Status type every entry point
// returns, host-side validation, and the entry points of the CUDA and CPU backends.
// It depends on nothing but the C++ standard library: no CUDA, torch or nanobind headers.
//
// The math (CONTRACT.md of the project, restated in docs/contract.md):
//   per (sequence n, value head h) a state S (K x V), for each token t in order
//     S <- diag(exp(gamma_t)) S                   decay, gamma_t <= 0 per key channel
//     S <- S + beta_t k_t (v_t - S^T k_t)^T        delta rule on the decayed state
//     o_t = S^T (scale * q_t)                      output reads the updated state
//
// All pointers are device pointers for kdakit::prefill / kdakit::decode and host pointers
// for the kdakit::cpu:: functions. Strides are counted in elements; the last dimension of
// every activation tensor is contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

// Same declaration as cuda_runtime_api.h, so that callers need no CUDA header to hold one.
typedef struct CUstream_st* cudaStream_t;

namespace kdakit {

// ------------------------------------------------------------------------------------------
// Status
// ------------------------------------------------------------------------------------------

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument,  // a value is wrong (shape, range, aliasing): Python ValueError
  kInvalidType,      // a dtype or device is wrong: Python TypeError
  kUnsupported,      // valid per the contract, not built/implemented here: NotImplementedError
  kCudaError,        // a CUDA call failed: RuntimeError
  kInternal,         // a kdakit bug: RuntimeError
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// ------------------------------------------------------------------------------------------
// Enums
// ------------------------------------------------------------------------------------------

enum class DType : int32_t { kFloat32 = 0, kBFloat16, kFloat16, kInt32, kInt64 };

// How gamma (natural-log decay per key channel, <= 0) is obtained from g.
enum class GateMode : int32_t {
  kPrecomputed = 0,  // gamma = g (caller guarantees g <= 0)
  kSoftplus,         // gamma = -exp(A_log[h]) * softplus(g + dt_bias[h])      (Kimi-Linear)
  kLowerBound,       // gamma = lb * sigmoid(exp(A_log[h]) * (g + dt_bias[h]))  (Kimi K3)
                     //   with A_log null: lb * sigmoid(g + dt_bias[h])
};

enum class StateLayout : int32_t {
  kVFirst = 0,  // each (n, h) state stored [V, K] (S^T, row-major); the serving default
  kKFirst,      // each (n, h) state stored [K, V] (S, row-major); FLA's default
};

// Bytes per element of `dtype`; 0 for a value outside the enum.
constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* to_string(DType dtype);
const char* to_string(GateMode gate);
const char* to_string(StateLayout layout);

// ------------------------------------------------------------------------------------------
// Prefill: chunked forward over fixed [B, T] or packed (cu_seqlens, B = 1) batches.
// ------------------------------------------------------------------------------------------
//
// Sequences: without cu_seqlens, N = B sequences of T tokens each. With cu_seqlens, B = 1 and
// sequence n is tokens [cu[n], cu[n+1]) of the single row; tokens past cu[N] are untouched.
//
// State (per sequence n, value head h: K x V, stored per state_layout):
//   dense: initial_state / final_state are [N, HV, ...] with stride_*_state_n between
//          sequences (usually HV*K*V).
//   pool:  with initial_state_indices (int32 [N]) the initial state of sequence n is slot
//          initial_state_indices[n] of initial_state (num_state_slots slots); a negative index
//          means "start from zeros". With final_state_indices the final state goes to that
//          slot of final_state; a negative index means "do not write".
//   In-place: initial_state == final_state (same pointer, same stride) is an update in place.
//   Dense, both buffers are read and written as rows n. Pooled (both indexed), the two index
//   arrays may differ: the prefix-caching pattern reads a cached slot a and writes a new slot
//   b of one pool. Caller guarantee for a shared pool: no slot that sequence n reads is
//   written by another sequence, and no slot is written by two sequences (the kernels run
//   sequences concurrently; each reads its own initial state before it writes anything, so a
//   sequence reading and writing the same slot is exact). KDAKIT_DEBUG_CHECKS=1 checks this.
//   Any other overlap of the state buffers (a shifted view, another stride, a pool read through
//   indices and written dense) is rejected as partial aliasing.
//
// Chunk states (prefix caching), optional: with chunk_states non-null and
// chunk_state_interval = C (a positive multiple of 64), each sequence of length L has
// ceil(L / C) entries (none when empty): entry j is the state *before* its token j*C (entry 0
// is the initial state), i.e. the state after its first j*C tokens. Entries are numbered
// sequence after sequence (FLA's `h` of return_intermediate_states with C = 64).
// num_chunk_states is the capacity in entries: a fixed batch needs B * ceil(T / C); for a
// packed batch (whose count depends on cu_seqlens) entries at or past it are not written.
//   dense:  entry e is row e of chunk_states (rows stride_chunk_states_n apart).
//   pool:   with chunk_state_indices (int32 [num_chunk_states]), entry e is written to row
//           chunk_state_indices[e] of chunk_states (num_chunk_state_slots rows); a negative
//           index skips the entry. States at caller-chosen token offsets (multiples of 64):
//           C = 64 and -1 for every chunk not wanted. chunk_states may then be the state pool
//           itself (same pointer, stride and dtype as initial_state / final_state), under the
//           guarantee above extended to these writes (a sequence's entries are written in
//           order, then its final state).
// Chunk states are stored in dtype_chunk_states (unset: dtype_state) and state_layout.
struct PrefillParams {
  // --- sizes
  int64_t batch = 0;            // B (1 with cu_seqlens)
  int64_t seqlen = 0;           // T, tokens per batch row
  int64_t num_seqs = 0;         // N: B without cu_seqlens, len(cu_seqlens) - 1 with
  // With cu_seqlens: the longest sequence's length when the caller knows it on the host (0:
  // unknown; at most T). A routing hint only: the CUDA path is otherwise chosen by the average
  // length (the lengths are on the device), and with it a batch of short sequences whose
  // longest member is past what the token-serial and fused kernels are for takes the two-kernel
  // path (docs/contract.md, "Kernel paths"). A wrong hint never makes a call wrong, only slower;
  // ask prefill_workspace_size with the same hint.
  int64_t max_seqlen = 0;
  int64_t num_state_slots = 0;  // slots in initial_state / final_state when indexed; else N
  int64_t num_chunk_states = 0;       // chunk-state entries the call may write (capacity; with
                                      // chunk_state_indices, the length of that array)
  int64_t num_chunk_state_slots = 0;  // rows of chunk_states when chunk_state_indices is set
  int32_t num_qk_heads = 0;     // H
  int32_t num_v_heads = 0;      // HV, a multiple of H (GVA)
  int32_t head_dim_k = 0;       // K
  int32_t head_dim_v = 0;       // V

  // --- inputs
  const void* q = nullptr;           // [B, T, H, K]
  const void* k = nullptr;           // [B, T, H, K]
  const void* v = nullptr;           // [B, T, HV, V]
  const void* g = nullptr;           // [B, T, HV, K], or [B, T, HV] with scalar_gate (GDN)
  const void* beta = nullptr;        // [B, T, HV]
  const float* A_log = nullptr;      // [HV], nullable (required by kSoftplus)
  const float* dt_bias = nullptr;    // [HV, K] ([HV] with scalar_gate), nullable (= zeros)
  const void* cu_seqlens = nullptr;  // [N + 1], int32 or int64, nullable

  // --- outputs and state
  void* o = nullptr;                                // [B, T, HV, V]
  const void* initial_state = nullptr;              // [N or num_state_slots, HV, state], nullable
  const int32_t* initial_state_indices = nullptr;   // [N], nullable (dense initial state)
  void* final_state = nullptr;                      // [N or num_state_slots, HV, state], nullable
  const int32_t* final_state_indices = nullptr;     // [N], nullable (dense final state)
  void* chunk_states = nullptr;                     // [rows, HV, state], nullable; rows:
                                                    // num_chunk_states, or num_chunk_state_slots
                                                    // with chunk_state_indices
  const int32_t* chunk_state_indices = nullptr;     // [num_chunk_states], nullable (dense)

  // --- strides (elements)
  int64_t stride_q_b = 0, stride_q_t = 0, stride_q_h = 0;
  int64_t stride_k_b = 0, stride_k_t = 0, stride_k_h = 0;
  int64_t stride_v_b = 0, stride_v_t = 0, stride_v_h = 0;
  int64_t stride_g_b = 0, stride_g_t = 0, stride_g_h = 0;
  int64_t stride_beta_b = 0, stride_beta_t = 0, stride_beta_h = 0;
  int64_t stride_o_b = 0, stride_o_t = 0, stride_o_h = 0;
  int64_t stride_initial_state_n = 0;  // between sequences / slots; a state is HV*K*V dense
  int64_t stride_final_state_n = 0;
  int64_t stride_chunk_states_n = 0;  // between chunk-state rows (entries or pool slots)

  // --- enums
  DType dtype_qkv = DType::kBFloat16;    // q, k, v and o
  DType dtype_g = DType::kBFloat16;
  DType dtype_beta = DType::kBFloat16;
  DType dtype_state = DType::kFloat32;      // initial_state, final_state
  std::optional<DType> dtype_chunk_states{};  // chunk_states; unset: dtype_state
  DType dtype_cu_seqlens = DType::kInt64;
  GateMode gate = GateMode::kPrecomputed;
  StateLayout state_layout = StateLayout::kVFirst;

  // --- scalars
  float scale = 0.f;             // multiplies q (after the L2 norm); callers default K^-0.5
  float lower_bound = 0.f;       // kLowerBound only, in [-5, 0)
  bool use_qk_l2norm = false;    // q, k <- x / sqrt(sum x^2 + 1e-6)
  bool use_beta_sigmoid = false; // beta <- sigmoid(beta)
  bool allow_neg_eigval = false; // beta <- 2 * sigmoid(beta); needs use_beta_sigmoid
  bool scalar_gate = false;      // one gate per (token, head): GDN
  int32_t chunk_state_interval = 0;  // tokens between chunk states; 0 = none

  // --- plan / workspace
  void* workspace = nullptr;  // device scratch of at least prefill_workspace_size(...) bytes
  size_t workspace_bytes = 0;
  // The plan region of `workspace` already holds this batch's plan, written by prefill_plan()
  // on the same stream (or earlier in the same graph) for the same batch fields and the same
  // cu_seqlens values: prefill skips its plan kernel. Needs `workspace`. The plan is not
  // checked on the run path (that would need a device read); KDAKIT_DEBUG_CHECKS=1 compares it
  // with cu_seqlens. false: prefill builds the plan itself, on the fly.
  bool plan_ready = false;
};

// The dtype chunk_states are stored in: dtype_chunk_states, else dtype_state.
inline DType chunk_states_dtype(const PrefillParams& p) {
  return p.dtype_chunk_states.value_or(p.dtype_state);
}

// ------------------------------------------------------------------------------------------
// Decode: token-serial recurrence over a state pool, updated in place.
// ------------------------------------------------------------------------------------------
//
// Tokens: dense [B, T] (N = B sequences of T tokens) or packed (cu_seqlens, B = 1).
// state is a pool [num_state_slots, HV, state] with stride_state_slot between slots.
// state_indices is int32 [N, num_index_cols] with stride_state_indices_n between rows:
//   - start slot of sequence n: state_indices[n, acc[n] - 1] with num_accepted_tokens
//     (acc clamped to [1, num_index_cols]), state_indices[n, 0] without.
//   - a start slot < 0 (or == 0 with null_slot_is_padding), or >= num_state_slots, makes
//     row n a padding row: its outputs are written as zeros and no state is read or written.
//   - num_index_cols == 1: the state after the sequence's last token is written back to the
//     start slot (in place).
//   - num_index_cols > 1 (speculative decoding): the state after token t is written to slot
//     state_indices[n, t] for t < min(len(n), num_index_cols); a negative (or out-of-range)
//     slot there is skipped.
struct DecodeParams {
  // --- sizes
  int64_t batch = 0;            // B (1 with cu_seqlens)
  int64_t seqlen = 0;           // T, tokens per batch row
  int64_t num_seqs = 0;         // N
  int64_t num_state_slots = 0;  // slots in the pool
  int32_t num_index_cols = 1;   // columns of state_indices: 1, or 1 + S for spec decoding
  int32_t num_qk_heads = 0;     // H
  int32_t num_v_heads = 0;      // HV
  int32_t head_dim_k = 0;       // K
  int32_t head_dim_v = 0;       // V

  // --- inputs
  const void* q = nullptr;           // [B, T, H, K]
  const void* k = nullptr;           // [B, T, H, K]
  const void* v = nullptr;           // [B, T, HV, V]
  const void* g = nullptr;           // [B, T, HV, K], or [B, T, HV] with scalar_gate
  const void* beta = nullptr;        // [B, T, HV]
  const float* A_log = nullptr;      // [HV], nullable
  const float* dt_bias = nullptr;    // [HV, K] ([HV] with scalar_gate), nullable
  const void* cu_seqlens = nullptr;  // [N + 1], nullable
  const int32_t* state_indices = nullptr;        // [N, num_index_cols]
  const int32_t* num_accepted_tokens = nullptr;  // [N], nullable

  // --- outputs and state
  void* o = nullptr;      // [B, T, HV, V]
  void* state = nullptr;  // [num_state_slots, HV, state], updated in place

  // --- strides (elements)
  int64_t stride_q_b = 0, stride_q_t = 0, stride_q_h = 0;
  int64_t stride_k_b = 0, stride_k_t = 0, stride_k_h = 0;
  int64_t stride_v_b = 0, stride_v_t = 0, stride_v_h = 0;
  int64_t stride_g_b = 0, stride_g_t = 0, stride_g_h = 0;
  int64_t stride_beta_b = 0, stride_beta_t = 0, stride_beta_h = 0;
  int64_t stride_o_b = 0, stride_o_t = 0, stride_o_h = 0;
  int64_t stride_state_slot = 0;      // >= HV*K*V
  int64_t stride_state_indices_n = 0; // >= num_index_cols

  // --- enums
  DType dtype_qkv = DType::kBFloat16;
  DType dtype_g = DType::kBFloat16;
  DType dtype_beta = DType::kBFloat16;
  DType dtype_state = DType::kFloat32;
  DType dtype_cu_seqlens = DType::kInt64;
  GateMode gate = GateMode::kPrecomputed;
  StateLayout state_layout = StateLayout::kVFirst;

  // --- scalars
  float scale = 0.f;
  float lower_bound = 0.f;
  bool use_qk_l2norm = false;
  bool use_beta_sigmoid = false;
  bool allow_neg_eigval = false;
  bool scalar_gate = false;
  bool null_slot_is_padding = false;  // slot 0 is a null slot: treat index 0 as padding
};

// ------------------------------------------------------------------------------------------
// Validation (host only; reads no device memory). Every entry point calls it first.
// ------------------------------------------------------------------------------------------

Status validate(const PrefillParams& p);
Status validate(const DecodeParams& p);

// ------------------------------------------------------------------------------------------
// CUDA backend (sm_90a). Runs on `stream`; no host synchronisation, no allocation.
// In a build without CUDA these return kUnsupported.
// ------------------------------------------------------------------------------------------

// The batch fields of PrefillParams: batch, seqlen, num_seqs, num_v_heads, cu_seqlens (null or
// not, and its dtype). They alone size the workspace and determine the plan; every other field
// may still be unset when the two functions below are called.

// Bytes of device workspace prefill needs for this batch: an upper bound from B, T, N and HV
// (cu_seqlens is not read), non-decreasing in each, so a buffer sized for the largest batch of
// an engine serves every smaller one. Reads only the batch fields; 0 when they are invalid
// (prefill then reports why) and in a build without CUDA.
size_t prefill_workspace_size(const PrefillParams& p);

// Plan step: turns the device-resident cu_seqlens into the per-batch metadata the kernels read
// (sequence ranges, chunk-to-sequence map, chunk offsets), written into the plan region at the
// start of p.workspace by one single-CTA kernel on `stream`. No host synchronisation, no
// allocation, so it can be captured in a CUDA graph. Reads only the batch fields, `workspace`
// and `workspace_bytes` (>= prefill_workspace_size(p)). Run it once per forward step; every
// prefill of that step (one per KDA layer) on the same workspace then sets plan_ready = true.
// The CPU backend needs no plan: in a build without CUDA this returns kUnsupported.
Status prefill_plan(const PrefillParams& p, cudaStream_t stream);

Status prefill(const PrefillParams& p, cudaStream_t stream);
Status decode(const DecodeParams& p, cudaStream_t stream);

// Whether this build carries the CUDA kernels.
bool built_with_cuda();

// ------------------------------------------------------------------------------------------
// CPU backend: the oracle the kernels are tested against, and a chunked mirror of the GPU
// algorithm. Host pointers; parallel over (sequence, head) on all cores. They need neither a
// workspace nor a plan: workspace, workspace_bytes and plan_ready are not read.
// ------------------------------------------------------------------------------------------
namespace cpu {

// float64 token-by-token recurrence: the specification.
Status prefill_reference(const PrefillParams& p);
Status decode_reference(const DecodeParams& p);

// fp32 chunked algorithm (chunk 64, base-2 gate cumsum, WY form, chunk-to-chunk state
// passing): what the GPU prefill computes, in plain C++.
Status prefill_chunked(const PrefillParams& p);

}  // namespace cpu
}  // namespace kdakit
