// kda_prefill_tile16_sm90_kernel: chunked KDA prefill with 16-token tiles, for batches of short
// sequences. One CTA of 8 warps per (sequence, value head); the state stays in registers (fp32
// mma accumulators, 16 value rows per warp) from the first tile to the last, and two CTAs share
// an SM, so that one CTA's state load and store overlap the other's compute.
//
// Math (per tile of C <= 16 tokens r, s; b_r the base-2 running gate sum per key channel from
// the tile's start; qn = scale q / ||q||, kn = k / ||k|| with the optional norms; S^T the
// state, V x K):
//   W^T = S0^T Kt^T,  Kt = kn 2^b          (the prediction of each token, from S0)
//   L[r,s] = sum_i kn_r kn_s 2^(b_r - b_s)  (s < r)
//   M[r,s] = sum_i qn_r kn_s 2^(b_r - b_s)  (s <= r)
//   T = (I + diag(beta) L)^-1
//   U^T = (V^T - W^T) diag(beta) T^T
//   O^T = S0^T Qt^T + U^T M^T,  Qt = qn 2^b
//   S^T = S0^T diag(2^b_15) + U^T Kend,  Kend = kn 2^(b_15 - b)
// Exponents: L and M factor 2^(b_r - b_s) into row factors 2^(b_r - m) and column factors
// 2^(m - b_s) around a reference m per channel and column half: the midpoint of that 8-token
// half's range of b (softplus and precomputed gates), or of the tile's (the lower-bound gate,
// whose 16-token span is at most 115). Both factors stay within 2^96 on the diagonal blocks
// for spans up to kMaxSpan, and below them (rows of the second half against the first half's
// reference) the row factors are 2^(non-positive). The state operand of W and O takes the first
// reference: S0^T diag(2^m) (kn 2^(b - m))^T = S0^T Kt^T. A channel whose span passes kMaxSpan
// in a half ("wide") uses m = 0 there for the row factors, 0 for the column factors, and adds
// its L and M terms with columns in that half per element. Kend's factors are 2^(non-positive).
// Precision: every product on tf32 tensor cores (operands rounded to nearest, 11 significant
// bits, once: the factor tiles are stored rounded), fp32 accumulation, the state in fp32
// throughout; T by fp32 forward substitution.
//
// Per tile, all 256 threads (thread (c, hh) = key channel c, token half hh = rows 8 hh .. + 7):
//   P1  thread (c, hh): gate and running sum b over its half; warps: q/k row norms, beta
//   P2  thread (c, hh): b from both halves' sums; the factor tiles Qm, Km, Kc, Kend
//       (token-major) of its rows, and Qm1, Km1 (the second half's reference) for steep gates
//   P3  warps 0, 1: L, warps 6, 7: M, one 8-column half each; every warp: W^T and S0^T Qt^T
//       for its 16 value rows; warp 2, half-way through those: T by forward substitution, once
//       warps 0 and 1 have stored L; then the wide channels' terms, if any
//       (and T after them, past the barrier that closes P3, with one more barrier before P5)
//   P4  every warp: R^T = (V^T - W^T) diag(beta), the state's decay (no barrier before P5)
//   P5  U^T = R^T T^T, O^T += U^T M^T (stored), S^T = S^T diag(decay) + U^T Kend
// Three CTA barriers a tile (after P1, P2 and P3). The raw inputs have two stages: tile j + 1's
// q, k and g are copied in (cp.async) from the top of tile j, its v and its beta and scalar gate
// (loaded into registers at the top) after tile j's P1 barrier; tile j's P3 barrier waits for
// its q, k, g, beta and scalar gate, so that tile j + 1 starts without a barrier.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/device_setup.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sm90/prefill/common/gate.cuh"
#include "cuda/sm90/prefill/common/o_store.cuh"
#include "cuda/sm90/prefill/common/ptx.cuh"
#include "cuda/sm90/prefill/common/state_io.cuh"
#include "cuda/sm90/prefill/common/token_params.h"
#include "cuda/sm90/prefill/tile16/config.h"
#include "cuda/sm90/prefill/tile16/launch.h"

namespace kdakit::sm90::prefill::tile16 {

using kdakit::cuda::cp_async_16;
using kdakit::cuda::cp_async_4;
using kdakit::cuda::fast_exp2;
using kdakit::cuda::mma_tf32_1688;
using kdakit::cuda::smem_u32;
using kdakit::cuda::to_tf32;

// Kernel-side parameters, derived from PrefillParams by the launcher (the state fields in the
// common base).
struct KernelParams : common::StateParams {
  const int64_t* seq_start;  // [N] plan region
  const int32_t* seq_len;    // [N] plan region
  int32_t num_seqs;
  int32_t num_v_heads;
  int32_t v_heads_per_qk_head;
  bool packed;  // cu_seqlens given: every sequence lives in batch row 0

  const __nv_bfloat16* q;  // [B, T, H, K]
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;  // [B, T, HV, V]
  int64_t stride_q_b, stride_q_t, stride_q_h;
  int64_t stride_k_b, stride_k_t, stride_k_h;
  int64_t stride_v_b, stride_v_t, stride_v_h;
  const void* g;  // [B, T, HV, K] or [B, T, HV]
  int64_t stride_g_b, stride_g_t, stride_g_h;
  bool g_fp32, scalar_gate;
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

using Smem = SharedMemoryPlan;

// One (sequence, value head) of the grid, and the global offsets of its tokens.
struct Work {
  int n, h, z;  // z: unused (0)
  int len;
  int64_t q_off, k_off, v_off, g_off, beta_off, o_off;  // elements, at the sequence's token 0
  int64_t cs_base;  // first chunk-state entry of the sequence (with chunk states)
  int64_t pad;
};
static_assert(sizeof(Work) == SharedMemoryPlan::kWorkBytes, "tile16 prefill: work record size");

// NOTE: the copy functions below read the work record from shared memory (common::vld of the
// fields they use, so not hoisted out of the tile loop): kept in registers across it, the
// offsets pushed the kernel past 128.
using common::vld;

__device__ __forceinline__ Work work_of(const KernelParams& p, int cta) {
  Work w;
  w.z = 0;
  w.h = cta % p.num_v_heads;
  w.n = cta / p.num_v_heads;
  w.len = max(p.seq_len[w.n], 0);
  const int64_t start = p.seq_start[w.n];
  const int64_t brow = p.packed ? 0 : w.n;
  const int hk = w.h / p.v_heads_per_qk_head;
  w.q_off = brow * p.stride_q_b + start * p.stride_q_t + int64_t(hk) * p.stride_q_h;
  w.k_off = brow * p.stride_k_b + start * p.stride_k_t + int64_t(hk) * p.stride_k_h;
  w.v_off = brow * p.stride_v_b + start * p.stride_v_t + int64_t(w.h) * p.stride_v_h;
  w.g_off = brow * p.stride_g_b + start * p.stride_g_t + int64_t(w.h) * p.stride_g_h;
  w.beta_off = brow * p.stride_beta_b + start * p.stride_beta_t + int64_t(w.h) * p.stride_beta_h;
  w.o_off = brow * p.stride_o_b + start * p.stride_o_t + int64_t(w.h) * p.stride_o_h;
  return w;
}

// Byte offset of tile j's stage of raw inputs (add to the k*RawOffset of the plan).
__device__ __forceinline__ uint32_t stage_offset(int j) {
  return uint32_t(j & 1) * uint32_t(Smem::kStageBytes);
}

// The raw v of tile j into shared memory, as issue_tile_copies below.
// The caller commits the group.
__device__ __forceinline__ void issue_v_copy(const KernelParams& p, const Work& w, int j,
                                             uint8_t* smem, int tid) {
  const int valid = min(kTile, vld(&w.len) - j * kTile);
  // 16 rows x 16 chunks of 16 bytes; one chunk per thread
  const int r = tid >> 4, ch = tid & 15;
  uint8_t* dst =
      smem + stage_offset(j) + Smem::kVRawOffset + uint32_t(r) * (kHeadDim * 2) + ch * 16;
  if (r < valid)
    cp_async_16(smem_u32(dst),
                p.v + vld(&w.v_off) + (int64_t(j) * kTile + r) * p.stride_v_t + ch * 8);
  else
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
}

// The raw q, k and (per-channel) g of tile j into shared memory: cp.async for the tile's
// tokens, zeros for q and k rows past the sequence (never read from global memory: they may
// hold another sequence's values or lie past the tensor). The caller commits the group.
__device__ __forceinline__ void issue_tile_copies(const KernelParams& p, const Work& w, int j,
                                                  uint8_t* smem_base, int tid) {
  uint8_t* smem = smem_base + stage_offset(j);
  const int valid = min(kTile, vld(&w.len) - j * kTile);
  const int64_t tok0 = int64_t(j) * kTile;
  const int64_t q_off = vld(&w.q_off), k_off = vld(&w.k_off), g_off = vld(&w.g_off);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // q, k: 16 rows x 16 chunks of 16 bytes each; one chunk per thread.
  {
    const int r = tid >> 4, ch = tid & 15;
    const uint32_t off = uint32_t(r) * (kHeadDim * 2) + uint32_t(ch) * 16;
    if (r < valid) {
      cp_async_16(smem_u32(smem + Smem::kQRawOffset + off),
                  p.q + q_off + (tok0 + r) * p.stride_q_t + ch * 8);
      cp_async_16(smem_u32(smem + Smem::kKRawOffset + off),
                  p.k + k_off + (tok0 + r) * p.stride_k_t + ch * 8);
    } else {
      *reinterpret_cast<uint4*>(smem + Smem::kQRawOffset + off) = zero;
      *reinterpret_cast<uint4*>(smem + Smem::kKRawOffset + off) = zero;
    }
  }
  // per-channel g: bf16 as q; fp32 element by element (thread = channel: coalesced per token,
  // and any 4-byte aligned layout). Rows past the sequence are never read (P1 skips them).
  if (!p.scalar_gate) {
    if (p.g_fp32) {
      // thread (c, hh): rows 8 hh .. 8 hh + 7 of channel c
      const int c = tid & (kHeadDim - 1), r0 = (tid >> 7) * kTileHalf;
      const float* g = static_cast<const float*>(p.g) + g_off + c;
      for (int r = r0; r < min(valid, r0 + kTileHalf); ++r)
        cp_async_4(smem_u32(smem + Smem::kGRawOffset + (uint32_t(r) * kHeadDim + c) * 4),
                   g + (tok0 + r) * p.stride_g_t);
    } else {
      const __nv_bfloat16* g = static_cast<const __nv_bfloat16*>(p.g) + g_off;
      {
        const int r = tid >> 4, ch = tid & 15;
        if (r < valid)
          cp_async_16(
              smem_u32(smem + Smem::kGRawOffset + uint32_t(r) * (kHeadDim * 2) + uint32_t(ch) * 16),
              g + (tok0 + r) * p.stride_g_t + ch * 8);
      }
    }
  }
}

// Raw beta and scalar gate of token `tid` of tile j (threads < 16; 0 past the sequence).
__device__ __forceinline__ float load_beta(const KernelParams& p, const Work& w, int j, int tid) {
  const int r = j * kTile + tid;
  if (tid >= kTile || r >= vld(&w.len)) return 0.f;
  const int64_t off = vld(&w.beta_off) + int64_t(r) * p.stride_beta_t;
  return p.beta_fp32 ? static_cast<const float*>(p.beta)[off]
                     : __bfloat162float(static_cast<const __nv_bfloat16*>(p.beta)[off]);
}
__device__ __forceinline__ float load_scalar_gate(const KernelParams& p, const Work& w, int j,
                                                  int tid) {
  const int r = j * kTile + tid;
  if (!p.scalar_gate || tid >= kTile || r >= vld(&w.len)) return 0.f;
  const int64_t off = vld(&w.g_off) + int64_t(r) * p.stride_g_t;
  return p.g_fp32 ? static_cast<const float*>(p.g)[off]
                  : __bfloat162float(static_cast<const __nv_bfloat16*>(p.g)[off]);
}

// x as a rounded tf32 mma operand, kept in an fp32 slot (only mma operands read these).
__device__ __forceinline__ float tf32_value(float x) { return __uint_as_float(to_tf32(x)); }

__device__ __forceinline__ float2 lds2(const uint8_t* base, uint32_t byte_off) {
  return *reinterpret_cast<const float2*>(base + byte_off);
}

// A operand (16 rows x 8 k) of an mma.m16n8k8 from an accumulator tile c of the same rows:
// the k index of A register pair (0, 1) / (2, 3) is column 2t / 2t + 1 of the tile, as long as
// the B operand reads its rows in the same order (lds2 of columns 2t, 2t + 1).
__device__ __forceinline__ void acc_as_a(const float (&c)[4], uint32_t (&a)[4]) {
  a[0] = to_tf32(c[0]);
  a[1] = to_tf32(c[2]);
  a[2] = to_tf32(c[1]);
  a[3] = to_tf32(c[3]);
}

// threadIdx.x read anew (volatile: not merged with earlier reads), so that values derived from
// it are recomputed in the tile loop rather than held across it (at 128 registers the compiler
// spilled the thread-in-group index instead).
__device__ __forceinline__ int fresh_tid() {
  int x;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(x));
  return x;
}

// T = (I + diag(beta) L)^-1 by fp32 forward substitution, written over L: one warp, lane = column
// (lanes 16-31 repeat lanes 0-15 and store nothing).
__device__ __forceinline__ void invert_tile(float* l_s, const float* beta) {
  constexpr int PT = Smem::kPitchT;
  const int lane = int(threadIdx.x) & 31;  // from threadIdx again: 128 registers
  const int col = lane & (kTile - 1);
  float x[kTile];
#pragma unroll
  for (int i = 0; i < kTile; ++i) {
    float acc0 = 0.f, acc1 = 0.f;  // two chains: half the dependent FMAs per row
#pragma unroll
    for (int r = 0; r < i; r += 2) {
      acc0 += l_s[i * PT + r] * x[r];
      if (r + 1 < i) acc1 += l_s[i * PT + r + 1] * x[r + 1];
    }
    x[i] = (i == col ? 1.f : 0.f) - beta[i] * (acc0 + acc1);
  }
  __syncwarp();  // T goes over L: every lane is done reading it
  if (lane < kTile) {
#pragma unroll
    for (int i = 0; i < kTile; ++i) l_s[i * PT + col] = x[i];
  }
}

// W^T += S0^T diag(2^m) Km^T and S0^T Qt^T += S0^T diag(2^m) Qm^T over key tiles k0 .. k0 + 7
// (channels 8 k0 .. 8 k0 + 63): the warp's 16 value rows x 16 tokens.
template <int k0>
__device__ __forceinline__ void state_products(const float (&state)[16][4], const float* m2_s,
                                               const uint8_t* smem, int g, int t,
                                               float (&wacc)[2][4], float (&qacc)[2][4]) {
  constexpr int PC = Smem::kPitchC;
#pragma unroll
  for (int kk = k0; kk < k0 + kHeadDim / 16; ++kk) {
    const int ch = 8 * kk + 2 * t;
    const float2 f = *reinterpret_cast<const float2*>(m2_s + ch);
    uint32_t a[4];
    a[0] = to_tf32(state[kk][0] * f.x);
    a[1] = to_tf32(state[kk][2] * f.x);
    a[2] = to_tf32(state[kk][1] * f.y);
    a[3] = to_tf32(state[kk][3] * f.y);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float2 kb = lds2(smem + Smem::kKmOffset, uint32_t((8 * nt + g) * PC + ch) * 4);
      const float2 qb = lds2(smem + Smem::kQmOffset, uint32_t((8 * nt + g) * PC + ch) * 4);
      mma_tf32_1688(wacc[nt], a, __float_as_uint(kb.x), __float_as_uint(kb.y));
      mma_tf32_1688(qacc[nt], a, __float_as_uint(qb.x), __float_as_uint(qb.y));
    }
  }
}

// Tile j's activated beta and raw scalar gate of token tid (threads < 16) into its stage's slots
// (beta 0 past the sequence).
__device__ __forceinline__ void store_token_scalars(const KernelParams& p, const Work& w, int j,
                                                    int tid, float beta, float gs, float* beta_s,
                                                    float* gs_s) {
  if (tid >= kTile) return;
  const int valid = min(kTile, vld(&w.len) - j * kTile);
  const int slot = (j & 1) * kTile + tid;
  beta_s[slot] = tid < valid
                     ? kdakit::cuda::beta_activation(beta, p.use_beta_sigmoid, p.allow_neg_eigval)
                     : 0.f;
  gs_s[slot] = gs;
}

template <GateMode kGate>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    kda_prefill_tile16_sm90_kernel(const __grid_constant__ KernelParams p) {
  // NOTE: references per 8-token half for the gates that can decay steeply (softplus,
  // precomputed): on the H200 the benchmark's softplus H32 1024 x 8, forced here, went from
  // 1.09 to 0.48 ms (most of its tiles had a channel wide over 16 tokens, ~none over 8); for the
  // lower-bound gate the second reference cost 2-3% and buys nothing.
  constexpr bool kHalfRefs = kGate != GateMode::kLowerBound;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = int(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;  // mma group and thread in group
  // A routed call: the prep grid, launched next with PDL, may start (prep/kernel.cuh,
  // launch_prep_kernel); it reads nothing this kernel writes.
  if (p.route.longest != nullptr) kdakit::cuda::ptx::griddep_launch_dependents();
  if (!tile_side_runs(p.route)) return;  // a routed call the two-kernel path takes

  Work& wk = *reinterpret_cast<Work*>(smem + Smem::kWorkOffset);
  uint64_t* lbar = reinterpret_cast<uint64_t*>(smem + Smem::kLBarOffset);
  if (tid == 0) ptx::mbarrier_init(lbar, 3 * 32);  // visible past the barrier below
  if (warp == 0) {
    const Work w = work_of(p, int(blockIdx.x));
    const int64_t base = p.chunk_states != nullptr ? common::chunk_state_base_of(p, w.n, lane) : 0;
    if (lane == 0) {
      wk = w;
      wk.cs_base = base;
    }
  }
  __syncthreads();
  const int n = vld(&wk.n), h = vld(&wk.h), len = vld(&wk.len);
  const int tiles = (len + kTile - 1) / kTile;

  float* beta_s = reinterpret_cast<float*>(smem + Smem::kBetaOffset);
  float* gs_s = reinterpret_cast<float*>(smem + Smem::kGsOffset);
  // The first tile's inputs, then the state (in flight together).
  float beta0 = 0.f, gs0 = 0.f;
  if (tiles > 0) {
    issue_tile_copies(p, wk, 0, smem, tid);
    issue_v_copy(p, wk, 0, smem, tid);
    beta0 = load_beta(p, wk, 0, tid);
    gs0 = load_scalar_gate(p, wk, 0, tid);
  }
  kdakit::cuda::cp_async_commit();
  // The warp's 16 value rows of S^T (vrow: row of c0/c1; c2/c3: vrow + 8), key tiles j = 0..15.
  const int vrow = kWarpCols * warp + g;
  float state[16][4];
  common::load_initial_state(state, p, n, h, vrow, t);

  // Gate constants of thread (c, hh)'s channel.
  const int c = tid & (kHeadDim - 1), hh = tid >> 7, r0 = hh * kTileHalf;
  float gate_a = 1.f, gate_dt = 0.f;
  if constexpr (kGate == GateMode::kSoftplus) gate_a = -expf(p.A_log[h]);
  if constexpr (kGate == GateMode::kLowerBound)
    gate_a = p.A_log != nullptr ? expf(p.A_log[h]) : 1.f;
  if (kGate != GateMode::kPrecomputed && p.dt_bias != nullptr)
    gate_dt = p.scalar_gate ? p.dt_bias[h] : p.dt_bias[h * kHeadDim + c];

  const int chunks_per_state = p.chunk_states != nullptr ? p.chunk_state_interval / kTile : 0;

  float* qm_s = reinterpret_cast<float*>(smem + Smem::kQmOffset);
  float* km_s = reinterpret_cast<float*>(smem + Smem::kKmOffset);
  float* kc_s = reinterpret_cast<float*>(smem + Smem::kKcOffset);
  float* qm1_s = reinterpret_cast<float*>(smem + Smem::kQm1Offset);
  float* km1_s = reinterpret_cast<float*>(smem + Smem::kKm1Offset);
  float* kend_s = reinterpret_cast<float*>(smem + Smem::kKendOffset);
  float* l_s = reinterpret_cast<float*>(smem + Smem::kLOffset);
  float* m_s = reinterpret_cast<float*>(smem + Smem::kMOffset);
  float* t_s = reinterpret_cast<float*>(smem + Smem::kTOffset);
  float* decay_s = reinterpret_cast<float*>(smem + Smem::kDecayOffset);
  float* m2_s = reinterpret_cast<float*>(smem + Smem::kM2Offset);
  float* half_s = reinterpret_cast<float*>(smem + Smem::kHalfSumOffset);
  float* rq_s = reinterpret_cast<float*>(smem + Smem::kRqOffset);
  float* rk_s = reinterpret_cast<float*>(smem + Smem::kRkOffset);
  uint32_t* wide_s = reinterpret_cast<uint32_t*>(smem + Smem::kWideOffset);
  constexpr int PC = Smem::kPitchC, PK = Smem::kPitchK, PT = Smem::kPitchT;
  // Stored here, once the gate constants' loads are issued (warp 0 waits for beta to store it).
  if (tiles > 0) store_token_scalars(p, wk, 0, tid, beta0, gs0, beta_s, gs_s);
  kdakit::cuda::cp_async_wait_all();
  __syncthreads();  // the first tile's raw inputs, beta and scalar gate

  for (int j = 0; j < tiles; ++j) {
    const int valid = min(kTile, vld(&wk.len) - j * kTile);
    const int t = fresh_tid() & 3;  // shadows the prologue's
    const bool more = j + 1 < tiles;
    // This tile's stage of raw inputs; the wide channels' running sums b go over its raw g.
    uint8_t* stage = smem + stage_offset(j);
    const __nv_bfloat16* q_raw = reinterpret_cast<const __nv_bfloat16*>(stage + Smem::kQRawOffset);
    const __nv_bfloat16* k_raw = reinterpret_cast<const __nv_bfloat16*>(stage + Smem::kKRawOffset);
    float* b_s = reinterpret_cast<float*>(stage + Smem::kBOffset);
    const float* beta_t = beta_s + (j & 1) * kTile;  // this tile's slots
    const float* gs_t = gs_s + (j & 1) * kTile;
    // The state entering this tile, at every chunk-state interval (a multiple of 64 tokens).
    if (chunks_per_state > 0 && j % chunks_per_state == 0) {
      const int64_t off =
          common::chunk_state_offset(p, vld(&wk.cs_base) + j / chunks_per_state, vld(&wk.h));
      if (off >= 0)
        common::store_state(state, common::state_at(p.chunk_states, off, p.chunk_bf16), vrow, t,
                            common::StateView{p.k_first, p.chunk_bf16, p.chunk_pairs});
    }

    // The next tile's raw q, k and g into the other stage (the tile before this one read it
    // before its P3 barrier), its beta and scalar gate into registers (stored after this tile's
    // P1 barrier). Every tile commits a group, empty or not, for the waits' counts.
    if (more) issue_tile_copies(p, wk, j + 1, smem, tid);
    kdakit::cuda::cp_async_commit();
    float beta_next = 0.f, gs_next = 0.f;
    if (more && tid < kTile) {
      beta_next = load_beta(p, wk, j + 1, tid);
      gs_next = load_scalar_gate(p, wk, j + 1, tid);
    }

    // ---- P1: gates and running sums (thread = channel), norms and beta
    // ---------------------------
    // No barrier first: this tile's raw q, k, g, beta and scalar gate were waited for and stored
    // before the last tile's P3 barrier (the first tile's before the loop), and P1 writes only
    // rq, rk and the halves' sums, which the last tile read before that barrier.
    {
      // warp w: rows 2w, 2w + 1 of q (sums 0, 1) and of k (2, 3); lane = channels 4 lane .. + 3.
      // A transposed butterfly: after the xor-16 and 8 steps lane l holds sum (l / 8) % 4 of its
      // half and quarter; three more steps finish it (6 shuffles for the 4 sums).
      float v4[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __nv_bfloat16* src =
            (i < 2 ? q_raw : k_raw) + (2 * warp + (i & 1)) * kHeadDim + 4 * lane;
        const uint2 x = *reinterpret_cast<const uint2*>(src);
        const float a = __uint_as_float(x.x << 16), b = __uint_as_float(x.x & 0xffff0000u);
        const float c4 = __uint_as_float(x.y << 16), d = __uint_as_float(x.y & 0xffff0000u);
        v4[i] = a * a + b * b + c4 * c4 + d * d;
      }
      float v2[2];
      const bool h16 = (lane & 16) != 0, h8 = (lane & 8) != 0;
#pragma unroll
      for (int i = 0; i < 2; ++i)
        v2[i] =
            (h16 ? v4[i + 2] : v4[i]) + __shfl_xor_sync(0xffffffffu, h16 ? v4[i] : v4[i + 2], 16);
      float sum = (h8 ? v2[1] : v2[0]) + __shfl_xor_sync(0xffffffffu, h8 ? v2[0] : v2[1], 8);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      const int idx = (lane >> 3) & 3;  // 0, 1: q row 2w + idx; 2, 3: k row 2w + idx - 2
      const int r = 2 * warp + (idx & 1);
      // NOTE: rsqrt.approx (relative error ~2^-23), not the IEEE 1 / sqrt and its slow path.
      const float norm = p.use_qk_l2norm ? rsqrtf(sum + 1e-6f) : 1.f;
      if ((lane & 7) == 0) {
        if (idx < 2)
          rq_s[r] = r < valid ? p.scale * norm : 0.f;
        else
          rk_s[r] = r < valid ? norm : 0.f;
      }
    }
    float b[kTileHalf];  // the raw gate of rows r0 + i, then the running sum over the half
    if (p.scalar_gate) {
#pragma unroll
      for (int i = 0; i < kTileHalf; ++i) b[i] = gs_t[r0 + i];
    } else if (p.g_fp32) {
#pragma unroll
      for (int i = 0; i < kTileHalf; ++i)
        b[i] = reinterpret_cast<const float*>(stage + Smem::kGRawOffset)[(r0 + i) * kHeadDim + c];
    } else {
#pragma unroll
      for (int i = 0; i < kTileHalf; ++i)
        b[i] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(
            stage + Smem::kGRawOffset)[(r0 + i) * kHeadDim + c]);
    }
    {
      float run = 0.f;
#pragma unroll
      for (int i = 0; i < kTileHalf; ++i) {
        // NOTE: rows past the sequence decay by nothing: b_15 is b of the last token.
        run +=
            r0 + i < valid ? common::gate_log2<kGate>(b[i], gate_a, gate_dt, p.lower_bound) : 0.f;
        b[i] = run;
      }
      half_s[hh * kHeadDim + c] = run;
    }
    __syncthreads();  // rq, rk, the halves' sums
    // The next tile's v into the other stage, its beta and scalar gate into their slots (the
    // last tile's P4 read them before this barrier).
    if (more) {
      issue_v_copy(p, wk, j + 1, smem, tid);
      store_token_scalars(p, wk, j + 1, tid, beta_next, gs_next, beta_s, gs_s);
    }
    kdakit::cuda::cp_async_commit();
    const float sum0 = half_s[c];
    const float bend = sum0 + half_s[kHeadDim + c];
    if (hh == 1) {
#pragma unroll
      for (int i = 0; i < kTileHalf; ++i) b[i] += sum0;
    }
    // References per token half h: m_h, the midpoint of the half's range of b ([b_7, 0] and
    // [b_15, b_7]); a half whose span passes kMaxSpan is wide for the channel (reference 0 for
    // the first half's row factors, column factors 0). The lower-bound gate (at most 115 over
    // the whole tile) takes one reference, the tile's midpoint, for both halves (kHalfRefs).
    const float sum1 = bend - sum0;
    bool wide0, wide1;
    float m0, m1;
    if constexpr (kHalfRefs) {
      wide0 = -sum0 > kMaxSpan, wide1 = -sum1 > kMaxSpan;
      m0 = wide0 ? 0.f : 0.5f * sum0, m1 = sum0 + 0.5f * sum1;
    } else {
      wide0 = wide1 = -bend > kMaxSpan;
      m0 = m1 = wide0 ? 0.f : 0.5f * bend;
    }
    const bool wide = hh == 0 ? wide0 : wide1;  // this thread's rows' half
    const float mine = hh == 0 ? m0 : m1;       // the column reference of the thread's rows
    if (hh == 0) {
      decay_s[c] = fast_exp2(bend);
      m2_s[c] = fast_exp2(m0);  // the state operand's factor (row factors Km0, Qm0)
    }
    {
      // warps 0-3 (half 0) and 4-7 (half 1): the wide-channel masks of both halves, word w
      const uint32_t ballot = __ballot_sync(0xffffffffu, wide);
      if (lane == 0) wide_s[warp] = ballot;
    }

    // ---- P2: factor tiles ----------------------------------------------------------------------
    // Stored as tf32 (rounded to nearest): every later read is an mma operand.
#pragma unroll
    for (int i = 0; i < kTileHalf; ++i) {
      const int r = r0 + i;
      const float4 rq4 = *reinterpret_cast<const float4*>(rq_s + r0 + (i & ~3));
      const float4 rk4 = *reinterpret_cast<const float4*>(rk_s + r0 + (i & ~3));
      const float rq = (i & 3) == 0 ? rq4.x : (i & 3) == 1 ? rq4.y : (i & 3) == 2 ? rq4.z : rq4.w;
      const float rk = (i & 3) == 0 ? rk4.x : (i & 3) == 1 ? rk4.y : (i & 3) == 2 ? rk4.z : rk4.w;
      const float qn = __bfloat162float(q_raw[r * kHeadDim + c]) * rq;
      const float kn = __bfloat162float(k_raw[r * kHeadDim + c]) * rk;
      // Row factors against half 0's reference (its diagonal block: <= 2^96; the rows of half 1:
      // 2^(non-positive)) and, for the rows of half 1, against half 1's (<= 2^96; zeros where
      // half 1 is wide); the rows of half 0 have no terms with the columns of half 1 (zeros).
      // Column factor against the row's own half (<= 2^96; 0 where that half is wide), and Kend's
      // 2^(b_15 - b_r) <= 1.
      const float e_row0 = fast_exp2(b[i] - m0);
      float e_row1 = 0.f, e_col, e_end;
      if constexpr (kHalfRefs) {
        e_row1 = hh == 1 && !wide1 ? fast_exp2(b[i] - m1) : 0.f;  // no inf next to Kc's 0
        e_col = wide ? 0.f : fast_exp2(mine - b[i]);
        e_end = fast_exp2(bend - b[i]);
      } else {
        // one reference m = b_15 / 2: 2^(b_15 - b_r) = 2^(m - b_r) 2^m when not wide
        const float e = fast_exp2(wide ? bend - b[i] : mine - b[i]);
        e_col = wide ? 0.f : e;
        e_end = wide ? e : e * fast_exp2(m0);
      }
      qm_s[r * PC + c] = tf32_value(qn * e_row0);
      km_s[r * PC + c] = tf32_value(kn * e_row0);
      if constexpr (kHalfRefs) {
        qm1_s[r * PC + c] = tf32_value(qn * e_row1);
        km1_s[r * PC + c] = tf32_value(kn * e_row1);
      }
      kc_s[r * PC + c] = tf32_value(kn * e_col);
      kend_s[r * PK + c] = tf32_value(kn * e_end);
      // read by the wide channels' terms only: a channel wide in half 0 also needs b of the rows
      // of half 1 (their terms with half 0's columns), wide there or not
      if (wide0 || wide1) b_s[r * kHeadDim + c] = b[i];
    }
    const bool any_wide = __syncthreads_or(wide0 || wide1) != 0;

    // ---- P3: L, M and the state products (tf32 tensor cores) ------------------------------
    // W^T = S0^T diag(2^m) Km^T and S0^T diag(2^m) Qm^T: the warp's 16 value rows x 16 tokens,
    // in two halves of key tiles; warps 2-5 take their first half while the others compute L and M.
    float wacc[2][4], qacc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) wacc[nt][e] = qacc[nt][e] = 0.f;
    if (!is_lm_warp(warp)) {
      state_products<0>(state, m2_s, smem, g, t, wacc, qacc);
    } else {
      // warp 0, 1: L; 6, 7: M; columns 8 nt .. 8 nt + 7, row factors against half nt's reference
      const int mat = warp < 2 ? 0 : 1, nt = warp & 1;
      const bool second = kHalfRefs && nt == 1;
      const uint8_t* rows = smem + (mat == 0 ? (second ? Smem::kKm1Offset : Smem::kKmOffset)
                                             : (second ? Smem::kQm1Offset : Smem::kQmOffset));
      const uint8_t* cols = smem + Smem::kKcOffset;
      float acc[4] = {};
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 8; ++kk) {
        const int ch = 8 * kk + 2 * t;
        const float2 r0 = lds2(rows, uint32_t(g * PC + ch) * 4),
                     r1 = lds2(rows, uint32_t((g + 8) * PC + ch) * 4);
        const float2 cb = lds2(cols, uint32_t((8 * nt + g) * PC + ch) * 4);
        const uint32_t a[4] = {__float_as_uint(r0.x), __float_as_uint(r1.x), __float_as_uint(r0.y),
                               __float_as_uint(r1.y)};
        mma_tf32_1688(acc, a, __float_as_uint(cb.x), __float_as_uint(cb.y));
      }
      float* out = mat == 0 ? l_s : m_s;
      const int col = 8 * nt + 2 * t;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), cl = col + (e & 1);
        out[row * PT + cl] = (mat == 1 && cl > row) ? 0.f : acc[e];
      }
    }
    // L is stored: warps 0 and 1 hand it over without waiting, and warp kSubstWarp, half-way
    // through its products, inverts it while the L and M warps do theirs (after the wide
    // channels' terms when there are any: P4). Warp kSubstWarp arrives too, for the phase's
    // token (no phase count to carry).
    // NOTE: an mbarrier, not a named barrier: with bar.arrive / bar.sync on these three warps,
    // compute-sanitizer racecheck reported 19-54 hazards between accesses that CTA barriers
    // order (none with a CTA barrier in the same place); the mbarrier runs as fast and racecheck
    // reports none (docs/design/20261202-prefill-tile16.md, session 38).
    if (!any_wide) {
      if (warp < 2) ptx::mbarrier_arrive(lbar);  // releases each thread's L stores
      if (warp == kSubstWarp) {
        ptx::mbarrier_wait_state(lbar, ptx::mbarrier_arrive_state(lbar));
        invert_tile(t_s, beta_t);
      }
    }
    if (is_lm_warp(warp)) state_products<0>(state, m2_s, smem, g, t, wacc, qacc);
    state_products<kHeadDim / 16>(state, m2_s, smem, g, t, wacc, qacc);
    if (any_wide) {
      // Wide channels: their L and M terms with columns in the half where they are wide, per
      // element, on top of the tensor-core sums.
      __syncthreads();
#pragma unroll 1
      for (int e = tid; e < 2 * kTile * kTile; e += kThreads) {
        const int mat = e / (kTile * kTile), r = (e / kTile) % kTile, s = e % kTile;
        if (s > r || (mat == 0 && s == r)) continue;
        const __nv_bfloat16* rows = mat == 0 ? k_raw : q_raw;
        const float rr = mat == 0 ? rk_s[r] : rq_s[r];
        float sum = 0.f;
#pragma unroll 1
        for (int word = 0; word < 4; ++word) {
          uint32_t bits = wide_s[4 * (s / kTileHalf) + word];  // wide in the column's half
          while (bits != 0) {
            const int ch = 32 * word + __ffs(bits) - 1;
            bits &= bits - 1;
            sum += __bfloat162float(rows[r * kHeadDim + ch]) *
                   __bfloat162float(k_raw[s * kHeadDim + ch]) *
                   fast_exp2(b_s[r * kHeadDim + ch] - b_s[s * kHeadDim + ch]);
          }
        }
        float* out = mat == 0 ? l_s : m_s;
        out[r * PT + s] += sum * rr * rk_s[s];
      }
    }
    // This tile's v and the next tile's q, k and g have landed (the next tile's v may not have).
    kdakit::cuda::cp_async_wait_group<1>();
    __syncthreads();  // L, M, T; this tile's v; the next tile's raw q, k, g, beta, scalar gate

    // ---- P4: R^T = (V^T - W^T) diag(beta), the state's decay; T if wide channels delayed it
    if (any_wide && warp == kSubstWarp) invert_tile(t_s, beta_t);
    {
      const __nv_bfloat16* v_raw =
          reinterpret_cast<const __nv_bfloat16*>(stage + Smem::kVRawOffset);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = 8 * nt + 2 * t + (e & 1);
          const int vc = kWarpCols * warp + g + 8 * (e >> 1);
          wacc[nt][e] = (__bfloat162float(v_raw[tok * kHeadDim + vc]) - wacc[nt][e]) * beta_t[tok];
        }
    }
    // The state's decay over the tile (S0^T diag(2^b_15)).
    common::decay_state(state, decay_s, t);
    if (any_wide) __syncthreads();  // T

    // ---- P5: U^T = R^T T^T; O^T = S0^T Qt^T + U^T M^T; S^T = S0^T diag(decay) + U^T Kend
    // ----------
    float u[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) u[nt][0] = u[nt][1] = u[nt][2] = u[nt][3] = 0.f;
#pragma unroll
    for (int kt = 0; kt < 2; ++kt) {
      uint32_t a[4];
      acc_as_a(wacc[kt], a);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float2 tb =
            lds2(smem + Smem::kTOffset, uint32_t((8 * nt + g) * PT + 8 * kt + 2 * t) * 4);
        mma_tf32_1688(u[nt], a, to_tf32(tb.x), to_tf32(tb.y));
      }
    }
    uint32_t ua[2][4];
    acc_as_a(u[0], ua[0]);
    acc_as_a(u[1], ua[1]);
#pragma unroll
    for (int kt = 0; kt < 2; ++kt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float2 mb =
            lds2(smem + Smem::kMOffset, uint32_t((8 * nt + g) * PT + 8 * kt + 2 * t) * 4);
        mma_tf32_1688(qacc[nt], ua[kt], to_tf32(mb.x), to_tf32(mb.y));
      }
    {
      const float(&o_acc)[8] = reinterpret_cast<const float(&)[8]>(qacc);
      // NOTE: the warp's column from threadIdx again (kept live across the tile loop it spilled)
      common::store_o_tile<2>(o_acc,
                              p.o + vld(&wk.o_off) + int64_t(j) * kTile * p.stride_o_t +
                                  kWarpCols * int(threadIdx.x >> 5),
                              p.stride_o_t, valid, p.o_pairs, g, t);
    }
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
#pragma unroll
      for (int kt = 0; kt < 2; ++kt) {
        // B (k = token, n = channel): tokens 8 kt + 2t and + 1 (the order of ua's k index)
        const float* kend = kend_s + (8 * kt + 2 * t) * PK + 8 * jj + g;
        mma_tf32_1688(state[jj], ua[kt], __float_as_uint(kend[0]), __float_as_uint(kend[PK]));
      }
    }
  }

  void* fin = common::final_state_of(p, vld(&wk.n), vld(&wk.h));
  if (fin != nullptr) common::store_state(state, fin, kWarpCols * int(threadIdx.x >> 5) + g, t, p);
}

}  // namespace kdakit::sm90::prefill::tile16

// ---- host launcher ------------------------------------------------------------------------------
namespace kdakit::sm90::prefill {

template <GateMode kGate>
Status launch_prefill_tile16(const PrefillParams& p, const WorkspacePlan& plan,
                             const void* workspace, cudaStream_t stream) {
  using namespace tile16;
  if (p.num_seqs == 0) return Status::Ok();
  const int64_t num_ctas = p.num_seqs * p.num_v_heads;
  if (num_ctas > int64_t(INT32_MAX) || p.seqlen > int64_t(INT32_MAX) / 2)
    return Status(StatusCode::kUnsupported, "prefill (tile16): N * HV and T must stay below 2^31");

  KernelParams kp{};
  static_cast<common::StateParams&>(kp) = common::state_params(p);
  kp.route = route_of(plan, workspace);
  common::fill_token_params(kp, p, plan, workspace);
  kp.q = static_cast<const __nv_bfloat16*>(p.q);
  kp.k = static_cast<const __nv_bfloat16*>(p.k);
  kp.v = static_cast<const __nv_bfloat16*>(p.v);
  kp.stride_q_b = p.stride_q_b;
  kp.stride_q_t = p.stride_q_t;
  kp.stride_q_h = p.stride_q_h;
  kp.stride_k_b = p.stride_k_b;
  kp.stride_k_t = p.stride_k_t;
  kp.stride_k_h = p.stride_k_h;
  kp.stride_v_b = p.stride_v_b;
  kp.stride_v_t = p.stride_v_t;
  kp.stride_v_h = p.stride_v_h;

  auto kernel = kda_prefill_tile16_sm90_kernel<kGate>;
  // The lower-bound gate's kernel has no second-reference tiles (Qm1, Km1: the plan's end).
  constexpr int kSmem = int(kGate == GateMode::kLowerBound ? SharedMemoryPlan::kBytesOneRef
                                                           : SharedMemoryPlan::kBytes);
  // NOTE: per function and device; set once per device (common/device_setup.cuh), so no driver
  // call is left on the run path.
  static kdakit::cuda::PerDeviceOnce attr_once;
  const cudaError_t attr_err = kdakit::cuda::set_up_once_per_device(attr_once, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  });
  if (attr_err != cudaSuccess)
    return Status(StatusCode::kCudaError, std::string("tile16/kernel.cuh: cudaFuncSetAttribute: ") +
                                              cudaGetErrorString(attr_err));
  kernel<<<unsigned(num_ctas), kThreads, kSmem, stream>>>(kp);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status(StatusCode::kCudaError,
                  std::string("tile16/kernel.cuh: kda_prefill_tile16_sm90_kernel launch: ") +
                      cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace kdakit::sm90::prefill
