// Prefill straight from a state pool on the GPU (kdakit::prefill), against the float64 CPU
// reference: one pool read through initial_state_indices and written through other
// final_state_indices (prefix caching, chunked and token-serial paths), chunk states into pool
// rows or in a dtype of their own, and the round trip "prefill, save the state at a 64-token
// offset, prefill the rest from it" against one prefill. Slots and rows the call does not own
// must stay bit-identical; unwritten outputs stay poisoned (NaN positions must match).
//
// Every case must run: the chunked kernels take chunk states into pool rows, at any row
// stride and in their own dtype (a kUnsupported answer is a failure). Skipped without an
// sm_90 GPU.
//
// Bars (CONTRACT.md section 6): output 4e-3, fp32 state 2e-3, bf16 state storage 8e-3.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/cases.h"
#include "common/device_tensors.h"
#include "common/host_tensor.h"
#include "common/pieces.h"
#include "common/prefill_checks.h"
#include "kdakit/kdakit.h"

namespace kdakit::testing {
namespace {

constexpr double kOutputBar = 4e-3;

double state_bar(DType dtype) { return dtype == DType::kBFloat16 ? 8e-3 : 2e-3; }

// The shared pool cases raised to the shape the chunked kernels build (K = V = 128, padding
// that keeps rows 16-byte aligned), plus longer ones and a batch of short sequences (the
// token-serial path).
std::vector<PrefillCase> gpu_pool_cases() {
  std::vector<PrefillCase> all;
  for (PrefillCase c : prefill_pool_cases()) {
    c.K = c.V = 128;
    if (c.pad > 0) c.pad = 8;
    all.push_back(c);
  }
  PrefillCase shared{.name = "long_write_elsewhere_gva",
                     .seq_lens = {1000, 0, 333, 64, 700},
                     .H = 1,
                     .HV = 3,
                     .K = 128,
                     .V = 128,
                     .gate = GateMode::kSoftplus,
                     .dtype_g = DType::kBFloat16,
                     .dtype_beta = DType::kBFloat16,
                     .initial = StateSource::kPool,
                     .final_state = StateSource::kPool,
                     .extra_slots = 4,
                     .negative_indices = true,
                     .in_place = true,
                     .write_elsewhere = true,
                     .chunk_state_interval = 256};
  all.push_back(shared);
  PrefillCase rows = shared;
  rows.name = "long_chunk_rows_in_the_state_pool_bf16";
  rows.dtype_state = DType::kBFloat16;
  rows.chunk_pool = rows.chunk_in_state_pool = true;
  all.push_back(rows);
  PrefillCase shorts = shared;
  shorts.name = "short_token_serial_write_elsewhere";
  shorts.seq_lens = {1, 2, 3, 5, 8, 13, 21, 0, 16};
  shorts.H = shorts.HV = 2;
  shorts.chunk_state_interval = 64;
  all.push_back(shorts);
  return all;
}

class PrefillPoolGpu : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(PrefillPoolGpu, MatchesFloat64Reference) {
  if (!have_sm90()) GTEST_SKIP() << "no sm_90 GPU";
  const PrefillCase& c = GetParam();
  Rng rng = make_rng();
  SCOPED_TRACE(c.name + ", " + rng.trace());
  const PrefillTensors inputs = make_prefill_tensors(c, rng);
  PrefillTensors gpu = inputs;
  const Status st = run_prefill_on_gpu(c, gpu);
  ASSERT_TRUE(st.ok()) << st.message();
  PrefillTensors ref = inputs;
  ASSERT_TRUE(run_reference_fp32_output(c, ref).ok());

  EXPECT_TRUE(rel_l2_below("o", gpu.o, ref.o, kOutputBar));
  const HostTensor& got_pool = final_state_of(c, gpu);
  ASSERT_TRUE(got_pool.defined());
  EXPECT_TRUE(
      rel_l2_below("state pool", got_pool, final_state_of(c, ref), state_bar(c.dtype_state)));
  EXPECT_TRUE(untouched_slots_equal(final_state_of(c, inputs), got_pool, final_state_of(c, ref)));
  if (gpu.chunk_states.defined()) {
    const DType chunk_dtype = c.dtype_chunk_states.value_or(c.dtype_state);
    EXPECT_TRUE(
        rel_l2_below("chunk states", gpu.chunk_states, ref.chunk_states, state_bar(chunk_dtype)));
    if (c.chunk_pool) {
      EXPECT_TRUE(untouched_slots_equal(inputs.chunk_states, gpu.chunk_states, ref.chunk_states));
    }
  }

  PrefillTensors again = inputs;
  ASSERT_TRUE(run_prefill_on_gpu(c, again).ok());
  EXPECT_TRUE(bitwise_equal("o (second run)", again.o, gpu.o));
  EXPECT_TRUE(bitwise_equal("state pool (second run)", final_state_of(c, again), got_pool));
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefillPoolGpu, ::testing::ValuesIn(gpu_pool_cases()),
                         [](const ::testing::TestParamInfo<PrefillCase>& info) {
                           return info.param.name;
                         });

// The prefix-caching round trip on the GPU, boundary states saved densely (the chunk states
// the kernels write today) or into pool rows: the rest run from them equals one prefill within
// the bar, the first parts end in the saved states, and the whole run meets the bar against
// the float64 reference. The measured errors are printed (RecordProperty) next to the bars.
class PrefillPiecesGpu : public ::testing::TestWithParam<std::tuple<bool, DType>> {};

TEST_P(PrefillPiecesGpu, EqualsOnePrefill) {
  if (!have_sm90()) GTEST_SKIP() << "no sm_90 GPU";
  const auto [into_pool_rows, state_dtype] = GetParam();
  Rng rng = make_rng();
  SCOPED_TRACE(rng.trace());
  const std::vector<int64_t> lengths = {1000, 333, 64, 700, 129};
  const PrefillCase c{.name = "pieces",
                      .seq_lens = lengths,
                      .H = 2,
                      .HV = 2,
                      .K = 128,
                      .V = 128,
                      .dtype_state = state_dtype};
  std::vector<int64_t> split = random_splits(lengths, rng);
  split[0] = 512, split[2] = 0;
  Pieces p = make_pieces(c, split, into_pool_rows, rng);
  PrefillTensors ref = p.whole_t;

  const Status st = run_prefill_on_gpu(p.whole, p.whole_t);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(run_prefill_on_gpu(p.head, p.head_t).ok());
  take_boundary_states(p);
  ASSERT_TRUE(run_prefill_on_gpu(p.tail, p.tail_t).ok());

  const double bar = state_bar(state_dtype);
  const ErrorReport boundary = relative_l2(boundary_states(p), p.head_t.final_state);
  const ErrorReport o = relative_l2(stitched_outputs(p), p.whole_t.o);
  const ErrorReport final_state = relative_l2(tail_final_states(p), p.whole_t.final_state);
  ::testing::Test::RecordProperty("boundary_vs_head_final", std::to_string(boundary.rel_l2));
  ::testing::Test::RecordProperty("pieces_vs_whole_o", std::to_string(o.rel_l2));
  ::testing::Test::RecordProperty("pieces_vs_whole_final", std::to_string(final_state.rel_l2));
  EXPECT_TRUE(boundary.nonfinite_mismatch < 0 && boundary.rel_l2 <= bar) << boundary.str();
  EXPECT_TRUE(o.nonfinite_mismatch < 0 && o.rel_l2 <= kOutputBar) << o.str();
  EXPECT_TRUE(final_state.nonfinite_mismatch < 0 && final_state.rel_l2 <= bar) << final_state.str();

  ASSERT_TRUE(run_reference_fp32_output(p.whole, ref).ok());
  EXPECT_TRUE(rel_l2_below("o vs reference", p.whole_t.o, ref.o, kOutputBar));
  EXPECT_TRUE(rel_l2_below("final vs reference", p.whole_t.final_state, ref.final_state, bar));
  EXPECT_TRUE(rel_l2_below("boundary vs reference", p.whole_t.chunk_states, ref.chunk_states, bar));
}

INSTANTIATE_TEST_SUITE_P(Modes, PrefillPiecesGpu,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16)),
                         [](const ::testing::TestParamInfo<std::tuple<bool, DType>>& info) {
                           return std::string(std::get<0>(info.param) ? "pool_rows_" : "dense_") +
                                  to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace kdakit::testing
