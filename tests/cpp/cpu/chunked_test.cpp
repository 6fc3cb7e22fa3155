// The fp32 chunked prefill against the float64 reference, over the case groups of the test
// library and a sweep of head dims and gates; plus the properties both paths must have:
// run-to-run bitwise determinism, in-place = out-of-place bit for bit, chunk states equal to
// the final state of a prefix run.
#include "cpu/chunked.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "common/prefill_checks.h"
#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

using testing::PrefillCase;
using testing::PrefillTensors;
using testing::StateSource;

// fp32 accumulation against float64 over chunks of 64 tokens and K <= 128 channels.
constexpr double kChunkedBar = 1e-5;

void expect_chunked_matches_reference(const PrefillCase& c, testing::Rng& rng) {
  SCOPED_TRACE(c.name);
  PrefillTensors ref = testing::make_prefill_tensors(c, rng);
  PrefillTensors got = ref;
  const Status ref_status = testing::run_prefill_on_host(cpu::prefill_reference, c, ref);
  ASSERT_TRUE(ref_status.ok()) << ref_status.message();
  const Status got_status = testing::run_prefill_on_host(cpu::prefill_chunked, c, got);
  ASSERT_TRUE(got_status.ok()) << got_status.message();
  testing::expect_prefill_matches(c, got, ref, kChunkedBar);
}

class ChunkedVsReference : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(ChunkedVsReference, OutputsAndStates) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  expect_chunked_matches_reference(GetParam(), rng);
}

auto case_name = [](const ::testing::TestParamInfo<PrefillCase>& info) { return info.param.name; };

INSTANTIATE_TEST_SUITE_P(Regular, ChunkedVsReference,
                         ::testing::ValuesIn(testing::prefill_regular_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Irregular, ChunkedVsReference,
                         ::testing::ValuesIn(testing::prefill_irregular_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Corner, ChunkedVsReference,
                         ::testing::ValuesIn(testing::prefill_corner_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Pool, ChunkedVsReference,
                         ::testing::ValuesIn(testing::prefill_pool_cases()), case_name);

// Head dims K = V in {16, 32, 64, 128} under each gate (vector and scalar), fp32 activations
// so the fp32 bar applies to the outputs too; lengths straddle chunk boundaries.
std::vector<PrefillCase> head_dim_sweep() {
  std::vector<PrefillCase> cases;
  for (int32_t d : {13, 16, 32, 64, 128}) {  // 13: the blocked products' row and column tails
    const int64_t scale_down = d == 128 ? 2 : 1;  // keep the K = 128 cases short
    for (GateMode gate : {GateMode::kPrecomputed, GateMode::kSoftplus, GateMode::kLowerBound}) {
      for (bool scalar : {false, true}) {
        if (d == 128 && scalar) continue;
        PrefillCase c{.seq_lens = {129 / scale_down, 0, 70 / scale_down},
                      .H = 1,
                      .HV = d <= 32 ? 2 : 1,
                      .K = d,
                      .V = d,
                      .gate = gate,
                      .lower_bound = -3.f,
                      .scalar_gate = scalar,
                      .dtype_qkv = DType::kFloat32,
                      .l2norm = gate != GateMode::kPrecomputed,
                      .beta_sigmoid = gate != GateMode::kPrecomputed};
        c.name = "d" + std::to_string(d) + "_" + to_string(gate) + (scalar ? "_scalar" : "");
        for (char& ch : c.name) {
          if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
        }
        cases.push_back(c);
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(HeadDims, ChunkedVsReference, ::testing::ValuesIn(head_dim_sweep()),
                         case_name);

// fp32 everything with initial state, GVA, K != V and K-first: the fp32 bar on every tensor.
TEST(ChunkedVsReferenceFp32, AllFp32StorageMeetsTheFp32Bar) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (StateLayout layout : {StateLayout::kVFirst, StateLayout::kKFirst}) {
    expect_chunked_matches_reference(PrefillCase{.name = "fp32_all",
                                                 .seq_lens = {200, 1, 64, 65},
                                                 .H = 2,
                                                 .HV = 4,
                                                 .K = 32,
                                                 .V = 48,
                                                 .gate = GateMode::kSoftplus,
                                                 .dtype_qkv = DType::kFloat32,
                                                 .dtype_g = DType::kFloat32,
                                                 .dtype_beta = DType::kFloat32,
                                                 .layout = layout,
                                                 .neg_eigval = true,
                                                 .pad = 1,
                                                 .chunk_state_interval = 64},
                                     rng);
  }
}

// Extreme gates: softplus pre-activations in [15, 30] (the linear branch past 20, decays of
// e^-20 and more per token, so most exp2 factors underflow to zero) and the lower-bound gate
// at its bound; nothing may overflow, and the chunked path still meets the bar.
TEST(ChunkedVsReferenceExtreme, StrongDecaysUnderflowHarmlessly) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (GateMode gate : {GateMode::kSoftplus, GateMode::kLowerBound}) {
    const PrefillCase c{.name = "extreme",
                        .seq_lens = {150, 70},
                        .gate = gate,
                        .lower_bound = -5.f,
                        .dtype_qkv = DType::kFloat32};
    PrefillTensors ref = testing::make_prefill_tensors(c, rng);
    for (int64_t e = 0; e < ref.g.numel(); ++e) ref.g.set(e, rng.uniform(15.0, 30.0));
    ref.A_log.fill_uniform(rng, 0.0, 1.0);
    PrefillTensors got = ref;
    ASSERT_TRUE(testing::run_prefill_on_host(cpu::prefill_reference, c, ref).ok());
    ASSERT_TRUE(testing::run_prefill_on_host(cpu::prefill_chunked, c, got).ok());
    for (int64_t e = 0; e < got.o.numel(); ++e) ASSERT_TRUE(std::isfinite(got.o.get(e)));
    for (int64_t e = 0; e < got.final_state.numel(); ++e) {
      ASSERT_TRUE(std::isfinite(got.final_state.get(e)));
    }
    testing::expect_prefill_matches(c, got, ref, kChunkedBar);
  }
}

// Random cases: every knob drawn at random (GVA, K != V, gates, dtypes, layouts, flags, pools,
// in place, chunk states, tails, empty sequences), a fresh draw each run.
TEST(ChunkedVsReferenceRandom, RandomCases) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const testing::RandomCaseLimits limits;
  for (int i = 0; i < 40; ++i) {
    const PrefillCase c = testing::random_prefill_case(rng, limits, i);
    expect_chunked_matches_reference(c, rng);
    if (::testing::Test::HasFailure()) break;
  }
}

// ------------------------------------------------------------------------------------------
// Determinism, in place, chunk states
// ------------------------------------------------------------------------------------------

TEST(PrefillDeterminism, RepeatedRunsAreBitwiseEqual) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const PrefillCase c{.name = "determinism",
                      .seq_lens = {150, 0, 77, 33, 64},
                      .H = 2,
                      .HV = 4,
                      .chunk_state_interval = 64};
  const PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
  for (const testing::CpuBackend& backend : testing::kCpuBackends) {
    SCOPED_TRACE(backend.name);
    PrefillTensors first = inputs;
    ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, first).ok());
    for (int repeat = 0; repeat < 5; ++repeat) {
      PrefillTensors again = inputs;
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, again).ok());
      ASSERT_TRUE(testing::storage_equal("o", again.o, first.o));
      ASSERT_TRUE(testing::storage_equal("final state", again.final_state, first.final_state));
      ASSERT_TRUE(testing::storage_equal("chunk states", again.chunk_states, first.chunk_states));
    }
  }
}

// In place (initial_state == final_state, same indices) equals writing a separate buffer that
// started as a copy of the initial one, bit for bit, for dense states and pools.
TEST(PrefillInPlace, EqualsOutOfPlaceBitwise) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (StateSource source : {StateSource::kDense, StateSource::kPool}) {
    for (DType state_dtype : {DType::kFloat32, DType::kBFloat16}) {
      PrefillCase in_place{.name = "in_place",
                           .seq_lens = {90, 0, 17, 64},
                           .dtype_state = state_dtype,
                           .initial = source,
                           .final_state = source,
                           .extra_slots = 4,
                           .negative_indices = source == StateSource::kPool,
                           .in_place = true};
      const PrefillTensors inputs = testing::make_prefill_tensors(in_place, rng);
      PrefillCase out_of_place = in_place;
      out_of_place.in_place = false;
      for (const testing::CpuBackend& backend : testing::kCpuBackends) {
        SCOPED_TRACE(std::string(backend.name) +
                     (source == StateSource::kPool ? " pool " : " dense ") +
                     to_string(state_dtype));
        PrefillTensors a = inputs;
        ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, in_place, a).ok());
        PrefillTensors b = inputs;
        b.final_state = b.initial_state;
        b.final_state_indices = b.initial_state_indices;
        ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, out_of_place, b).ok());
        EXPECT_TRUE(testing::storage_equal("state", a.initial_state, b.final_state));
        EXPECT_TRUE(testing::storage_equal("o", a.o, b.o));
      }
    }
  }
}

// Chunk entry e of sequence n equals the final state of a run over the sequence's first
// e * interval tokens (e = 0: the initial state itself, bit for bit). For the chunked path the
// prefix ends on a chunk boundary, so the two runs do the same arithmetic: bit for bit too.
TEST(PrefillChunkStates, EqualFinalStatesOfPrefixRuns) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (int32_t interval : {64, 128}) {
    const PrefillCase c{.name = "chunk_states",
                        .seq_lens = {200, 0, 64, 129},
                        .HV = 2,
                        .K = 16,
                        .V = 16,
                        .dtype_state = interval == 64 ? DType::kFloat32 : DType::kBFloat16,
                        .initial = StateSource::kPool,
                        .extra_slots = 2,
                        .chunk_state_interval = interval};
    const PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
    for (const testing::CpuBackend& backend : testing::kCpuBackends) {
      SCOPED_TRACE(std::string(backend.name) + " interval " + std::to_string(interval));
      PrefillTensors full = inputs;
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, full).ok());
      int64_t entry = 0;
      int64_t begin = 0;
      for (size_t n = 0; n < c.seq_lens.size(); ++n) {
        const int64_t length = c.seq_lens[n];
        for (int64_t e = 0; e * interval < length; ++e, ++entry) {
          // Prefix run: the same pool, sequence n cut to its first e * interval tokens. cu is
          // {0, begin, ..., begin, begin + e * interval, ...}: sequence 0 absorbs the tokens
          // before `begin` (its result is not looked at), the ones after n are empty.
          PrefillCase prefix = c;
          prefix.chunk_state_interval = 0;
          PrefillTensors run = inputs;
          run.chunk_states = testing::HostTensor();
          for (size_t m = 1; m <= c.seq_lens.size(); ++m) {
            run.cu_seqlens.set(int64_t(m), double(m <= n ? begin : begin + e * interval));
          }
          run.final_state.poison();
          ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, prefix, run).ok());
          for (int32_t h = 0; h < c.HV; ++h) {
            for (int64_t a = 0; a < c.V; ++a) {
              for (int64_t b = 0; b < c.K; ++b) {
                const double want = run.final_state.at({int64_t(n), h, a, b});
                const double have = full.chunk_states.at({entry, h, a, b});
                ASSERT_EQ(want, have) << "sequence " << n << " entry " << e << " head " << h;
              }
            }
          }
        }
        begin += length;
      }
      EXPECT_EQ(entry, full.chunk_states.shape[0]);
    }
  }
}

// The exposed per-chunk intermediates (what a GPU prep kernel is checked against) satisfy the
// identities that define them, have zero rows past a partial chunk, and chaining apply_chunk
// over a sequence's chunks gives prefill_chunked's final state bit for bit.
TEST(ChunkPrep, IntermediatesSatisfyTheirDefinitions) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const PrefillCase c{.name = "prep",
                      .seq_lens = {10, 150},
                      .HV = 2,
                      .K = 32,
                      .V = 16,
                      .gate = GateMode::kSoftplus,
                      .dtype_qkv = DType::kFloat32};
  PrefillTensors t = testing::make_prefill_tensors(c, rng);
  const PrefillParams p = testing::fill_prefill_params(c, t, testing::host_pointers(t));
  const int32_t K = c.K, V = c.V, kC = cpu::kChunk;
  for (int32_t h = 0; h < c.HV; ++h) {
    std::vector<float> S(size_t(K) * V);
    for (int32_t i = 0; i < K; ++i) {
      for (int32_t j = 0; j < V; ++j)
        S[size_t(i) * V + j] = float(t.initial_state.at({1, h, j, i}));
    }
    std::vector<float> O(size_t(kC) * V);
    for (int64_t chunk = 0; chunk < 3; ++chunk) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + " head " + std::to_string(h));
      cpu::ChunkPrep x(K, V);
      ASSERT_TRUE(cpu::prefill_chunk_prep(p, 1, chunk, h, x).ok());
      const int32_t rows = chunk < 2 ? 64 : 22;
      ASSERT_EQ(x.rows, rows);
      for (int32_t r = 0; r < kC; ++r) {
        for (int32_t s = 0; s < kC; ++s) {
          // (I + diag(beta) L) T = I on the chunk's rows; zeros outside them.
          if (r >= rows || s >= rows) {
            ASSERT_EQ(x.T[size_t(r) * kC + s], 0.f);
            ASSERT_EQ(x.M[size_t(r) * kC + s], 0.f);
            continue;
          }
          double product = x.T[size_t(r) * kC + s];
          for (int32_t m = 0; m < r; ++m)
            product += x.beta[size_t(r)] * x.L[size_t(r) * kC + m] * x.T[size_t(m) * kC + s];
          ASSERT_NEAR(product, r == s ? 1.0 : 0.0, 1e-5) << r << ", " << s;
          if (s > r) ASSERT_EQ(x.M[size_t(r) * kC + s], 0.f);
        }
        if (r >= rows) {
          for (int32_t i = 0; i < K; ++i) ASSERT_EQ(x.W[size_t(r) * K + i], 0.f);
          for (int32_t j = 0; j < V; ++j) ASSERT_EQ(x.U0[size_t(r) * V + j], 0.f);
        }
      }
      for (int32_t i = 0; i < K; ++i) {
        ASSERT_EQ(x.Kh[size_t(rows - 1) * K + i], x.kn[size_t(rows - 1) * K + i]);  // exp2(0) = 1
        ASSERT_LE(x.decay[size_t(i)], 1.f);
        ASSERT_EQ(x.decay[size_t(i)], std::exp2(x.b2[size_t(rows - 1) * K + i]));
      }
      // M's diagonal: scale q_r . k_r (the gate factor is exp2(0) = 1).
      for (int32_t r = 0; r < rows; ++r) {
        double dot = 0.0;
        for (int32_t i = 0; i < K; ++i)
          dot += double(x.qn[size_t(r) * K + i]) * x.kn[size_t(r) * K + i];
        ASSERT_NEAR(x.M[size_t(r) * kC + r], p.scale * dot, 1e-5);
      }
      cpu::apply_chunk(x, S.data(), O.data());
    }
    PrefillTensors run = t;
    ASSERT_TRUE(testing::run_prefill_on_host(cpu::prefill_chunked, c, run).ok());
    for (int32_t i = 0; i < K; ++i) {
      for (int32_t j = 0; j < V; ++j)
        ASSERT_EQ(S[size_t(i) * V + j], float(run.final_state.at({1, h, j, i})));
    }
  }
  cpu::ChunkPrep x(K, V);
  EXPECT_FALSE(cpu::prefill_chunk_prep(p, 0, 1, 0, x).ok());  // sequence 0 has one chunk
  EXPECT_FALSE(cpu::prefill_chunk_prep(p, 2, 0, 0, x).ok());
}

}  // namespace
}  // namespace kdakit
