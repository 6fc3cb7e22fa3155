// The launch-time divisor of src/cuda/common/fast_div.h against the integer division, on the
// host (the device path differs only in how the multiply-high is spelled).
#include "cuda/common/fast_div.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

namespace kdakit {
namespace {

using cuda::fast_div;
using cuda::make_fast_div;

TEST(FastDiv, SmallDivisorsAndEveryResidueNearTheEdges) {
  for (uint32_t d = 1; d <= 1024; ++d) {
    const auto f = make_fast_div(d);
    for (uint32_t n = 0; n < 4 * d + 3; ++n) ASSERT_EQ(fast_div(n, f), n / d) << n << " / " << d;
    for (uint32_t n = (1u << 31) - 4 * d - 3; n < (1u << 31); ++n) ASSERT_EQ(fast_div(n, f), n / d) << n << " / " << d;
  }
}

TEST(FastDiv, RandomNumeratorsAndDivisors) {
  std::mt19937_64 gen(20261204);
  std::uniform_int_distribution<uint32_t> num(0, (1u << 31) - 1);
  for (int i = 0; i < 2000; ++i) {
    // divisors of every size: uniform in [1, 2^k] for a random k
    const uint32_t d = 1 + uint32_t(gen() % (uint64_t{1} << (1 + gen() % 31)));
    const auto f = make_fast_div(d);
    for (int j = 0; j < 200; ++j) {
      const uint32_t n = num(gen);
      ASSERT_EQ(fast_div(n, f), n / d) << n << " / " << d;
    }
    // and the multiples and their neighbours
    for (uint32_t q : {0u, 1u, 2u, ((1u << 31) - 1) / d}) {
      const uint64_t base = uint64_t(q) * d;
      for (int64_t delta = -1; delta <= 1; ++delta) {
        const int64_t n = int64_t(base) + delta;
        if (n < 0 || n >= (int64_t{1} << 31)) continue;
        ASSERT_EQ(fast_div(uint32_t(n), f), uint32_t(n) / d) << n << " / " << d;
      }
    }
  }
}

}  // namespace
}  // namespace kdakit
