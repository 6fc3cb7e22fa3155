// Compile-time decisions and the kernel-side parameter struct of the token-serial (recurrent)
// KDA kernel that serves decode, speculative decoding and short prefill. Host-includable: no
// CUDA headers.
#pragma once

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
template <class StateT, int kHeadDim, bool kSingleToken, int kGroups>
struct StagedSharedMemoryPlan {
  static constexpr int kSliceBytes = kGroups * kValuesPerCta * kHeadDim * int(sizeof(StateT));
  static constexpr bool kSeparateRunning = !kSingleToken && sizeof(StateT) != sizeof(float);
  static constexpr int kRunningBytes =
      kSeparateRunning ? kGroups * kValuesPerCta * kHeadDim * int(sizeof(float)) : 0;
  static constexpr int kTokenOffsetBytes = kSliceBytes + kRunningBytes;
  static constexpr int kReduceBytes = SharedMemoryPlan<kHeadDim>::kReduceFloats * int(sizeof(float));
  static constexpr int bytes() { return kTokenOffsetBytes + SharedMemoryPlan<kHeadDim>::bytes(kGroups) - kReduceBytes; }
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

}  // namespace kdakit::sm90::recurrent
