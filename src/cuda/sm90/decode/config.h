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
//   slice[32][K] in the state dtype (the cp.async target; fp32 pools also keep the running
//   state there between tokens), for bf16 pools a fp32 running copy [32][K] (sequences of more
//   than one token), then the token buffer of SharedMemoryPlan<K> for one token.
// NOTE: 8 CTAs per SM (64 registers per thread) for one token per sequence: 128 KB of fp32
// state loads in flight per SM, and the per-CTA latency chain (slot index -> state -> math ->
// store) overlaps across 8 CTAs. With a token loop (packed batches) the kernel needs 80
// registers without spills: 6 CTAs per SM (ptxas -v, nvcc 13.0).
constexpr int staged_min_ctas_per_sm(bool single_token) { return single_token ? 8 : 6; }

template <class StateT, int kHeadDim>
struct StagedSharedMemoryPlan {
  static constexpr int kSliceBytes = kValuesPerCta * kHeadDim * int(sizeof(StateT));
  static constexpr bool kSeparateRunning = sizeof(StateT) != sizeof(float);
  static constexpr int kRunningBytes = kSeparateRunning ? kValuesPerCta * kHeadDim * int(sizeof(float)) : 0;
  static constexpr int kTokenOffsetBytes = kSliceBytes + kRunningBytes;
  static constexpr int bytes() { return kTokenOffsetBytes + SharedMemoryPlan<kHeadDim>::bytes(1); }
  static_assert(kSliceBytes % (16 * kThreads) == 0, "the slice copy moves 16-byte chunks, the same count per thread");
};

// ------------------------------------------------------------------------------------------
// Ring variant (V-first decode, one index column, one token per sequence, K = V = 128): a
// persistent grid; each CTA walks the items (sequence, value head, 32-channel slice) with a
// stride of the grid size through a ring of kStages shared-memory stages. One producer warp
// reads slot indices, moves each slice with one bulk copy (cp.async.bulk, completion counted
// on the stage's mbarrier) and preprocesses the item's token into the stage's token buffer;
// kNumWarps consumer warps run the token math over the staged slice and store the state.
// Shared memory per CTA: kStages x (slice + token buffer) + 2 kStages mbarriers + kStages slots.
// ------------------------------------------------------------------------------------------

constexpr int kRingThreads = (kNumWarps + 1) * 32;  // 4 consumer warps + 1 producer warp

// NOTE: two shapes of the ring, both timed on the H200 (docs/design/20261129-decode.md):
//   shallow: 4 CTAs per SM, 3 fp32 / 5 bf16 stages (48 / 40 KB of slices per CTA): 16
//            consumer warps per SM, up to 2 (fp32) / 4 (bf16) slices in flight per CTA while
//            one is computed, i.e. 128 KB per SM of reads in flight in steady state;
//   deep:    2 CTAs per SM, 6 fp32 / 11 bf16 stages: the same bytes of slices per SM in fewer,
//            deeper rings (fewer producers, more stages each).
// 4 x (3 x 17.7 KB) and 2 x (6 x 17.7 KB) fit the 227 KB of shared memory an SM offers.
constexpr int ring_min_ctas_per_sm(bool deep) { return deep ? 2 : 4; }
constexpr int ring_stages(bool deep, int state_bytes) {
  return state_bytes == 4 ? (deep ? 6 : 3) : (deep ? 11 : 5);
}

template <class StateT, int kHeadDim, bool kDeep>
struct RingSharedMemoryPlan {
  static constexpr int kStages = ring_stages(kDeep, int(sizeof(StateT)));
  static constexpr int kSliceBytes = kValuesPerCta * kHeadDim * int(sizeof(StateT));
  // Token buffer of one stage: q, k, decay [K], v [32], beta, <k, q> (fp32), 16-byte rounded.
  static constexpr int kTokenFloats = 3 * kHeadDim + kValuesPerCta + 2;
  static constexpr int kTokenBytes = (kTokenFloats * 4 + 15) / 16 * 16;
  static constexpr int stage(int s) { return s * kSliceBytes; }
  static constexpr int token(int s) { return kStages * kSliceBytes + s * kTokenBytes; }
  static constexpr int full_barrier(int s) { return token(kStages) + 8 * s; }
  static constexpr int empty_barrier(int s) { return full_barrier(kStages) + 8 * s; }
  static constexpr int slot(int s) { return empty_barrier(kStages) + 8 * s; }
  static constexpr int bytes() { return slot(kStages); }
  static_assert(kSliceBytes % 16 == 0, "a bulk copy moves a multiple of 16 bytes");
  // The token buffer is addressed with SharedMemoryPlan<K>'s single-token offsets, which start
  // after the K-first reduction area: the base passed to the preprocessing lies that many
  // floats before the stage's token buffer, still inside the CTA's shared memory.
  static_assert(token(0) >= SharedMemoryPlan<kHeadDim>::kReduceFloats * 4,
                "the token buffer base must stay inside shared memory");
  static_assert(SharedMemoryPlan<kHeadDim>::floats(1) - SharedMemoryPlan<kHeadDim>::kReduceFloats == kTokenFloats,
                "token buffer layout must match SharedMemoryPlan");
  static_assert(ring_min_ctas_per_sm(kDeep) * (bytes() + 1024) <= 228 * 1024,
                "the ring's CTAs per SM must fit the SM's shared memory");
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
