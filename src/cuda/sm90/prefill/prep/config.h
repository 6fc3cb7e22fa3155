// Compile-time decisions of the prefill plan and prep kernels (kernel.cuh), and the kernel-side
// parameter struct. Host and device include this header; it has no CUDA includes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/common/fast_div.h"
#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill::prep {

// ------------------------------------------------------------------------------------------
// Plan kernel: one CTA walks cu_seqlens in tiles of kPlanThreads.
// ------------------------------------------------------------------------------------------
// NOTE: N is at most a few thousand sequences, so one CTA (a few tile iterations) is cheaper
// than a multi-CTA scan with its extra launch or grid-wide synchronisation.
inline constexpr int kPlanThreads = 512;  // 128 registers per thread: the 64-bit scans do not spill

// ------------------------------------------------------------------------------------------
// Prep kernel: one CTA per (chunk, value head).
// ------------------------------------------------------------------------------------------
// 8 warps: the elementwise phase gives each thread 4 rows x 8 key channels (64 x 128 / 256),
// and the L/M product phase gives each warp one (16-row sub-block, matrix) pair (4 x 2).
inline constexpr int kWarps = 8;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kSubBlock = 16;                  // rows of an mma tile
inline constexpr int kSubBlocks = kChunk / kSubBlock;  // 4
inline constexpr int kRowsPerThread = 4;               // elementwise phase
inline constexpr int kChannelsPerThread = 8;           // one 16-byte bf16 vector
static_assert(kThreads * kRowsPerThread * kChannelsPerThread == kChunk * kHeadDim,
              "the elementwise phase must cover the 64 x 128 chunk exactly once");
static_assert(kWarps == 2 * kSubBlocks, "the L/M phase maps one warp to each (sub-block, matrix)");
static_assert(kSubBlock % kRowsPerThread == 0, "a thread's rows must lie in one sub-block");

// Diagonal tiles of L and M use the sub-block's midpoint as exponent reference, so both factors
// are at most 2^(span / 2), span = c_{R-1} - c_R (base-2 gate sum over the 16 rows). 192 keeps
// them <= 2^96, far from bf16/fp32 overflow (2^128) even for |q|, |k| up to 2^30; channels with
// a larger span (a decay of more than 133 nats within 16 tokens) are summed per element.
inline constexpr float kMaxDiagSpan = 192.f;
// With the in-kernel L2 norm |kn| <= 1 and |qn| <= scale, so factors up to 2^108 stay 2^19 below
// overflow, and the small factor of a pair (>= |x| 2^-108) flushes to zero only for |x| < 2^-18,
// whose terms are below 2^-18 of the entry. 216 halves the wide-span (per-element) channels of
// the softplus gate's benchmark inputs against 192 (2.6% -> 1.2% of (channel, sub-block) pairs).
inline constexpr float kMaxDiagSpanNormed = 216.f;
__host__ __device__ constexpr float max_diag_span(bool qk_l2norm) { return qk_l2norm ? kMaxDiagSpanNormed : kMaxDiagSpan; }

// Rows of the B operand of sub-block R: B^(R) covers columns s in [0, 16 (R + 1)).
constexpr int kb_row_offset(int R) { return kSubBlock * R * (R + 1) / 2; }
inline constexpr int kKbRows = kb_row_offset(kSubBlocks);  // 16 + 32 + 48 + 64 = 160

// Phase 2's work split. L and M are each 20 n8 tiles (16 rows x 8 columns, k = 128): sub-block
// R's rows times columns 0 .. 16 (R + 1) - 1, i.e. nt < 2 (R + 1). M's tiles take two mma per
// k-step (A^M as bf16 hi + lo), L's one. Each warp runs up to two segments, a segment being up to
// four consecutive tiles of one matrix in one sub-block (one A operand): at most 8 mma per
// k-step per warp (warps 6, 7: 6).
// NOTE: a segment's sub-block and first tile are runtime values, so warps of one shape
// (lm_shape) share one product loop: four copies in all. The split it
// replaced (warp w < 4: L's tiles 5 w .. 5 w + 4 and one M tile, w >= 4: four M tiles, spanning
// up to two sub-blocks) was a compile-time template per warp: 8 inlined copies of the product
// loop, 2,275 of the kernel's 8,000 SASS instructions; then 7,280 (lower-bound, bf16 g), and prep
// 2.5-3.3% faster on the lower-bound rows, 8% on the softplus benchmark rows (H200). The prep
// kernel is sensitive to its code size (kernel.cuh's header NOTE; docs/design/20261129-prefill.md,
// sessions 13 and 14); the ctest prefill_prep_code_size holds it under 6,600.
struct LmSegment {
  int m;    // 0: L (strictly lower), 1: M (with its diagonal)
  int R;    // sub-block (row block)
  int nt0;  // first n8 tile (columns 8 nt0 ..)
  int n;    // tiles, 0..4 (0: no segment)
};
__host__ __device__ constexpr LmSegment lm_segment(int warp, int which) {
  switch (2 * warp + which) {
    case 0: return {1, 3, 0, 4};   // warp 0: M R3 nt 0-3
    case 2: return {1, 3, 4, 4};   // warp 1: M R3 nt 4-7
    case 4: return {1, 2, 0, 4};   // warp 2: M R2 nt 0-3
    case 6: return {1, 2, 4, 2};   // warp 3: M R2 nt 4-5, M R1 nt 0-1
    case 7: return {1, 1, 0, 2};
    case 8: return {1, 1, 2, 2};   // warp 4: M R1 nt 2-3, M R0 nt 0-1
    case 9: return {1, 0, 0, 2};
    case 10: return {0, 3, 0, 4};  // warp 5: L R3 nt 0-3, L R2 nt 0-3
    case 11: return {0, 2, 0, 4};
    case 12: return {0, 3, 4, 4};  // warp 6: L R3 nt 4-7, L R2 nt 4-5
    case 13: return {0, 2, 4, 2};
    case 14: return {0, 1, 0, 4};  // warp 7: L R1 nt 0-3, L R0 nt 0-1
    case 15: return {0, 0, 0, 2};
    default: return {0, 0, 0, 0};
  }
}
// The code shape of a warp's segments, (matrix, tiles) of segment 0 and of segment 1 (0 tiles: no
// second segment); kernel.cuh (with_lm_shape) has one product loop per shape.
struct LmShape {
  int m0, n0, m1, n1;
};
inline constexpr LmShape kLmShapes[4] = {{1, 4, 1, 0}, {1, 2, 1, 2}, {0, 4, 0, 4}, {0, 4, 0, 2}};
__host__ __device__ constexpr int lm_shape(int warp) { return warp < 3 ? 0 : warp < 5 ? 1 : warp == 5 ? 2 : 3; }
constexpr bool lm_shapes_match() {
  for (int w = 0; w < kWarps; ++w) {
    const LmShape sh = kLmShapes[lm_shape(w)];
    const LmSegment s0 = lm_segment(w, 0), s1 = lm_segment(w, 1);
    if (s0.m != sh.m0 || s0.n != sh.n0 || s1.n != sh.n1 || (s1.n > 0 && s1.m != sh.m1)) return false;
  }
  return true;
}
static_assert(lm_shapes_match(), "each warp's segments must have its shape's matrices and tile counts");
// Every tile of both matrices exactly once, no segment past its sub-block's last tile.
constexpr bool lm_segments_cover_once() {
  int seen[2][kSubBlocks][2 * kSubBlocks] = {};
  for (int w = 0; w < kWarps; ++w) {
    for (int which = 0; which < 2; ++which) {
      const LmSegment s = lm_segment(w, which);
      if (s.n < 0 || s.n > 4) return false;
      for (int i = 0; i < s.n; ++i) {
        if (s.nt0 + i >= 2 * (s.R + 1)) return false;
        ++seen[s.m][s.R][s.nt0 + i];
      }
    }
  }
  for (int m = 0; m < 2; ++m)
    for (int R = 0; R < kSubBlocks; ++R)
      for (int nt = 0; nt < 2 * (R + 1); ++nt)
        if (seen[m][R][nt] != 1) return false;
  return true;
}
static_assert(lm_segments_cover_once(), "phase 2's segments must cover L's and M's 20 tiles exactly once");

// Shared memory plan (bytes). bf16 [rows][128] arrays are 256-byte rows whose sixteen 16-byte
// chunks are XOR-swizzled by (row & 7): ldmatrix of 8 rows at one logical chunk then hits 8
// distinct bank groups, without padding (padding would push two CTAs past the SM's 228 KB).
struct SharedMemoryPlan {
  static constexpr size_t kRowBytes = kHeadDim * 2;
  static constexpr size_t kBf16Tile = kChunk * kRowBytes;  // 16 KiB
  // Phase 1 (elementwise) and 2 (L/M products):
  static constexpr size_t kVOffset = 0;                               // V  bf16 [64][128]
  static constexpr size_t kAmLoOffset = kVOffset;                     // A^M lo, before V (phases 1-2)
  static constexpr size_t kKtOffset = kVOffset + kBf16Tile;           // Kt bf16 [64][128]
  static constexpr size_t kQaOffset = kKtOffset + kBf16Tile;          // qA bf16 [64][128]
  static constexpr size_t kKaOffset = kQaOffset + kBf16Tile;          // kA bf16 [64][128]
  static constexpr size_t kKbOffset = kKaOffset + kBf16Tile;          // kB bf16 [160][128]
  static constexpr size_t kKbBytes = size_t(kKbRows) * kRowBytes;
  static constexpr size_t kRowScaleOffset = kKbOffset + kKbBytes;     // rq, rk, beta fp32 [3][64]
  // Sub-block boundaries fp32 [5][128]: row 0 zeros (c_{-1}), row R + 1 c_R, so that c_{R-1}
  // is read without a branch on R. Like every per-channel fp32 vector here (these, the row
  // references, the warps' gate totals), in the lane-interleaved channel order of kernel.cuh
  // (vo): a quarter-warp's float4 reads are conflict-free.
  static constexpr size_t kBoundOffset = kRowScaleOffset + 3 * kChunk * 4;
  // Wide-span channels as bit masks uint32 [2][4][4]: [0] wide in the sub-block, [1] wide
  // within its first 8-row half too (a subset).
  static constexpr size_t kMaskOffset = kBoundOffset + (kSubBlocks + 1) * kHeadDim * 4;
  // Wide-span channels per sub-block as lists (uint8 [4][128]): the ones whose first 8-row half
  // spans at most max_diag_span ascending from the front, the others ascending from the back
  // (kernel.cuh, phase 3), and their counts (int [2][4]: front lists, then back lists).
  static constexpr size_t kWideListOffset = kMaskOffset + 2 * kSubBlocks * (kHeadDim / 32) * 4;
  static constexpr size_t kWideCountOffset = kWideListOffset + kSubBlocks * kHeadDim;
  // fp32 [4][128]: each sub-block's row reference m_R per channel (kernel.cuh, phase 1b).
  static constexpr size_t kHalfBoundOffset = kWideCountOffset + 2 * kSubBlocks * 4;
  static constexpr size_t kBytes = kHalfBoundOffset + kSubBlocks * kHeadDim * 4;
  // Overlays. The warps' 8-row gate totals [8 warps][128] fp32 (phase 1b) live in kB before
  // kB is written.
  static constexpr size_t kWarpTotalOffset = kKbOffset;
  // Phase 3 (after the L/M products): L, T fp32 [64][kLdF], then the T diag(beta) hi/lo tiles,
  // all in the qA/kA/kB space.
  static constexpr int kLdF = kChunk + 4;  // fp32 row pitch (floats): rows 16 B apart mod 128
  static constexpr size_t kF32Tile = size_t(kChunk) * kLdF * 4;
  static constexpr size_t kLOffset = kQaOffset;
  static constexpr size_t kTOffset = kLOffset + kF32Tile;             // also M before T
  // T diag(beta) as bf16 hi and lo tiles [64][64] (128-byte rows, 16-byte chunks XOR-swizzled by
  // row & 7), after L and T.
  static constexpr size_t kTbHiOffset = kTOffset + kF32Tile;
  static constexpr size_t kTbLoOffset = kTbHiOffset + size_t(kChunk) * kChunk * 2;
};
static_assert(SharedMemoryPlan::kHalfBoundOffset % 16 == 0, "the half bounds are read as float4");
static_assert(SharedMemoryPlan::kWarpTotalOffset + kWarps * kHeadDim * 4 <= SharedMemoryPlan::kRowScaleOffset,
              "the warps' gate totals must fit in the kB space");
static_assert(SharedMemoryPlan::kTbLoOffset + kChunk * kChunk * 2 <= SharedMemoryPlan::kRowScaleOffset,
              "the T diag(beta) hi/lo tiles must fit in the kB space");
// NOTE: two CTAs per SM (2 x (kBytes + 1 KiB reserved) <= 228 KiB): one CTA's loads and stores
// stay in flight while the other computes; the kernel is bound by memory traffic.
static_assert(2 * (SharedMemoryPlan::kBytes + 1024) <= 228 * 1024, "two prep CTAs must fit in one SM");

// NOTE: one kernel. Its inverse runs on tensor cores (warp R inverts the diagonal 16 x 16 block
// in registers as (I + X)(I + X^2)(I + X^4)(I + X^8), X = -diag(beta) L_RR strictly lower, then
// its row of off-diagonal blocks right to left, T_RS = (sum_{S < J <= R} T_RJ X_JS) T_SS, three
// bf16 passes per 16 x 16 product), and W / U0 take the same work per warp (one product, 32
// columns, all rows) from T diag(beta) as bf16 hi/lo tiles. Three other variants (the fp32
// CUDA-core inverse, the sub-block-per-warp W / U0 product) were measured slower on every shape
// (H200, H=96, T=8192, prep alone 1.030 ms against 1.099-1.194, docs/design/20261129-prefill.md)
// and removed (last present at commit 8e99fae).

// Kernel-side parameters, passed by value as __grid_constant__.
struct PrepParams {
  const void* q;     // [B, T, H, K] bf16
  const void* k;     // [B, T, H, K] bf16
  const void* v;     // [B, T, HV, V] bf16
  const void* g;     // [B, T, HV, K] (or [B, T, HV] with scalar_gate), bf16 or fp32
  const void* beta;  // [B, T, HV], bf16 or fp32
  const float* A_log;    // [HV], nullable
  const float* dt_bias;  // [HV, K] ([HV] with scalar_gate), nullable
  int64_t stride_q_b, stride_q_t, stride_q_h;
  int64_t stride_k_b, stride_k_t, stride_k_h;
  int64_t stride_v_b, stride_v_t, stride_v_h;
  int64_t stride_g_b, stride_g_t, stride_g_h;
  int64_t stride_beta_b, stride_beta_t, stride_beta_h;
  const int32_t* chunk_offsets;  // plan region
  const int32_t* chunk_seq;
  const int64_t* seq_start;
  const int32_t* seq_len;
  unsigned char* chunk_blocks;  // [max_chunks][HV] blocks of kChunkBlockBytes
  int32_t num_seqs;
  // fixed batch (no cu_seqlens): T and ceil(T / 64), from which the kernel derives its chunk's
  // sequence and rows without reading the plan region (0 and 0 when packed)
  int32_t seqlen;
  int32_t chunks_per_row;
  int32_t num_v_heads;
  // NOTE: the CTA's (chunk, head) and its batch row and q/k head come from three divisions by
  // these; as launch-time divisors (multiply-high and shift) they are ~60 instructions a warp
  // fewer, ahead of the first loads.
  kdakit::cuda::FastDiv div_v_heads;          // by num_v_heads
  kdakit::cuda::FastDiv div_chunks_per_row;   // by chunks_per_row (1 when packed)
  kdakit::cuda::FastDiv div_v_heads_per_qk;   // by HV / H (value heads per q/k head)
  bool packed;                  // cu_seqlens given: every sequence lies in batch row 0
  bool beta_fp32;
  bool scalar_gate;
  bool use_qk_l2norm;
  bool use_beta_sigmoid;
  bool allow_neg_eigval;
  float scale;
  float lower_bound;
  // Qt, W, Kh and M as fp16 and no Kh lo (WorkspacePlan::f16_block); else bf16 with Kh hi + lo
  bool f16_block;
  Route route;  // a routed call: the CTAs exit unless the plan's longest sequence is past the bound
  // A call whose plan kernel the dispatcher skipped (WorkspacePlan::plan_by_prep): a fixed batch,
  // or a packed one of one sequence. Each sequence's first-chunk CTA at value head 0 writes its
  // plan entries (chunk_offsets[n], and [N] for the last; seq_start[n], seq_len[n]: what
  // plan_kernel.cuh would write and the kernels after this one read). Null: no.
  int32_t* fixed_chunk_offsets;
  int64_t* fixed_seq_start;
  int32_t* fixed_seq_len;
  // ... the packed single sequence's cu_seqlens (int32 or int64 [2]) and the row's tokens T: the
  // CTAs map their chunk from cu[0], cu[1] (clamped to [0, T] as the plan kernel does) instead
  // of reading the plan region. Null when not that case.
  const void* single_cu;
  bool single_cu_int64;
  int32_t row_tokens;
};

}  // namespace kdakit::sm90::prefill::prep
