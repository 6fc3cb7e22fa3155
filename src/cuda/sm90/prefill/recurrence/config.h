// Compile-time decisions of the chunk-serial prefill recurrence kernel (kernel.cuh).
// Host and device include this header; it has no CUDA includes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/prefill/workspace.h"

namespace kdakit::sm90::prefill::recurrence {

// One CTA owns kValueRows value channels (rows of S^T, V x K) of one (sequence, value head).
// Each consumer warp owns 16 of them: the m16 of mma.m16n8k16. Value rows never mix, so the
// V split is exact. 16..128 rows lets the dispatcher fill 132 SMs from 4 heads to 96 heads.
template <int kValueRows_>
struct Config {
  static constexpr int kValueRows = kValueRows_;
  static_assert(kValueRows % 16 == 0 && kValueRows >= 16 && kValueRows <= kHeadDim,
                "value rows per CTA must be a multiple of 16 in [16, 128]");
  static constexpr int kConsumerWarps = kValueRows / 16;
  // NOTE: thread 0 issues the TMA loads between its MMAs. A dedicated producer warp would make
  // 9 warps at 128 rows, and the register file then holds only 168 registers per thread
  // (allocation in whole warpgroups): the kernel needs ~220.
  static constexpr int kThreads = kConsumerWarps * 32;
  static constexpr int kSlices = kHeadDim / kValueRows;  // CTAs per (sequence, value head)
  // One CTA per SM (shared memory): every thread may use up to 255 registers at 128 rows.
  static constexpr int kMaxRegisters = 255;

  // Two stages: chunk j+1's block lands while chunk j is computed. A third stage would not fit
  // at 128 rows (3 x 105 KB) and the load of one block (~105 KB) takes less time than one
  // chunk's products (488 mma.sync per warp at 16 / 32 rows; 40 m64n64 and 12 m64n128 wgmma
  // per warpgroup at 64 / 128).
  static constexpr int kStages = 2;

  // ---- shared memory plan (bytes; every TMA destination 1024-byte aligned for the 128B swizzle)
  struct SharedMemoryPlan {
    // Qt, W, Kh, Kh lo of one chunk as two column halves [2][256 rows][64 cols] bf16 (fp16
    // blocks: fp16, and Kh lo's rows stay unwritten),
    // 128B-swizzled: row 64 a + r of half c is array a (0 Qt, 1 W, 2 Kh, 3 Kh lo), token r, key
    // channels 64 c .. 64 c + 63.
    static constexpr int kQwkArrays = 4;
    static constexpr size_t kQwkBytes = 2 * kQwkArrays * kChunk * 64 * 2;  // 64 KiB
    static constexpr size_t kMBytes = kChunk * kChunk * 2;        // M [64][64] bf16, swizzled
    // U0 [64][kValueRows] fp32; from 32 rows on as kU0Boxes column blocks
    // [64 tokens][32] of 128-byte rows whose 16-byte chunk c sits at c ^ (token % 8) (TMA 128B
    // swizzle). NOTE: unswizzled, the m64n64 accumulator's read (tokens 2t, value rows g) put
    // the four quads of a warp in one bank: 32 four-way conflicted loads per thread and chunk,
    // ~1k shared-memory cycles per chunk at 128 rows, ahead of the chunk's first product. At 16
    // rows (64-byte rows) the tile stays unswizzled.
    static constexpr size_t kU0Bytes = kChunk * kValueRows * 4;
    static constexpr bool kU0Swizzled = kValueRows >= 32;
    static constexpr int kU0Boxes = kU0Swizzled ? kValueRows / 32 : 1;
    static constexpr int kU0BoxCols = kValueRows / kU0Boxes;
    static constexpr size_t kU0BoxBytes = kU0Bytes / kU0Boxes;
    static constexpr size_t kDecayBytes = kHeadDim * 4;           // decay [128] fp32
    static constexpr size_t kQwkOffset = 0;
    static constexpr size_t kMOffset = kQwkOffset + kQwkBytes;
    static constexpr size_t kU0Offset = kMOffset + kMBytes;
    static constexpr size_t kDecayOffset = kU0Offset + kU0Bytes;
    static constexpr size_t kStageBytes = align_up(kDecayOffset + kDecayBytes, 1024);
    static constexpr uint32_t kStageTxBytes = uint32_t(kQwkBytes + kMBytes + kU0Bytes + kDecayBytes);

    // Output staging: each warp's O [64 tokens][16 value ch] bf16 goes into its own 16 columns of
    // the stage's U0 slice (64 bytes of each U0 row; only this warp reads them, at the start of
    // the chunk), so the stage is released after the output's global stores. NOTE: a separate
    // staging area (24 KB at 128 rows) no longer fits beside two stages that carry Kh lo.
    static constexpr size_t kU0RowBytes = kValueRows * 4;
    static constexpr size_t kBarrierOffset = kStages * kStageBytes;  // full[], empty[]
    // CTA-uniform flags that must not hold a register through the chunk loop (kernel.cuh)
    static constexpr size_t kFlagsOffset = kBarrierOffset + 2 * kStages * 8;
    static constexpr size_t kBytes = kFlagsOffset + 16;
    // Dynamic shared memory is only 16-byte aligned by the runtime: the kernel rounds its base
    // up to 1024, so ask for that much more.
    static constexpr size_t kAllocBytes = kBytes + 1024;
  };
  static_assert(SharedMemoryPlan::kAllocBytes <= 227 * 1024, "shared memory plan exceeds 227 KiB per CTA");
  static_assert(SharedMemoryPlan::kU0Offset % (SharedMemoryPlan::kU0Swizzled ? 1024 : 128) == 0,
                "TMA destination of U0 must be 128-byte aligned (1024 when swizzled)");
  static_assert(SharedMemoryPlan::kDecayOffset % 16 == 0, "bulk copy destination must be 16-byte aligned");
  static_assert(SharedMemoryPlan::kMOffset % 1024 == 0, "swizzled TMA destination must be 1024-byte aligned");
};

}  // namespace kdakit::sm90::prefill::recurrence
