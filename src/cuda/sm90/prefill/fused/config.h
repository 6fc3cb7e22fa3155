// Compile-time decisions of the fused chunked prefill kernel (kernel.cuh): warp roles, register
// split, the shared-memory plan and the pipeline barriers. Host and device include this header;
// it has no CUDA includes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/prefill/workspace.h"

namespace kdakit::sm90::prefill::fused {

inline constexpr int kSubBlock = 16;  // rows of an mma tile, and of a gate sub-block
inline constexpr int kSubBlocks = kChunk / kSubBlock;  // 4
inline constexpr int kWarpGroup = 128;

// Channels whose base-2 gate sum drops by more than this within one 16-token sub-block have
// their diagonal-tile terms of L and M summed per element (kernel.cuh, "wide-span channels").
// NOTE: the diagonal tile factors x exp2(b_r - m) and exp2(m - b_s) around the sub-block
// midpoint m are then at most 2^96, far from fp32/bf16 overflow (2^128) for any |q|, |k| below
// 2^30. The lower-bound gate (>= -5 nats a token, 115 in base 2 over 16 tokens) never gets there.
inline constexpr float kMaxDiagSpan = 192.f;

// kConsumers consumer warpgroups of 64 value rows each (the wgmma M), one producer warpgroup.
// 2: a CTA owns a whole (sequence, head); 1: the head's two value halves are two CTAs, each with
// its own producer (the preparation is done twice), for batches with too few (sequence, head)
// pairs to fill the SMs.
template <int kConsumers_>
struct Config {
  static constexpr int kConsumers = kConsumers_;
  static_assert(kConsumers == 1 || kConsumers == 2, "one or two consumer warpgroups");
  static constexpr int kThreads = kWarpGroup * (1 + kConsumers);
  static constexpr int kValueRows = 64 * kConsumers;
  static constexpr int kSlices = kHeadDim / kValueRows;  // CTAs per (sequence, value head)
  // NOTE: 384 threads get 168 registers each at launch, and setmaxnreg only moves registers
  // within the CTA's allocation (a request beyond it blocks forever): 152 + 2 x 176 = 3 x 168.
  // A consumer holds the fp32 state (64), the U^T and O^T accumulators (2 x 32) and half of the
  // bf16 state operand (16) at its peak; the producer's L/M phase holds 64 accumulators and ~40
  // element values. ptxas fits both roles without spills (the build fails on any spill). With
  // one consumer (256 threads) every thread may use 255.
  static constexpr uint32_t kProducerRegs = 152;
  static constexpr uint32_t kConsumerRegs = 176;
  static_assert(kConsumers == 1 ||
                    kProducerRegs + kConsumers * kConsumerRegs <= (1 + kConsumers) * 168,
                "setmaxnreg must stay within the registers the CTA is launched with");
};

// Shared memory plan (bytes from a 1024-byte aligned base). bf16 [64 rows][128] tiles are two
// halves of [64][64] (8 KB each, 128-byte rows, 16-byte chunks XOR-swizzled by row % 8: the TMA
// 128-byte swizzle, read by wgmma descriptors and ldmatrix).
//
// Producer-only:
//   q, k raw (TMA)                        phases B, C1, C2, D1; refilled with chunk j+1 after D1
//   g raw (TMA), then the B tile          g: phase A; B tile (col operand of L and M): C1, C2
//   b (fp32 running gate sum [64][128],   A .. D1; then L (fp32 [64][kLdF]) whose diagonal
//      16-byte chunks XOR-swizzled)       blocks take T's diagonal blocks in place
// Consumer-facing (the producer writes, the consumers read):
//   Qt, Kh [2 stages], decay [2 stages]   written in A/C1/C2, read during the consumers' chunk
//   W (Kt before W), M, T diag(beta) hi/lo   one buffer each: written late in the producer's chunk,
//                                         released early in the consumers' chunk
//   V [2 halves]                          one per consumer warpgroup, loaded by it (TMA)
struct SharedMemoryPlan {
  static constexpr size_t kTile = size_t(kChunk) * kHeadDim * 2;  // 16 KB
  static constexpr size_t kHalf = kTile / 2;                      // 8 KB
  static constexpr size_t kQRawOffset = 0;
  static constexpr size_t kKRawOffset = kQRawOffset + kTile;
  static constexpr size_t kGRawOffset = kKRawOffset + kTile;  // also the B tile
  static constexpr size_t kBOffset = kGRawOffset;
  static constexpr size_t kB2Offset = kGRawOffset + kTile;  // fp32 [64][128]; later L / T fp32
  static constexpr size_t kB2Bytes = size_t(kChunk) * kHeadDim * 4;
  static constexpr size_t kLfOffset = kB2Offset;
  static constexpr size_t kQtOffset = kB2Offset + kB2Bytes;   // [2 stages]
  static constexpr size_t kKhOffset = kQtOffset + 2 * kTile;  // [2 stages]
  static constexpr size_t kWOffset = kKhOffset + 2 * kTile;
  static constexpr size_t kMOffset = kWOffset + kTile;        // bf16 [64][64]
  static constexpr size_t kTbHiOffset = kMOffset + kHalf;     // bf16 [64][64]
  static constexpr size_t kTbLoOffset = kTbHiOffset + kHalf;  // bf16 [64][64]
  static constexpr size_t kVOffset = kTbLoOffset + kHalf;     // [2 halves] bf16 [64][64]
  static constexpr size_t kSwizzledEnd = kVOffset + kTile;
  // Small arrays (16-byte aligned, no swizzle).
  static constexpr size_t kDecayOffset = kSwizzledEnd;                    // fp32 [2 stages][128]
  static constexpr size_t kBetaOffset = kDecayOffset + 2 * kHeadDim * 4;  // fp32 [64]
  static constexpr size_t kRqOffset = kBetaOffset + kChunk * 4;  // fp32 [64] scale / ||q_r||
  static constexpr size_t kRkOffset = kRqOffset + kChunk * 4;    // fp32 [64] 1 / ||k_r||
  // Per-channel vectors fp32 [kSubBlocks][128] (R = sub-block of the row, c_R = b at its last
  // row, c_{-1} = 0, m_R its exponent reference): CPREV = c_{R-1}, MY = m_R (for the
  // column factors), MX = m_R or +inf for wide-span channels (diagonal-tile row factor),
  // PFAC = 2^c_{R-1}, HFAC = 2^(c_3 - m_R); GFAC [6][128] = 2^(c_{R-1} - m_S), S < R, at
  // index R (R - 1) / 2 + S.
  static constexpr size_t kVecBytes = kSubBlocks * kHeadDim * 4;  // 2 KB
  static constexpr size_t kCPrevOffset = kRkOffset + kChunk * 4;
  static constexpr size_t kMyOffset = kCPrevOffset + kVecBytes;
  static constexpr size_t kMxOffset = kMyOffset + kVecBytes;
  static constexpr size_t kPFacOffset = kMxOffset + kVecBytes;
  static constexpr size_t kHFacOffset = kPFacOffset + kVecBytes;
  static constexpr size_t kGFacOffset = kHFacOffset + kVecBytes;
  static constexpr size_t kWideOffset = kGFacOffset + 6 * kHeadDim * 4;  // uint32 [4 sub-blocks][4]
  static constexpr size_t kItemOffset =
      kWideOffset + kSubBlocks * 4 * 4;  // item records: consumers, producer
  static constexpr size_t kItemBytes = 3 * 48;
  static constexpr size_t kBarrierOffset = kItemOffset + kItemBytes;
  static constexpr int kNumBarriers = 13;
  static constexpr size_t kBytes = kBarrierOffset + kNumBarriers * 8;
  // Dynamic shared memory is only 16-byte aligned: the kernel rounds its base up to 1024.
  static constexpr size_t kAllocBytes = kBytes + 1024;
};
static_assert(SharedMemoryPlan::kAllocBytes <= 227 * 1024,
              "fused prefill: shared memory plan exceeds 227 KiB");
static_assert(SharedMemoryPlan::kSwizzledEnd % 1024 == 0 &&
                  SharedMemoryPlan::kMOffset % 1024 == 0 &&
                  SharedMemoryPlan::kTbHiOffset % 1024 == 0 &&
                  SharedMemoryPlan::kVOffset % 1024 == 0,
              "swizzled tiles must be 1024-byte aligned");
static_assert(size_t(kChunk) * 68 * 4 <= SharedMemoryPlan::kB2Bytes,
              "L (fp32, pitch 68) must fit over b");

// Barrier indices (each an mbarrier in shared memory; FULL: the producer's writes landed,
// EMPTY: every consumer warp has read the buffer).
enum Barrier : int {
  kRawFull = 0,    // q, k (and g) raw of chunk j, by TMA (producer thread 0 arms it)
  kVFull = 1,      // [2] V half of consumer warpgroup c, by TMA (its thread 0 arms it)
  kQtKhFull = 3,   // [2 stages] Qt, Kh, decay
  kQtKhEmpty = 5,  // [2 stages]
  kMFull = 7,
  kMEmpty = 8,
  kWFull = 9,  // W and T diag(beta)
  kWEmpty = 10,
  kTbFull = 11,
  kTbEmpty = 12,
};
static_assert(kTbEmpty + 1 == SharedMemoryPlan::kNumBarriers, "barrier count");

// Named barriers (bar.sync ids; 0 is __syncthreads).
inline constexpr uint32_t kProducerBarrier = 1;   // the producer warpgroup
inline constexpr uint32_t kConsumerBarrier0 = 2;  // consumer warpgroup c: 2 + c

}  // namespace kdakit::sm90::prefill::fused
