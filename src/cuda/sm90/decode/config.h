// Compile-time decisions and the kernel-side parameter struct of the token-serial (recurrent)
// KDA kernel that serves decode, speculative decoding and short prefill. Host-includable: no
// CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kdakit/kdakit.h"

namespace kdakit::sm90::recurrent {

// ------------------------------------------------------------------------------------------
// Tiling
// ------------------------------------------------------------------------------------------

// NOTE: 4 warps per CTA and 32 value channels per CTA: a K = 128 fp32 state slice is 16 KB,
// so a 128-thread CTA keeps 16 KB of loads in flight with 32 fp32 state registers per thread.
// Small CTAs give many of them (4 per (sequence, head) at V = 128): B = 1, H = 32 already
// spreads over 128 of the 132 SMs, and at large B up to 16 CTAs share an SM (64 warps),
// 256 KB in flight per SM, well past the ~50 KB that hides HBM latency at 32 B/ns per SM.
constexpr int kNumWarps = 4;
constexpr int kThreads = kNumWarps * 32;
constexpr int kValuesPerCta = 32;  // value channels (rows of S^T) owned by one CTA

// NOTE: register caps from __launch_bounds__: V-first fits 96 registers without spills
// (5 CTAs = 20 warps per SM, 80 KB of state loads in flight per SM); K-first holds 3 x 8 key
// rows and the cross-warp exchange besides the state; 128 spills, so 3 CTAs per SM. Tighter caps
// spill (ptxas -v, nvcc 13.0).
constexpr int min_ctas_per_sm(StateLayout layout) { return layout == StateLayout::kVFirst ? 5 : 3; }

// V-first ([V, K] per head): each warp owns kRowsPerWarp value rows, each lane K / 32
// consecutive key channels of every row (16-byte fp32 loads at K = 128).
constexpr int kRowsPerWarp = kValuesPerCta / kNumWarps;

// K-first ([K, V] per head): each thread owns kColsPerThread consecutive value columns
// (16-byte fp32 loads) of K / kRowGroups key rows; 8 lanes cover the CTA's 32 columns, so a
// warp reads 4 rows per instruction and the CTA has 16 row groups.
constexpr int kColsPerThread = 4;
constexpr int kLanesPerRow = kValuesPerCta / kColsPerThread;
constexpr int kRowGroups = kThreads / kLanesPerRow;

// Tokens preprocessed together into shared memory before the serial loop over them.
// NOTE: 16 covers speculative decoding (1 + S <= 16) in one group; a K = 128 group is 27 KB.
constexpr int kMaxTokenGroup = 16;

static_assert(kValuesPerCta % kNumWarps == 0, "value rows must split evenly over the warps");
static_assert(kValuesPerCta == 32, "the token preprocessing loads v with one lane per value channel");
static_assert(kThreads % kLanesPerRow == 0, "K-first row groups must tile the CTA");

// Shared memory of one CTA, in floats, for a token group of `group` tokens:
//   reduce[2][kNumWarps][2][kValuesPerCta]  K-first cross-warp partial sums (double-buffered)
//   q[group][K], k[group][K], decay[group][K]   preprocessed per-token vectors
//   v[group][kValuesPerCta], beta[group], kq[group]
template <int kHeadDim>
struct SharedMemoryPlan {
  static constexpr int kReduceFloats = 2 * kNumWarps * 2 * kValuesPerCta;
  static constexpr int q(int) { return kReduceFloats; }
  static constexpr int k(int group) { return kReduceFloats + group * kHeadDim; }
  static constexpr int decay(int group) { return kReduceFloats + 2 * group * kHeadDim; }
  static constexpr int v(int group) { return kReduceFloats + 3 * group * kHeadDim; }
  static constexpr int beta(int group) { return v(group) + group * kValuesPerCta; }
  static constexpr int kq(int group) { return beta(group) + group; }
  static constexpr int floats(int group) { return kq(group) + group; }
  static constexpr int bytes(int group) { return floats(group) * int(sizeof(float)); }
  static_assert(kReduceFloats % 4 == 0 && kHeadDim % 4 == 0, "q/k/decay rows must be 16-byte aligned");
};

// ------------------------------------------------------------------------------------------
// Staged variant (V-first decode, one index column): the CTA's state slice is copied into
// shared memory with cp.async (no registers held while the loads are in flight) and the token
// math streams over it in two passes. Shared memory per CTA:
//   slice[kGroups * 32][K] in the state dtype (the cp.async target; fp32 pools also keep the
//   running state there between tokens), with a token loop and a bf16 pool a fp32 running copy
//   [32][K], then the token buffer (SharedMemoryPlan<K> offsets for kGroups tokens, token 0 used).
// NOTE: 8 CTAs per SM (64 registers per thread) for one token per sequence: 128 KB of fp32
// state loads in flight per SM, and the per-CTA latency chain (slot index -> state -> math ->
// store) overlaps across 8 CTAs; 64-row fp32 slices (35.3 KB) fit 6 per SM, 192 KB. With a
// token loop (packed batches) the kernel needs 80 registers without spills: 6 CTAs per SM
// (ptxas -v, nvcc 13.0).
constexpr int staged_min_ctas_per_sm(bool single_token) { return single_token ? 8 : 6; }

// kGroups: 32-row groups per CTA (1 or 2; 2 only for single-token decode). A CTA of kGroups
// groups moves kGroups x 32 x K state elements: a 64-row bf16 slice is 16 KB, as many bytes in
// flight per CTA as a 32-row fp32 slice.
// NOTE: the token buffer is addressed with SharedMemoryPlan<K>'s offsets for a group of kGroups
// tokens (only token 0 is used; v gets kGroups x 32 entries), which start after the K-first
// reduction area; the kernel passes a base shifted back by that area, which stays inside the
// CTA's shared memory because the state slice lies before the token buffer.
// The fp32 running copy of a bf16 slice exists only with a token loop (!kSingleToken).
// kPasses (1 or 2; 2 only for single-token 64-row slices): the CTA runs kPasses consecutive
// slices through the same buffer (the whole 128-row head at kGroups = 2, K = 128); the later
// passes' v entries follow the token buffer (kGroups x 32 floats per pass).
template <class StateT, int kHeadDim, bool kSingleToken, int kGroups, int kPasses = 1>
struct StagedSharedMemoryPlan {
  static constexpr int kSliceBytes = kGroups * kValuesPerCta * kHeadDim * int(sizeof(StateT));
  static constexpr bool kSeparateRunning = !kSingleToken && sizeof(StateT) != sizeof(float);
  static constexpr int kRunningBytes =
      kSeparateRunning ? kGroups * kValuesPerCta * kHeadDim * int(sizeof(float)) : 0;
  static constexpr int kTokenOffsetBytes = kSliceBytes + kRunningBytes;
  static constexpr int kReduceBytes = SharedMemoryPlan<kHeadDim>::kReduceFloats * int(sizeof(float));
  static constexpr int bytes() {
    return kTokenOffsetBytes + SharedMemoryPlan<kHeadDim>::bytes(kGroups) - kReduceBytes +
           (kPasses - 1) * kGroups * kValuesPerCta * int(sizeof(float));
  }
  static_assert(kSliceBytes % (16 * kThreads) == 0, "the slice copy moves 16-byte chunks, the same count per thread");
  static_assert(kTokenOffsetBytes >= kReduceBytes, "the shifted token-buffer base must stay inside shared memory");
  static_assert(kGroups == 1 || kGroups == 2, "one or two 32-row groups per CTA");
};

// ------------------------------------------------------------------------------------------
// Kernel-side parameters (passed by value as __grid_constant__)
// ------------------------------------------------------------------------------------------

enum class Mode : int32_t {
  kDecode = 0,  // DecodeParams: state pool, padding rows, speculative per-token writes
  kPrefill,     // PrefillParams: dense or pool-indexed initial/final state, chunk states
};

struct RecurrentKernelParams {
  // --- sizes
  int64_t num_seqs = 0;
  int64_t seqlen = 0;
  int32_t num_qk_heads = 0;
  int32_t num_v_heads = 0;
  int32_t token_group = 1;  // tokens per shared-memory group, in [1, kMaxTokenGroup]

  // --- inputs
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* g = nullptr;
  const void* beta = nullptr;
  const float* A_log = nullptr;
  const float* dt_bias = nullptr;
  const void* cu_seqlens = nullptr;
  void* o = nullptr;

  // --- state
  Mode mode = Mode::kDecode;
  // kDecode: the pool is both source and destination.
  void* pool = nullptr;
  int64_t num_pool_slots = 0;
  int64_t stride_pool_slot = 0;
  const int32_t* state_indices = nullptr;
  int64_t stride_state_indices_n = 0;
  int32_t num_index_cols = 1;
  const int32_t* num_accepted_tokens = nullptr;
  bool null_slot_is_padding = false;
  // Staged kernel launched with PDL: the L2 prefetch of FastFlags::kPrefetchBeforeWait.
  bool prefetch_before_wait = false;
  // Staged kernel with several passes: thread 0 asks for an L2 prefetch of the later passes' rows
  // right after issuing the first pass's copy, so the whole head is on its way from DRAM at once
  // while the shared-memory buffer holds one pass.
  bool prefetch_next_pass = false;
  // kPrefill: initial state (null = zeros), dense or indexed; final state likewise.
  const void* initial_state = nullptr;
  const int32_t* initial_state_indices = nullptr;
  int64_t stride_initial_state_n = 0;
  int64_t num_initial_slots = 0;
  void* final_state = nullptr;
  const int32_t* final_state_indices = nullptr;
  int64_t stride_final_state_n = 0;
  int64_t num_final_slots = 0;
  void* chunk_states = nullptr;
  int64_t num_chunk_states = 0;
  int32_t chunk_state_interval = 0;

  // --- strides (elements)
  int64_t stride_q_b = 0, stride_q_t = 0, stride_q_h = 0;
  int64_t stride_k_b = 0, stride_k_t = 0, stride_k_h = 0;
  int64_t stride_v_b = 0, stride_v_t = 0, stride_v_h = 0;
  int64_t stride_g_b = 0, stride_g_t = 0, stride_g_h = 0;
  int64_t stride_beta_b = 0, stride_beta_t = 0, stride_beta_h = 0;
  int64_t stride_o_b = 0, stride_o_t = 0, stride_o_h = 0;

  // --- enums
  DType dtype_qkv = DType::kBFloat16;
  DType dtype_g = DType::kBFloat16;
  DType dtype_beta = DType::kBFloat16;
  DType dtype_cu_seqlens = DType::kInt64;
  GateMode gate = GateMode::kPrecomputed;

  // --- scalars
  float scale = 0.f;
  float lower_bound = 0.f;
  bool use_qk_l2norm = false;
  bool use_beta_sigmoid = false;
  bool allow_neg_eigval = false;
  bool scalar_gate = false;
};


// ------------------------------------------------------------------------------------------
// Fast single-column decode kernel: direct.cuh (state in registers). V-first, decode mode, one
// index column, dense T = 1 or packed (cu_seqlens, any lengths; a sequence of several tokens runs
// a token loop). It keeps every per-token vector in the registers of the warp that uses it: lane
// l owns key channels [l K/32, (l+1) K/32) of q, k, the decay and of each state row, so the
// preprocessing needs no shared memory and no CTA barrier.
// ------------------------------------------------------------------------------------------

// direct: 4 warps per CTA; kRowsPerWarp (8 or 4) value rows per warp, so 32 or 16 rows per
// CTA. NOTE: B = 1 is latency-bound (slot index -> state -> math -> store); 16-row CTAs
// halve each warp's serial math and put 256 CTAs on the 132 SMs at H = 32.
constexpr int kDirectWarps = 4;
constexpr int kDirectThreads = kDirectWarps * 32;
// NOTE: 5 CTAs per SM cap the direct kernel at 102 registers (the fp32 and bf16 K = 128 8-row
// kernels use 96, no spills; a cap of 6 spills: ptxas -v, nvcc 13.0). It serves small grids and,
// with fp32 pools, mid-sized ones, where an SM's bytes in flight set the bandwidth: 5 CTAs keep
// 80 KB of fp32 state loads in flight against 64 KB at 4 (120 registers). H200 2026-12-01, same
// device call, 5 against 4: H32 B32 fp32 38.41 / 38.99 us, H96 B32 105.60 / 108.29, H96 B8
// 28.71 / 29.48; direct32 H32 B128 fp32 143.10 us, staged64x2 147.66.
constexpr int kDirectMinCtasPerSm = 5;
// The direct grid is (HV x slices, N): gridDim.y caps the sequences.
constexpr int kDirectMaxSeqs = 65535;

// Kernel-side parameters of the fast kernel, passed by value as __grid_constant__.
// NOTE: 192 bytes instead of RecurrentKernelParams' ~440, and the first 64 bytes hold every
// pointer a CTA dereferences before its state load, so the start of the dependent chain
// (slot index -> state) touches one or two constant-cache lines. Token strides are per token:
// stride_b for dense T = 1 batches, stride_t for packed ones (one batch row).
struct FastDecodeParams {
  // --- pointers read first
  const int32_t* state_indices = nullptr;  // [N, stride_state_indices_n], start slot in column 0
  void* pool = nullptr;                    // [num_pool_slots, HV, V, K], updated in place
  const void* q = nullptr;                 // token tk, head hk: q + tk * stride_q_tok + hk * stride_q_h
  const void* k = nullptr;
  const void* v = nullptr;
  const void* g = nullptr;
  const void* beta = nullptr;
  void* o = nullptr;
  // --- other pointers
  const float* A_log = nullptr;      // [HV], nullable
  const float* dt_bias = nullptr;    // [HV, K] ([HV] with scalar_gate), nullable
  const void* cu_seqlens = nullptr;  // [N + 1], nullable (dense T = 1)
  int64_t stride_pool_slot = 0;      // elements
  uint64_t qk_group_magic = 0;       // ceil(2^32 / (HV / H)): q/k head = (h * magic) >> 32 (fast_qk_head)
  // --- sizes
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;      // tokens of the packed row (cu_seqlens clamped to it); 1 for dense
  int32_t num_pool_slots = 0;  // min(slots, INT32_MAX): slot indices are int32
  int32_t stride_state_indices_n = 0;
  int32_t num_v_heads = 0;
  uint32_t flags = 0;     // FastFlags
  // --- strides (elements)
  int32_t stride_q_tok = 0, stride_q_h = 0;
  int32_t stride_k_tok = 0, stride_k_h = 0;
  int32_t stride_v_tok = 0, stride_v_h = 0;
  int32_t stride_g_tok = 0, stride_g_h = 0;
  int32_t stride_beta_tok = 0, stride_beta_h = 0;
  int32_t stride_o_tok = 0, stride_o_h = 0;
  // --- scalars
  float scale = 0.f;
  float lower_bound = 0.f;
};

static_assert(offsetof(FastDecodeParams, o) + sizeof(void*) <= 64, "the pointers read first share one 64-byte line");
static_assert(sizeof(FastDecodeParams) <= 192, "keep the fast kernels' parameter block small");

// FastDecodeParams::flags: dtypes (DType values, 2 bits each), gate mode, switches.
struct FastFlags {
  static constexpr int kDtypeQkvShift = 0;
  static constexpr int kDtypeGShift = 2;
  static constexpr int kDtypeBetaShift = 4;
  static constexpr int kGateShift = 6;
  static constexpr uint32_t kCuInt64 = 1u << 8;
  static constexpr uint32_t kL2Norm = 1u << 9;
  static constexpr uint32_t kBetaSigmoid = 1u << 10;
  static constexpr uint32_t kNegEigval = 1u << 11;
  static constexpr uint32_t kScalarGate = 1u << 12;
  static constexpr uint32_t kNullSlotIsPadding = 1u << 13;
  // Launched with PDL: before griddepcontrol.wait, read the slot index at GPU scope and ask L2
  // for the warp's state rows (ptx_sm90.cuh: load_relaxed_gpu, bulk_prefetch_l2), so that the
  // state's DRAM round trip overlaps the previous kernel instead of following it.
  static constexpr uint32_t kPrefetchBeforeWait = 1u << 14;
  static constexpr uint32_t pack(DType qkv, DType g, DType beta, GateMode gate) {
    return (uint32_t(qkv) << kDtypeQkvShift) | (uint32_t(g) << kDtypeGShift) |
           (uint32_t(beta) << kDtypeBetaShift) | (uint32_t(gate) << kGateShift);
  }
  static constexpr DType dtype_qkv(uint32_t f) { return DType((f >> kDtypeQkvShift) & 3u); }
  static constexpr DType dtype_g(uint32_t f) { return DType((f >> kDtypeGShift) & 3u); }
  static constexpr DType dtype_beta(uint32_t f) { return DType((f >> kDtypeBetaShift) & 3u); }
  static constexpr GateMode gate(uint32_t f) { return GateMode((f >> kGateShift) & 3u); }
};
static_assert(int(DType::kFloat32) < 4 && int(DType::kBFloat16) < 4 && int(DType::kFloat16) < 4,
              "float dtypes must fit the 2-bit fields of FastFlags");
static_assert(int(GateMode::kLowerBound) < 4, "gate modes must fit the 2-bit field of FastFlags");

}  // namespace kdakit::sm90::recurrent
