// Per-warp pieces of the fast decode kernel (direct.cuh): a token's inputs loaded
// and preprocessed in the registers of one warp, and one token step over a group of value
// rows of the state held in that warp's registers.
//
// Lane l owns key channels [l kE, (l+1) kE), kE = K / 32, of q, k, the decay and every state
// row, so a warp needs nobody else's data: each warp preprocesses the token itself (the same
// loads and arithmetic as the other warps of its head; the inputs are ~1 KB against 64 KB of
// state) and no shared memory or CTA barrier sits between the loads and the math.
//
// Math (kernel.cuh has the derivation): with the decayed row s_j = exp(gamma) * S^T[j, :],
//   pred_j = <s_j, k>, qd_j = <s_j, q>, delta_j = beta (v_j - pred_j),
//   S^T[j, :] = s_j + delta_j k, o_j = qd_j + delta_j <k, q>;
// q carries `scale` (and the L2 norm), k its L2 norm.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/dtype.cuh"
#include "cuda/common/math.cuh"
#include "cuda/sm90/decode/config.h"

namespace kdakit::sm90::recurrent::fast {

using kdakit::cuda::load_as_float;
using kdakit::cuda::load_vec_as_float;
using kdakit::cuda::store_from_float;

// A token's raw inputs as one lane loads them: its kE channels of q, k, g and dt_bias, the
// head's beta and A_log, and v of one value row (the row `v_row` the caller picked per lane).
template <int kE>
struct RawToken {
  float q[kE], k[kE], g[kE], bias[kE];
  float beta, v, a_log;
};

// The preprocessed token: q (scaled, normalised), k (normalised), decay = exp(gamma), beta
// after its activation, and <k, q> (the same on every lane).
template <int kE>
struct Token {
  float q[kE], k[kE], d[kE];
  float beta, kq;
};

__device__ __forceinline__ bool fast_slot_valid(int32_t slot, const FastDecodeParams& p) {
  return slot >= 0 && slot < p.num_pool_slots &&
         !((p.flags & FastFlags::kNullSlotIsPadding) && slot == 0);
}

// q/k head of value head h: h / (HV / H) as a multiply-high by the host's magic number (no
// run-time division on the path to the first loads). Exact for h, HV < 2^16 (the dispatcher
// checks HV): with m = ceil(2^32 / d) = (2^32 + e) / d, e < d, h m / 2^32 = h / d + h e / (d 2^32)
// and h e < 2^32, so the added term never carries past the next integer.
__device__ __forceinline__ int fast_qk_head(const FastDecodeParams& p, int h) {
  return int((uint64_t(uint32_t(h)) * p.qk_group_magic) >> 32);
}

// Token range of sequence n: dense T = 1 (token n, length 1) or packed (cu_seqlens clamped to
// [0, num_tokens], a decreasing pair is an empty sequence).
struct FastRange {
  int32_t begin;
  int32_t len;
};
__device__ __forceinline__ FastRange fast_range(const FastDecodeParams& p, int32_t n) {
  if (p.cu_seqlens == nullptr) return FastRange{n, 1};
  int64_t lo, hi;
  if (p.flags & FastFlags::kCuInt64) {
    lo = static_cast<const int64_t*>(p.cu_seqlens)[n];
    hi = static_cast<const int64_t*>(p.cu_seqlens)[n + 1];
  } else {
    lo = static_cast<const int32_t*>(p.cu_seqlens)[n];
    hi = static_cast<const int32_t*>(p.cu_seqlens)[n + 1];
  }
  const int64_t begin = min(max(lo, int64_t{0}), int64_t(p.num_tokens));
  const int64_t end = min(max(hi, begin), int64_t(p.num_tokens));
  return FastRange{int32_t(begin), int32_t(end - begin)};
}

// NOTE: vector loads of q, k, g and dt_bias: the dispatcher only picks the fast kernels when
// every such base pointer and stride keeps kE-element accesses aligned (dispatch.cu).
template <int kHeadDim>
__device__ __forceinline__ RawToken<kHeadDim / 32> load_raw(const FastDecodeParams& p, int64_t tk,
                                                            int h, int hk, int v_row, bool load_v,
                                                            int lane) {
  constexpr int kE = kHeadDim / 32;
  const uint32_t f = p.flags;
  const DType dq = FastFlags::dtype_qkv(f);
  const GateMode gate = FastFlags::gate(f);
  const int i0 = lane * kE;
  RawToken<kE> x;
  load_vec_as_float<kE>(p.q, dq, tk * p.stride_q_tok + int64_t(hk) * p.stride_q_h + i0, x.q);
  load_vec_as_float<kE>(p.k, dq, tk * p.stride_k_tok + int64_t(hk) * p.stride_k_h + i0, x.k);
  const int64_t g_base = tk * p.stride_g_tok + int64_t(h) * p.stride_g_h;
  if (f & FastFlags::kScalarGate) {
    const float g = load_as_float(p.g, FastFlags::dtype_g(f), g_base);
#pragma unroll
    for (int e = 0; e < kE; ++e) x.g[e] = g;
  } else {
    load_vec_as_float<kE>(p.g, FastFlags::dtype_g(f), g_base + i0, x.g);
  }
  const bool gated = gate != GateMode::kPrecomputed;
  if (gated && p.dt_bias != nullptr) {
    if (f & FastFlags::kScalarGate) {
      const float b = p.dt_bias[h];
#pragma unroll
      for (int e = 0; e < kE; ++e) x.bias[e] = b;
    } else {
      kdakit::cuda::load_vec<kE>(p.dt_bias + int64_t(h) * kHeadDim + i0, x.bias);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kE; ++e) x.bias[e] = 0.f;
  }
  x.a_log = gated && p.A_log != nullptr ? p.A_log[h] : 0.f;
  x.beta = load_as_float(p.beta, FastFlags::dtype_beta(f),
                         tk * p.stride_beta_tok + int64_t(h) * p.stride_beta_h);
  x.v = load_v ? load_as_float(p.v, dq, tk * p.stride_v_tok + int64_t(h) * p.stride_v_h + v_row)
               : 0.f;
  return x;
}

// The preprocessing arithmetic (CONTRACT.md section 1), the same operations as
// kernel.cuh's finish_token, on the warp's registers.
template <int kE>
__device__ __forceinline__ Token<kE> finish(const FastDecodeParams& p, const RawToken<kE>& x) {
  const uint32_t f = p.flags;
  Token<kE> t;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    t.q[e] = x.q[e];
    t.k[e] = x.k[e];
  }
  float q_scale = p.scale;
  if (f & FastFlags::kL2Norm) {
    float qq = 0.f, kk = 0.f;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      qq += t.q[e] * t.q[e];
      kk += t.k[e] * t.k[e];
    }
    qq = kdakit::cuda::warp_sum(qq);
    kk = kdakit::cuda::warp_sum(kk);
    q_scale *= kdakit::cuda::l2norm_scale(qq);
    const float k_scale = kdakit::cuda::l2norm_scale(kk);
#pragma unroll
    for (int e = 0; e < kE; ++e) t.k[e] *= k_scale;
  }
  float kq = 0.f;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    t.q[e] *= q_scale;
    kq += t.k[e] * t.q[e];
  }
  t.kq = kdakit::cuda::warp_sum(kq);

  const GateMode gate = FastFlags::gate(f);
  if (gate == GateMode::kPrecomputed) {
#pragma unroll
    for (int e = 0; e < kE; ++e) t.d[e] = expf(x.g[e]);
  } else {
    const float a = p.A_log != nullptr ? expf(x.a_log) : 1.f;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const float gamma = gate == GateMode::kSoftplus
                              ? kdakit::cuda::gate_softplus(x.g[e], -a, x.bias[e])
                              : kdakit::cuda::gate_lower_bound(x.g[e], a, x.bias[e], p.lower_bound);
      t.d[e] = expf(gamma);
    }
  }
  t.beta = kdakit::cuda::beta_activation(x.beta, (f & FastFlags::kBetaSigmoid) != 0,
                                         (f & FastFlags::kNegEigval) != 0);
  return t;
}

// One stage of the reduce-scatter: a lane keeps values [0, kHalf) or [kHalf, 2 kHalf) of part
// (chosen by lane bit 2 kHalf) and adds the partner lane's copy of the kept half.
template <int kHalf, int kN>
__device__ __forceinline__ void scatter_stage(float (&part)[kN], int lane) {
  const bool upper = (lane & (2 * kHalf)) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float lo = part[i], hi = part[i + kHalf];
    const float send = upper ? lo : hi;
    const float keep = upper ? hi : lo;
    part[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * kHalf);
  }
}

// Lanes that end a step holding o of row output_row(lane) of the group (one lane per row).
template <int kRows>
__device__ __forceinline__ bool holds_output(int lane) {
  return (lane & (2 * kRows)) != 0 && (lane & 1) == 0 && (kRows == 8 || lane < 16);
}
template <int kRows>
__device__ __forceinline__ int output_row(int lane) {
  return (lane >> 1) & (kRows - 1);
}

// One token over kRows (8 or 4) value rows s[r][e] (row r, key channel lane kE + e), updated in
// place. v_lane: lane m holds v of row m - v_first of the group (v of row r is read from lane
// v_first + r). Returns o of row output_row(lane) on the lanes where holds_output<kRows>(lane).
//
// NOTE: the 2 kRows partial dot products of a lane (<s_r, k>, then <s_r, q>) are reduced with a
// reduce-scatter over lane bits log2(2 kRows) .. 1 (2 kRows - 1 shuffles), then the lane bits
// that stay (bit 0, and bit 4 for 4 rows) are summed with butterflies: lane l ends with the sum
// of value index (l >> 1) & (2 kRows - 1), <s_r, k> where lane bit log2(2 kRows) is clear and
// <s_r, q> where it is set. The delta of row r is broadcast from lane 2 r.
template <int kRows, int kE>
__device__ __forceinline__ float step_rows(float (&s)[kRows][kE], const Token<kE>& t, float v_lane,
                                           int v_first, int lane) {
  static_assert(kRows == 8 || kRows == 4, "the reduce-scatter is written for 8 or 4 rows");
  float part[2 * kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    part[r] = 0.f;
    part[kRows + r] = 0.f;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      s[r][e] *= t.d[e];
      part[r] = fmaf(s[r][e], t.k[e], part[r]);
      part[kRows + r] = fmaf(s[r][e], t.q[e], part[kRows + r]);
    }
  }
  if constexpr (kRows == 8) scatter_stage<8>(part, lane);
  scatter_stage<4>(part, lane);
  scatter_stage<2>(part, lane);
  scatter_stage<1>(part, lane);
  float total = part[0] + __shfl_xor_sync(0xffffffffu, part[0], 1);
  if constexpr (kRows == 4) total += __shfl_xor_sync(0xffffffffu, total, 16);

  const float my_v = __shfl_sync(0xffffffffu, v_lane, v_first + output_row<kRows>(lane));
  const float my_delta = t.beta * (my_v - total);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float delta = __shfl_sync(0xffffffffu, my_delta, 2 * r);
#pragma unroll
    for (int e = 0; e < kE; ++e) s[r][e] = fmaf(delta, t.k[e], s[r][e]);
  }
  const float partner_delta = __shfl_xor_sync(0xffffffffu, my_delta, 2 * kRows);
  return fmaf(partner_delta, t.kq, total);
}

}  // namespace kdakit::sm90::recurrent::fast
