// kda_decode_sm90_kernel: the token-serial KDA recurrence over a state pool (decode,
// speculative decoding) or dense / pool-indexed states (short prefill). The second kernel of
// this file, kda_decode_sm90_staged_kernel (V-first decode with one index column), shares the
// math and grid and stages the state in shared memory instead of registers; see its section.
//
// Math, per (sequence n, value head h), state S (K x V) in fp32 registers, for each token t:
//   S <- diag(exp(gamma_t)) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T q_t
// with q_t already multiplied by `scale`. Value channels j never mix, so with the decayed
// column s_j = exp(gamma_t) * S[:, j]:
//   pred_j = <s_j, k>,  qd_j = <s_j, q>,  delta_j = beta (v_j - pred_j),
//   S[:, j] = s_j + delta_j k,  o_j = qd_j + delta_j <k, q>
// i.e. one pass over the decayed column gives both dot products, plus <k, q> once per token.
//
// Shapes: q, k [B, T, H, K]; v, o [B, T, HV, V]; g [B, T, HV, K] (or [B, T, HV]); beta
// [B, T, HV]; state blocks K x V stored [V, K] (kVFirst) or [K, V] (kKFirst); K = V.
//
// Grid: one CTA per (sequence, value head, slice of kValuesPerCta = 32 value channels),
// flattened with the slice fastest so that neighbouring CTAs stream neighbouring memory.
// Block: kNumWarps = 4 warps, no warp specialisation.
//
// Steps of one CTA:
//   1. resolve the sequence's token range (cu_seqlens clamped) and its start state (a slot
//      of the pool; padding rows write zero outputs and return);
//   2. issue every state load of the CTA's slice (registers, streaming hint) before any use;
//   3. for each group of <= kMaxTokenGroup tokens: the warps preprocess the group's tokens in
//      parallel into shared memory (warp w takes tokens w, w + 4, ...: loads, L2 norms, scale,
//      gate, exp, beta, <k, q>), barrier, then every warp runs the group's tokens serially on
//      its registers; per-token states (speculative decoding, chunk states) are stored from
//      registers as they are produced; barrier;
//   4. store the final state.
//
// Thread mapping of the state slice:
//   kVFirst: warp w owns value rows j0 + 8w .. j0 + 8w + 7; lane l owns key channels
//            [l * K/32, (l+1) * K/32) of each row (16-byte loads for fp32, K = 128). Dot
//            products reduce over the 32 lanes with butterfly shuffles; no barrier per token.
//   kKFirst: thread (warp w, lane l) owns value columns j0 + 4 (l % 8) .. +3 of key rows
//            [rg * K/16, (rg+1) * K/16) with rg = 4w + l / 8. Dot products reduce in-thread
//            over its rows, across the 4 row groups of a warp by shuffles, across warps through
//            shared memory (double-buffered: one barrier per token).
//
// Untrusted device metadata (cu_seqlens, slot indices, accepted counts) is clamped or
// skipped: no access leaves the given buffers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "cuda/common/device_setup.cuh"
#include "cuda/common/dtype.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sm90/decode/config.h"
#include "cuda/common/pdl_launch.cuh"
#include "cuda/sm90/decode/launch.h"

namespace kdakit::sm90::recurrent {

using kdakit::cuda::load_as_float;
using kdakit::cuda::store_from_float;

// ------------------------------------------------------------------------------------------
// Per-sequence metadata
// ------------------------------------------------------------------------------------------

struct TokenRange {
  int64_t row;    // batch row
  int64_t begin;  // first token of the sequence in that row
  int64_t end;    // one past the last
};

__device__ __forceinline__ int64_t load_offset(const void* cu, DType dtype, int64_t i) {
  return dtype == DType::kInt32 ? int64_t(static_cast<const int32_t*>(cu)[i])
                                : static_cast<const int64_t*>(cu)[i];
}

__device__ __forceinline__ TokenRange token_range(const RecurrentKernelParams& p, int64_t n) {
  if (p.cu_seqlens == nullptr) return TokenRange{n, 0, p.seqlen};
  const int64_t lo = load_offset(p.cu_seqlens, p.dtype_cu_seqlens, n);
  const int64_t hi = load_offset(p.cu_seqlens, p.dtype_cu_seqlens, n + 1);
  const int64_t begin = min(max(lo, int64_t{0}), p.seqlen);
  const int64_t end = min(max(hi, begin), p.seqlen);
  return TokenRange{0, begin, end};
}

__device__ __forceinline__ bool slot_valid(int64_t slot, int64_t num_slots, bool null_slot_is_padding) {
  return slot >= 0 && slot < num_slots && !(null_slot_is_padding && slot == 0);
}

// Index of the first chunk-state entry of sequence n: sum over earlier sequences of
// ceil(len / interval). Fixed batches have it in closed form; packed batches sum over the
// clamped cu_seqlens, each warp on its own (warp-strided loop, then a warp sum).
__device__ __forceinline__ int64_t first_chunk_entry(const RecurrentKernelParams& p, int64_t n, int lane) {
  const int64_t c = p.chunk_state_interval;
  if (p.cu_seqlens == nullptr) return n * ((p.seqlen + c - 1) / c);
  long long total = 0;
  for (int64_t m = lane; m < n; m += 32) {
    const TokenRange r = token_range(p, m);
    total += (r.end - r.begin + c - 1) / c;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(0xffffffffu, total, offset);
  return int64_t(total);
}

// ------------------------------------------------------------------------------------------
// Token preprocessing (one warp per token) into shared memory
// ------------------------------------------------------------------------------------------

// Raw inputs of one token for one lane: what the preprocessing reads from global memory. Split
// from the arithmetic so that a kernel can issue these loads early (before its state loads).
// kPreloadGate: A_log and dt_bias are loaded here too (else where used, in finish_token: the
// register kernel holds its state meanwhile and has no registers to spare).
template <int kHeadDim>
__device__ __forceinline__ float load_bias(const RecurrentKernelParams& p, int h, int i) {
  return p.dt_bias == nullptr ? 0.f : p.scalar_gate ? p.dt_bias[h] : p.dt_bias[int64_t(h) * kHeadDim + i];
}

template <int kHeadDim>
struct RawToken {
  static constexpr int kE = kHeadDim / 32;  // key channels per lane
  float q[kE], k[kE], g[kE], bias[kE];
  float beta, v, a_log;
};

template <int kHeadDim, bool kPreloadGate>
__device__ __forceinline__ RawToken<kHeadDim> load_token(const RecurrentKernelParams& p, int64_t row, int64_t t,
                                                         int h, int j0, int lane) {
  constexpr int kE = RawToken<kHeadDim>::kE;
  RawToken<kHeadDim> x;
  const int hk = h / (p.num_v_heads / p.num_qk_heads);
  const int i0 = lane * kE;
  const int64_t q_base = row * p.stride_q_b + t * p.stride_q_t + int64_t(hk) * p.stride_q_h + i0;
  const int64_t k_base = row * p.stride_k_b + t * p.stride_k_t + int64_t(hk) * p.stride_k_h + i0;
  const int64_t g_base = row * p.stride_g_b + t * p.stride_g_t + int64_t(h) * p.stride_g_h;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    x.q[e] = load_as_float(p.q, p.dtype_qkv, q_base + e);
    x.k[e] = load_as_float(p.k, p.dtype_qkv, k_base + e);
    x.g[e] = load_as_float(p.g, p.dtype_g, g_base + (p.scalar_gate ? 0 : i0 + e));
    if constexpr (kPreloadGate) x.bias[e] = load_bias<kHeadDim>(p, h, i0 + e);
  }
  x.beta = load_as_float(p.beta, p.dtype_beta, row * p.stride_beta_b + t * p.stride_beta_t + int64_t(h) * p.stride_beta_h);
  x.v = load_as_float(p.v, p.dtype_qkv, row * p.stride_v_b + t * p.stride_v_t + int64_t(h) * p.stride_v_h + j0 + lane);
  if constexpr (kPreloadGate) x.a_log = p.A_log != nullptr ? p.A_log[h] : 0.f;
  return x;
}

// The arithmetic of the preprocessing (one warp, one token), written to token slot
// `slot_in_group` of the shared-memory token buffer.
template <int kHeadDim, bool kPreloadGate>
__device__ __forceinline__ void finish_token(const RecurrentKernelParams& p, const RawToken<kHeadDim>& x, int h,
                                             float* smem, int group, int slot_in_group, int lane) {
  using Plan = SharedMemoryPlan<kHeadDim>;
  constexpr int kE = RawToken<kHeadDim>::kE;
  const int i0 = lane * kE;
  float q[kE], k[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    q[e] = x.q[e];
    k[e] = x.k[e];
  }

  // --- q/k L2 norm, then scale on q
  float q_scale = p.scale;
  if (p.use_qk_l2norm) {
    float qq = 0.f, kk = 0.f;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      qq += q[e] * q[e];
      kk += k[e] * k[e];
    }
    qq = kdakit::cuda::warp_sum(qq);
    kk = kdakit::cuda::warp_sum(kk);
    q_scale *= kdakit::cuda::l2norm_scale(qq);
    const float k_scale = kdakit::cuda::l2norm_scale(kk);
#pragma unroll
    for (int e = 0; e < kE; ++e) k[e] *= k_scale;
  }
  float kq = 0.f;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    q[e] *= q_scale;
    kq += k[e] * q[e];
  }
  kq = kdakit::cuda::warp_sum(kq);

  // --- gate: gamma (natural log, <= 0), then the decay factor exp(gamma)
  float decay[kE];
  if (p.gate == GateMode::kPrecomputed) {
#pragma unroll
    for (int e = 0; e < kE; ++e) decay[e] = expf(x.g[e]);
  } else {
    const float a_log = kPreloadGate ? x.a_log : (p.A_log != nullptr ? p.A_log[h] : 0.f);
    const float a = p.A_log != nullptr ? expf(a_log) : 1.f;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const float bias = kPreloadGate ? x.bias[e] : load_bias<kHeadDim>(p, h, i0 + e);
      const float gamma = p.gate == GateMode::kSoftplus
                              ? kdakit::cuda::gate_softplus(x.g[e], -a, bias)
                              : kdakit::cuda::gate_lower_bound(x.g[e], a, bias, p.lower_bound);
      decay[e] = expf(gamma);
    }
  }
  const float beta = kdakit::cuda::beta_activation(x.beta, p.use_beta_sigmoid, p.allow_neg_eigval);

  // --- store
  float* q_s = smem + Plan::q(group) + slot_in_group * kHeadDim + i0;
  float* k_s = smem + Plan::k(group) + slot_in_group * kHeadDim + i0;
  float* d_s = smem + Plan::decay(group) + slot_in_group * kHeadDim + i0;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    q_s[e] = q[e];
    k_s[e] = k[e];
    d_s[e] = decay[e];
  }
  smem[Plan::v(group) + slot_in_group * kValuesPerCta + lane] = x.v;
  if (lane == 0) {
    smem[Plan::beta(group) + slot_in_group] = beta;
    smem[Plan::kq(group) + slot_in_group] = kq;
  }
}

template <int kHeadDim>
__device__ __forceinline__ void preprocess_token(const RecurrentKernelParams& p, float* smem, int group,
                                                 int slot_in_group, int64_t row, int64_t t, int h, int j0,
                                                 int lane) {
  finish_token<kHeadDim, false>(p, load_token<kHeadDim, false>(p, row, t, h, j0, lane), h, smem, group,
                                slot_in_group, lane);
}

// Reads n consecutive fp32 values of shared memory (16-byte aligned) into registers.
template <int kN>
__device__ __forceinline__ void load_smem(const float* p, float (&out)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += 4) {
      const float4 x = *reinterpret_cast<const float4*>(p + i);
      out[i] = x.x;
      out[i + 1] = x.y;
      out[i + 2] = x.z;
      out[i + 3] = x.w;
    }
  } else if constexpr (kN % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += 2) {
      const float2 x = *reinterpret_cast<const float2*>(p + i);
      out[i] = x.x;
      out[i + 1] = x.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = p[i];
  }
}

// ------------------------------------------------------------------------------------------
// State slice of one thread, per layout
// ------------------------------------------------------------------------------------------

// kVFirst: kRowsPerWarp rows x kE key channels. Element (r, e) is S^T[j0 + 8w + r][lane*kE + e].
template <class StateT, int kHeadDim>
struct VFirstSlice {
  static constexpr int kE = kHeadDim / 32;
  float s[kRowsPerWarp][kE];

  // NOTE: one 32-bit offset per thread plus compile-time row offsets (r * K), so that the
  // loads and stores of every row use the same address register with an immediate offset.
  __device__ __forceinline__ static int thread_offset(int j0, int warp, int lane) {
    return (j0 + warp * kRowsPerWarp) * kHeadDim + lane * kE;
  }
  __device__ __forceinline__ void load(const StateT* block, int j0, int warp, int lane) {
    const StateT* base = block + thread_offset(j0, warp, lane);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) kdakit::cuda::load_vec_stream<kE>(base + r * kHeadDim, s[r]);
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int e = 0; e < kE; ++e) s[r][e] = 0.f;
  }
  __device__ __forceinline__ void store(StateT* block, int j0, int warp, int lane) const {
    StateT* base = block + thread_offset(j0, warp, lane);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) kdakit::cuda::store_vec_stream<kE>(base + r * kHeadDim, s[r]);
  }
};

// kKFirst: kRows key rows x kColsPerThread value columns. Element (r, c) is
// S[rg * kRows + r][j0 + 4 * (lane % 8) + c].
template <class StateT, int kHeadDim>
struct KFirstSlice {
  static constexpr int kRows = kHeadDim / kRowGroups;
  static_assert(kHeadDim % kRowGroups == 0, "K must split over the 16 row groups");
  float s[kRows][kColsPerThread];

  __device__ __forceinline__ static int row_group(int warp, int lane) { return warp * (32 / kLanesPerRow) + lane / kLanesPerRow; }
  __device__ __forceinline__ static int thread_offset(int j0, int warp, int lane) {
    return row_group(warp, lane) * kRows * kHeadDim + j0 + (lane % kLanesPerRow) * kColsPerThread;
  }
  __device__ __forceinline__ void load(const StateT* block, int j0, int warp, int lane) {
    const StateT* base = block + thread_offset(j0, warp, lane);
#pragma unroll
    for (int r = 0; r < kRows; ++r) kdakit::cuda::load_vec_stream<kColsPerThread>(base + r * kHeadDim, s[r]);
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) s[r][c] = 0.f;
  }
  __device__ __forceinline__ void store(StateT* block, int j0, int warp, int lane) const {
    StateT* base = block + thread_offset(j0, warp, lane);
#pragma unroll
    for (int r = 0; r < kRows; ++r) kdakit::cuda::store_vec_stream<kColsPerThread>(base + r * kHeadDim, s[r]);
  }
};

// ------------------------------------------------------------------------------------------
// One token on the registers
// ------------------------------------------------------------------------------------------

// One stage of the V-first reduce-scatter: a lane keeps values [0, kHalf) or [kHalf, 2 kHalf)
// of part (by lane bit log2(2 kHalf)) and adds the partner lane's copy of the kept half.
template <int kHalf, int kN>
__device__ __forceinline__ void reduce_scatter_stage(float (&part)[kN], int lane) {
  const bool upper = (lane & (2 * kHalf)) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float lo = part[i], hi = part[i + kHalf];
    const float send = upper ? lo : hi;
    const float keep = upper ? hi : lo;
    part[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * kHalf);
  }
}

// kVFirst. Updates the warp's rows; *o_row_out gets o of row (lane >> 1) & 7 on lanes 16..31.
template <class StateT, int kHeadDim>
__device__ __forceinline__ void step_vfirst(VFirstSlice<StateT, kHeadDim>& st, const float* smem, int group,
                                            int tt, int warp, int lane, float* o_row_out) {
  using Plan = SharedMemoryPlan<kHeadDim>;
  constexpr int kE = VFirstSlice<StateT, kHeadDim>::kE;
  float q[kE], k[kE], d[kE];
  load_smem<kE>(smem + Plan::q(group) + tt * kHeadDim + lane * kE, q);
  load_smem<kE>(smem + Plan::k(group) + tt * kHeadDim + lane * kE, k);
  load_smem<kE>(smem + Plan::decay(group) + tt * kHeadDim + lane * kE, d);
  const float beta = smem[Plan::beta(group) + tt];
  const float kq = smem[Plan::kq(group) + tt];

  // part[r] = partial <s_r, k> of row r, part[8 + r] = partial <s_r, q>, over this lane's
  // key channels.
  static_assert(kRowsPerWarp == 8, "the reduce-scatter below is written for 16 partial sums");
  float part[2 * kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    part[r] = 0.f;
    part[kRowsPerWarp + r] = 0.f;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      st.s[r][e] *= d[e];
      part[r] = fmaf(st.s[r][e], k[e], part[r]);
      part[kRowsPerWarp + r] = fmaf(st.s[r][e], q[e], part[kRowsPerWarp + r]);
    }
  }
  // NOTE: reduce-scatter over the 32 lanes instead of 16 butterfly reductions (80 shuffles):
  // at each stage a lane keeps the half of its values selected by one lane bit and adds the
  // partner's copy of that half (8 + 4 + 2 + 1 shuffles), then one last xor-1 step. Lane l
  // ends with the full sum of value index 8 b4 + 4 b3 + 2 b2 + b1 (b = bits of l): lanes
  // 0..15 hold <s_r, k> of row r = (l >> 1) & 7, lanes 16..31 hold <s_r, q> of that row.
  // Fewer shuffles and far fewer live temporaries than the butterflies.
  reduce_scatter_stage<8>(part, lane);
  reduce_scatter_stage<4>(part, lane);
  reduce_scatter_stage<2>(part, lane);
  reduce_scatter_stage<1>(part, lane);
  const float total = part[0] + __shfl_xor_sync(0xffffffffu, part[0], 1);
  const int my_row = (lane >> 1) & (kRowsPerWarp - 1);

  // delta of row my_row on the lanes holding <s_r, k>; every lane needs every row's delta.
  const float* v_s = smem + Plan::v(group) + tt * kValuesPerCta + warp * kRowsPerWarp;
  const float my_delta = beta * (v_s[my_row] - total);
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float delta = __shfl_sync(0xffffffffu, my_delta, 2 * r);
#pragma unroll
    for (int e = 0; e < kE; ++e) st.s[r][e] = fmaf(delta, k[e], st.s[r][e]);
  }
  // o_r = <s_r, q> + delta_r <k, q> on the lanes holding <s_r, q> (lane 16 + 2r and its pair).
  const float partner_delta = __shfl_xor_sync(0xffffffffu, my_delta, 16);
  *o_row_out = fmaf(partner_delta, kq, total);
}

// kKFirst. `reduce` is this token's half of the double-buffered cross-warp buffer. Returns
// the outputs of the thread's columns in o[] (valid in every thread).
template <class StateT, int kHeadDim>
__device__ __forceinline__ void step_kfirst(KFirstSlice<StateT, kHeadDim>& st, const float* smem, float* reduce,
                                            int group, int tt, int warp, int lane,
                                            float (&o)[kColsPerThread]) {
  using Plan = SharedMemoryPlan<kHeadDim>;
  constexpr int kRows = KFirstSlice<StateT, kHeadDim>::kRows;
  const int rg = KFirstSlice<StateT, kHeadDim>::row_group(warp, lane);
  const int cg = lane % kLanesPerRow;
  // NOTE: q, k and decay of the thread's key rows are read from shared memory where used
  // (broadcast within the 8 lanes of a row group) rather than held: 3 x kRows registers saved.
  const float* q_s = smem + Plan::q(group) + tt * kHeadDim + rg * kRows;
  const float* k_s = smem + Plan::k(group) + tt * kHeadDim + rg * kRows;
  const float* d_s = smem + Plan::decay(group) + tt * kHeadDim + rg * kRows;
  const float beta = smem[Plan::beta(group) + tt];
  const float kq = smem[Plan::kq(group) + tt];

  float pk[kColsPerThread], pq[kColsPerThread];
#pragma unroll
  for (int c = 0; c < kColsPerThread; ++c) {
    pk[c] = 0.f;
    pq[c] = 0.f;
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float d = d_s[r], k = k_s[r], q = q_s[r];
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      st.s[r][c] *= d;
      pk[c] = fmaf(st.s[r][c], k, pk[c]);
      pq[c] = fmaf(st.s[r][c], q, pq[c]);
    }
  }
  // Across the row groups of this warp (lanes with equal l % 8).
#pragma unroll
  for (int offset = kLanesPerRow; offset < 32; offset <<= 1) {
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      pk[c] += __shfl_xor_sync(0xffffffffu, pk[c], offset);
      pq[c] += __shfl_xor_sync(0xffffffffu, pq[c], offset);
    }
  }
  // Across warps through shared memory: reduce[warp][0 = pred, 1 = qd][column].
  if (lane < kLanesPerRow) {
    float* dst = reduce + warp * 2 * kValuesPerCta + cg * kColsPerThread;
    *reinterpret_cast<float4*>(dst) = make_float4(pk[0], pk[1], pk[2], pk[3]);
    *reinterpret_cast<float4*>(dst + kValuesPerCta) = make_float4(pq[0], pq[1], pq[2], pq[3]);
  }
  __syncthreads();
  static_assert(kColsPerThread == 4, "the cross-warp exchange moves one float4 per column group");
  float pred[kColsPerThread] = {0.f, 0.f, 0.f, 0.f}, qd[kColsPerThread] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int w = 0; w < kNumWarps; ++w) {
    const float* src = reduce + w * 2 * kValuesPerCta + cg * kColsPerThread;
    const float4 a = *reinterpret_cast<const float4*>(src);
    const float4 b = *reinterpret_cast<const float4*>(src + kValuesPerCta);
    pred[0] += a.x, pred[1] += a.y, pred[2] += a.z, pred[3] += a.w;
    qd[0] += b.x, qd[1] += b.y, qd[2] += b.z, qd[3] += b.w;
  }
  const float* v_s = smem + Plan::v(group) + tt * kValuesPerCta + cg * kColsPerThread;
#pragma unroll
  for (int c = 0; c < kColsPerThread; ++c) {
    const float delta = beta * (v_s[c] - pred[c]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) st.s[r][c] = fmaf(delta, k_s[r], st.s[r][c]);
    o[c] = fmaf(delta, kq, qd[c]);
  }
}

// ------------------------------------------------------------------------------------------
// The kernel
// ------------------------------------------------------------------------------------------

template <class StateT, StateLayout kLayout, int kHeadDim>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm(kLayout)) kda_decode_sm90_kernel(const __grid_constant__ RecurrentKernelParams p) {
  using Plan = SharedMemoryPlan<kHeadDim>;
  using Slice = std::conditional_t<kLayout == StateLayout::kVFirst, VFirstSlice<StateT, kHeadDim>,
                                   KFirstSlice<StateT, kHeadDim>>;
  constexpr int kSlices = kHeadDim / kValuesPerCta;
  constexpr int64_t kBlockElems = int64_t(kHeadDim) * kHeadDim;
  extern __shared__ float4 smem_raw[];
  float* smem = reinterpret_cast<float*>(smem_raw);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // NOTE: the launcher caps the grid at 2^31 - 1 CTAs, so 32-bit index math is exact.
  const int cta = int(blockIdx.x);
  const int j0 = (cta % kSlices) * kValuesPerCta;
  const int h = (cta / kSlices) % p.num_v_heads;
  const int64_t n = cta / (kSlices * p.num_v_heads);
  const int64_t head_offset = int64_t(h) * kBlockElems;

  // --- 1. sequence, start state, final destination
  const TokenRange range = token_range(p, n);
  const int64_t len = range.end - range.begin;
  const StateT* init = nullptr;
  StateT* final_dst = nullptr;
  const int32_t* index_row = nullptr;
  bool padding = false;
  if (p.mode == Mode::kDecode) {
    StateT* pool = static_cast<StateT*>(p.pool);
    index_row = p.state_indices + n * p.stride_state_indices_n;
    const int cols = p.num_index_cols;
    const int accepted = p.num_accepted_tokens != nullptr ? min(max(p.num_accepted_tokens[n], 1), cols) : 1;
    const int64_t start = index_row[accepted - 1];
    padding = !slot_valid(start, p.num_pool_slots, p.null_slot_is_padding);
    if (!padding) {
      init = pool + start * p.stride_pool_slot + head_offset;
      if (cols == 1 && len > 0) final_dst = pool + start * p.stride_pool_slot + head_offset;
    }
  } else {
    if (p.initial_state != nullptr) {
      const StateT* base = static_cast<const StateT*>(p.initial_state);
      if (p.initial_state_indices == nullptr) {
        init = base + n * p.stride_initial_state_n + head_offset;
      } else {
        const int64_t slot = p.initial_state_indices[n];
        if (slot_valid(slot, p.num_initial_slots, false)) init = base + slot * p.stride_initial_state_n + head_offset;
      }
    }
    if (p.final_state != nullptr) {
      StateT* base = static_cast<StateT*>(p.final_state);
      if (p.final_state_indices == nullptr) {
        final_dst = base + n * p.stride_final_state_n + head_offset;
      } else {
        const int64_t slot = p.final_state_indices[n];
        if (slot_valid(slot, p.num_final_slots, false)) final_dst = base + slot * p.stride_final_state_n + head_offset;
      }
    }
  }

  if (padding) {
    // NOTE: a padding row still owns its output rows: zeros, so that no stale value leaks.
    for (int64_t x = threadIdx.x; x < len * kValuesPerCta; x += kThreads) {
      const int64_t t = range.begin + x / kValuesPerCta;
      const int j = j0 + int(x % kValuesPerCta);
      store_from_float(p.o, p.dtype_qkv,
                       range.row * p.stride_o_b + t * p.stride_o_t + int64_t(h) * p.stride_o_h + j, 0.f);
    }
    return;
  }

  // --- 2. state loads, all issued before the first use
  Slice st;
  if (init != nullptr) {
    st.load(init, j0, warp, lane);
  } else {
    st.zero();
  }

  const bool write_chunks = p.mode == Mode::kPrefill && p.chunk_states != nullptr && p.chunk_state_interval > 0;
  int64_t next_chunk_entry = write_chunks ? first_chunk_entry(p, n, lane) : 0;
  int64_t next_chunk_token = 0;  // the next chunk state is the one before this token
  const bool write_per_token = p.mode == Mode::kDecode && p.num_index_cols > 1;

  // --- 3. token groups
  const int group = p.token_group;
  float* reduce = smem;
  int parity = 0;
#pragma unroll 1
  for (int64_t g0 = 0; g0 < len; g0 += group) {
    const int count = int(min(int64_t(group), len - g0));
#pragma unroll 1
    for (int tt = warp; tt < count; tt += kNumWarps) {
      preprocess_token<kHeadDim>(p, smem, group, tt, range.row, range.begin + g0 + tt, h, j0, lane);
    }
    __syncthreads();

#pragma unroll 1
    for (int tt = 0; tt < count; ++tt) {
      const int64_t t = g0 + tt;  // token index inside the sequence
      if (write_chunks && t == next_chunk_token) {
        if (next_chunk_entry < p.num_chunk_states) {
          st.store(static_cast<StateT*>(p.chunk_states) + next_chunk_entry * p.num_v_heads * kBlockElems +
                       head_offset,
                   j0, warp, lane);
        }
        ++next_chunk_entry;
        next_chunk_token += p.chunk_state_interval;
      }

      const int64_t o_base = range.row * p.stride_o_b + (range.begin + t) * p.stride_o_t + int64_t(h) * p.stride_o_h;
      if constexpr (kLayout == StateLayout::kVFirst) {
        float out;
        step_vfirst<StateT, kHeadDim>(st, smem, group, tt, warp, lane, &out);
        if (lane >= 16 && (lane & 1) == 0) {
          store_from_float(p.o, p.dtype_qkv, o_base + j0 + warp * kRowsPerWarp + ((lane >> 1) & (kRowsPerWarp - 1)), out);
        }
      } else {
        float out[kColsPerThread];
        step_kfirst<StateT, kHeadDim>(st, smem, reduce + parity * kNumWarps * 2 * kValuesPerCta, group, tt, warp,
                                      lane, out);
        parity ^= 1;
        if (warp == 0 && lane < kLanesPerRow) {
#pragma unroll
          for (int c = 0; c < kColsPerThread; ++c) {
            store_from_float(p.o, p.dtype_qkv, o_base + j0 + lane * kColsPerThread + c, out[c]);
          }
        }
      }

      if (write_per_token && t < p.num_index_cols) {
        const int64_t slot = index_row[t];
        if (slot_valid(slot, p.num_pool_slots, p.null_slot_is_padding)) {
          st.store(static_cast<StateT*>(p.pool) + slot * p.stride_pool_slot + head_offset, j0, warp, lane);
        }
      }
    }
    __syncthreads();
  }

  // --- 4. final state
  if (final_dst != nullptr) st.store(final_dst, j0, warp, lane);
}

template <class StateT, StateLayout kLayout, int kHeadDim>
Status launch_recurrent(const RecurrentKernelParams& p, cudaStream_t stream) {
  static_assert(kHeadDim % kValuesPerCta == 0 && kHeadDim % 32 == 0, "K = V must be a multiple of 32");
  const int64_t ctas = p.num_seqs * p.num_v_heads * (kHeadDim / kValuesPerCta);
  if (ctas <= 0) return Status::Ok();
  if (ctas > int64_t{0x7fffffff}) {
    return Status(StatusCode::kUnsupported,
                  "decode: num_seqs * num_v_heads * " + std::to_string(kHeadDim / kValuesPerCta) +
                      " CTAs exceed the grid limit 2^31 - 1 (got " + std::to_string(ctas) + ")");
  }
  const int smem_bytes = SharedMemoryPlan<kHeadDim>::bytes(p.token_group);
  kda_decode_sm90_kernel<StateT, kLayout, kHeadDim><<<dim3(unsigned(ctas)), kThreads, smem_bytes, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return Status(StatusCode::kCudaError, std::string(__FILE__) + ":" + std::to_string(__LINE__) +
                                              ": kda_decode_sm90_kernel launch failed: " + cudaGetErrorString(err));
  }
  return Status::Ok();
}

// ------------------------------------------------------------------------------------------
// Staged variant: kda_decode_sm90_staged_kernel (V-first, decode, one index column)
// ------------------------------------------------------------------------------------------
//
// Same math and grid as kda_decode_sm90_kernel; what differs is where the state waits:
//   0. launched with PDL: thread 0 reads the slot index at GPU scope and asks L2 for the slice
//      (one bulk prefetch) while the previous kernel finishes, then every thread waits for that
//      kernel (griddepcontrol.wait; a no-op without PDL) before the loads below;
//   1. warp 0 issues the raw loads of token 0 (q, k, g, beta, v, A_log, dt_bias) first, so
//      that they overlap the slot-index -> state chain;
//   2. the start slot is read; padding rows write zeros and return;
//   3. the slice (kGroups x 32 rows x K) is copied into shared memory with cp.async (16-byte
//      chunks, coalesced): no register is tied to an outstanding load, so 8 CTAs fit on an SM
//      (64 registers) instead of 5. Single-token decode: each warp copies the rows it will
//      compute on (one 512-byte row per instruction at fp32 K = 128), one commit group per
//      32-row group, and waits only for its own group before its math (no CTA barrier for the
//      state; with kGroups = 2 group 1 is still arriving while group 0 is computed and stored:
//      H200, 2026-12-01, 2.2-3.5% faster than the CTA-wide copy at B >= 128 with an fp32 pool).
//      The token loop keeps the CTA-wide copy (one group, `kSliceBytes / (16 * 128)` chunks per
//      thread, waited for with a CTA barrier);
//   4. warp 0 finishes token 0's preprocessing into the token buffer; (CTA-wide copy) wait for
//      the copy; barrier;
//   5. per token, each warp streams over its 8 rows twice: pass 1 decays a row and forms the
//      partial <s, k>, <s, q> (reduce-scatter as in step_vfirst), pass 2 decays again (same
//      operations, same bits), adds delta k and either stores the row to the pool (last token)
//      or keeps it in the fp32 running state in shared memory (sequences of several tokens,
//      possible with cu_seqlens; warp 0 preprocesses each next token, one barrier around it).
//      With kGroups = 2 (single-token decode only) a CTA owns 64 value rows and each warp runs
//      rows 8w .. 8w + 7 of both 32-row groups, one group after the other: twice the bytes in
//      flight per CTA (a bf16 64-row slice moves 16 KB like an fp32 32-row one), half the CTAs.

// Waits until at most `pending` (0 or 1) of this thread's newest commit groups are outstanding.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  if (pending == 0) {
    kdakit::cuda::cp_async_wait_group<0>();
  } else {
    kdakit::cuda::cp_async_wait_group<1>();
  }
}

// One commit group: the lane's 16-byte chunks of a warp's rows from row0 on (the same offsets
// in the global slice `src` and in shared memory).
template <int kLaneChunks, int kChunksPerRow, int kRowBytes>
__device__ __forceinline__ void copy_warp_rows(char* smem_bytes, const char* src, int row0, int lane) {
#pragma unroll
  for (int i = 0; i < kLaneChunks; ++i) {
    const int c = i * 32 + lane;
    const int offset = (row0 + c / kChunksPerRow) * kRowBytes + (c % kChunksPerRow) * 16;
    kdakit::cuda::cp_async_16(kdakit::cuda::smem_u32(smem_bytes + offset), src + offset);
  }
  kdakit::cuda::cp_async_commit();
}

// kE consecutive elements of a shared-memory row as fp32.
template <int kE, class T>
__device__ __forceinline__ void load_smem_row(const T* p, float (&out)[kE]) {
  if constexpr (std::is_same_v<T, float>) {
    load_smem<kE>(p, out);
  } else {
    kdakit::cuda::load_vec<kE>(p, out);
  }
}

template <class StateT, int kHeadDim, bool kSingleToken, int kGroups, int kPasses>
__global__ void __launch_bounds__(kThreads, staged_min_ctas_per_sm(kSingleToken))
    kda_decode_sm90_staged_kernel(const __grid_constant__ RecurrentKernelParams p) {
  using Plan = SharedMemoryPlan<kHeadDim>;
  using Staged = StagedSharedMemoryPlan<StateT, kHeadDim, kSingleToken, kGroups, kPasses>;
  constexpr int kE = kHeadDim / 32;
  constexpr int kBufferRows = kGroups * kValuesPerCta;  // rows of the shared-memory slice
  constexpr int kRowsPerCta = kBufferRows * kPasses;     // kPasses slices run through it one after the other
  constexpr int kSlices = kHeadDim / kRowsPerCta;
  constexpr int64_t kBlockElems = int64_t(kHeadDim) * kHeadDim;
  constexpr int kChunksPerThread = Staged::kSliceBytes / (16 * kThreads);
  constexpr int kRowBytes = kHeadDim * int(sizeof(StateT));
  constexpr int kChunksPerRow = kRowBytes / 16;
  constexpr int kLaneChunksPerGroup = kRowsPerWarp * kChunksPerRow / 32;  // warp loads: per lane, per group
  static_assert(kRowsPerWarp == 8, "the reduce-scatter is written for 8 rows per warp");
  static_assert(kGroups == 1 || kSingleToken, "several row groups per CTA only for single-token decode");
  static_assert(kRowsPerWarp * kChunksPerRow % 32 == 0, "a warp's rows must split into whole 16-byte chunks per lane");
  static_assert(kHeadDim % kRowsPerCta == 0, "the slices must tile the value rows");
  static_assert(kPasses == 1 || (kSingleToken && kGroups == 2), "several passes only for single-token 64-row slices");
  // NOTE: per-warp loads (step 3) only for single-token decode: with the token loop the kernel
  // spills with them (12 bytes at its 80 registers, ptxas -v, nvcc 13.0).
  constexpr bool kWarpLoads = kSingleToken;
  extern __shared__ float4 smem_raw[];
  char* smem_bytes = reinterpret_cast<char*>(smem_raw);
  StateT* slice = reinterpret_cast<StateT*>(smem_bytes);
  float* running = Staged::kSeparateRunning ? reinterpret_cast<float*>(smem_bytes + Staged::kSliceBytes)
                                            : reinterpret_cast<float*>(smem_bytes);
  // NOTE: shifted base, see StagedSharedMemoryPlan: tok + Plan::q(kGroups) is the first byte
  // of the token buffer.
  float* tok = reinterpret_cast<float*>(smem_bytes + Staged::kTokenOffsetBytes) - Plan::kReduceFloats;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int cta = int(blockIdx.x);
  const int j0 = (cta % kSlices) * kRowsPerCta;
  const int h = (cta / kSlices) % p.num_v_heads;
  const int64_t n = cta / (kSlices * p.num_v_heads);
  const int64_t head_offset = int64_t(h) * kBlockElems;

  // --- 0. with PDL: aim an L2 prefetch of the slice while the previous kernel finishes (the
  // index is re-read after the wait); then wait for it and let the next grid launch.
  if (p.prefetch_before_wait && threadIdx.x == 0) {
    const int64_t guess = kdakit::cuda::ptx::load_relaxed_gpu(p.state_indices + n * p.stride_state_indices_n);
    if (slot_valid(guess, p.num_pool_slots, p.null_slot_is_padding)) {
      kdakit::cuda::ptx::bulk_prefetch_l2(
          static_cast<const StateT*>(p.pool) + guess * p.stride_pool_slot + head_offset + int64_t(j0) * kHeadDim,
          uint32_t(Staged::kSliceBytes * kPasses));
    }
  }
  kdakit::cuda::ptx::griddep_wait();
  kdakit::cuda::ptx::griddep_launch_dependents();

  // --- 1. token 0's raw inputs (warp 0), issued before the dependent slot -> state chain
  const TokenRange range = token_range(p, n);
  const int64_t len = range.end - range.begin;
  RawToken<kHeadDim> raw;
  // v of the CTA's later 32-row groups (value row j0 + 32 x + lane), x = 1 .. kGroups kPasses - 1
  float v_more[kGroups * kPasses > 1 ? kGroups * kPasses - 1 : 1];
  if (warp == 0 && len > 0) {
    raw = load_token<kHeadDim, true>(p, range.row, range.begin, h, j0, lane);
#pragma unroll
    for (int x = 1; x < kGroups * kPasses; ++x) {
      v_more[x - 1] = load_as_float(p.v, p.dtype_qkv,
                                    range.row * p.stride_v_b + range.begin * p.stride_v_t + int64_t(h) * p.stride_v_h +
                                        j0 + x * kValuesPerCta + lane);
    }
  }

  // --- 2. start slot (one index column: the state goes back where it came from)
  const int64_t start = p.state_indices[n * p.stride_state_indices_n];
  if (!slot_valid(start, p.num_pool_slots, p.null_slot_is_padding)) {
    for (int64_t x = threadIdx.x; x < len * kRowsPerCta; x += kThreads) {
      const int64_t t = range.begin + x / kRowsPerCta;
      const int j = j0 + int(x % kRowsPerCta);
      store_from_float(p.o, p.dtype_qkv, range.row * p.stride_o_b + t * p.stride_o_t + int64_t(h) * p.stride_o_h + j,
                       0.f);
    }
    return;
  }
  if (len == 0) return;  // an empty sequence: its state passes through untouched
  StateT* block = static_cast<StateT*>(p.pool) + start * p.stride_pool_slot + head_offset + int64_t(j0) * kHeadDim;

  // --- 3. the slice into shared memory (16-byte chunks). kWarpLoads: each warp copies the rows
  // it computes on, one commit group per row group, so it starts on group 0 while the later
  // groups are still arriving and needs no CTA barrier for the state; else consecutive threads
  // copy consecutive chunks of the whole slice (one group, a CTA barrier before the math).
  {
    const char* src = reinterpret_cast<const char*>(block);
    if constexpr (kPasses > 1) {
      // The later passes' rows, on their way into L2 while this pass computes (their cp.async
      // copies are issued only as each warp frees its rows of the buffer).
      if (p.prefetch_next_pass && threadIdx.x == 0) {
        kdakit::cuda::ptx::bulk_prefetch_l2(src + Staged::kSliceBytes, uint32_t((kPasses - 1) * Staged::kSliceBytes));
      }
    }
    if constexpr (kWarpLoads) {
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        copy_warp_rows<kLaneChunksPerGroup, kChunksPerRow, kRowBytes>(smem_bytes, src,
                                                                       g * kValuesPerCta + warp * kRowsPerWarp, lane);
      }
    } else {
#pragma unroll
      for (int c = 0; c < kChunksPerThread; ++c) {
        const int chunk = c * kThreads + int(threadIdx.x);
        kdakit::cuda::cp_async_16(kdakit::cuda::smem_u32(smem_bytes + chunk * 16), src + chunk * 16);
      }
      kdakit::cuda::cp_async_commit();
    }
  }

  // The token buffer's v entries of pass `pass` (kBufferRows each): the plan's v area for pass
  // 0, the area after the plan's floats (StagedSharedMemoryPlan) for the later ones.
  auto v_area = [&](int pass) { return pass == 0 ? Plan::v(kGroups) : Plan::floats(kGroups) + (pass - 1) * kBufferRows; };

  // --- 4./5. tokens
  // NOTE: kSingleToken (the launcher guarantees len <= 1: dense batches with T = 1) drops the
  // token loop; its loop-carried values cost the 16 registers that keep the kernel at 64.
  const int64_t steps = kSingleToken ? 1 : len;
  const int my_row = (lane >> 1) & (kRowsPerWarp - 1);
#pragma unroll 1
  for (int64_t t = 0; t < steps; ++t) {
    if (warp == 0) {
      if (t > 0) raw = load_token<kHeadDim, true>(p, range.row, range.begin + t, h, j0, lane);
      finish_token<kHeadDim, true>(p, raw, h, tok, kGroups, 0, lane);
#pragma unroll
      for (int x = 1; x < kGroups * kPasses; ++x) tok[v_area(x / kGroups) + (x % kGroups) * kValuesPerCta + lane] = v_more[x - 1];
    }
    if (!kWarpLoads && t == 0) kdakit::cuda::cp_async_wait_all();
    __syncthreads();

    float q[kE], k[kE], d[kE];
    load_smem<kE>(tok + Plan::q(kGroups) + lane * kE, q);
    load_smem<kE>(tok + Plan::k(kGroups) + lane * kE, k);
    load_smem<kE>(tok + Plan::decay(kGroups) + lane * kE, d);
    const float beta = tok[Plan::beta(kGroups)];
    const float kq = tok[Plan::kq(kGroups)];
    const bool from_slice = kSingleToken || t == 0;
    const bool last = kSingleToken || t + 1 == len;

#pragma unroll 1
    for (int pass = 0; pass < kPasses; ++pass) {
    StateT* const pass_block = block + int64_t(pass) * kBufferRows * kHeadDim;
#pragma unroll 1
    for (int g = 0; g < kGroups; ++g) {
      const int row0 = g * kValuesPerCta + warp * kRowsPerWarp;  // first of this warp's rows in the slice
      if (kWarpLoads && from_slice) {
        // This warp's rows of group g are in (the lane's own copies and, for rows of fewer than
        // 512 bytes, its neighbours': hence the warp barrier). Outstanding after it: this pass's
        // later groups and the next pass's groups already reissued (0 .. g - 1).
        cp_async_wait_pending(kGroups - 1 - g + (pass + 1 < kPasses ? g : 0));
        __syncwarp();
      }
      // Pass 1: decayed rows -> partial dot products.
      float part[2 * kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float s[kE];
        const int offset = (row0 + r) * kHeadDim + lane * kE;
        if (from_slice) {
          load_smem_row<kE>(slice + offset, s);
        } else {
          load_smem<kE>(running + offset, s);
        }
        part[r] = 0.f;
        part[kRowsPerWarp + r] = 0.f;
#pragma unroll
        for (int e = 0; e < kE; ++e) {
          s[e] *= d[e];
          part[r] = fmaf(s[e], k[e], part[r]);
          part[kRowsPerWarp + r] = fmaf(s[e], q[e], part[kRowsPerWarp + r]);
        }
      }
      reduce_scatter_stage<8>(part, lane);
      reduce_scatter_stage<4>(part, lane);
      reduce_scatter_stage<2>(part, lane);
      reduce_scatter_stage<1>(part, lane);
      const float total = part[0] + __shfl_xor_sync(0xffffffffu, part[0], 1);
      const float my_delta = beta * (tok[v_area(pass) + row0 + my_row] - total);

      // Pass 2: decay again (identical operations), rank-1 update, store.
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float delta = __shfl_sync(0xffffffffu, my_delta, 2 * r);
        float s[kE];
        const int offset = (row0 + r) * kHeadDim + lane * kE;
        if (from_slice) {
          load_smem_row<kE>(slice + offset, s);
        } else {
          load_smem<kE>(running + offset, s);
        }
#pragma unroll
        for (int e = 0; e < kE; ++e) s[e] = fmaf(delta, k[e], s[e] * d[e]);
        if (last) {
          kdakit::cuda::store_vec_stream<kE>(pass_block + offset, s);
        } else {
#pragma unroll
          for (int e = 0; e < kE; ++e) running[offset + e] = s[e];
        }
      }
      const float partner_delta = __shfl_xor_sync(0xffffffffu, my_delta, 16);
      if (lane >= 16 && (lane & 1) == 0) {
        const int64_t o_off = range.row * p.stride_o_b + (range.begin + t) * p.stride_o_t + int64_t(h) * p.stride_o_h +
                              j0 + pass * kBufferRows + row0 + my_row;
        store_from_float(p.o, p.dtype_qkv, o_off, fmaf(partner_delta, kq, total));
      }
      if constexpr (kPasses > 1) {
        // This warp's rows of group g are stored: copy the next pass's rows into them (every
        // lane is done reading the buffer once the warp is past the barrier).
        if (pass + 1 < kPasses) {
          __syncwarp();
          copy_warp_rows<kLaneChunksPerGroup, kChunksPerRow, kRowBytes>(
              smem_bytes, reinterpret_cast<const char*>(pass_block + int64_t(kBufferRows) * kHeadDim), row0, lane);
        }
      }
    }
    }
    if (!last) __syncthreads();  // the token buffer is rewritten for the next token
  }
}

template <class StateT, int kHeadDim, bool kSingleToken, int kGroups, int kPasses>
Status launch_staged(const RecurrentKernelParams& p, cudaStream_t stream, bool pdl) {
  constexpr int kSlices = kHeadDim / (kGroups * kValuesPerCta * kPasses);
  const int64_t ctas = p.num_seqs * p.num_v_heads * kSlices;
  if (ctas <= 0) return Status::Ok();
  if (ctas > int64_t{0x7fffffff}) {
    return Status(StatusCode::kUnsupported,
                  "decode: num_seqs * num_v_heads * " + std::to_string(kSlices) +
                      " CTAs exceed the grid limit 2^31 - 1 (got " + std::to_string(ctas) + ")");
  }
  auto kernel = kda_decode_sm90_staged_kernel<StateT, kHeadDim, kSingleToken, kGroups, kPasses>;
  const int smem_bytes = StagedSharedMemoryPlan<StateT, kHeadDim, kSingleToken, kGroups, kPasses>::bytes();
  // NOTE: ask once per device for the largest shared-memory carveout, so that the CTAs per SM the
  // registers allow (8 x 9-37 KB, fewer for the 37 KB fp32 64-row slices) are not cut by a
  // smaller default L1/shared split; slices over 48 KB would need the opt-in attribute too.
  static_assert(StagedSharedMemoryPlan<StateT, kHeadDim, kSingleToken, kGroups, kPasses>::bytes() <= 48 * 1024,
                "the staged kernel launches without the dynamic shared-memory opt-in");
  static kdakit::cuda::PerDeviceOnce carveout_once;  // per function and device (common/device_setup.cuh)
  const cudaError_t carveout = kdakit::cuda::set_up_once_per_device(carveout_once, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                int(cudaSharedmemCarveoutMaxShared));
  });
  if (carveout != cudaSuccess) {
    return Status(StatusCode::kCudaError, std::string(__FILE__) + ":" + std::to_string(__LINE__) +
                                              ": setting the shared-memory carveout failed: " +
                                              cudaGetErrorString(carveout));
  }
  return kdakit::cuda::launch_pdl_kernel(kernel, "kda_decode_sm90_staged_kernel", dim3(unsigned(ctas)), kThreads,
                                         smem_bytes, stream, pdl, p);
}

}  // namespace kdakit::sm90::recurrent
