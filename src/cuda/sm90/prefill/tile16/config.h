// Compile-time decisions of the 16-token-tile prefill kernel (kernel.cuh): threads, the value
// slice of a CTA, the exponent rule and the shared-memory plan. Host and device include this
// header; it has no CUDA includes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/prefill/workspace.h"

namespace kdakit::sm90::prefill::tile16 {

inline constexpr int kTile = 16;  // tokens per step of the chain
inline constexpr int kWarps = 8;  // warp w: value rows 16 w .. 16 w + 15 of the head's state
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kWarpCols = kHeadDim / kWarps;  // value channels per warp (one m16 tile)
inline constexpr int kTileHalf = kTile / 2;  // thread (c, hh): channel c, rows 8 hh .. 8 hh + 7
// P3's roles: warps 0 and 1 compute L (one 8-column half each), warps 6 and 7 M, and warp
// kSubstWarp inverts (I + diag(beta) L) between the halves of its own state products, once warps
// 0 and 1 have stored L (an mbarrier: warps 0, 1 and 2 arrive, warp 2 waits). Each SM
// sub-partition (warps w and w + 4) then holds one L or M warp.
inline constexpr int kSubstWarp = 2;
constexpr bool is_lm_warp(int w) { return w < 2 || w >= kWarps - 2; }
// NOTE: 2 CTAs per SM (shared memory, registers <= 128): while one CTA computes, the other's
// state load and store are in flight.
inline constexpr int kMinCtasPerSm = 2;

// Channels whose base-2 gate sum drops by more than this within one 8-token half of a tile are
// wide in that half: their L and M terms with columns in it are summed per element (kernel.cuh,
// "wide channels"). The others factor 2^(b_r - b_s) around the midpoint m_h of the columns' half
// h into 2^(b_r - m_h) 2^(m_h - b_s), at most 2^96 on the diagonal 8 x 8 blocks and
// 2^(non-positive) below them. The lower-bound gate (>= -5 nats a token, 58 in base 2 over 8
// tokens) never gets there; the benchmark's steepest softplus heads rarely do.
inline constexpr float kMaxSpan = 192.f;

// Shared memory (bytes; every offset a multiple of 16). fp32 tiles have padded rows so that the
// mma fragment reads of a warp hit distinct banks (or two ways at most).
struct SharedMemoryPlan {
  static constexpr int kPitchC = kHeadDim + 8;  // [16 tokens][136]: the factor tiles
  static constexpr int kPitchK =
      kHeadDim + 4;  // [16 tokens][132]: Kend (read a column pair at a time)
  static constexpr int kPitchT = kTile + 4;  // [16][20]: L, M, T
  static constexpr size_t kChannelTile = size_t(kTile) * kPitchC * 4;
  static constexpr size_t kSmallTile = size_t(kTile) * kPitchT * 4;
  // Row factors qn 2^(b - m), kn 2^(b - m) and the column factor kn 2^(m - b) (0 for wide
  // channels), token-major, as tf32 operands.
  static constexpr size_t kQmOffset = 0;
  static constexpr size_t kKmOffset = kQmOffset + kChannelTile;
  static constexpr size_t kKcOffset = kKmOffset + kChannelTile;
  // kn 2^(b_15 - b), token-major (the B operand of the state update).
  static constexpr size_t kKendOffset = kKcOffset + kChannelTile;
  static constexpr size_t kKendBytes = size_t(kTile) * kPitchK * 4;
  // L = Km Kc^T (unscaled by beta); T = (I + diag(beta) L)^-1 over it (written once L is read);
  // M = Qm Kc^T (zero above the diagonal).
  static constexpr size_t kLOffset = kKendOffset + kKendBytes;
  static constexpr size_t kTOffset = kLOffset;
  static constexpr size_t kMOffset = kLOffset + kSmallTile;
  // Raw inputs of a tile (cp.async), two stages (tile j in stage j % 2): tile j + 1's are
  // copied in while tile j runs, so that no barrier waits for them at the top of a tile. Per
  // stage: q, k bf16 [16][128]; g bf16 or fp32 [16][128] (per channel), whose space then holds
  // the wide channels' running gate sums b (fp32 [16][128]); v bf16 [16][128].
  static constexpr size_t kRawTile = size_t(kTile) * kHeadDim * 2;
  static constexpr size_t kGRawBytes = size_t(kTile) * kHeadDim * 4;
  static constexpr size_t kVBytes = size_t(kTile) * kHeadDim * 2;
  static constexpr size_t kStageBytes = 2 * kRawTile + kGRawBytes + kVBytes;
  static constexpr size_t kQRawOffset = kMOffset + kSmallTile;  // + stage * kStageBytes
  static constexpr size_t kKRawOffset = kQRawOffset + kRawTile;
  static constexpr size_t kGRawOffset = kKRawOffset + kRawTile;
  static constexpr size_t kBOffset = kGRawOffset;
  static constexpr size_t kVRawOffset = kGRawOffset + kGRawBytes;
  static constexpr size_t kStagesEnd = kQRawOffset + 2 * kStageBytes;
  // Per-channel vectors fp32 [128]: 2^b_15 (the tile's decay), 2^m (the state operand's factor).
  static constexpr size_t kDecayOffset = kStagesEnd;
  static constexpr size_t kM2Offset = kDecayOffset + kHeadDim * 4;
  // fp32 [2][128]: each token half's gate sum per channel (the second half's running sums start
  // from the first's).
  static constexpr size_t kHalfSumOffset = kM2Offset + kHeadDim * 4;
  // Per-token fp32 [16]: scale / ||q||, 1 / ||k||; fp32 [2 stages][16]: beta, the raw scalar
  // gate (tile j + 1's are written during tile j).
  static constexpr size_t kRqOffset = kHalfSumOffset + 2 * kHeadDim * 4;
  static constexpr size_t kRkOffset = kRqOffset + kTile * 4;
  static constexpr size_t kBetaOffset = kRkOffset + kTile * 4;
  static constexpr size_t kGsOffset = kBetaOffset + 2 * kTile * 4;
  // uint32 [2 halves][4]: the channels wide in each token half
  static constexpr size_t kWideOffset = kGsOffset + 2 * kTile * 4;
  // uint64: the mbarrier on which warps 0 and 1 hand L over to warp kSubstWarp
  static constexpr size_t kLBarOffset = kWideOffset + 32;
  static constexpr size_t kWorkOffset = kLBarOffset + 16;  // the CTA's work record (kernel.cuh)
  static constexpr size_t kWorkBytes = 80;
  // What the lower-bound gate's kernel uses (one reference per tile); the other gates' add:
  static constexpr size_t kBytesOneRef = kWorkOffset + kWorkBytes;
  // the row factors against the second token half's reference (rows 8-15; rows 0-7 zero).
  static constexpr size_t kQm1Offset = kBytesOneRef;
  static constexpr size_t kKm1Offset = kQm1Offset + kChannelTile;
  static constexpr size_t kBytes = kKm1Offset + kChannelTile;
};
static_assert(SharedMemoryPlan::kBytes % 16 == 0, "tile16 prefill: plan alignment");
// 228 KB per SM, 1 KB of it reserved per CTA.
static_assert(kMinCtasPerSm * (SharedMemoryPlan::kBytes + 1024) <= 228 * 1024,
              "tile16 prefill: two CTAs per SM must fit the shared memory");

}  // namespace kdakit::sm90::prefill::tile16
