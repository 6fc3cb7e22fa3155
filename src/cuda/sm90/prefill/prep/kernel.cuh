// Token-parallel prefill prep kernel (sm_90a; the tensor-core path is the sm_80 mma.sync one,
// which Hopper runs natively). The plan kernel that feeds it is in plan_kernel.cuh.
//
// ---- Prep: kda_prefill_prep_sm90_kernel, grid max_chunks x HV (heads fastest), 256 threads --
// One CTA per (chunk c, value head h) writes that pair's chunk block (workspace.h):
//   inputs  q, k [64 rows][128] of qk head h / (HV / H), v [64][128], g [64][128] (or [64]),
//           beta [64]; rows r >= C' (chunk length) read as zeros, their gamma and beta as 0.
//   outputs Qt, W, Kh (hi and lo) bf16 [64][128], M bf16 [64][64], U0 fp32 [64][128], decay fp32 [128].
// with b2_r the base-2 running gate sum, c_R = b2 at the last row of 16-row sub-block R
// (c_{-1} = 0), qn = scale * q / ||q||, kn = k / ||k|| (norms optional), and
//   E_r = exp2(b2_r - c_{R-1}) <= 1,  F_r = exp2(c_R - b2_r) <= 1         (r in sub-block R)
//   Qt = qn E exp2(c_{R-1}),  Kt = kn E exp2(c_{R-1}),  Kh = kn F exp2(c_3 - c_R)
//     (E exp2(c_{R-1}) = exp2(b2_r) <= 1 is formed as that one exponential)
//   L[r, s] = A^L_r . B^(R)_s,  M[r, s] = A^M_r . B^(R)_s  (s < 16 (R + 1), then masked)
//     A^x_r   = x_r exp2(b2_r - m_R),   B^(R)_s = kn_s exp2(m_R - b2_s)
//     m_R     = (c_{R-1} + c_R) / 2 per channel while span = c_{R-1} - c_R <= max_diag_span
//               (config.h): for s in an earlier sub-block both factors are <= 1; in the
//               diagonal tile they are <= 2^(span / 2) and each is one exp2 of its summed
//               exponent (never E times a factor > 1, which would lose values whose E
//               underflows). A wider channel takes the midpoint of its first 8-row half,
//               (c_{R-1} + h_R) / 2 with h_R = b2 at row 16 R + 7, when that half spans at most
//               the bound: the diagonal tile's columns of the second half are left out of the
//               product and their terms (second-half rows) summed per element with
//               exp2(b2_r - b2_s) <= 1; second-half rows against first-half columns stay in the
//               product (A <= 1; an A that flushes below 2^-126 loses a term below 2^-18 of
//               |x_r kn_s|). A channel steep within the first half too takes m_R = c_{R-1} and
//               leaves the whole diagonal tile to the per-element path.
//   T = (I + diag(beta) L)^-1,  W = T diag(beta) Kt,  U0 = T diag(beta) V.
//
// Warp roles and phases (one CTA, 8 warps, __syncthreads between phases):
//   1. q, k -> shared by cp.async (into the A^M, A^L tiles). Warp w owns the 8-row half hw of
//      sub-block hw / 2 (hw = w, with halves 4, 5 and 6, 7 swapped: the phase 1 mapping),
//      thread (warp w, lane 16 rq + co) rows 8 hw + 4 rq .. + 3 and
//      channels 8 co .. + 7: it copies its own q/k pieces, loads its g rows (16-byte loads),
//      gate and running sum in registers (local sum, one shuffle, then the earlier halves'
//      totals through shared memory), norms as warp sums (no shared partials). One barrier
//      publishes the halves' totals; the second-half warps then write c_R and classify their
//      sub-block's channels (wide-span masks, lists, m_R), and a second barrier publishes that.
//      Writes Qt, Kh, decay to the block; Kt, A^L, A^M (in place over k, q), B^(R) to shared
//      memory (bf16, 16-byte chunks XOR-swizzled by row).
//   2. L, M on tensor cores: each is 20 n8 tiles, split over the warps as up to two segments
//      of one matrix and sub-block each (config.h, lm_segment), one product loop per segment
//      shape. M's A operand is A^M as bf16 hi + lo (its lo tile in V's space, V loaded after this
//      phase): the rounding of A^M was the largest single share of the output error on
//      lower-bound gates (tools/chunked_rounding_model.py).
//   3. L to shared fp32 (masked); M straight to the block as bf16, except, when the CTA has a
//      wide-span channel, its diagonal tiles: to shared fp32, their per-element terms added,
//      then to the block.
//   4. T on tensor cores (config.h): warps 0-3 invert their diagonal 16 x 16 block in registers
//      by repeated squaring, then warps 1-3 compute their row of off-diagonal blocks right to
//      left (three-pass bf16 products); every block of T diag(beta) goes to bf16 hi/lo tiles.
//   5. W, U0 on tensor cores with the A operand T diag(beta) as bf16 hi + lo (two passes): warp
//      w computes product w / 4, columns 32 (w % 4) .. + 31, all rows (equal work), and stores
//      its accumulators straight to the block.
// Nothing is pipelined inside a CTA: two CTAs share an SM (config.h), so one computes while the
// other's loads and stores are in flight. NOTE: measured on the H200 (H=96, T=8192), version 1
// took 1.19 ms and this kernel 0.95 ms (session 6; 1.00 ms in session 7 with Kh lo and A^M lo;
// 0.87 ms in session 22 with the phase 1 mapping above), against a 0.45 ms floor for the bytes. The
// grid time is waves of 2 CTAs per SM times the ~21 us latency of one CTA's dependent
// instruction chain (0.44 issued instructions per scheduler and cycle; the elementwise phase 1
// is about half of the samples), not the loads: an L2 prefetch of the next CTA's inputs
// measured 4% slower (docs/design/20261129-prefill.md).
// NOTE: code size is part of the budget: the kernel is straight-line code run by two CTAs per
// SM in different phases, so instruction fetch stalls grow with it. It slowed by 22% when it grew
// from 8,000 to 8,720 SASS instructions with code that never ran on those inputs (session 13,
// H200). At 7,568 (softplus) the benchmark's softplus inputs, which run all of it, spent 16% of
// their warp samples waiting for instructions against 5% for lower-bound inputs; rolling four
// loops (the inverse's squaring steps, phase 2's k-steps by 2, phase 5's halves, the wide-span
// loop by 2) took it to 6,520 and their prep 7% faster, the lower-bound rows unchanged (session
// 14). The ctest prefill_prep_code_size (tests/cpp/prefill/prep) fails past 6,600 for the
// lower-bound, bf16-g instantiations (6,336 now, 6,368 before session 31's one-pass phase 1c,
// 6,136 in session 23; 6,432 for the kExtras one with session 28's plan writers); the softplus
// ones run ~32 instructions larger (~190 before their gate lost its select, session 23).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common/device_setup.cuh"
#include "cuda/common/dtype.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/pdl_launch.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sm90/prefill/prep/config.h"
#include "cuda/sm90/prefill/prep/launch.h"
#include "cuda/sm90/prefill/common/gate.cuh"
#include "cuda/sm90/prefill/common/tc_inverse.cuh"

namespace kdakit::sm90::prefill::prep {

using kdakit::cuda::fast_exp2;
using kdakit::cuda::kLog2e;
using common::gate_log2;
using common::swz64;
using common::store_tile;
using common::store_tile_hilo;
using common::tc_diag_inverse;
using common::tc_offdiag_blocks;

// ------------------------------------------------------------------------------------------
// Prep kernel helpers
// ------------------------------------------------------------------------------------------

// Byte offset of 16-byte chunk `chunk` of row `row` in a bf16 [rows][128] shared array.
// NOTE: the XOR key (row ^ row / 4) mod 8 is a bijection on any 8 aligned rows (ldmatrix
// reads 8 consecutive rows at one logical chunk), so those hit 8 distinct bank groups; the
// elementwise phase's quarter-warps access 8 distinct chunks of one row.
__host__ __device__ constexpr uint32_t swz(int row, int chunk) {
  return uint32_t(row) * 256u + (uint32_t(chunk ^ ((row ^ (row >> 2)) & 7)) << 4);
}
// Phase 2 forms each k-step's offset as swz(row, c) ^ (ks << 5) (lm_segment_products): checked
// here for every row of the kB tile (the largest) and both lane halves.
constexpr bool swz_k_steps_are_xors() {
  for (int row = 0; row < kKbRows; ++row)
    for (int c = 0; c < 2; ++c)
      for (int ks = 0; ks < kHeadDim / 16; ++ks)
        if (swz(row, 2 * ks + c) != (swz(row, c) ^ (uint32_t(ks) << 5))) return false;
  return true;
}
static_assert(swz_k_steps_are_xors(), "phase 2's k-step offsets must equal the swizzle");

// Offset of element e (0..7) of a lane's 8 channels in the per-channel fp32 vectors, from the
// lane's base 4 co (the kernel's NOTE at the phase 1 mapping).
__host__ __device__ constexpr int vo(int e) { return e < 4 ? e : kHeadDim / 2 + e - 4; }

// A thread's 8 channel values to, and added from, a per-channel fp32 vector in that layout (p: the
// vector plus 4 co): two float4 accesses.
__device__ __forceinline__ void store_vo8(float* p, const float (&x)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  *reinterpret_cast<float4*>(p + vo(4)) = make_float4(x[4], x[5], x[6], x[7]);
}
__device__ __forceinline__ void add_vo8(float (&acc)[8], const float* p) {
  const float4 lo = *reinterpret_cast<const float4*>(p);
  const float4 hi = *reinterpret_cast<const float4*>(p + vo(4));
  acc[0] += lo.x, acc[1] += lo.y, acc[2] += lo.z, acc[3] += lo.w;
  acc[4] += hi.x, acc[5] += hi.y, acc[6] += hi.z, acc[7] += hi.w;
}

__device__ __forceinline__ void unpack8(const uint4& raw, float (&out)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __low2float(h[i]);
    out[2 * i + 1] = __high2float(h[i]);
  }
}

// 8 consecutive elements -> fp32, in 16-byte accesses.
template <typename T>
__device__ __forceinline__ void load8(const T* ptr, float (&out)[8]) {
  if constexpr (sizeof(T) == 4) {
    float lo[4], hi[4];
    kdakit::cuda::load_vec<4>(ptr, lo);
    kdakit::cuda::load_vec<4>(ptr + 4, hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[i] = lo[i];
      out[i + 4] = hi[i];
    }
  } else {
    kdakit::cuda::load_vec<8>(ptr, out);
  }
}

// Two values of a block array (Qt, W, Kh, M) in the block's element type (PrepParams::f16_block).
__device__ __forceinline__ uint32_t pack_block2(float lo, float hi, bool f16) {
  return f16 ? kdakit::cuda::pack_f16x2(lo, hi) : kdakit::cuda::pack_bf16x2(lo, hi);
}
__device__ __forceinline__ uint4 pack8_block(const float (&x)[8], bool f16) {
  return make_uint4(pack_block2(x[0], x[1], f16), pack_block2(x[2], x[3], f16), pack_block2(x[4], x[5], f16),
                    pack_block2(x[6], x[7], f16));
}
// Eight fp32 -> eight bf16 (the shared-memory tiles).
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) { return pack8_block(x, false); }
// Eight fp32 -> bf16 hi + lo (x ~ hi + lo; Kh on bf16 blocks, A^M).
__device__ __forceinline__ void split8(const float (&x)[8], uint4& hi, uint4& lo) {
  kdakit::cuda::split_bf16x2(x[0], x[1], hi.x, lo.x);
  kdakit::cuda::split_bf16x2(x[2], x[3], hi.y, lo.y);
  kdakit::cuda::split_bf16x2(x[4], x[5], hi.z, lo.z);
  kdakit::cuda::split_bf16x2(x[6], x[7], hi.w, lo.w);
}

// Wide-span channels' b2 (fp32) and raw k (bf16 bits), channel-major [128][64] so that phase 3's
// lanes read 16 consecutive rows of one channel: written in phase 1c into block space that phase
// 5 writes later (U0's and W's), read back in phase 3.
__device__ __forceinline__ float* wide_b2_scratch(unsigned char* blk) {
  return reinterpret_cast<float*>(blk + ChunkBlockLayout::kU0Offset);
}
__device__ __forceinline__ uint16_t* wide_k_scratch(unsigned char* blk) {
  return reinterpret_cast<uint16_t*>(blk + ChunkBlockLayout::kWOffset);
}

// kN tiles of matrix kM (0: L, 1: M) from sub-block R, first n8 tile nt0 (a segment,
// config.h lm_segment), into acc[0 .. kN - 1]. A: the kA tile (L) or the qA tile and its lo half
// (M: two passes per tile, lo then hi); B: the kB tile. R and nt0 are runtime values: warps whose
// segments have the same shape share this code.
template <int kM, int kN>
__device__ __forceinline__ void lm_segment_products(float (&acc)[4][4], const LmSegment seg, const unsigned char* smem,
                                                    int lane) {
  using Plan = SharedMemoryPlan;
  static_assert(kN >= 1 && kN <= 4, "a segment is 1 to 4 tiles");
  const uint32_t s0 = kdakit::cuda::smem_u32(smem);
  const uint32_t a_base = s0 + uint32_t(kM != 0 ? Plan::kQaOffset : Plan::kKaOffset);
  const uint32_t a_lo_base = s0 + uint32_t(Plan::kAmLoOffset);
  const uint32_t b_base = s0 + uint32_t(Plan::kKbOffset);
  static_assert(Plan::kQaOffset % 256 == 0 && Plan::kKaOffset % 256 == 0 && Plan::kAmLoOffset % 256 == 0 &&
                    Plan::kKbOffset % 256 == 0,
                "the k-step offsets below are XORs within 256-byte rows of 256-byte-aligned tiles");
  // NOTE: chunk 2 ks + c of row r is at swz(r, c) ^ (ks << 5): the row's XOR key acts on the
  // chunk's low three bits, and 2 ks and c have disjoint bits. So each operand's offset is formed
  // once, and a k-step costs one XOR per ldmatrix (the tile base is added by the ldmatrix's
  // register + uniform-register address) instead of a key XOR, a shift and an add.
  const uint32_t a_off = swz(kSubBlock * seg.R + (lane & 15), lane >> 4);
  uint32_t b_off[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) b_off[i] = swz(kb_row_offset(seg.R) + 8 * seg.nt0 + 8 * i + (lane & 7), (lane >> 3) & 1);
  // NOTE: unrolled by 2, not 8: the four shape copies of 8 k-steps were ~500 instructions more
  // (code size, the header's NOTE); the k-steps' order, and so the sums, are unchanged.
#pragma unroll 2
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    uint32_t a[4], l[4];
    const uint32_t step = uint32_t(ks) << 5;
    kdakit::cuda::ldmatrix_x4(a, a_base + (a_off ^ step));
    if constexpr (kM != 0) kdakit::cuda::ldmatrix_x4(l, a_lo_base + (a_off ^ step));
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      uint32_t b[2];
      kdakit::cuda::ldmatrix_x2(b, b_base + (b_off[i] ^ step));
      if constexpr (kM != 0) kdakit::cuda::mma_bf16_16816(acc[i], l, b[0], b[1]);
      kdakit::cuda::mma_bf16_16816(acc[i], a, b[0], b[1]);
    }
  }
}

// The segment from acc to L's fp32 [64][kLdF] matrix Lf (strictly lower) or, for M (with its
// diagonal), straight to the block as bf16 (m_block). Only the tiles left of the diagonal and the
// diagonal tiles exist: L's blocks above the diagonal are never read, M's are written as zeros.
// With m_diag_f32 (a wide-span channel in the CTA), M's diagonal tiles, the only ones its
// per-element terms touch, go to the fp32 matrix Mf instead, to be finished in phase 3.
template <int kM, int kN>
__device__ __forceinline__ void lm_segment_store(const float (&acc)[4][4], const LmSegment seg, float* Lf, float* Mf,
                                                 unsigned char* m_block, bool m_diag_f32, bool f16, int g, int t) {
  constexpr bool kStrict = kM == 0;
  float* dst = kStrict ? Lf : Mf;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int nt = seg.nt0 + i;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = kSubBlock * seg.R + g + 8 * half;
      const int s = 8 * nt + 2 * t;
      float x0 = acc[i][2 * half], x1 = acc[i][2 * half + 1];
      const bool diag = (nt >> 1) == seg.R;
      if (diag) {  // diagonal tile: entries above it may be inf, so select
        x0 = (kStrict ? s < r : s <= r) ? x0 : 0.f;
        x1 = (kStrict ? s + 1 < r : s + 1 <= r) ? x1 : 0.f;
      }
      if (!kStrict && !(diag && m_diag_f32)) {
        *reinterpret_cast<uint32_t*>(m_block + size_t(r) * 128 + s * 2) = pack_block2(x0, x1, f16);
      } else {
        *reinterpret_cast<float2*>(dst + r * SharedMemoryPlan::kLdF + s) = make_float2(x0, x1);
      }
    }
  }
}

// Calls f(shape) with warp `warp`'s segment shape as a compile-time constant (config.h, lm_shape
// and kLmShapes): one code copy per shape.
template <typename F>
__device__ __forceinline__ void with_lm_shape(int warp, F&& f) {
  switch (lm_shape(warp)) {
    case 0: f(std::integral_constant<int, 0>{}); break;
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 3>{}); break;
  }
}

// Phase 2 of warp `warp`: its two segments' products into acc0 / acc1.
__device__ __forceinline__ void lm_products(float (&acc0)[4][4], float (&acc1)[4][4], int warp,
                                            const unsigned char* smem, int lane) {
  const LmSegment seg0 = lm_segment(warp, 0), seg1 = lm_segment(warp, 1);
  with_lm_shape(warp, [&](auto shape) {
    constexpr LmShape kSh = kLmShapes[decltype(shape)::value];
    lm_segment_products<kSh.m0, kSh.n0>(acc0, seg0, smem, lane);
    if constexpr (kSh.n1 > 0) lm_segment_products<kSh.m1, kSh.n1>(acc1, seg1, smem, lane);
  });
}

// Phase 3's start: the products of lm_products to Lf / Mf.
__device__ __forceinline__ void lm_store(const float (&acc0)[4][4], const float (&acc1)[4][4], int warp, float* Lf,
                                         float* Mf, unsigned char* m_block, bool m_diag_f32, bool f16, int g, int t) {
  const LmSegment seg0 = lm_segment(warp, 0), seg1 = lm_segment(warp, 1);
  with_lm_shape(warp, [&](auto shape) {
    constexpr LmShape kSh = kLmShapes[decltype(shape)::value];
    lm_segment_store<kSh.m0, kSh.n0>(acc0, seg0, Lf, Mf, m_block, m_diag_f32, f16, g, t);
    if constexpr (kSh.n1 > 0) lm_segment_store<kSh.m1, kSh.n1>(acc1, seg1, Lf, Mf, m_block, m_diag_f32, f16, g, t);
  });
}

// ------------------------------------------------------------------------------------------
// Prep kernel
// ------------------------------------------------------------------------------------------
// kExtras: the call's plan entries may be written here (PrepParams::fixed_chunk_offsets, single_cu;
// the default for a fixed batch or one packed sequence). A separate instantiation, so that the
// kernel of every other call compiles to the code it had before them (session 28: in one kernel
// the unused branches rescheduled it, 125 -> 127 registers, and this kernel is sensitive to its
// code; the NOTE above).
template <GateMode kGate, typename GT, bool kExtras>
__global__ void __launch_bounds__(kThreads, 2) kda_prefill_prep_sm90_kernel(const __grid_constant__ PrepParams p) {
  using Plan = SharedMemoryPlan;
  using Layout = ChunkBlockLayout;
  extern __shared__ __align__(128) unsigned char smem[];
  if (!chunk_side_runs(p.route)) {  // a routed call the tile kernel takes
    // NOTE: a routed call's grid is launched with PDL after the tile kernel (launch_prep_kernel),
    // so these exits run in the tile kernel's last wave. The grid's last CTA waits for the tile
    // kernel, so that this grid, and what the stream runs after it, completes after it.
    kdakit::cuda::ptx::griddep_exit_after_previous();
    return;
  }

  // NOTE: value heads vary fastest, so the CTAs in flight read the rows of all heads of the
  // same tokens (contiguous in q/k/v/g) and write consecutive blocks. The grid covers the
  // bound max_chunks x HV; the plan's total decides which CTAs have work.
  const int chunk = int(kdakit::cuda::fast_div(blockIdx.x, p.div_v_heads));
  const int h = int(blockIdx.x) - chunk * p.num_v_heads;
  int n, chunk_in_seq, seq_len;
  int64_t seq_start;
  if (!p.packed) {
    // NOTE: a fixed batch's plan is arithmetic (plan_kernel.cuh writes exactly these values), so
    // no dependent plan load precedes the data loads; the grid is B x ceil(T / 64) x HV.
    n = int(kdakit::cuda::fast_div(uint32_t(chunk), p.div_chunks_per_row));
    chunk_in_seq = chunk - n * p.chunks_per_row;
    seq_len = p.seqlen;
    seq_start = 0;
  } else if (kExtras && p.single_cu != nullptr) {
    // One packed sequence whose plan this kernel writes (PrepParams::single_cu): the plan
    // kernel's clamping of cu[0], cu[1] to [0, T], and chunks past the sequence exit. The CTA of
    // chunk 0 at head 0 writes the entries first, even for an empty sequence (it then exits too).
    const int64_t c0 = p.single_cu_int64 ? static_cast<const int64_t*>(p.single_cu)[0]
                                         : static_cast<const int32_t*>(p.single_cu)[0];
    const int64_t c1 = p.single_cu_int64 ? static_cast<const int64_t*>(p.single_cu)[1]
                                         : static_cast<const int32_t*>(p.single_cu)[1];
    const int64_t start = min(max(c0, int64_t(0)), int64_t(p.row_tokens));
    const int64_t end = max(start, min(max(c1, int64_t(0)), int64_t(p.row_tokens)));
    n = 0;
    chunk_in_seq = chunk;
    seq_len = int(end - start);
    seq_start = start;
    if (chunk == 0 && h == 0 && threadIdx.x == 0) {
      p.fixed_chunk_offsets[0] = 0;
      p.fixed_chunk_offsets[1] = (seq_len + kChunk - 1) / kChunk;
      p.fixed_seq_start[0] = seq_start;
      p.fixed_seq_len[0] = seq_len;
    }
    if (chunk * kChunk >= seq_len) return;
  } else {
    // NOTE: chunk_seq is -1 past the plan's total, so the exit test needs no load of the total
    // before it: one dependent L2 round trip less ahead of the data loads.
    n = p.chunk_seq[chunk];
    if (n < 0) return;
    chunk_in_seq = chunk - p.chunk_offsets[n];
    seq_len = p.seq_len[n];
    seq_start = p.seq_start[n];
  }
  const int len = min(kChunk, seq_len - chunk_in_seq * kChunk);
  const int64_t tok0 = seq_start + int64_t(chunk_in_seq) * kChunk;
  const int64_t brow = p.packed ? 0 : n;
  const int hk = int(kdakit::cuda::fast_div(uint32_t(h), p.div_v_heads_per_qk));
  unsigned char* blk = p.chunk_blocks + (size_t(chunk) * size_t(p.num_v_heads) + size_t(h)) * kChunkBlockBytes;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  float* row_q = reinterpret_cast<float*>(smem + Plan::kRowScaleOffset);  // scale / ||q_r||
  float* row_k = row_q + kChunk;                                          // 1 / ||k_r||
  float* beta_s = row_k + kChunk;                                         // beta_r (0 past C')
  uint32_t* mask = reinterpret_cast<uint32_t*>(smem + Plan::kMaskOffset);  // wide-span channels
  uint8_t* wide_list = smem + Plan::kWideListOffset;                       // their indices [4][128]
  int* wide_count = reinterpret_cast<int*>(smem + Plan::kWideCountOffset);  // and counts [2][4]
  // [4][128]: b2 at row 16 R + 7, then (after the classification) the row reference m_R
  float* half_bound = reinterpret_cast<float*>(smem + Plan::kHalfBoundOffset);
  const float max_span = max_diag_span(p.use_qk_l2norm);
  float* bound = reinterpret_cast<float*>(smem + Plan::kBoundOffset);     // [5][128]: 0, c_0 .. c_3

  const __nv_bfloat16* qg = static_cast<const __nv_bfloat16*>(p.q) + brow * p.stride_q_b + tok0 * p.stride_q_t +
                            int64_t(hk) * p.stride_q_h;
  const __nv_bfloat16* kg = static_cast<const __nv_bfloat16*>(p.k) + brow * p.stride_k_b + tok0 * p.stride_k_t +
                            int64_t(hk) * p.stride_k_h;

  const __nv_bfloat16* vg = static_cast<const __nv_bfloat16*>(p.v) + brow * p.stride_v_b + tok0 * p.stride_v_t +
                            int64_t(h) * p.stride_v_h;

  // ---- Phase 1 mapping --------------------------------------------------------------------
  // Warp w owns 8-row half hw = w for w < 4, w ^ 2 for w >= 4, i.e. rows 8 hw .. 8 hw + 7 (the
  // first or second half of sub-block R = hw / 2), and lane (rq, co) = (lane / 16, lane % 16)
  // rows 8 hw + 4 rq .. + 3, channels 8 co .. 8 co + 7.
  // NOTE: warps w and w + 4 share a scheduler; the B^(R') copies (3 - R per row) then sum to 3
  // on every scheduler (sub-blocks 0 and 3, or 1 and 2) instead of 4 on two of them and 2 on the
  // other two.
  // NOTE: so a warp's rows lie in one sub-block (its B^(R') copies below are one warp-uniform
  // branch, not a loop that every warp ran with the lanes of other sub-blocks masked off), a row
  // lies in 16 lanes of one warp (the q/k norms are sums over them: no partial sums through shared
  // memory and no barrier), and a quarter-warp's 16-byte accesses are one row's 128 contiguous bytes.
  const int rq = lane >> 4, co = lane & 15;
  const int hw = warp < kWarps / 2 ? warp : warp ^ 2;         // the warp's 8-row half
  const int r0 = kSubBlock / 2 * hw + kRowsPerThread * rq;    // first of the thread's 4 rows
  const int R = hw >> 1;                                       // their sub-block
  const int c0 = co * 8;                                       // first of the thread's 8 channels
  const int ch0 = co;                                          // their 16-byte chunk
  // NOTE: the per-channel fp32 vectors (the boundaries c_R, the row references m_R, the warps'
  // totals) hold channel c at (c / 4 % 2) * 64 + c / 8 * 4 + c % 4, so that a quarter-warp's
  // float4 reads of its 8 lanes' channels 8 co .. 8 co + 3 (then + 4 .. + 7) are 128 contiguous
  // bytes: in channel order they were 32 bytes apart, 2-way bank conflicts (Nsight Compute: 12M
  // excess wavefronts at H96 fixed). Lane co's channel 8 co + e is at 4 co + vo(e).
  const int cv = 4 * co;

  // ---- Phase 1a: q, k -> shared (cp.async); rows past the chunk are zeros ----------------
  // q and k land in the qA and kA tiles, which phase 1c overwrites in place. V comes after
  // phase 2: its tile holds A^M lo until then. Each thread copies the (row, chunk) pieces it
  // reads back in 1b and 1c, so its own cp.async wait is all they need.
  {
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int r = r0 + j;
      const uint32_t off = swz(r, ch0);
      if (r < len) {
        kdakit::cuda::cp_async_16(kdakit::cuda::smem_u32(smem + Plan::kQaOffset + off), qg + int64_t(r) * p.stride_q_t + c0);
        kdakit::cuda::cp_async_16(kdakit::cuda::smem_u32(smem + Plan::kKaOffset + off), kg + int64_t(r) * p.stride_k_t + c0);
      } else {
        *reinterpret_cast<uint4*>(smem + Plan::kQaOffset + off) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(smem + Plan::kKaOffset + off) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    kdakit::cuda::cp_async_commit();
  }

  // ---- Phase 1b: gate and running sum (registers), beta, then norms ----------------------
  // NOTE: every global load of this phase (dt_bias, the thread's four g rows, beta) is issued
  // before any of them is used. With the gate computed row by row after each row's load (and a
  // branch on scalar_gate per row), the compiler issued the loads one after another, each behind
  // the previous row's gate: five dependent DRAM round trips at the head of every CTA.
  float b2[kRowsPerThread][8];  // the raw g values first, then the base-2 gates, then their sums
  {
    // A_log and dt_bias (per head), raw: the exponential of A_log comes after the g loads.
    float a_log = 0.f;
    if constexpr (kGate == GateMode::kSoftplus) a_log = p.A_log[h];
    if constexpr (kGate == GateMode::kLowerBound) a_log = p.A_log != nullptr ? p.A_log[h] : 0.f;
    float dt[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) dt[e] = 0.f;
    if constexpr (kGate != GateMode::kPrecomputed) {
      if (p.dt_bias != nullptr) {
        if (p.scalar_gate) {
#pragma unroll
          for (int e = 0; e < 8; ++e) dt[e] = p.dt_bias[h];
        } else {
          load8(p.dt_bias + int64_t(h) * kHeadDim + c0, dt);
        }
      }
    }
    const GT* gg = static_cast<const GT*>(p.g) + brow * p.stride_g_b + tok0 * p.stride_g_t + int64_t(h) * p.stride_g_h;
    if (p.scalar_gate) {
#pragma unroll
      for (int j = 0; j < kRowsPerThread; ++j) {
        const int r = r0 + j;
        const float sv = r < len ? kdakit::cuda::to_float(gg[int64_t(r) * p.stride_g_t]) : 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) b2[j][e] = sv;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kRowsPerThread; ++j) {
        const int r = r0 + j;
        if (r < len) {
          load8(gg + int64_t(r) * p.stride_g_t + c0, b2[j]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) b2[j][e] = 0.f;
        }
      }
    }
    if (tid < len) {  // len <= 64: threads tid < 64 park their row's raw beta in beta_s
      const int64_t off = brow * p.stride_beta_b + (tok0 + tid) * p.stride_beta_t + int64_t(h) * p.stride_beta_h;
      beta_s[tid] = p.beta_fp32 ? static_cast<const float*>(p.beta)[off]
                                : kdakit::cuda::to_float(static_cast<const __nv_bfloat16*>(p.beta)[off]);
    }
    float a = 1.f;  // exp(A_log): without A_log, 1 (lower bound)
    if constexpr (kGate == GateMode::kSoftplus) a = -expf(a_log);
    if constexpr (kGate == GateMode::kLowerBound) a = p.A_log != nullptr ? expf(a_log) : 1.f;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const bool valid = r0 + j < len;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        // NOTE: rows past the chunk decay by nothing, so b2 of row 63 is b2 of row C' - 1.
        b2[j][e] = valid ? gate_log2<kGate>(b2[j][e], a, dt[e], p.lower_bound) : 0.f;
      }
    }
  }
  // Running sum: 4 local rows, then the warp's first 4 rows before its last 4 (one shuffle), then
  // the halves before this warp's (their totals through shared memory, in row order).
#pragma unroll
  for (int j = 1; j < kRowsPerThread; ++j) {
#pragma unroll
    for (int e = 0; e < 8; ++e) b2[j][e] += b2[j - 1][e];
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float y = __shfl_up_sync(0xffffffffu, b2[kRowsPerThread - 1][e], 16);
    const float add = rq != 0 ? y : 0.f;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) b2[j][e] += add;
  }
  float* warp_total = reinterpret_cast<float*>(smem + Plan::kWarpTotalOffset);  // [8 halves][128]: 8-row totals
  if (rq == 1) store_vo8(warp_total + hw * kHeadDim + cv, b2[3]);
  if (tid < kHeadDim / 4) {  // row 0: c_{-1} = 0
    reinterpret_cast<float4*>(bound)[tid] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (tid < kChunk) {
    beta_s[tid] = tid < len ? kdakit::cuda::beta_activation(beta_s[tid], p.use_beta_sigmoid, p.allow_neg_eigval) : 0.f;
  }
  kdakit::cuda::cp_async_wait_all();
  __syncthreads();
  {
    // The prefix of the halves before this one: c_{R-1} after the first 2 R (0 for R = 0), then
    // for a second-half warp the first half's total, which makes it b2 at row 16 R + 7.
    // NOTE: every warp adds the same totals in the same order, so c_R computed here by the warps
    // of later sub-blocks equals bit for bit the b2 of row 16 R + 15 that half 2 R + 1's warp writes.
    float pre[8], c_prev[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) pre[e] = 0.f;
#pragma unroll 1
    for (int w2 = 0; w2 < 2 * R; ++w2) add_vo8(pre, warp_total + w2 * kHeadDim + cv);
#pragma unroll
    for (int e = 0; e < 8; ++e) c_prev[e] = pre[e];
    if (hw & 1) add_vo8(pre, warp_total + (hw - 1) * kHeadDim + cv);
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) b2[j][e] += pre[e];
    }
    if (hw == kWarps - 1 && rq == 1) {  // decay = exp2(b2 of the last row)
      float4* dst = reinterpret_cast<float4*>(reinterpret_cast<float*>(blk + Layout::kDecayOffset) + c0);
      dst[0] = make_float4(fast_exp2(b2[3][0]), fast_exp2(b2[3][1]), fast_exp2(b2[3][2]), fast_exp2(b2[3][3]));
      dst[1] = make_float4(fast_exp2(b2[3][4]), fast_exp2(b2[3][5]), fast_exp2(b2[3][6]), fast_exp2(b2[3][7]));
    }
    if (hw & 1) {
      // The second-half warp of sub-block R: its last row's b2 is the boundary c_R, and its lanes
      // rq = 1 classify the sub-block's channels. Wide-span channels: masks (bytes of the 32-bit
      // words, channel 8 co + e at bit e of byte co) and two ascending lists of their indices: the
      // front list holds the channels whose first 8-row half spans at most max_span (their
      // diagonal tile's first half goes through the product, phase 1c), the back list (stored
      // from index 127 down) the others. And each channel's row reference m_R (the header's).
      const bool act = rq == 1;
      uint32_t front = 0u, back = 0u;
      float m[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float cp = c_prev[e];
        const float span = cp - b2[3][e], span0 = cp - pre[e];
        const bool wide = span > max_span;
        const bool steep = wide && span0 > max_span;
        m[e] = !wide ? cp - 0.5f * span : (!steep ? cp - 0.5f * span0 : cp);
        front |= uint32_t(wide && !steep) << e;
        back |= uint32_t(steep) << e;
      }
      if (act) {
        store_vo8(bound + (R + 1) * kHeadDim + cv, b2[3]);
        store_vo8(half_bound + R * kHeadDim + cv, m);
        uint8_t* mask_bytes = reinterpret_cast<uint8_t*>(mask);
        mask_bytes[R * 16 + co] = uint8_t(front | back);
        mask_bytes[kSubBlocks * 16 + R * 16 + co] = uint8_t(back);
      }
      int total_front = 0, total_back = 0;
      if (__any_sync(0xffffffffu, act && (front | back) != 0u)) {  // warp-uniform, rarely taken
        const int nf = act ? __popc(front) : 0, nb = act ? __popc(back) : 0;
        int incf = nf, incb = nb;
#pragma unroll
        for (int d = 1; d < 16; d *= 2) {
          const int yf = __shfl_up_sync(0xffffffffu, incf, d), yb = __shfl_up_sync(0xffffffffu, incb, d);
          if (co >= d) incf += yf, incb += yb;
        }
        if (act) {
          int kf = incf - nf, kb = incb - nb;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            if ((front >> e) & 1u) wide_list[R * kHeadDim + kf++] = uint8_t(c0 + e);
            if ((back >> e) & 1u) wide_list[R * kHeadDim + kHeadDim - 1 - kb++] = uint8_t(c0 + e);
          }
        }
        total_front = __shfl_sync(0xffffffffu, incf, 31);
        total_back = __shfl_sync(0xffffffffu, incb, 31);
      }
      if (lane == 31) {
        wide_count[R] = total_front;
        wide_count[kSubBlocks + R] = total_back;
      }
    }
  }
  // q/k row norms: the thread's 8 channels of its 4 rows, then sums over the 16 lanes of each
  // row group by a transposed butterfly (8 values, 8 shuffles): lane co ends with the sum of
  // value co / 2 = 2 j + (0: q, 1: k).
  // NOTE: the __syncwarp tells the compiler that the warp is converged after the classification's
  // branches; without it every shuffle below also got a divergent-warp fallback (~150 SASS
  // instructions past the exit, never run, counted by the code-size budget).
  __syncwarp();
  {
    float v[8];
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      float qf[8], kf[8];
      unpack8(*reinterpret_cast<const uint4*>(smem + Plan::kQaOffset + swz(r0 + j, ch0)), qf);
      unpack8(*reinterpret_cast<const uint4*>(smem + Plan::kKaOffset + swz(r0 + j, ch0)), kf);
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        sq += qf[e] * qf[e];
        sk += kf[e] * kf[e];
      }
      v[2 * j] = sq;
      v[2 * j + 1] = sk;
    }
#pragma unroll
    for (int step = 0; step < 3; ++step) {  // lanes 8, 4, 2 apart: keep half of the values
      const int dist = 8 >> step, n = 4 >> step;
      const bool upper = (co & dist) != 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (i < n) {
          const float send = upper ? v[i] : v[i + n];
          const float keep = upper ? v[i + n] : v[i];
          v[i] = keep + __shfl_xor_sync(0xffffffffu, send, dist);
        }
      }
    }
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
    if ((co & 1) == 0) {
      const int idx = co >> 1, r = r0 + (idx >> 1);
      if (idx & 1) {
        row_k[r] = p.use_qk_l2norm ? kdakit::cuda::l2norm_scale(v[0]) : 1.f;
      } else {
        row_q[r] = (p.use_qk_l2norm ? kdakit::cuda::l2norm_scale(v[0]) : 1.f) * p.scale;
      }
    }
  }
  __syncthreads();

  // ---- Phase 1c: elementwise outputs ------------------------------------------------------
  {
    // Per-sub-block constants are re-read from shared memory where needed: keeping them in
    // registers would spill.
    const float* c_cur = bound + (R + 1) * kHeadDim + cv;  // element e at c_cur[vo(e)]
    const float* m_row = half_bound + R * kHeadDim + cv;  // m_R
    // The diagonal tile's column operands of this thread's rows leave out (-inf: zero) the
    // channels wide in the sub-block (rows of the second half) or within the first half (rows
    // of the first half); their terms are summed per element in phase 3.
    const uint32_t left_out = (mask[((r0 & (kSubBlock - 1)) < kSubBlock / 2 ? kSubBlocks * 4 : 0) + R * 4 + (c0 >> 5)] >>
                               (c0 & 31)) & 0xffu;
    // One pass over the thread's rows: Kh, Qt (block), B^(R) (shared), Kt, A^M, A^L (shared, in
    // place over k and q: each thread overwrites only the pieces it copied and reads), then the
    // B^(R') copies for R' > R.
    // NOTE: B^(R) and Kh share one exponential per element: t = exp2(a - b2), B^(R) = kn t and
    // kn F = B^(R) exp2(c_R - a), with a = m_R, or a = c_R (t = F) for a left-out channel, whose
    // B^(R) entries are then zeroed after the loop (a branch lower-bound gates never take). For a
    // channel that is not wide both factors stay normal (|m_R - b2| and c_R - m_R are at most
    // max_span / 2: 108, or 96 without the in-kernel norm), so the product flushes only where
    // exp2(c_R - b2) itself would. For the first-half rows of a wide channel that is not left out
    // (m_R the first half's midpoint), exp2(c_R - m_R) flushes to zero when c_R - m_R < -126, and
    // with it F of rows b2 < m_R; there F = exp2(c_R - m_R) exp2(m_R - b2) < 2^(-126 + 108) =
    // 2^-18, so the terms lost (Kh's, and B^(R')'s against later rows, whose decay is at most F)
    // are below 2^-18 of |k_r kn_s|: the bound the A operands already keep (kernel header). The
    // two-pass form (two exponentials) unpacked and scaled k twice and ran ~3 more instructions
    // per element on the path every thread takes.
    float kfr[kRowsPerThread][8];  // kn F, F = exp2(c_R - b2) <= 1
    {
      float* const wide_b2 = wide_b2_scratch(blk);
      uint16_t* const wide_k = wide_k_scratch(blk);
      float kh_fac[8], a_exp[8], s_fac[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        kh_fac[e] = fast_exp2(bound[kSubBlocks * kHeadDim + cv + vo(e)] - c_cur[vo(e)]);
        a_exp[e] = (left_out >> e) & 1u ? c_cur[vo(e)] : m_row[vo(e)];
        s_fac[e] = fast_exp2(c_cur[vo(e)] - a_exp[e]);  // 2^(-span / 2) (wide: less), or 1 if left out
      }
      // NOTE: the wide channels' scratch rows behind one branch ahead of the rows' loop, not as
      // per-element predicates inside it: predicated, its 64 stores and their conversions were
      // issued by every thread of every CTA (~130 issue slots) for channels that are almost never
      // wide (never, for lower-bound gates with the default bound). k is still raw in kA here.
      if (left_out != 0u) {  // the rows phase 3 reads: see there
        // All eight channels' scratch columns (phase 3 reads the flagged ones; the others are
        // block space phase 5 overwrites): per channel the thread's 4 rows are one 16-byte b2 run
        // and one 8-byte k run.
        uint4 raw[kRowsPerThread];
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) raw[j] = *reinterpret_cast<const uint4*>(smem + Plan::kKaOffset + swz(r0 + j, ch0));
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          *reinterpret_cast<float4*>(wide_b2 + (c0 + e) * kChunk + r0) = make_float4(b2[0][e], b2[1][e], b2[2][e], b2[3][e]);
          const uint32_t sel = (e & 1) ? 0x7632u : 0x5410u;  // the high or low bf16 of each row's word e / 2
          const uint32_t* w0 = &raw[0].x + (e >> 1);
          const uint32_t* w1 = &raw[1].x + (e >> 1);
          const uint32_t* w2 = &raw[2].x + (e >> 1);
          const uint32_t* w3 = &raw[3].x + (e >> 1);
          *reinterpret_cast<uint2*>(wide_k + (c0 + e) * kChunk + r0) =
              make_uint2(__byte_perm(*w0, *w1, sel), __byte_perm(*w2, *w3, sel));
        }
      }
      // Qt and Kt from exp2(b2) <= 1 (one exponential: it flushes to zero where the product
      // exp2(b2 - c_{R-1}) exp2(c_{R-1}) would, below 2^-126); A^M, A^L from exp2(b2 - m_R),
      // at most 2^(max_span / 2). The row reference m_R: the sub-block's midpoint, or for a wide
      // channel the first half's midpoint (its rows' factors are then <= 2^(span0 / 2), the
      // second half's <= 1) or c_{R-1} when that half too spans more than max_span; the column
      // operands match.
#pragma unroll
      for (int j = 0; j < kRowsPerThread; ++j) {
        const int r = r0 + j;
        const uint32_t off = swz(r, ch0);
        float qn[8], kn[8], kd[8], out[8];
        unpack8(*reinterpret_cast<const uint4*>(smem + Plan::kQaOffset + off), qn);
        unpack8(*reinterpret_cast<const uint4*>(smem + Plan::kKaOffset + off), kn);
        const float sq = row_q[r], sk = row_k[r];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          qn[e] *= sq;
          kn[e] *= sk;
          kd[e] = kn[e] * fast_exp2(a_exp[e] - b2[j][e]);
          kfr[j][e] = kd[e] * s_fac[e];
          out[e] = kfr[j][e] * kh_fac[e];
        }
        if (p.f16_block) {  // one fp16 term (11 significant bits) and no Kh lo
          *reinterpret_cast<uint4*>(blk + Layout::kKhOffset + size_t(r) * 256 + c0 * 2) = pack8_block(out, true);
        } else {
          uint4 kh_hi, kh_lo;
          split8(out, kh_hi, kh_lo);
          *reinterpret_cast<uint4*>(blk + Layout::kKhOffset + size_t(r) * 256 + c0 * 2) = kh_hi;
          *reinterpret_cast<uint4*>(blk + Layout::kKhLoOffset + size_t(r) * 256 + c0 * 2) = kh_lo;
        }
        *reinterpret_cast<uint4*>(smem + Plan::kKbOffset + swz(kb_row_offset(R) + r, ch0)) = pack8(kd);
        float fq[8], fa[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          fq[e] = fast_exp2(b2[j][e]);
          fa[e] = fast_exp2(b2[j][e] - m_row[vo(e)]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = qn[e] * fq[e];
        *reinterpret_cast<uint4*>(blk + Layout::kQtOffset + size_t(r) * 256 + c0 * 2) = pack8_block(out, p.f16_block);
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = kn[e] * fq[e];
        *reinterpret_cast<uint4*>(smem + Plan::kKtOffset + off) = pack8(out);
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = qn[e] * fa[e];
        uint4 am_hi, am_lo;  // A^M as bf16 hi + lo (M's product takes both)
        split8(out, am_hi, am_lo);
        *reinterpret_cast<uint4*>(smem + Plan::kQaOffset + off) = am_hi;
        *reinterpret_cast<uint4*>(smem + Plan::kAmLoOffset + off) = am_lo;
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = kn[e] * fa[e];
        *reinterpret_cast<uint4*>(smem + Plan::kKaOffset + off) = pack8(out);
      }
      if (left_out != 0u) {  // the left-out channels' B^(R) entries (diagonal tile) to zero
        uint32_t keep[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          keep[i] = ((left_out >> (2 * i)) & 1u ? 0u : 0x0000ffffu) |
                    ((left_out >> (2 * i + 1)) & 1u ? 0u : 0xffff0000u);
        }
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) {
          uint4* const kb = reinterpret_cast<uint4*>(smem + Plan::kKbOffset + swz(kb_row_offset(R) + r0 + j, ch0));
          const uint4 w = *kb;
          *kb = make_uint4(w.x & keep[0], w.y & keep[1], w.z & keep[2], w.w & keep[3]);
        }
      }
    }
#pragma unroll
    for (int Rb = 1; Rb < kSubBlocks; ++Rb) {
      if (Rb > R) {
        float b_fac[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          b_fac[e] = fast_exp2(half_bound[Rb * kHeadDim + cv + vo(e)] - c_cur[vo(e)]);  // m_{R'} <= c_{R'-1} <= c_R: at most 1
        }
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) {
          float kb[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) kb[e] = kfr[j][e] * b_fac[e];
          *reinterpret_cast<uint4*>(smem + Plan::kKbOffset + swz(kb_row_offset(Rb) + r0 + j, ch0)) = pack8(kb);
        }
      }
    }
  }
  __syncthreads();

  // ---- Phase 2: L and M on tensor cores (lm_segment: up to two segments per warp) --------
  const int g = lane >> 2, t = lane & 3;
  float acc0[4][4], acc1[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc0[i][c] = acc1[i][c] = 0.f;
  }
  lm_products(acc0, acc1, warp, smem, lane);
  __syncthreads();  // qA, A^M lo, kA and kB are no longer read

  // ---- V -> shared (cp.async, into the A^M lo tile), waited for before phase 5 -------------
  {
#pragma unroll
    for (int u = 0; u < kChunk * 16 / kThreads; ++u) {
      const int c = tid + u * kThreads;
      const int r = c >> 4, ch = c & 15;
      const uint32_t off = swz(r, ch);
      if (r < len) {
        kdakit::cuda::cp_async_16(kdakit::cuda::smem_u32(smem + Plan::kVOffset + off), vg + int64_t(r) * p.stride_v_t + ch * 8);
      } else {
        *reinterpret_cast<uint4*>(smem + Plan::kVOffset + off) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    kdakit::cuda::cp_async_commit();
  }

  // ---- Phase 3: L, M to shared fp32; wide-span terms; M to the block ---------------------
  float* Lf = reinterpret_cast<float*>(smem + Plan::kLOffset);
  float* Tf = reinterpret_cast<float*>(smem + Plan::kTOffset);  // M lives in the T space until it is stored
  // NOTE: M leaves from the accumulators as bf16, and its six blocks above the diagonal as zeros:
  // no fp32 round trip through shared memory. Without wide-span channels (every CTA of a
  // lower-bound gate, most of the others) that is all of it, with no conversion pass and one
  // barrier less; with them only the four diagonal tiles, which their per-element terms touch,
  // take the fp32 round trip (all ten did before session 23).
  uint32_t any_wide = 0;
#pragma unroll
  for (int i = 0; i < kSubBlocks; ++i) {  // the first mask: every wide channel
    const uint4 m4 = reinterpret_cast<const uint4*>(mask)[i];
    any_wide |= m4.x | m4.y | m4.z | m4.w;
  }
  lm_store(acc0, acc1, warp, Lf, Tf, blk + Layout::kMOffset, any_wide != 0u, p.f16_block, g, t);
  if (tid < 6 * 2 * kSubBlock) {  // blocks (R, S > R): 6 x 16 rows x 2 16-byte halves
    const int b = tid >> 5, rr = (tid >> 1) & 15, hh = tid & 1;
    const int R = b < 3 ? 0 : b < 5 ? 1 : 2, S = b < 3 ? b + 1 : b < 5 ? b - 1 : 3;
    *reinterpret_cast<uint4*>(blk + Layout::kMOffset + size_t(kSubBlock * R + rr) * 128 + (kSubBlock * S + 8 * hh) * 2) =
        make_uint4(0u, 0u, 0u, 0u);
  }
  __syncthreads();
  // Per-element diagonal-tile terms of wide-span channels. Thread (Rb, i, j) = (tid / 64,
  // tid / 8 % 8, tid % 8) owns entry (i, j) of the three 8 x 8 quadrants of sub-block Rb's
  // diagonal tile, second half x second half, first x first and second x first, in that order,
  // and adds there the terms of its flagged channels in list order: every wide channel's in the
  // first quadrant (the product left its second-half columns out), only the back list's in the
  // other two (channels steep within the first half, whose diagonal tile the product left out).
  // NOTE: so the front list's channels cost 36 entries each instead of the tile's 136, and the
  // four sub-blocks' entries run side by side on the CTA's 256 threads (the benchmark's softplus
  // inputs: 1.4% of (sub-block, channel) pairs wide, 0.002% steep within an 8-row half).
  if (any_wide != 0u) {
    const int Rb = tid >> 6, qi = (tid >> 3) & 7, qj = tid & 7;
    const float* const wide_b2 = wide_b2_scratch(blk);
    const uint16_t* const wide_k = wide_k_scratch(blk);
    const uint8_t* list = wide_list + Rb * kHeadDim;
    const int count_front = wide_count[Rb], count_back = wide_count[kSubBlocks + Rb];
#pragma unroll 1
    for (int quad = 0; quad < 3; ++quad) {
      const int r = kSubBlock * Rb + qi + (quad != 1 ? kSubBlock / 2 : 0);
      const int s = kSubBlock * Rb + qj + (quad == 0 ? kSubBlock / 2 : 0);
      const int count = (quad == 0 ? count_front : 0) + count_back;
      if ((quad != 2 && qj > qi) || r >= len || count == 0) continue;
      float dl = 0.f, dm = 0.f;
      // NOTE: a counted loop over the channel lists. Each thread now runs one sub-block's
      // lists (a quarter of the old loop's trips, which walked the four sub-blocks in turn on
      // a 16 x 16 mapping and was unrolled by 2); unrolled by 2 here it spills (36 bytes at 128
      // registers), so it is not. Walks over the mask bits, unrolls by 4 and 8, and all four
      // sub-blocks in one loop of the old mapping all measured slower than the old loop
      // (docs/design/20261129-prefill.md, sessions 13 and 14).
      // NOTE: the row-s operands come from the channel-major scratch, where a quadrant row's 8
      // columns are one 32- or 16-byte run; from a row-major b2 scratch and k they were a sector
      // per element (Nsight Compute, H32 softplus benchmark inputs: 9.0M excess L2 sectors of
      // 35.0M). The row-r operands are one address per 8 lanes.
      const int skip = quad == 0 ? count_front : 0;  // then the back list, read from index 127 down
      const __nv_bfloat16* kr_row = kg + int64_t(r) * p.stride_k_t;
      const __nv_bfloat16* qr_row = qg + int64_t(r) * p.stride_q_t;
      const float rk = row_k[r], rks = row_k[s], rq = row_q[r];
      const bool strict = s < r;
#pragma unroll 1
      for (int j = 0; j < count; ++j) {
        const int i = j < skip ? list[j] : list[kHeadDim - 1 - (j - skip)];
        const float e = fast_exp2(__ldcg(wide_b2 + i * kChunk + r) - __ldcg(wide_b2 + i * kChunk + s));
        const float kr = __bfloat162float(kr_row[i]) * rk;
        const float ksv = __bfloat162float(__ushort_as_bfloat16(__ldcg(wide_k + i * kChunk + s))) * rks;
        const float qr = __bfloat162float(qr_row[i]) * rq;
        if (strict) dl += kr * ksv * e;
        dm += qr * ksv * e;
      }
      Lf[r * Plan::kLdF + s] += dl;
      Tf[r * Plan::kLdF + s] += dm;
    }
    __syncthreads();
    {  // M's diagonal tiles: 64 rows x 4 quads of 4 bf16, one float4 per thread
      // NOTE: a quarter-warp's 8 lanes take one quad of 8 consecutive rows: rows are 16 bytes
      // apart mod 128 (kLdF), so conflict-free (4 lanes on one row's 64 bytes were 2-way).
      static_assert(kThreads == kChunk * 4, "one thread per (row, quad) of the diagonal tiles");
      const int r = (tid & 7) + 8 * (tid >> 5), col = kSubBlock * (r / kSubBlock) + 4 * ((tid >> 3) & 3);
      const float4 x = *reinterpret_cast<const float4*>(Tf + r * Plan::kLdF + col);
      *reinterpret_cast<uint2*>(blk + Layout::kMOffset + size_t(r) * 128 + col * 2) =
          make_uint2(pack_block2(x.x, x.y, p.f16_block), pack_block2(x.z, x.w, p.f16_block));
    }
    __syncthreads();
  }

  // ---- Phase 4: T = (I + diag(beta) L)^-1 --------------------------------------------------
  // Warp R < 4: diagonal block T_RR, in registers (C layout), also to shared fp32.
  // Every block of T diag(beta) goes straight to the bf16 hi/lo tiles of phase 5 (no fp32 copy
  // of the off-diagonal blocks, no staging pass).
  unsigned char* tb_hi = smem + Plan::kTbHiOffset;
  unsigned char* tb_lo = smem + Plan::kTbLoOffset;
  float trr[2][4];
  if (warp < kSubBlocks) {
    tc_diag_inverse(Lf, beta_s, warp, g, t, trr);
    store_tile(Tf, warp, warp, g, t, trr);
    store_tile_hilo(tb_hi, tb_lo, beta_s, warp, warp, g, t, trr);
  }
  __syncthreads();
  // The off-diagonal blocks, on six warps in three steps (its own barriers).
  tc_offdiag_blocks(Lf, Tf, beta_s, warp, g, t, tb_hi, tb_lo);
  kdakit::cuda::cp_async_wait_all();  // V
  __syncthreads();

  // ---- Phase 5: W = T diag(beta) Kt, U0 = T diag(beta) V from the hi/lo tiles, balanced ----
  // Warp w: product w / 4 (0: W from Kt, 1: U0 from V), output columns 32 (w % 4) .. + 31, all
  // 64 rows as two halves of two sub-blocks (32 accumulators); T is lower triangular, so
  // sub-block R needs k-steps 0..R. Every warp issues 80 mma.
  const int cb = 32 * (warp & 3);
  const bool is_u0 = warp >= 4;
  const unsigned char* b_tile = smem + (is_u0 ? Plan::kVOffset : Plan::kKtOffset);
  // NOTE: the two halves as a rolled loop (code size, the header's NOTE).
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    float acc5[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int n = 0; n < 4; ++n) acc5[i][n][0] = acc5[i][n][1] = acc5[i][n][2] = acc5[i][n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < 2 * half + 2; ++ks) {
      uint32_t bf[2][4];
      const int brow = kSubBlock * ks + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        kdakit::cuda::ldmatrix_x4_trans(bf[np], kdakit::cuda::smem_u32(b_tile + swz(brow, (cb + 16 * np) / 8 + (lane >> 4))));
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int Rb = 2 * half + i;
        if (ks <= Rb) {
          uint32_t ahi[4], alo[4];
          const uint32_t aoff = swz64(kSubBlock * Rb + (lane & 15), 2 * ks + (lane >> 4));
          kdakit::cuda::ldmatrix_x4(ahi, kdakit::cuda::smem_u32(tb_hi + aoff));
          kdakit::cuda::ldmatrix_x4(alo, kdakit::cuda::smem_u32(tb_lo + aoff));
#pragma unroll
          for (int np = 0; np < 2; ++np) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              kdakit::cuda::mma_bf16_16816(acc5[i][2 * np + j], alo, bf[np][2 * j], bf[np][2 * j + 1]);
              kdakit::cuda::mma_bf16_16816(acc5[i][2 * np + j], ahi, bf[np][2 * j], bf[np][2 * j + 1]);
            }
          }
        }
      }
    }
    // NOTE: each (row, 8-column) piece is a whole 32-byte sector of U0 (half of one of W),
    // so storing the accumulators directly needs no staging tile and no barrier.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = kSubBlock * (2 * half + i) + g + 8 * hr;
          const int c = cb + 8 * n + 2 * t;
          if (is_u0) {
            *reinterpret_cast<float2*>(blk + Layout::kU0Offset + size_t(r) * 512 + c * 4) =
                make_float2(acc5[i][n][2 * hr], acc5[i][n][2 * hr + 1]);
          } else {
            *reinterpret_cast<uint32_t*>(blk + Layout::kWOffset + size_t(r) * 256 + c * 2) =
                pack_block2(acc5[i][n][2 * hr], acc5[i][n][2 * hr + 1], p.f16_block);
          }
        }
      }
    }
  }
  // A fixed batch without the plan kernel: this row's plan entries, by the CTA of its first chunk
  // at head 0 (only the kernels after this one read them). NOTE: here at the end, where registers
  // are free; at the top, behind the opening loads, it took the kernel from 125 to 127 registers.
  // (A packed single sequence's are written at the top: its chunk 0 may have no work.)
  if (kExtras && p.fixed_chunk_offsets != nullptr && !p.packed && tid == 0 && h == 0 && chunk_in_seq == 0) {
    p.fixed_chunk_offsets[n] = chunk;
    if (n == p.num_seqs - 1) p.fixed_chunk_offsets[n + 1] = chunk + p.chunks_per_row;
    p.fixed_seq_start[n] = 0;
    p.fixed_seq_len[n] = p.seqlen;
  }
}

// ------------------------------------------------------------------------------------------
// Launcher of one instantiation
// ------------------------------------------------------------------------------------------
inline Status cuda_status(cudaError_t err, int line, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, std::string("prep/kernel.cuh:") + std::to_string(line) + ": " + what +
                                            ": " + cudaGetErrorString(err));
}

template <GateMode kGate, bool kGFp32>
Status launch_prep_kernel(const PrepParams& params, int64_t max_chunks, cudaStream_t stream) {
  using GT = std::conditional_t<kGFp32, float, __nv_bfloat16>;
  const bool extras = params.fixed_chunk_offsets != nullptr || params.single_cu != nullptr;
  auto* kernel = extras ? &kda_prefill_prep_sm90_kernel<kGate, GT, true> : &kda_prefill_prep_sm90_kernel<kGate, GT, false>;
  constexpr int kSmem = int(SharedMemoryPlan::kBytes);
  // NOTE: the attributes are per function and device; setting them once per device keeps the
  // run path free of repeated driver calls (common/device_setup.cuh).
  // NOTE: the largest carveout lets two CTAs (2 x 107 KB) share an SM.
  static kdakit::cuda::PerDeviceOnce attr_once, extras_attr_once;  // per function and device
  const cudaError_t attr_err = kdakit::cuda::set_up_once_per_device(extras ? extras_attr_once : attr_once, [&] {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   int(cudaSharedmemCarveoutMaxShared));
  });
  if (Status s = cuda_status(attr_err, __LINE__, "cudaFuncSetAttribute(prep)"); !s.ok()) return s;
  const int64_t ctas = max_chunks * params.num_v_heads;
  if (ctas <= 0) return Status::Ok();
  if (ctas > int64_t(INT32_MAX)) {
    return Status(StatusCode::kUnsupported, "prefill prep: supports up to 2^31 - 1 (chunk, value head) pairs");
  }
  // NOTE: a routed call (the tile kernel launched just before, which triggers this grid's launch
  // at its start) with PDL: the side that exits, which is this grid when the tile kernel does
  // the work, then exits on the SMs the tile kernel's last wave leaves free, instead of after it
  // (13,152 CTAs at H96 1024 x 8: 15.3 us on an H100, session 39). The chunk side does not read
  // what the tile kernel writes (nothing, on that side).
  const bool after_tile = params.route.longest != nullptr;
  return kdakit::cuda::launch_pdl_kernel(kernel, "kda_prefill_prep_sm90_kernel", dim3(unsigned(ctas)), kThreads,
                                         kSmem, stream, after_tile, params);
}

}  // namespace kdakit::sm90::prefill::prep
