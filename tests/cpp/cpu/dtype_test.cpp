// Conversions of src/cpu/dtype.h and the test library's tensors and comparisons.
#include "cpu/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "common/prefill_checks.h"
#include "cpu/layout.h"

namespace kdakit {
namespace {

using cpu::bf16_from_double;
using cpu::bf16_to_float;
using cpu::fp16_from_double;
using cpu::fp16_to_float;

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_from_double(1.0), 0x3f80);
  EXPECT_EQ(bf16_from_double(-2.0), 0xc000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(bf16_from_double(1.0 + std::ldexp(1.0, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(bf16_from_double(1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);
  // Just above the halfway point rounds up. Rounding through float would first round
  // 1 + 2^-8 + 2^-40 to 1 + 2^-8 (a tie) and then down: the double is rounded once here.
  EXPECT_EQ(bf16_from_double(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)), 0x3f81);
  EXPECT_EQ(bf16_from_double(1e39), 0x7f80);  // overflow to inf
  EXPECT_EQ(bf16_from_double(-1e39), 0xff80);
  EXPECT_EQ(bf16_from_double(std::ldexp(1.0, -133)), 0x0001);  // smallest subnormal
  EXPECT_EQ(bf16_from_double(std::ldexp(1.0, -135)), 0x0000);  // below half of it: zero
  EXPECT_TRUE(std::isnan(bf16_to_float(bf16_from_double(NAN))));
  EXPECT_EQ(bf16_to_float(0x3f81), 1.0f + 1.0f / 128.0f);
}

TEST(Dtype, Fp16RoundsToNearestEven) {
  EXPECT_EQ(fp16_from_double(1.0), 0x3c00);
  EXPECT_EQ(fp16_from_double(-0.5), 0xb800);
  EXPECT_EQ(fp16_from_double(65504.0), 0x7bff);
  EXPECT_EQ(fp16_from_double(65520.0), 0x7c00);  // halfway to 2^16: ties to even = inf
  EXPECT_EQ(fp16_from_double(65519.0), 0x7bff);
  EXPECT_EQ(fp16_from_double(1.0 + std::ldexp(1.0, -11)), 0x3c00);      // tie, to even
  EXPECT_EQ(fp16_from_double(1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);  // tie, to even
  EXPECT_EQ(fp16_from_double(std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(fp16_from_double(std::ldexp(3.0, -25)), 0x0002);  // 1.5 units: tie, to even
  EXPECT_EQ(fp16_from_double(std::ldexp(1.0, -14)), 0x0400);  // smallest normal
  EXPECT_TRUE(std::isnan(fp16_to_float(fp16_from_double(NAN))));
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0xfc00), -std::numeric_limits<float>::infinity());
}

TEST(Dtype, RoundTripEveryHalfPattern) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t b = uint16_t(bits);
    const float from_bf16 = bf16_to_float(b);
    const float from_fp16 = fp16_to_float(b);
    if (!std::isnan(from_bf16)) ASSERT_EQ(bf16_from_double(from_bf16), b) << bits;
    if (!std::isnan(from_fp16)) ASSERT_EQ(fp16_from_double(from_fp16), b) << bits;
  }
}

TEST(Layout, SequenceRangesClampUntrustedOffsets) {
  const int64_t cu[] = {0, 5, 5, 12, 3, 40};
  const cpu::SeqRange empty = cpu::sequence_range(cu, DType::kInt64, 1, 20);
  EXPECT_EQ(empty.length(), 0);
  EXPECT_EQ(cpu::sequence_range(cu, DType::kInt64, 2, 20).length(), 7);
  EXPECT_EQ(cpu::sequence_range(cu, DType::kInt64, 3, 20).length(), 0);  // decreasing: empty
  const cpu::SeqRange past = cpu::sequence_range(cu, DType::kInt64, 4, 20);
  EXPECT_EQ(past.begin, 3);
  EXPECT_EQ(past.end, 20);  // clamped to T
  const cpu::SeqRange fixed = cpu::sequence_range(nullptr, DType::kInt64, 3, 20);
  EXPECT_EQ(fixed.row, 3);
  EXPECT_EQ(fixed.length(), 20);
}

TEST(TestLibrary, RelativeL2ReportsWorstElementAndNanPositions) {
  testing::HostTensor ref = testing::HostTensor::padded(DType::kFloat32, {2, 3}, 1);
  testing::HostTensor got = testing::HostTensor::contiguous(DType::kFloat32, {2, 3});
  for (int64_t e = 0; e < 6; ++e) {
    ref.set(e, double(e + 1));
    got.set(e, double(e + 1));
  }
  EXPECT_TRUE(testing::rel_l2_below("same", got, ref, 0.0));
  got.set_at({1, 2}, 6.5);
  const testing::ErrorReport r = testing::relative_l2(got, ref);
  EXPECT_NEAR(r.rel_l2, 0.5 / std::sqrt(91.0), 1e-12);
  EXPECT_EQ(r.worst_where, "[1, 2]");
  EXPECT_FALSE(testing::rel_l2_below("changed", got, ref, 1e-3));
  got.set_at({1, 2}, NAN);
  EXPECT_GE(testing::relative_l2(got, ref).nonfinite_mismatch, 0);
  ref.set_at({1, 2}, NAN);
  EXPECT_TRUE(testing::rel_l2_below("nan in both", got, ref, 0.0));
  EXPECT_FALSE(testing::bitwise_equal("dtype", got,
                                      testing::HostTensor::contiguous(DType::kBFloat16, {2, 3})));
}

TEST(TestLibrary, PaddedViewsKeepLastDimContiguous) {
  testing::HostTensor t = testing::HostTensor::padded(DType::kBFloat16, {2, 3, 4}, 2);
  EXPECT_EQ(t.strides, (std::vector<int64_t>{30, 6, 1}));
  t.poison();
  t.set_at({1, 2, 3}, 1.5);
  EXPECT_EQ(t.at({1, 2, 3}), 1.5);
  EXPECT_TRUE(std::isnan(t.at({1, 2, 2})));
}

TEST(TestLibrary, CaseTensorsMatchTheirParams) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (const auto& c : testing::prefill_corner_cases()) {
    testing::PrefillTensors t = testing::make_prefill_tensors(c, rng);
    const PrefillParams p = testing::fill_prefill_params(c, t, testing::host_pointers(t));
    EXPECT_EQ(p.num_seqs, c.num_seqs()) << c.name;
    EXPECT_EQ(p.q, t.q.data()) << c.name;
    EXPECT_EQ(p.stride_o_t, t.o.stride(1)) << c.name;
    if (c.in_place) EXPECT_EQ(p.final_state, p.initial_state) << c.name;
    if (c.packed())
      EXPECT_EQ(cpu::load_index(p.cu_seqlens, p.dtype_cu_seqlens, p.num_seqs), p.seqlen - c.tail);
  }
}

// untouched_slots_equal flags a change to a slot the reference leaves alone, and only that.
TEST(TestLibrary, UntouchedSlotCheckCatchesStrayWrites) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const testing::DecodeCase c{.name = "slots", .batch = 3, .seqlen = 1, .extra_slots = 2};
  const testing::DecodeTensors inputs = testing::make_decode_tensors(c, rng);
  testing::DecodeTensors ref = inputs;
  ASSERT_TRUE(testing::run_decode_on_host(cpu::decode_reference, c, ref).ok());
  const auto* idx = static_cast<const int32_t*>(inputs.state_indices.data());
  int64_t untouched = 0;
  while (untouched == idx[0] || untouched == idx[1] || untouched == idx[2]) ++untouched;
  testing::DecodeTensors got = ref;
  EXPECT_TRUE(testing::untouched_slots_equal(inputs.state, got.state, ref.state));
  got.state.set_at({idx[1], 1, 3, 4}, got.state.at({idx[1], 1, 3, 4}) + 1e-3);  // a written slot
  EXPECT_TRUE(testing::untouched_slots_equal(inputs.state, got.state, ref.state));
  got.state.set_at({untouched, 0, 2, 2}, got.state.at({untouched, 0, 2, 2}) + 1e-3);
  EXPECT_FALSE(testing::untouched_slots_equal(inputs.state, got.state, ref.state));
}

}  // namespace
}  // namespace kdakit
