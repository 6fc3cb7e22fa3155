// Division by a divisor fixed at launch, for kernels that split a flat index (e.g. blockIdx.x
// into chunk and head): the host computes a multiplier and shift once, the kernel divides with
// one multiply-high, one add and one shift instead of the ~20-instruction integer division
// sequence. Plain C++ on the host (no CUDA headers needed), so that the CPU tests check it.
//
// Granlund and Montgomery, "Division by invariant integers using multiplication" (1994),
// figure 4.1 with N = 32: l = ceil(log2 d), m = floor(2^32 (2^l - d) / d) + 1, then
// n / d = (mulhi(m, n) + n) >> l. The sum is formed in 32 bits, so n must be below 2^31
// (mulhi(m, n) <= n); every caller divides non-negative int32 values.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KDAKIT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KDAKIT_HOST_DEVICE inline
#endif

namespace kdakit::cuda {

struct FastDiv {
  uint32_t mul = 1;    // m (1 for powers of two, d = 1 included)
  uint32_t shift = 0;  // l
};

// 1 <= d <= 2^31 (a larger d would need a shift of 32, which fast_div cannot apply).
inline FastDiv make_fast_div(uint32_t d) {
  uint32_t l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  const uint64_t m = ((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1;
  return FastDiv{uint32_t(m), l};
}

// n / d for 0 <= n < 2^31.
KDAKIT_HOST_DEVICE uint32_t fast_div(uint32_t n, FastDiv f) {
#if defined(__CUDA_ARCH__)
  const uint32_t t = __umulhi(n, f.mul);
#else
  const uint32_t t = uint32_t((uint64_t(n) * f.mul) >> 32);
#endif
  return (t + n) >> f.shift;
}

}  // namespace kdakit::cuda

#undef KDAKIT_HOST_DEVICE
