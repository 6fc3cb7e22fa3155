// End to end on the GPU: kdakit::prefill (the dispatcher's path; KDAKIT_PREFILL_PATH forces one)
// against the float64 token-by-token reference kdakit::cpu::prefill_reference, over the shared case groups
// (tests/cpp/common/cases.h) raised to K = V = 128, plus longer and GVA cases. Cases the
// chunked kernels do not build (K != 128, fp16/fp32 q/k/v, fp16 g or beta, rows that are not
// 16-byte aligned) must return kUnsupported. Bars (CONTRACT.md section 6): output 4e-3, fp32 final state 2e-3;
// bf16 state storage adds its own rounding (2^-9 relative per element): 8e-3.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/cases.h"
#include "common/device_tensors.h"
#include "common/host_tensor.h"
#include "common/prefill_checks.h"
#include "kdakit/kdakit.h"

namespace kdakit::testing {
namespace {

// What the chunked kernels are built for (prep's and the dispatcher's checks).
bool chunked_supported(const PrefillCase& c) {
  auto gate_dtype = [](DType d) { return d == DType::kBFloat16 || d == DType::kFloat32; };
  return c.K == 128 && c.V == 128 && c.dtype_qkv == DType::kBFloat16 && gate_dtype(c.dtype_g) &&
         gate_dtype(c.dtype_beta) && c.pad % 8 == 0;
}

std::vector<PrefillCase> gpu_cases() {
  std::vector<PrefillCase> all;
  for (auto group : {prefill_regular_cases(), prefill_irregular_cases(), prefill_corner_cases()})
    for (PrefillCase c : group) {
      if (c.name != "k_neq_v") c.K = c.V = 128;
      all.push_back(c);
    }
  // longer sequences (many chunks on the chain), GVA, 16-byte aligned strided views
  all.push_back({.name = "long_fixed_gva", .batch = 2, .seqlen = 700, .H = 1, .HV = 3, .K = 128, .V = 128});
  all.push_back({.name = "long_packed_softplus",
                 .seq_lens = {1000, 0, 333, 64},
                 .tail = 7,
                 .H = 2,
                 .HV = 2,
                 .K = 128,
                 .V = 128,
                 .gate = GateMode::kSoftplus,
                 .dtype_g = DType::kBFloat16,
                 .dtype_beta = DType::kBFloat16});
  all.push_back({.name = "strided_views_aligned", .seq_lens = {29, 100}, .H = 2, .HV = 4, .K = 128, .V = 128, .pad = 8});
  all.push_back({.name = "many_short", .seq_lens = {1, 2, 3, 5, 8, 13, 21, 34, 55, 0, 89}, .K = 128, .V = 128,
                 .initial = StateSource::kPool, .final_state = StateSource::kPool, .extra_slots = 4, .in_place = true});
  // average length <= 16 tokens: the dispatcher takes the token-serial kernel
  all.push_back({.name = "short_token_serial", .seq_lens = {16, 3, 0, 20, 9, 16, 1}, .K = 128, .V = 128,
                 .chunk_state_interval = 64});
  return all;
}

class PrefillGpu : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(PrefillGpu, MatchesFloat64Reference) {
  if (!have_sm90()) GTEST_SKIP() << "no sm_90 GPU";
  const PrefillCase& c = GetParam();
  Rng rng = make_rng();
  SCOPED_TRACE(c.name + ", " + rng.trace());
  PrefillTensors gpu = make_prefill_tensors(c, rng);
  PrefillTensors ref = gpu;
  PrefillTensors again = gpu;

  const Status st = run_prefill_on_gpu(c, gpu);
  if (!chunked_supported(c)) {
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.message();
    EXPECT_FALSE(st.message().empty());
    return;
  }
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(run_prefill_on_host(cpu::prefill_reference, c, ref).ok());

  EXPECT_TRUE(rel_l2_below("o", gpu.o, ref.o, 4e-3));
  const double state_bar = c.dtype_state == DType::kBFloat16 ? 8e-3 : 2e-3;
  const HostTensor& got_final = final_state_of(c, gpu);
  if (got_final.defined()) {
    // over the whole pool: a slot nobody writes holds the same values in both
    EXPECT_TRUE(rel_l2_below("final state", got_final, final_state_of(c, ref), state_bar));
  }
  if (gpu.chunk_states.defined())
    EXPECT_TRUE(rel_l2_below("chunk states", gpu.chunk_states, ref.chunk_states, state_bar));

  // bitwise identical run to run
  ASSERT_TRUE(run_prefill_on_gpu(c, again).ok());
  EXPECT_TRUE(bitwise_equal("o (second run)", again.o, gpu.o));
  if (got_final.defined()) EXPECT_TRUE(bitwise_equal("final state (second run)", final_state_of(c, again), got_final));
  if (gpu.chunk_states.defined()) EXPECT_TRUE(bitwise_equal("chunk states (second run)", again.chunk_states, gpu.chunk_states));
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefillGpu, ::testing::ValuesIn(gpu_cases()),
                         [](const ::testing::TestParamInfo<PrefillCase>& info) { return info.param.name; });

}  // namespace
}  // namespace kdakit::testing
