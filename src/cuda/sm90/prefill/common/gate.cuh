// The KDA gate in base 2, shared by the prefill kernels (prep and fused): per element
// log2(e) * gamma from the raw gate input g, with the hardware approximations of ex2, lg2, rcp.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/math.cuh"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill::common {

using kdakit::cuda::fast_exp2;
using kdakit::cuda::kLog2e;

__device__ __forceinline__ float approx_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float approx_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Base-2 gate log2(e) * gamma of one element. a = exp(A_log[h]) (1 without A_log) for the
// lower-bound gate, -exp(A_log[h]) for softplus.
// NOTE: the hardware approximations (ex2, lg2, rcp: relative error ~2^-22) put an absolute
// error of ~1e-7 on gamma, far below what the chunk's fp32 running sum already carries, for a
// quarter of the instructions of expf, log1pf and an IEEE division. softplus(x) is written
// max(x, 0) + log(1 + e^-|x|), whose log argument lies in (1, 2], so no precision is lost for
// x << 0. The contract's x > 20 rule needs no branch here: past x = 17.4, e^-|x| < 2^-25, so
// 1 + e^-|x| rounds to 1, lg2 of it is 0 and the sum is max(x, 0) log2(e) = x log2(e), what the
// rule gives (the select and its extra multiply were three of the gate's eleven instructions).
template <GateMode kGate>
__device__ __forceinline__ float gate_log2(float g, float a, float dt_bias, float lower_bound) {
  if constexpr (kGate == GateMode::kPrecomputed) {
    return g * kLog2e;
  } else if constexpr (kGate == GateMode::kSoftplus) {
    const float x = g + dt_bias;
    const float sp2 = fmaxf(x, 0.f) * kLog2e + approx_log2(1.f + fast_exp2(-fabsf(x) * kLog2e));
    return a * sp2;
  } else {
    const float x = a * (g + dt_bias);
    return lower_bound * kLog2e * approx_rcp(1.f + fast_exp2(-x * kLog2e));
  }
}

}  // namespace kdakit::sm90::prefill::common
