// kda_prefill_fused_sm90_kernel: the whole chunked KDA prefill in one kernel, with no workspace
// round trip between the token-parallel preparation and the chunk-serial recurrence.
//
// Math (per sequence n, value head h, chunk of C = 64 tokens, rows r, s; b_r the base-2 running
// gate sum per key channel; qn = scale q / ||q||, kn = k / ||k|| with the optional norms):
//   Qt = qn 2^b,  Kt = kn 2^b,  Kh = kn 2^(b_63 - b)                      [64 x 128]
//   L[r,s] = sum_i kn_r kn_s 2^(b_r - b_s) (s < r),  M[r,s] = sum_i qn_r kn_s 2^(b_r - b_s) (s <= r)
//   T = (I + diag(beta) L)^-1,   W = T diag(beta) Kt,   U0 = T diag(beta) V
//   with S^T the fp32 state (V x K), per chunk:
//     U^T = U0^T - S0^T W^T,   O^T = S0^T Qt^T + U^T M^T,   S^T = S0^T diag(2^b_63) + U^T Kh
// Exponent safety: every factor is a power of 2 of a non-positive exponent, except inside the
// diagonal 16 x 16 tiles of L and M, whose factors 2^(b_r - m) and 2^(m - b_s) around the
// sub-block midpoint m stay within 2^(span / 2) (span <= kMaxDiagSpan; wider channels are
// summed per element). Products are formed as (terms <= 1) x (terms <= 1) wherever a single
// underflow could hide a non-negligible value.
//
// Grid: one CTA per (sequence, value head, value slice of kValueRows = 64 kConsumers rows).
// Warp roles (one CTA of 1 + kConsumers warpgroups):
//   producer warpgroup (warps 0-3): per chunk, from TMA-loaded raw q, k, g (and beta):
//     A  thread c = key channel c: gate, running sum b (shared fp32), sub-block references.
//     B  warp R = rows 16R..16R+15 (sub-block R): q/k row norms from the mma A fragments.
//     C1 column factors: the B tile (kn 2^(m - b), operand of L and M) and Kh.
//     C2 Qt, Kt; L and M on mma.sync m16n8k16 (A fragments built in registers, B from the tile).
//     D  wide-span terms; L to fp32, M to bf16; T diag(beta) on tensor cores (common/tc_inverse).
//     E  W = T diag(beta) Kt with wgmma (bf16 hi + lo A passes).
//   consumer warpgroup c (64 value rows of S^T as the fp32 m64n128 accumulator, 64 registers
//   per thread, from the first chunk to the last):
//     U0^T = V^T (T diag(beta))^T (wgmma, both from shared memory, hi + lo), minus S0^T W^T
//     (A = bf16 S0^T from registers), O^T = S0^T Qt^T + U^T M^T, state decay, S^T += U^T Kh
//     (U^T as bf16 hi + lo A fragments: 16 mantissa bits, see 20261129-prefill-recurrence.md).
// Pipeline (config.h): Qt/Kh/decay double-buffered, W, M, T diag(beta) single-buffered (the
// producer writes them late in its chunk, the consumers release them early in theirs), raw q/k/g
// single-buffered (refilled for chunk j+1 once phase D1 of chunk j is done), V per consumer
// warpgroup (refilled by that warpgroup once its chunk-j U0 product is done).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/common/device_setup.cuh"
#include "cuda/common/dtype.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/sm90/prefill/common/gate.cuh"
#include "cuda/sm90/prefill/common/gmma.cuh"
#include "cuda/sm90/prefill/common/o_store.cuh"
#include "cuda/sm90/prefill/common/ptx.cuh"
#include "cuda/sm90/prefill/common/state_io.cuh"
#include "cuda/sm90/prefill/common/tc_inverse.cuh"
#include "cuda/sm90/prefill/common/tensor_map.h"
#include "cuda/sm90/prefill/common/token_params.h"
#include "cuda/sm90/prefill/fused/config.h"
#include "cuda/sm90/prefill/fused/launch.h"

namespace kdakit::sm90::prefill::fused {

using kdakit::cuda::fast_exp2;
using kdakit::cuda::pack_bf16x2;

// Kernel-side parameters, derived from PrefillParams by the launcher (the state fields in the
// common base).
struct KernelParams : common::StateParams {
  const int64_t* seq_start;  // [N] plan region
  const int32_t* seq_len;    // [N] plan region
  int32_t num_seqs;
  int32_t num_v_heads;
  int32_t v_heads_per_qk_head;
  bool packed;  // cu_seqlens given: every sequence lives in batch row 0

  // g through plain loads (fp32 g or the scalar gate); bf16 per-channel g comes by TMA.
  const void* g;  // [B, T, HV, K] or [B, T, HV]
  int64_t stride_g_b, stride_g_t, stride_g_h;
  bool g_tma, g_fp32, scalar_gate;
  const void* beta;  // [B, T, HV]
  int64_t stride_beta_b, stride_beta_t, stride_beta_h;
  bool beta_fp32;
  const float* A_log;    // [HV], nullable
  const float* dt_bias;  // [HV, K] ([HV] with the scalar gate), nullable

  __nv_bfloat16* o;  // [B, T, HV, V]
  int64_t stride_o_b, stride_o_t, stride_o_h;
  bool o_pairs;  // two neighbouring value channels of o are one aligned 4-byte store

  float scale;
  float lower_bound;
  bool use_qk_l2norm;
  bool use_beta_sigmoid;
  bool allow_neg_eigval;
};

struct TmaParams {
  CUtensorMap q, k, v, g;  // (128, heads, T, B) bf16, boxes 64 x 1 x 64 x 1, 128B swizzle
};

// ---- shared-memory addressing -------------------------------------------------------------
// bf16 [64][128] tile as two [64][64] halves: byte address of 16-byte chunk `chunk` (0..15) of
// `row` (the TMA 128-byte swizzle).
__device__ __forceinline__ uint32_t tile_addr(uint32_t base, int row, int chunk) {
  return base + uint32_t(chunk >> 3) * uint32_t(SharedMemoryPlan::kHalf) + uint32_t(row) * 128u +
         (uint32_t((chunk & 7) ^ (row & 7)) << 4);
}
// bf16 [64][64] tile: chunk 0..7.
__device__ __forceinline__ uint32_t half_addr(uint32_t base, int row, int chunk) {
  return base + uint32_t(row) * 128u + (uint32_t(chunk ^ (row & 7)) << 4);
}
// fp32 [64][128] running sums: byte offset of (row, channel); 16-byte chunks XOR-swizzled by
// 2 (row % 8), so 8-byte reads of (rows g, channels 2t + 8j) across a warp hit distinct banks.
__device__ __forceinline__ uint32_t b2_off(int row, int c) {
  return uint32_t(row) * 512u + (uint32_t((c >> 2) ^ ((row & 7) << 1)) << 4) + uint32_t(c & 3) * 4u;
}

__device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

using common::gmma_rs;
using common::gmma_ss;
using common::OpNegRS64;
using common::OpRS64;
using common::OpState;
using common::OpU0;
using common::OpW;

// Descriptors: K-major operands step 32 bytes per k16 inside a 128-byte row (two 64-column
// halves 8 KB apart for K = 128); MN-major ones step 16 rows (2 KB) per k16.
__device__ __forceinline__ uint64_t desc_k128(uint32_t base,
                                              int kk) {  // [64][128] tile, K = channels
  return ptx::smem_desc(
      base + uint32_t(kk >> 2) * uint32_t(SharedMemoryPlan::kHalf) + uint32_t(kk & 3) * 32u, 16,
      1024);
}
__device__ __forceinline__ uint64_t desc_k64(uint32_t base, int kk) {  // [64][64] tile, K = columns
  return ptx::smem_desc(base + uint32_t(kk) * 32u, 16, 1024);
}
__device__ __forceinline__ uint64_t desc_mn(uint32_t base,
                                            int kk) {  // K = rows (tokens), MN = columns
  return ptx::smem_desc(base + uint32_t(kk) * 2048u, uint32_t(SharedMemoryPlan::kHalf), 1024);
}

// ---- work items -------------------------------------------------------------------------------
// A work item is one (sequence n, value head h, value slice z), z fastest; CTA b takes items
// b, b + gridDim.x, ... (a persistent grid: the producer prepares the next item's first chunk
// while the consumers finish the last one's).
struct Item {
  int n, h, z;
  int len;        // tokens (0 for an empty sequence)
  int chunks;     // ceil(len / 64)
  int brow;       // batch row of the tensors (0 when packed)
  int64_t start;  // first token within the row
};
// A warpgroup's copy of its current item (shared memory, see the consumer loop; the producer
// uses o_off for the first token, n for the batch row, len and h).
struct ItemRecord {
  int64_t o_off;    // element offset of the warpgroup's first value channel of token 0 in o
  int64_t cs_base;  // first chunk-state entry of the sequence
  int len, chunks, n, h, vbase, pad;
};
using common::vld;
template <int kSlices>
__device__ __forceinline__ Item item_at(const KernelParams& p, int item) {
  Item it;
  it.z = item % kSlices;
  it.h = (item / kSlices) % p.num_v_heads;
  it.n = item / kSlices / p.num_v_heads;
  it.len = max(p.seq_len[it.n], 0);
  it.chunks = (it.len + kChunk - 1) / kChunk;
  it.brow = p.packed ? 0 : it.n;
  it.start = p.seq_start[it.n];
  return it;
}
// The chunk processed after chunk j of item `item` (by this CTA): chunk j + 1, or chunk 0 of the
// next item with tokens; ok = false past the last.
struct NextChunk {
  bool ok;
  int j;
  Item it;
};
template <int kSlices>
__device__ __forceinline__ NextChunk next_chunk(const KernelParams& p, int num_items, int item,
                                                const Item& it, int j) {
  if (j + 1 < it.chunks) return {true, j + 1, it};
  for (int i = item + int(gridDim.x); i < num_items; i += int(gridDim.x)) {
    const Item nx = item_at<kSlices>(p, i);
    if (nx.chunks > 0) return {true, 0, nx};
  }
  return {false, 0, it};
}

// ---- the kernel ---------------------------------------------------------------------------------
template <GateMode kGate, int kConsumers>
__global__ void __launch_bounds__(Config<kConsumers>::kThreads, 1)
    kda_prefill_fused_sm90_kernel(const __grid_constant__ KernelParams p,
                                  const __grid_constant__ TmaParams tma) {
  using Cfg = Config<kConsumers>;
  using Smem = SharedMemoryPlan;

  extern __shared__ uint8_t smem_raw[];
  // NOTE: aligned by pointer arithmetic on the __shared__ array (not through an integer), so the
  // compiler keeps every access in the shared window: 32-bit LDS/STS addresses, not generic ones.
  uint8_t* smem = smem_raw + ((1024u - (ptx::smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Smem::kBarrierOffset);
  const uint32_t sbase = ptx::smem_addr(smem);

  // NOTE: read through a shuffle so that the compiler knows the role is warp-uniform (wgmma
  // in a path it cannot prove uniform gets serialized).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / kWarpGroup), 0);

  if (threadIdx.x == 0) {
    ptx::mbarrier_init(&bars[kRawFull], 1);
    ptx::mbarrier_init(&bars[kVFull], 1);
    ptx::mbarrier_init(&bars[kVFull + 1], 1);
    for (int s = 0; s < 2; ++s) {
      ptx::mbarrier_init(&bars[kQtKhFull + s], 1);
      ptx::mbarrier_init(&bars[kQtKhEmpty + s], 4 * kConsumers);
    }
    ptx::mbarrier_init(&bars[kMFull], 1);
    ptx::mbarrier_init(&bars[kMEmpty], 4 * kConsumers);
    ptx::mbarrier_init(&bars[kWFull], 1);
    ptx::mbarrier_init(&bars[kWEmpty], 4 * kConsumers);
    ptx::mbarrier_init(&bars[kTbFull], 1);
    ptx::mbarrier_init(&bars[kTbEmpty], 4 * kConsumers);
    ptx::fence_barrier_init();
  }
  // T diag(beta) is lower triangular: the producer writes only its lower blocks, so the upper
  // ones are zeroed once here (both wgmma products read the whole tile).
  if (wg == 0) {
    uint4* tb = reinterpret_cast<uint4*>(smem + Smem::kTbHiOffset);
    for (int i = threadIdx.x; i < int(2 * Smem::kHalf / 16); i += kWarpGroup)
      tb[i] = make_uint4(0u, 0u, 0u, 0u);
    ptx::fence_proxy_async_shared();
  }
  __syncthreads();

  // NOTE: work-item coordinates are read after the barrier, separately by each role: values
  // computed before the role branch stay live in both and pushed the consumers past their
  // registers.
  const int num_items = p.num_seqs * p.num_v_heads * Cfg::kSlices;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  if (wg == 0) {
    // ======================================== producer ========================================
    if constexpr (kConsumers == 2) ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    const int ptid = threadIdx.x;  // 0..127
    const int R = ptid / 32;       // warp = row sub-block of phases B..E
    const uint32_t q_raw = sbase + Smem::kQRawOffset, k_raw = sbase + Smem::kKRawOffset;
    const uint32_t g_raw = sbase + Smem::kGRawOffset, b_tile = sbase + Smem::kBOffset;
    const uint32_t w_buf = sbase + Smem::kWOffset, m_buf = sbase + Smem::kMOffset;
    const uint32_t tb_hi = sbase + Smem::kTbHiOffset, tb_lo = sbase + Smem::kTbLoOffset;
    uint8_t* b2 = smem + Smem::kB2Offset;
    float* Lf = reinterpret_cast<float*>(smem + Smem::kLfOffset);
    float* beta_s = reinterpret_cast<float*>(smem + Smem::kBetaOffset);
    float* rq_s = reinterpret_cast<float*>(smem + Smem::kRqOffset);
    float* rk_s = reinterpret_cast<float*>(smem + Smem::kRkOffset);
    float* cprev_v = reinterpret_cast<float*>(smem + Smem::kCPrevOffset);
    float* my_v = reinterpret_cast<float*>(smem + Smem::kMyOffset);
    float* mx_v = reinterpret_cast<float*>(smem + Smem::kMxOffset);
    float* pfac_v = reinterpret_cast<float*>(smem + Smem::kPFacOffset);
    float* hfac_v = reinterpret_cast<float*>(smem + Smem::kHFacOffset);
    float* gfac_v = reinterpret_cast<float*>(smem + Smem::kGFacOffset);
    uint32_t* wide = reinterpret_cast<uint32_t*>(smem + Smem::kWideOffset);
    const uint32_t raw_bytes = uint32_t((p.g_tma ? 3 : 2) * Smem::kTile);

    auto issue_raw = [&](const Item& it, int j) {
      const int tok = int(it.start) + j * kChunk;
      const int hk = it.h / p.v_heads_per_qk_head;
      ptx::mbarrier_arrive_expect_tx(&bars[kRawFull], raw_bytes);
      for (int half = 0; half < 2; ++half) {
        ptx::tma_load_4d(smem + Smem::kQRawOffset + half * Smem::kHalf, &tma.q, &bars[kRawFull],
                         64 * half, hk, tok, it.brow);
        ptx::tma_load_4d(smem + Smem::kKRawOffset + half * Smem::kHalf, &tma.k, &bars[kRawFull],
                         64 * half, hk, tok, it.brow);
        if (p.g_tma)
          ptx::tma_load_4d(smem + Smem::kGRawOffset + half * Smem::kHalf, &tma.g, &bars[kRawFull],
                           64 * half, it.h, tok, it.brow);
      }
    };
    auto load_beta = [&](const Item& it,
                         int j) -> float {  // raw beta of row ptid of chunk j (threads < 64)
      const int r = ptid;
      if (r >= kChunk || j * kChunk + r >= it.len) return 0.f;
      const int64_t off = int64_t(it.brow) * p.stride_beta_b +
                          (it.start + j * kChunk + r) * p.stride_beta_t +
                          int64_t(it.h) * p.stride_beta_h;
      return p.beta_fp32 ? static_cast<const float*>(p.beta)[off]
                         : __bfloat162float(static_cast<const __nv_bfloat16*>(p.beta)[off]);
    };
    float beta_next = 0.f;
    {
      // The first chunk of the CTA: chunk 0 of its first item with tokens.
      const NextChunk first = next_chunk<Cfg::kSlices>(
          p, num_items, int(blockIdx.x) - int(gridDim.x), Item{0, 0, 0, 0, 0, 0, 0}, 0);
      if (first.ok) {
        if (ptid == 0) {
          ptx::prefetch_tensormap(&tma.q);
          ptx::prefetch_tensormap(&tma.k);
          if (p.g_tma) ptx::prefetch_tensormap(&tma.g);
          issue_raw(first.it, 0);
        }
        beta_next = load_beta(first.it, 0);
      }
    }

    // NOTE: as for the consumers (below), the item's scalars are read back from shared memory
    // where used instead of being kept in registers across the chunk loop.
    ItemRecord* prec = reinterpret_cast<ItemRecord*>(smem + Smem::kItemOffset) + 2;
    int gc = 0;  // chunks this CTA has processed: stages and barrier phases
    for (int item = int(blockIdx.x); item < num_items; item += int(gridDim.x)) {
      int chunks;
      float gate_a = 1.f, gate_dt = 0.f;  // per-item gate constants (thread = channel in phase A)
      {
        const Item it = item_at<Cfg::kSlices>(p, item);
        chunks = it.chunks;
        if (chunks == 0) continue;
        ptx::named_barrier_sync(kProducerBarrier,
                                kWarpGroup);  // every thread is done with the last record
        if (ptid == 0) {
          prec->o_off = it.start;
          prec->len = it.len;
          prec->h = it.h;
          prec->n = it.brow;
        }
        const int h = it.h;
        if constexpr (kGate == GateMode::kSoftplus) gate_a = -expf(p.A_log[h]);
        if constexpr (kGate == GateMode::kLowerBound)
          gate_a = p.A_log != nullptr ? expf(p.A_log[h]) : 1.f;
        if (kGate != GateMode::kPrecomputed && p.dt_bias != nullptr)
          gate_dt = p.scalar_gate ? p.dt_bias[h] : p.dt_bias[h * kHeadDim + ptid];
        ptx::named_barrier_sync(kProducerBarrier, kWarpGroup);
      }

      for (int j = 0; j < chunks; ++j, ++gc) {
        const int s = gc & 1;
        const int valid = min(kChunk, vld(&prec->len) - j * kChunk);

        // ---- phase A: gate and running sum, thread = key channel --------------------------------
        // The stage's Qt/Kh/decay of chunk j - 2 must have been read.
        ptx::mbarrier_wait(&bars[kQtKhEmpty + s], ((gc >> 1) & 1) ^ 1);
        ptx::mbarrier_wait(&bars[kRawFull], gc & 1);
        if (ptid < kChunk)
          beta_s[ptid] = ptid < valid ? kdakit::cuda::beta_activation(beta_next, p.use_beta_sigmoid,
                                                                      p.allow_neg_eigval)
                                      : 0.f;
        if (ptid < kChunk) {  // beta of the next chunk lands during the rest of this one
          const NextChunk nxt =
              next_chunk<Cfg::kSlices>(p, num_items, item, item_at<Cfg::kSlices>(p, item), j);
          if (nxt.ok) beta_next = load_beta(nxt.it, nxt.j);
        }
        {
          const int c = ptid;
          float cR[kSubBlocks];
          float b = 0.f;
          const uint8_t* gsrc = nullptr;
          if (!p.g_tma)
            gsrc = static_cast<const uint8_t*>(p.g) +
                   (int64_t(vld(&prec->n)) * p.stride_g_b +
                    (vld(&prec->o_off) + int64_t(j) * kChunk) * p.stride_g_t +
                    int64_t(vld(&prec->h)) * p.stride_g_h + (p.scalar_gate ? 0 : c)) *
                       (p.g_fp32 ? 4 : 2);
          const int64_t gstep = p.stride_g_t * (p.g_fp32 ? 4 : 2);
#pragma unroll
          for (int Rb = 0; Rb < kSubBlocks; ++Rb) {
            // NOTE: partly unrolled: the whole producer chunk is straight-line code, and fully
            // unrolled loops made it larger than the instruction cache (measured: ~30 us a chunk).
#pragma unroll 4
            for (int i = 0; i < kSubBlock; ++i) {
              const int r = kSubBlock * Rb + i;
              float gv = 0.f;
              if (p.g_tma) {
                gv = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(
                    smem + (tile_addr(g_raw, r, c >> 3) - sbase) + uint32_t(c & 7) * 2u));
              } else if (r < valid) {
                gv = p.g_fp32 ? *reinterpret_cast<const float*>(gsrc + r * gstep)
                              : __bfloat162float(
                                    *reinterpret_cast<const __nv_bfloat16*>(gsrc + r * gstep));
              }
              // NOTE: rows past the chunk decay by nothing, so b of row 63 is b of row valid - 1.
              const float gam =
                  r < valid ? common::gate_log2<kGate>(gv, gate_a, gate_dt, p.lower_bound) : 0.f;
              b += gam;
              *reinterpret_cast<float*>(b2 + b2_off(r, c)) = b;
            }
            cR[Rb] = b;
          }
          // Sub-block references: m_R is the midpoint of [c_R, c_{R-1}] (c_R for wide-span channels).
          float my[kSubBlocks];
#pragma unroll
          for (int Rb = 0; Rb < kSubBlocks; ++Rb) {
            const float cp = Rb == 0 ? 0.f : cR[Rb - 1];
            const float span = cp - cR[Rb];
            const bool is_wide = span > kMaxDiagSpan;
            my[Rb] = is_wide ? cR[Rb] : cp - 0.5f * span;
            cprev_v[Rb * kHeadDim + c] = cp;
            my_v[Rb * kHeadDim + c] = my[Rb];
            mx_v[Rb * kHeadDim + c] = is_wide ? INFINITY : my[Rb];
            pfac_v[Rb * kHeadDim + c] = fast_exp2(cp);
            hfac_v[Rb * kHeadDim + c] = fast_exp2(cR[kSubBlocks - 1] - my[Rb]);
            const uint32_t bits = __ballot_sync(0xffffffffu, is_wide);
            if (lane == 0) wide[Rb * 4 + R] = bits;
          }
#pragma unroll
          for (int Rb = 1; Rb < kSubBlocks; ++Rb) {
#pragma unroll
            for (int S = 0; S < Rb; ++S)
              gfac_v[(Rb * (Rb - 1) / 2 + S) * kHeadDim + c] = fast_exp2(cR[Rb - 1] - my[S]);
          }
          float* decay = reinterpret_cast<float*>(smem + Smem::kDecayOffset) + s * kHeadDim;
          decay[c] = fast_exp2(cR[kSubBlocks - 1]);
        }
        ptx::named_barrier_sync(kProducerBarrier, kWarpGroup);

        // ---- phase B: row norms; warp R owns rows 16R + g and 16R + g + 8 -------------------------
        const int r0 = kSubBlock * R + g, r1 = r0 + 8;
        const bool ok0 = r0 < valid, ok1 = r1 < valid;
        float rq0, rq1, rk0, rk1;
        {
          float sq0 = 0.f, sq1 = 0.f, sk0 = 0.f, sk1 = 0.f;
#pragma unroll 2
          for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            uint32_t qa[4], ka[4];
            kdakit::cuda::ldmatrix_x4(
                qa, tile_addr(q_raw, kSubBlock * R + (lane & 15), 2 * kk + (lane >> 4)));
            kdakit::cuda::ldmatrix_x4(
                ka, tile_addr(k_raw, kSubBlock * R + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
              sq0 += bf16_lo(qa[i]) * bf16_lo(qa[i]) + bf16_hi(qa[i]) * bf16_hi(qa[i]);
              sq1 +=
                  bf16_lo(qa[i + 1]) * bf16_lo(qa[i + 1]) + bf16_hi(qa[i + 1]) * bf16_hi(qa[i + 1]);
              sk0 += bf16_lo(ka[i]) * bf16_lo(ka[i]) + bf16_hi(ka[i]) * bf16_hi(ka[i]);
              sk1 +=
                  bf16_lo(ka[i + 1]) * bf16_lo(ka[i + 1]) + bf16_hi(ka[i + 1]) * bf16_hi(ka[i + 1]);
            }
          }
          sq0 = kdakit::cuda::warp_sum_width<4>(sq0);
          sq1 = kdakit::cuda::warp_sum_width<4>(sq1);
          sk0 = kdakit::cuda::warp_sum_width<4>(sk0);
          sk1 = kdakit::cuda::warp_sum_width<4>(sk1);
          const bool l2 = p.use_qk_l2norm;
          rq0 = ok0 ? p.scale * (l2 ? kdakit::cuda::l2norm_scale(sq0) : 1.f) : 0.f;
          rq1 = ok1 ? p.scale * (l2 ? kdakit::cuda::l2norm_scale(sq1) : 1.f) : 0.f;
          rk0 = ok0 ? (l2 ? kdakit::cuda::l2norm_scale(sk0) : 1.f) : 0.f;
          rk1 = ok1 ? (l2 ? kdakit::cuda::l2norm_scale(sk1) : 1.f) : 0.f;
          if (t == 0) {
            rq_s[r0] = rq0;
            rq_s[r1] = rq1;
            rk_s[r0] = rk0;
            rk_s[r1] = rk1;
          }
        }
        // Fragment element e of register i: row (i & 1 ? r1 : r0), channel 16 kk + 2t + 8 (i >> 1) + e.
        auto load_b = [&](int kk, float2(&bv)[4]) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            bv[i] = *reinterpret_cast<const float2*>(
                b2 + b2_off(i & 1 ? r1 : r0, 16 * kk + 2 * t + 8 * (i >> 1)));
        };
        auto load_vec = [&](const float* vec, int kk, float2(&out)[2]) {
          out[0] = *reinterpret_cast<const float2*>(vec + 16 * kk + 2 * t);
          out[1] = *reinterpret_cast<const float2*>(vec + 16 * kk + 2 * t + 8);
        };
        const uint32_t st_row = uint32_t(kSubBlock * R + (lane & 15));  // ldmatrix / stmatrix row

        // ---- phase C1: B tile (kn 2^(m_R - b), L/M column operand) and Kh -------------------------
        // NOTE: g is dead after phase A (the barrier above), so the B tile takes its place.
        uint8_t* kh_stage = smem + Smem::kKhOffset + s * Smem::kTile;
        const uint32_t kh_buf = ptx::smem_addr(kh_stage);
#pragma unroll 2
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          uint32_t ka[4];
          kdakit::cuda::ldmatrix_x4(ka, tile_addr(k_raw, st_row, 2 * kk + (lane >> 4)));
          float2 bv[4], myv[2], hfv[2];
          load_b(kk, bv);
          load_vec(my_v + R * kHeadDim, kk, myv);
          load_vec(hfac_v + R * kHeadDim, kk, hfv);
          uint32_t bt[4], kh[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            // NOTE: select, not multiply: rows past the sequence may hold anything, NaN included.
            const bool ok = i & 1 ? ok1 : ok0;
            const float rk = i & 1 ? rk1 : rk0;
            const float k0 = ok ? bf16_lo(ka[i]) * rk : 0.f, k1 = ok ? bf16_hi(ka[i]) * rk : 0.f;
            const float2 m = myv[i >> 1], hf = hfv[i >> 1];
            const float x0 = k0 * fast_exp2(m.x - bv[i].x), x1 = k1 * fast_exp2(m.y - bv[i].y);
            bt[i] = pack_bf16x2(x0, x1);
            kh[i] = pack_bf16x2(x0 * hf.x, x1 * hf.y);
          }
          ptx::stmatrix_x4(tile_addr(b_tile, st_row, 2 * kk + (lane >> 4)), bt[0], bt[1], bt[2],
                           bt[3]);
          ptx::stmatrix_x4(tile_addr(kh_buf, st_row, 2 * kk + (lane >> 4)), kh[0], kh[1], kh[2],
                           kh[3]);
        }
        ptx::named_barrier_sync(kProducerBarrier, kWarpGroup);

        // ---- phase C2: Qt, Kt; L and M -------------------------------------------------------
        // Kt goes into the W buffer, which the consumers must have released (chunk j - 1).
        ptx::mbarrier_wait(&bars[kWEmpty], (gc & 1) ^ 1);
        const uint32_t qt_buf = sbase + uint32_t(Smem::kQtOffset + s * Smem::kTile);
        float accL[8][4], accM[8][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) accL[i][e] = accM[i][e] = 0.f;
        }
#pragma unroll 1
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          uint32_t qa[4], ka[4];
          kdakit::cuda::ldmatrix_x4(qa, tile_addr(q_raw, st_row, 2 * kk + (lane >> 4)));
          kdakit::cuda::ldmatrix_x4(ka, tile_addr(k_raw, st_row, 2 * kk + (lane >> 4)));
          float2 bv[4], cpv[2], mxv[2], pfv[2];
          load_b(kk, bv);
          load_vec(cprev_v + R * kHeadDim, kk, cpv);
          load_vec(mx_v + R * kHeadDim, kk, mxv);
          load_vec(pfac_v + R * kHeadDim, kk, pfv);
          // qe, ke = qn 2^(b - c_{R-1}), kn 2^(b - c_{R-1}) (<= |x|): Qt, Kt and the off-diagonal
          // rows; the diagonal tile's A operands (x 2^(b - m_R)) are packed right away.
          float qe[4][2], ke[4][2];
          uint32_t qt[4], kt[4], aLd[4], aMd[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const bool ok = i & 1 ? ok1 : ok0;
            const float rq = i & 1 ? rq1 : rq0, rk = i & 1 ? rk1 : rk0;
            const float q0 = ok ? bf16_lo(qa[i]) * rq : 0.f, q1 = ok ? bf16_hi(qa[i]) * rq : 0.f;
            const float k0 = ok ? bf16_lo(ka[i]) * rk : 0.f, k1 = ok ? bf16_hi(ka[i]) * rk : 0.f;
            const float2 cp = cpv[i >> 1], mx = mxv[i >> 1], pf = pfv[i >> 1];
            const float e0 = fast_exp2(bv[i].x - cp.x), e1 = fast_exp2(bv[i].y - cp.y);  // <= 1
            const float x0 = fast_exp2(bv[i].x - mx.x),
                        x1 = fast_exp2(bv[i].y - mx.y);  // <= 2^96; 0 if wide
            qe[i][0] = q0 * e0;
            qe[i][1] = q1 * e1;
            ke[i][0] = k0 * e0;
            ke[i][1] = k1 * e1;
            qt[i] = pack_bf16x2(qe[i][0] * pf.x, qe[i][1] * pf.y);
            kt[i] = pack_bf16x2(ke[i][0] * pf.x, ke[i][1] * pf.y);
            aLd[i] = pack_bf16x2(k0 * x0, k1 * x1);
            aMd[i] = pack_bf16x2(q0 * x0, q1 * x1);
          }
          ptx::stmatrix_x4(tile_addr(qt_buf, st_row, 2 * kk + (lane >> 4)), qt[0], qt[1], qt[2],
                           qt[3]);
          ptx::stmatrix_x4(tile_addr(w_buf, st_row, 2 * kk + (lane >> 4)), kt[0], kt[1], kt[2],
                           kt[3]);
          // NOTE: the diagonal tile first (S = R, then down to 0).
#pragma unroll
          for (int S = kSubBlocks - 1; S >= 0; --S) {
            if (S > R) continue;
            uint32_t aL[4], aM[4];
            if (S == R) {
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                aL[i] = aLd[i];
                aM[i] = aMd[i];
              }
            } else {
              float2 gv[2];
              load_vec(gfac_v + (R * (R - 1) / 2 + S) * kHeadDim, kk, gv);
#pragma unroll
              for (int i = 0; i < 4; ++i) {  // 2^(b - m_S) as (<= 1) x (<= 1)
                const float2 gf = gv[i >> 1];
                aL[i] = pack_bf16x2(ke[i][0] * gf.x, ke[i][1] * gf.y);
                aM[i] = pack_bf16x2(qe[i][0] * gf.x, qe[i][1] * gf.y);
              }
            }
            uint32_t bb[4];
            kdakit::cuda::ldmatrix_x4(
                bb, tile_addr(b_tile, kSubBlock * S + (lane & 7) + ((lane >> 4) << 3),
                              2 * kk + ((lane >> 3) & 1)));
            kdakit::cuda::mma_bf16_16816(accL[2 * S], aL, bb[0], bb[1]);
            kdakit::cuda::mma_bf16_16816(accL[2 * S + 1], aL, bb[2], bb[3]);
            kdakit::cuda::mma_bf16_16816(accM[2 * S], aM, bb[0], bb[1]);
            kdakit::cuda::mma_bf16_16816(accM[2 * S + 1], aM, bb[2], bb[3]);
          }
        }

        // ---- phase D1: diagonal-tile terms of wide-span channels, per element ---------------------
        uint32_t any_wide = 0;
#pragma unroll
        for (int i = 0; i < kSubBlocks * 4; ++i) any_wide |= wide[i];
        if (any_wide != 0u) {
#pragma unroll
          for (int S = 0; S < kSubBlocks; ++S) {
            if (S != R) continue;
            for (int word = 0; word < 4; ++word) {
              uint32_t bits = wide[R * 4 + word];
              while (bits != 0u) {
                const int c = word * 32 + __ffs(bits) - 1;
                bits &= bits - 1u;
                auto raw = [&](uint32_t base, int row) {
                  uint16_t x;
                  asm volatile("ld.shared.u16 %0, [%1];"
                               : "=h"(x)
                               : "r"(tile_addr(base, row, c >> 3) + uint32_t(c & 7) * 2u));
                  return __uint_as_float(uint32_t(x) << 16);
                };
                auto bval = [&](int row) {
                  return *reinterpret_cast<const float*>(b2 + b2_off(row, c));
                };
                const float br[2] = {bval(r0), bval(r1)};
                const float kr[2] = {ok0 ? raw(k_raw, r0) * rk0 : 0.f,
                                     ok1 ? raw(k_raw, r1) * rk1 : 0.f};
                const float qr[2] = {ok0 ? raw(q_raw, r0) * rq0 : 0.f,
                                     ok1 ? raw(q_raw, r1) * rq1 : 0.f};
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
                  for (int e = 0; e < 2; ++e) {
                    const int col = kSubBlock * S + 8 * nt + 2 * t + e;
                    const float bs = bval(col),
                                ks = col < valid ? raw(k_raw, col) * rk_s[col] : 0.f;
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr) {
                      const float ex = fast_exp2(fminf(br[hr] - bs, 0.f));
                      accL[2 * S + nt][2 * hr + e] += kr[hr] * ks * ex;
                      accM[2 * S + nt][2 * hr + e] += qr[hr] * ks * ex;
                    }
                  }
                }
              }
            }
          }
        }

        // ---- phase D2: raw q, k, g, b and the B tile are dead: refill with chunk j + 1 ------------
        ptx::named_barrier_sync(kProducerBarrier, kWarpGroup);
        if (ptid == 0) {
          // NOTE: recomputed here rather than kept from phase A: nine values live across the chunk
          // pushed the producer past its registers.
          const NextChunk nxt =
              next_chunk<Cfg::kSlices>(p, num_items, item, item_at<Cfg::kSlices>(p, item), j);
          if (nxt.ok) {
            ptx::fence_proxy_async_shared();
            issue_raw(nxt.it, nxt.j);
          }
        }

        // ---- phase D3: L (masked) to fp32 over b, M (masked, bf16) to its buffer ----------------
        ptx::mbarrier_wait(&bars[kMEmpty], (gc & 1) ^ 1);
#pragma unroll
        for (int S = 0; S < kSubBlocks; ++S) {
          uint32_t mp[4];
          if (S <= R) {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
              for (int hr = 0; hr < 2; ++hr) {
                const int r = kSubBlock * R + g + 8 * hr;
                const int col = kSubBlock * S + 8 * nt + 2 * t;
                float l0 = accL[2 * S + nt][2 * hr], l1 = accL[2 * S + nt][2 * hr + 1];
                float m0 = accM[2 * S + nt][2 * hr], m1 = accM[2 * S + nt][2 * hr + 1];
                if (S == R) {  // the diagonal tile: entries above it may be inf, so select
                  l0 = col < r ? l0 : 0.f;
                  l1 = col + 1 < r ? l1 : 0.f;
                  m0 = col <= r ? m0 : 0.f;
                  m1 = col + 1 <= r ? m1 : 0.f;
                }
                *reinterpret_cast<float2*>(Lf + r * common::kLdF + col) = make_float2(l0, l1);
                mp[2 * nt + hr] = pack_bf16x2(m0, m1);
              }
            }
          } else {
            mp[0] = mp[1] = mp[2] = mp[3] = 0u;
          }
          ptx::stmatrix_x4(half_addr(m_buf, st_row, 2 * S + (lane >> 4)), mp[0], mp[1], mp[2],
                           mp[3]);
        }
        ptx::named_barrier_sync(kProducerBarrier, kWarpGroup);

        // ---- phase D4: T diag(beta) (bf16 hi/lo), T's diagonal blocks in place over L's ----------
        ptx::mbarrier_wait(&bars[kTbEmpty], (gc & 1) ^ 1);
        {
          uint8_t* hi = smem + Smem::kTbHiOffset;
          uint8_t* lo = smem + Smem::kTbLoOffset;
          float trr[2][4];
          common::tc_diag_inverse(Lf, beta_s, R, g, t, trr);
          __syncwarp();
          common::store_tile(Lf, R, R, g, t, trr);
          common::store_tile_hilo(hi, lo, beta_s, R, R, g, t, trr);
          ptx::named_barrier_sync(kProducerBarrier, kWarpGroup);
          switch (R) {
            case 1:
              common::tc_offdiag_row<1, true>(Lf, Lf, beta_s, g, t, trr, hi, lo);
              break;
            case 2:
              common::tc_offdiag_row<2, true>(Lf, Lf, beta_s, g, t, trr, hi, lo);
              break;
            case 3:
              common::tc_offdiag_row<3, true>(Lf, Lf, beta_s, g, t, trr, hi, lo);
              break;
            default:
              break;
          }
        }
        ptx::fence_proxy_async_shared();  // Kt, T diag(beta): generic writes, read by wgmma next
        ptx::named_barrier_sync(kProducerBarrier, kWarpGroup);

        // ---- phase E: W = T diag(beta) Kt (wgmma), over Kt ---------------------------------------
        {
          float accW[64];
          ptx::wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kChunk / 16; ++kk)
            gmma_ss<OpW>(desc_k64(tb_hi, kk), desc_mn(w_buf, kk), accW, kk > 0);
#pragma unroll
          for (int kk = 0; kk < kChunk / 16; ++kk)
            gmma_ss<OpW>(desc_k64(tb_lo, kk), desc_mn(w_buf, kk), accW, true);
          ptx::wgmma_commit();
          ptx::wgmma_wait<0>();
          ptx::fence_operands(accW);
          ptx::named_barrier_sync(kProducerBarrier,
                                  kWarpGroup);  // every warp's reads of Kt are done
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            ptx::stmatrix_x4(tile_addr(w_buf, st_row, 2 * q + (lane >> 4)),
                             pack_bf16x2(accW[8 * q], accW[8 * q + 1]),
                             pack_bf16x2(accW[8 * q + 2], accW[8 * q + 3]),
                             pack_bf16x2(accW[8 * q + 4], accW[8 * q + 5]),
                             pack_bf16x2(accW[8 * q + 6], accW[8 * q + 7]));
          }
        }
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync(kProducerBarrier, kWarpGroup);
        if (ptid == 0) {
          ptx::mbarrier_arrive(&bars[kQtKhFull + s]);
          ptx::mbarrier_arrive(&bars[kMFull]);
          ptx::mbarrier_arrive(&bars[kTbFull]);
          ptx::mbarrier_arrive(&bars[kWFull]);
        }
      }
    }
  } else {
    // ======================================== consumers ========================================
    if constexpr (kConsumers == 2) ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int cw = wg - 1;                 // consumer warpgroup
    const int w = (threadIdx.x / 32) % 4;  // warp within it
    const int ctid = threadIdx.x % kWarpGroup;
    uint8_t* v_half = smem + Smem::kVOffset + cw * Smem::kHalf;
    const uint32_t v_addr = ptx::smem_addr(v_half);
    const uint32_t tb_hi = sbase + Smem::kTbHiOffset, tb_lo = sbase + Smem::kTbLoOffset;
    const uint32_t w_buf = sbase + Smem::kWOffset, m_buf = sbase + Smem::kMOffset;

    auto issue_v = [&](const Item& it, int j) {
      ptx::mbarrier_arrive_expect_tx(&bars[kVFull + cw], uint32_t(Smem::kHalf));
      ptx::tma_load_4d(v_half, &tma.v, &bars[kVFull + cw], it.z * Cfg::kValueRows + 64 * cw, it.h,
                       int(it.start) + j * kChunk, it.brow);
    };
    {
      const NextChunk first = next_chunk<Cfg::kSlices>(
          p, num_items, int(blockIdx.x) - int(gridDim.x), Item{0, 0, 0, 0, 0, 0, 0}, 0);
      if (ctid == 0 && first.ok) {
        ptx::prefetch_tensormap(&tma.v);
        issue_v(first.it, 0);
      }
    }

    // NOTE: the item's scalars live in shared memory (written once per item by thread 0, read
    // back with volatile loads where used): kept in registers across the chunk loop they pushed
    // the consumers past their budget.
    ItemRecord* rec = reinterpret_cast<ItemRecord*>(smem + Smem::kItemOffset) + cw;
    int gc = 0;  // chunks this CTA has processed (the producer counts the same way)
    for (int item = int(blockIdx.x); item < num_items; item += int(gridDim.x)) {
      if (ctid == 0) {
        const Item it = item_at<Cfg::kSlices>(p, item);
        const int vb = it.z * Cfg::kValueRows + 64 * cw;
        rec->o_off = (p.packed ? 0 : int64_t(it.n) * p.stride_o_b) + it.start * p.stride_o_t +
                     int64_t(it.h) * p.stride_o_h + vb;
        rec->len = it.len;
        rec->chunks = it.chunks;
        rec->n = it.n;
        rec->h = it.h;
        rec->vbase = vb;
      }
      ptx::named_barrier_sync(kConsumerBarrier0 + cw, kWarpGroup);
      const int vrow = vld(&rec->vbase) + 16 * w + g;  // value row of c0/c1 (c2/c3: vrow + 8)

      float state[64];
      float(&state4)[16][4] = reinterpret_cast<float(&)[16][4]>(state);
      {
        const int n = vld(&rec->n);
        const void* init = common::initial_state_of(p, n, vld(&rec->h));
        if (init != nullptr) {
          common::load_state(state4, init, vrow, t, p);
        } else {
#pragma unroll
          for (int i = 0; i < 64; ++i) state[i] = 0.f;
        }
      }

      // First chunk-state entry of this sequence: sum over earlier sequences of ceil(len / interval).
      const int chunks_per_state = p.chunk_states != nullptr ? p.chunk_state_interval / kChunk : 0;
      if (chunks_per_state > 0 && w == 0) {
        const int n = vld(&rec->n);
        const int64_t base = common::chunk_state_base_of(p, n, lane);
        if (lane == 0) rec->cs_base = base;
      }
      if (chunks_per_state > 0) ptx::named_barrier_sync(kConsumerBarrier0 + cw, kWarpGroup);

      for (int j = 0; j < vld(&rec->chunks); ++j, ++gc) {
        const int s = gc & 1;
        const int valid = min(kChunk, vld(&rec->len) - j * kChunk);
        if (chunks_per_state > 0 && j % chunks_per_state == 0) {
          const int64_t off = common::chunk_state_offset(
              p, vld(&rec->cs_base) + j / chunks_per_state, vld(&rec->h));
          if (off >= 0)
            common::store_state(state4, common::state_at(p.chunk_states, off, p.chunk_bf16), vrow,
                                t, common::StateView{p.k_first, p.chunk_bf16, p.chunk_pairs});
        }

        // S0^T as bf16 A fragments (key channels 64 half .. 64 half + 63), built while no wgmma of
        // the chunk is in flight: the state is the accumulator of the last chunk's update.
        // NOTE: built and used one half at a time (16 registers instead of 32): the consumer holds
        // the state, U^T and O^T accumulators and this operand at once, and the whole set fits
        // the warpgroup's register budget only this way.
        uint32_t sa[4][4];
        auto pack_state_half = [&](int half) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int kk = 4 * half + i;
            sa[i][0] = pack_bf16x2(state4[2 * kk][0], state4[2 * kk][1]);
            sa[i][1] = pack_bf16x2(state4[2 * kk][2], state4[2 * kk][3]);
            sa[i][2] = pack_bf16x2(state4[2 * kk + 1][0], state4[2 * kk + 1][1]);
            sa[i][3] = pack_bf16x2(state4[2 * kk + 1][2], state4[2 * kk + 1][3]);
          }
        };
        pack_state_half(0);

        // ---- U0^T = V^T (T diag(beta))^T (hi + lo) -----------------------------------------------
        ptx::mbarrier_wait(&bars[kVFull + cw], gc & 1);
        if (valid < kChunk) {
          // NOTE: rows past the sequence are another sequence's tokens, or past cu[N]: whatever
          // they hold, zeros keep them out of the product (T diag(beta) is 0 there, but 0 * NaN
          // is not).
          for (int i = ctid; i < (kChunk - valid) * 8; i += kWarpGroup)
            *reinterpret_cast<uint4*>(v_half + (valid + i / 8) * 128 + (i % 8) * 16) =
                make_uint4(0u, 0u, 0u, 0u);
          ptx::fence_proxy_async_shared();
          ptx::named_barrier_sync(kConsumerBarrier0 + cw, kWarpGroup);
        }
        ptx::mbarrier_wait(&bars[kTbFull], gc & 1);
        float accU[32], accO[32];
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kChunk / 16; ++kk)
          gmma_ss<OpU0>(desc_mn(v_addr, kk), desc_k64(tb_hi, kk), accU, kk > 0);
#pragma unroll
        for (int kk = 0; kk < kChunk / 16; ++kk)
          gmma_ss<OpU0>(desc_mn(v_addr, kk), desc_k64(tb_lo, kk), accU, true);

        // ---- U^T -= S0^T W^T, O^T = S0^T Qt^T (A = bf16 S0^T) ------------------------------------
        ptx::mbarrier_wait(&bars[kWFull], gc & 1);
        ptx::mbarrier_wait(&bars[kQtKhFull + s], (gc >> 1) & 1);
        const uint32_t qt_buf = sbase + uint32_t(Smem::kQtOffset + s * Smem::kTile);
        const uint32_t kh_buf = sbase + uint32_t(Smem::kKhOffset + s * Smem::kTile);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (half == 1) pack_state_half(1);
          ptx::wgmma_fence();
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int kk = 4 * half + i;
            gmma_rs<OpNegRS64>(sa[i], desc_k128(w_buf, kk), accU, true);
            gmma_rs<OpRS64>(sa[i], desc_k128(qt_buf, kk), accO, kk > 0);
          }
          ptx::wgmma_commit();
          ptx::wgmma_wait<0>();
          ptx::fence_operands(accU);
          ptx::fence_operands(accO);
        }
        if (lane == 0) {
          ptx::mbarrier_arrive(&bars[kTbEmpty]);
          ptx::mbarrier_arrive(&bars[kWEmpty]);
        }
        // The warpgroup's reads of its V half are done: load chunk j + 1 into it.
        ptx::named_barrier_sync(kConsumerBarrier0 + cw, kWarpGroup);
        if (ctid == 0) {
          const NextChunk nxt =
              next_chunk<Cfg::kSlices>(p, num_items, item, item_at<Cfg::kSlices>(p, item), j);
          if (nxt.ok) issue_v(nxt.it, nxt.j);
        }

        // ---- O^T += U^T M^T; S^T = S0^T diag(decay) + U^T Kh (U^T as bf16 hi + lo) ----------------
        uint32_t uh[4][4], ul[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          kdakit::cuda::split_bf16x2(accU[8 * ks], accU[8 * ks + 1], uh[ks][0], ul[ks][0]);
          kdakit::cuda::split_bf16x2(accU[8 * ks + 2], accU[8 * ks + 3], uh[ks][1], ul[ks][1]);
          kdakit::cuda::split_bf16x2(accU[8 * ks + 4], accU[8 * ks + 5], uh[ks][2], ul[ks][2]);
          kdakit::cuda::split_bf16x2(accU[8 * ks + 6], accU[8 * ks + 7], uh[ks][3], ul[ks][3]);
        }
        ptx::mbarrier_wait(&bars[kMFull], gc & 1);
        ptx::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          gmma_rs<OpRS64>(ul[ks], desc_k64(m_buf, ks), accO, true);
          gmma_rs<OpRS64>(uh[ks], desc_k64(m_buf, ks), accO, true);
        }
        ptx::wgmma_commit();
        {
          const float* decay =
              reinterpret_cast<const float*>(smem + Smem::kDecayOffset) + s * kHeadDim;
          common::decay_state(state4, decay, t);
        }
        ptx::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          gmma_rs<OpState>(ul[ks], desc_mn(kh_buf, ks), state, true);
          gmma_rs<OpState>(uh[ks], desc_mn(kh_buf, ks), state, true);
        }
        ptx::wgmma_commit();
        ptx::wgmma_wait<1>();
        ptx::fence_operands(accO);
        if (lane == 0) ptx::mbarrier_arrive(&bars[kMEmpty]);

        // ---- O: value rows vrow, vrow + 8 of tokens 8 nt + 2t, +1 ---------------------------------
        common::store_o_tile(accO, p.o + vld(&rec->o_off) + int64_t(j) * kChunk * p.stride_o_t + 16 * w,
                             p.stride_o_t, valid, p.o_pairs, g, t);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(state);
        if (lane == 0) ptx::mbarrier_arrive(&bars[kQtKhEmpty + s]);
      }

      // ---- final state (an empty sequence passes its initial state through bit for bit) ----------
      if (p.final_state != nullptr) {
        void* fin = common::final_state_of(p, vld(&rec->n), vld(&rec->h));
        if (fin != nullptr) common::store_state(state4, fin, vrow, t, p);
      }
      // The record is rewritten for the next item only after every thread has read it.
      ptx::named_barrier_sync(kConsumerBarrier0 + cw, kWarpGroup);
    }
  }
}

}  // namespace kdakit::sm90::prefill::fused

// ---- host launcher ------------------------------------------------------------------------------
namespace kdakit::sm90::prefill {

template <GateMode kGate, int kConsumers>
Status launch_prefill_fused(const PrefillParams& p, const WorkspacePlan& plan,
                            const void* workspace, int num_sms, cudaStream_t stream) {
  using namespace fused;
  using Cfg = Config<kConsumers>;
  if (p.num_seqs == 0) return Status::Ok();
  const int64_t num_items = p.num_seqs * p.num_v_heads * Cfg::kSlices;
  if (num_items > int64_t(INT32_MAX) || p.seqlen > int64_t(INT32_MAX) / 2)
    return Status(StatusCode::kUnsupported,
                  "prefill (fused): N * HV * slices and T must stay below 2^31");
  // NOTE: a persistent grid, one CTA per SM (shared memory allows no second): each CTA walks
  // its work items in turn, the producer running into the next item's first chunk.
  const int64_t num_ctas = std::min<int64_t>(num_items, std::max(num_sms, 1));

  const bool packed = p.cu_seqlens != nullptr;
  const bool g_tma = p.dtype_g == DType::kBFloat16 && !p.scalar_gate;
  KernelParams kp{};
  static_cast<common::StateParams&>(kp) = common::state_params(p);
  common::fill_token_params(kp, p, plan, workspace);
  kp.g_tma = g_tma;

  // NOTE: tokens past T read as zeros; a packed batch is one row (its batch stride unused).
  const uint64_t tokens = uint64_t(std::max<int64_t>(p.seqlen, 1));
  const uint64_t batch = packed ? 1 : uint64_t(std::max<int64_t>(p.batch, 1));
  auto bstride = [&](int64_t sb, int64_t st) { return packed ? st * int64_t(tokens) : sb; };
  TmaParams tma{};
  Status st = common::encode_activation_map(&tma.q, p.q, kHeadDim, uint64_t(p.num_qk_heads), tokens,
                                            batch, p.stride_q_h, p.stride_q_t,
                                            bstride(p.stride_q_b, p.stride_q_t), "q");
  if (st.ok())
    st = common::encode_activation_map(&tma.k, p.k, kHeadDim, uint64_t(p.num_qk_heads), tokens,
                                       batch, p.stride_k_h, p.stride_k_t,
                                       bstride(p.stride_k_b, p.stride_k_t), "k");
  if (st.ok())
    st = common::encode_activation_map(&tma.v, p.v, kHeadDim, uint64_t(p.num_v_heads), tokens,
                                       batch, p.stride_v_h, p.stride_v_t,
                                       bstride(p.stride_v_b, p.stride_v_t), "v");
  if (st.ok() && g_tma)
    st = common::encode_activation_map(&tma.g, p.g, kHeadDim, uint64_t(p.num_v_heads), tokens,
                                       batch, p.stride_g_h, p.stride_g_t,
                                       bstride(p.stride_g_b, p.stride_g_t), "g");
  if (!st.ok()) return st;

  auto kernel = kda_prefill_fused_sm90_kernel<kGate, kConsumers>;
  constexpr int kSmem = int(SharedMemoryPlan::kAllocBytes);
  // NOTE: per function and device; setting it once per device keeps driver calls off the run
  // path (common/device_setup.cuh).
  static kdakit::cuda::PerDeviceOnce attr_once;
  const cudaError_t attr_err = kdakit::cuda::set_up_once_per_device(
      attr_once, [&] { return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem); });
  if (attr_err != cudaSuccess)
    return Status(StatusCode::kCudaError, std::string("fused/kernel.cuh: cudaFuncSetAttribute: ") +
                                              cudaGetErrorString(attr_err));
  kernel<<<unsigned(num_ctas), Cfg::kThreads, kSmem, stream>>>(kp, tma);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status(StatusCode::kCudaError,
                  std::string("fused/kernel.cuh: kda_prefill_fused_sm90_kernel launch: ") +
                      cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace kdakit::sm90::prefill
