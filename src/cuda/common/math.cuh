// Device math helpers shared by the kdakit kernels: fast exponentials, the KDA gate
// functions, beta activation, and warp reductions. All arguments and results are fp32.
//
// Interface (stable; the prefill kernels include it too):
//   fast_exp2(x)                      2^x with ex2.approx.ftz (max rel. error 2^-22 on sm_90)
//   fast_exp(x)                       e^x as fast_exp2(x * log2(e))
//   softplus(x)                       x for x > 20, else log(1 + e^x)     (CONTRACT.md 1)
//   sigmoid(x)                        1 / (1 + e^-x)
//   gate_softplus(g, neg_a, dt)       -a * softplus(g + dt), neg_a = -exp(A_log)   (kSoftplus)
//   gate_lower_bound(g, a, dt, lb)    lb * sigmoid(a * (g + dt)), a = exp(A_log) or 1 (kLowerBound)
//   beta_activation(b, sig, neg)      b, sigmoid(b) or 2 sigmoid(b)
//   l2norm_scale(sum_sq)              1 / sqrt(sum_sq + 1e-6)   (eps inside the sqrt)
//   warp_sum(x)                       butterfly sum over the 32 lanes (every lane gets it)
//   warp_sum_width<W>(x)              the same over aligned groups of W lanes
#pragma once

#include <cuda_runtime.h>

namespace kdakit::cuda {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float fast_exp(float x) { return fast_exp2(x * kLog2e); }

// NOTE: the x > 20 branch is the contract's rule (and FLA's): past it log(1 + e^x) equals x
// to fp32 precision, and e^x would overflow for large x. log1pf keeps precision for x << 0.
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// kSoftplus: gamma = -exp(A_log) * softplus(g + dt_bias). neg_a = -exp(A_log[h]).
__device__ __forceinline__ float gate_softplus(float g, float neg_a, float dt_bias) {
  return neg_a * softplus(g + dt_bias);
}

// kLowerBound: gamma = lb * sigmoid(a * (g + dt_bias)), a = exp(A_log[h]) (1 without A_log).
__device__ __forceinline__ float gate_lower_bound(float g, float a, float dt_bias, float lower_bound) {
  return lower_bound * sigmoid(a * (g + dt_bias));
}

__device__ __forceinline__ float beta_activation(float b, bool use_sigmoid, bool allow_neg_eigval) {
  if (!use_sigmoid) return b;
  const float s = sigmoid(b);
  return allow_neg_eigval ? 2.f * s : s;
}

// Multiplier of the q/k L2 norm: x / sqrt(sum(x^2) + 1e-6).
__device__ __forceinline__ float l2norm_scale(float sum_sq) { return 1.f / sqrtf(sum_sq + 1e-6f); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Sum over aligned groups of kWidth lanes (kWidth a power of two <= 32); every lane of the
// group gets the group's sum.
template <int kWidth>
__device__ __forceinline__ float warp_sum_width(float x) {
  static_assert(kWidth >= 1 && kWidth <= 32 && (kWidth & (kWidth - 1)) == 0,
                "kWidth must be a power of two in [1, 32]");
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace kdakit::cuda
