// The float64 reference on cases small enough to work out by hand, and the preprocessing
// formulas (gate modes, L2 norm, beta) on chosen values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "common/prefill_checks.h"
#include "cpu/preprocess.h"
#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

using testing::HostTensor;

// One sequence of T tokens, H = HV = 1, K = V = 2, fp32 everywhere, contiguous.
struct TinyPrefill {
  int64_t T;
  HostTensor q, k, v, g, beta, o, initial, final_state;
  StateLayout layout;

  TinyPrefill(int64_t tokens, StateLayout l = StateLayout::kVFirst)
      : T(tokens),
        q(HostTensor::contiguous(DType::kFloat32, {1, tokens, 1, 2})),
        k(HostTensor::contiguous(DType::kFloat32, {1, tokens, 1, 2})),
        v(HostTensor::contiguous(DType::kFloat32, {1, tokens, 1, 2})),
        g(HostTensor::contiguous(DType::kFloat32, {1, tokens, 1, 2})),
        beta(HostTensor::contiguous(DType::kFloat32, {1, tokens, 1})),
        o(HostTensor::contiguous(DType::kFloat32, {1, tokens, 1, 2})),
        initial(HostTensor::contiguous(DType::kFloat32, {1, 1, 2, 2})),
        final_state(HostTensor::contiguous(DType::kFloat32, {1, 1, 2, 2})),
        layout(l) {
    o.poison();
    final_state.poison();
  }

  void set_token(int64_t t, std::vector<double> q_, std::vector<double> k_, std::vector<double> v_,
                 std::vector<double> g_, double beta_) {
    for (int64_t i = 0; i < 2; ++i) {
      q.set_at({0, t, 0, i}, q_[size_t(i)]);
      k.set_at({0, t, 0, i}, k_[size_t(i)]);
      v.set_at({0, t, 0, i}, v_[size_t(i)]);
      g.set_at({0, t, 0, i}, g_[size_t(i)]);
    }
    beta.set_at({0, t, 0}, beta_);
  }
  // S[i][j] (key i, value j) of the initial state, stored per layout.
  void set_initial(double s00, double s01, double s10, double s11) {
    const double S[2][2] = {{s00, s01}, {s10, s11}};
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        initial.set_at(layout == StateLayout::kVFirst ? std::initializer_list<int64_t>{0, 0, j, i}
                                                      : std::initializer_list<int64_t>{0, 0, i, j},
                       S[i][j]);
      }
    }
  }
  double final_S(int64_t i, int64_t j) const {
    return layout == StateLayout::kVFirst ? final_state.at({0, 0, j, i})
                                          : final_state.at({0, 0, i, j});
  }

  PrefillParams params(bool with_initial) {
    return PrefillParams{
        .batch = 1,
        .seqlen = T,
        .num_seqs = 1,
        .num_state_slots = 1,
        .num_qk_heads = 1,
        .num_v_heads = 1,
        .head_dim_k = 2,
        .head_dim_v = 2,
        .q = q.data(),
        .k = k.data(),
        .v = v.data(),
        .g = g.data(),
        .beta = beta.data(),
        .o = o.data(),
        .initial_state = with_initial ? initial.data() : nullptr,
        .final_state = final_state.data(),
        .stride_q_b = q.stride(0),
        .stride_q_t = q.stride(1),
        .stride_q_h = q.stride(2),
        .stride_k_b = k.stride(0),
        .stride_k_t = k.stride(1),
        .stride_k_h = k.stride(2),
        .stride_v_b = v.stride(0),
        .stride_v_t = v.stride(1),
        .stride_v_h = v.stride(2),
        .stride_g_b = g.stride(0),
        .stride_g_t = g.stride(1),
        .stride_g_h = g.stride(2),
        .stride_beta_b = beta.stride(0),
        .stride_beta_t = beta.stride(1),
        .stride_beta_h = beta.stride(2),
        .stride_o_b = o.stride(0),
        .stride_o_t = o.stride(1),
        .stride_o_h = o.stride(2),
        .stride_initial_state_n = 4,
        .stride_final_state_n = 4,
        .dtype_qkv = DType::kFloat32,
        .dtype_g = DType::kFloat32,
        .dtype_beta = DType::kFloat32,
        .dtype_state = DType::kFloat32,
        .gate = GateMode::kPrecomputed,
        .state_layout = layout,
        .scale = 1.f,
    };
  }
};

constexpr double kTol = 1e-6;  // fp32 inputs (log 0.5 is not exact in fp32), fp32 outputs

// Two tokens from a zero state, worked out by hand (S is K x V, row i = key channel i):
//   token 1: q = (1, 0), k = (1, 0), v = (2, 4), gamma = log(0.5) (both rows), beta = 0.5
//     decay: S = 0;  prediction S^T k = 0;  delta = 0.5 (v - 0) = (1, 2)
//     S = k delta^T = [[1, 2], [0, 0]];  o_1 = S^T q = (1, 2)
//   token 2: q = (0, 1), k = (0.6, 0.8), v = (1, -1), gamma = (log 0.5, 0), beta = 1
//     decay rows by (0.5, 1): S = [[0.5, 1], [0, 0]]
//     prediction S^T k = (0.5 * 0.6, 1 * 0.6) = (0.3, 0.6);  delta = (0.7, -1.6)
//     S += k delta^T: row 0 += 0.6 (0.7, -1.6) -> (0.92, 0.04); row 1 = 0.8 (0.7, -1.6) = (0.56,
//     -1.28) o_2 = S^T q = row 1 = (0.56, -1.28)
void expect_two_token_case(StateLayout layout) {
  TinyPrefill x(2, layout);
  const double half = std::log(0.5);
  x.set_token(0, {1, 0}, {1, 0}, {2, 4}, {half, half}, 0.5);
  x.set_token(1, {0, 1}, {0.6, 0.8}, {1, -1}, {half, 0}, 1.0);
  ASSERT_TRUE(cpu::prefill_reference(x.params(false)).ok());
  EXPECT_NEAR(x.o.at({0, 0, 0, 0}), 1.0, kTol);
  EXPECT_NEAR(x.o.at({0, 0, 0, 1}), 2.0, kTol);
  EXPECT_NEAR(x.o.at({0, 1, 0, 0}), 0.56, kTol);
  EXPECT_NEAR(x.o.at({0, 1, 0, 1}), -1.28, kTol);
  EXPECT_NEAR(x.final_S(0, 0), 0.92, kTol);
  EXPECT_NEAR(x.final_S(0, 1), 0.04, kTol);
  EXPECT_NEAR(x.final_S(1, 0), 0.56, kTol);
  EXPECT_NEAR(x.final_S(1, 1), -1.28, kTol);
}

TEST(ReferenceByHand, TwoTokensVFirst) { expect_two_token_case(StateLayout::kVFirst); }
TEST(ReferenceByHand, TwoTokensKFirst) { expect_two_token_case(StateLayout::kKFirst); }

// One token from S0 = [[1, 3], [0, 1]] (K x V):
//   q = (1, 1), k = (1, 0), v = (2, 4), gamma = log(0.5) (both rows), beta = 0.5, scale 1
//   decay: S = [[0.5, 1.5], [0, 0.5]];  prediction S^T k = (0.5, 1.5)
//   delta = 0.5 ((2, 4) - (0.5, 1.5)) = (0.75, 1.25)
//   S += k delta^T: [[1.25, 2.75], [0, 0.5]];  o = S^T (1, 1) = (1.25, 3.25)
void expect_initial_state_case(StateLayout layout) {
  TinyPrefill x(1, layout);
  const double half = std::log(0.5);
  x.set_token(0, {1, 1}, {1, 0}, {2, 4}, {half, half}, 0.5);
  x.set_initial(1, 3, 0, 1);
  ASSERT_TRUE(cpu::prefill_reference(x.params(true)).ok());
  EXPECT_NEAR(x.o.at({0, 0, 0, 0}), 1.25, kTol);
  EXPECT_NEAR(x.o.at({0, 0, 0, 1}), 3.25, kTol);
  EXPECT_NEAR(x.final_S(0, 0), 1.25, kTol);
  EXPECT_NEAR(x.final_S(0, 1), 2.75, kTol);
  EXPECT_NEAR(x.final_S(1, 0), 0.0, kTol);
  EXPECT_NEAR(x.final_S(1, 1), 0.5, kTol);
}

TEST(ReferenceByHand, InitialStateVFirst) { expect_initial_state_case(StateLayout::kVFirst); }
TEST(ReferenceByHand, InitialStateKFirst) { expect_initial_state_case(StateLayout::kKFirst); }

// The same token run through the chunked path (one partial chunk of 1 token).
TEST(ReferenceByHand, ChunkedAgreesOnTheInitialStateCase) {
  TinyPrefill x(1);
  const double half = std::log(0.5);
  x.set_token(0, {1, 1}, {1, 0}, {2, 4}, {half, half}, 0.5);
  x.set_initial(1, 3, 0, 1);
  ASSERT_TRUE(cpu::prefill_chunked(x.params(true)).ok());
  EXPECT_NEAR(x.o.at({0, 0, 0, 1}), 3.25, kTol);
  EXPECT_NEAR(x.final_S(0, 1), 2.75, kTol);
}

// ------------------------------------------------------------------------------------------
// Preprocessing formulas on chosen values
// ------------------------------------------------------------------------------------------

// Token inputs of a one-token, one-head problem with K = 2 and the given gate settings.
struct OneToken {
  float q[2] = {3.f, 4.f}, k[2] = {0.f, -2.f}, v[2] = {1.f, 1.f};
  float g[2] = {1.f, 25.f};
  float beta = 0.f;
  float A_log = float(std::log(2.0));
  float dt_bias[2] = {0.5f, 0.5f};
  float o[2] = {};

  cpu::TokenInputs<double> run(GateMode gate, float lb, bool a_log, bool dt, bool l2norm,
                               bool sigmoid, bool neg, bool scalar) {
    PrefillParams p{.batch = 1,
                    .seqlen = 1,
                    .num_seqs = 1,
                    .num_qk_heads = 1,
                    .num_v_heads = 1,
                    .head_dim_k = 2,
                    .head_dim_v = 2,
                    .q = q,
                    .k = k,
                    .v = v,
                    .g = g,
                    .beta = &beta,
                    .A_log = a_log ? &A_log : nullptr,
                    .dt_bias = dt ? dt_bias : nullptr,
                    .o = o,
                    .stride_q_t = 2,
                    .stride_k_t = 2,
                    .stride_v_t = 2,
                    .stride_g_t = 2,
                    .stride_g_h = 2,
                    .stride_beta_t = 1,
                    .stride_o_t = 2,
                    .dtype_qkv = DType::kFloat32,
                    .dtype_g = DType::kFloat32,
                    .dtype_beta = DType::kFloat32,
                    .gate = gate,
                    .scale = 1.f,
                    .lower_bound = lb,
                    .use_qk_l2norm = l2norm,
                    .use_beta_sigmoid = sigmoid,
                    .allow_neg_eigval = neg,
                    .scalar_gate = scalar};
    const cpu::KdaProblem m = cpu::make_problem(p);
    cpu::TokenInputs<double> in{qs, ks, vs, gamma, 0.0};
    cpu::load_token(m, 0, 0, 0, in);
    return in;
  }
  double qs[2], ks[2], vs[2], gamma[2];
};

TEST(ReferencePreprocess, SoftplusGate) {
  OneToken x;
  // gamma = -exp(A_log) softplus(g + dt_bias) = -a log(1 + e^1.5) with a = exp(A_log) ~ 2 (A_log
  // is the fp32 value of log 2); past 20 softplus is linear: -a * 25.5.
  const double a = std::exp(double(x.A_log));
  const auto in = x.run(GateMode::kSoftplus, 0.f, true, true, false, false, false, false);
  EXPECT_NEAR(in.gamma[0], -a * std::log1p(std::exp(1.5)), 1e-12);
  EXPECT_NEAR(in.gamma[1], -a * 25.5, 1e-12);
  const auto no_bias = x.run(GateMode::kSoftplus, 0.f, true, false, false, false, false, false);
  EXPECT_NEAR(no_bias.gamma[0], -a * std::log1p(std::exp(1.0)), 1e-12);
}

TEST(ReferencePreprocess, LowerBoundGate) {
  OneToken x;
  // gamma = lb sigmoid(exp(A_log) (g + dt_bias)) = -5 sigmoid(a * 1.5), a = exp(A_log) ~ 2
  const double a = std::exp(double(x.A_log));
  const auto in = x.run(GateMode::kLowerBound, -5.f, true, true, false, false, false, false);
  EXPECT_NEAR(in.gamma[0], -5.0 / (1.0 + std::exp(-a * 1.5)), 1e-12);
  // without A_log: -2.5 sigmoid(g + dt_bias) = -2.5 sigmoid(1.5)
  const auto no_a = x.run(GateMode::kLowerBound, -2.5f, false, true, false, false, false, false);
  EXPECT_NEAR(no_a.gamma[0], -2.5 / (1.0 + std::exp(-1.5)), 1e-12);
  EXPECT_NEAR(no_a.gamma[1], -2.5 / (1.0 + std::exp(-25.5)), 1e-12);
}

TEST(ReferencePreprocess, PrecomputedAndScalarGate) {
  OneToken x;
  x.g[0] = -0.25f;
  x.g[1] = -0.75f;
  const auto in = x.run(GateMode::kPrecomputed, 0.f, false, false, false, false, false, false);
  EXPECT_EQ(in.gamma[0], -0.25);
  EXPECT_EQ(in.gamma[1], -0.75);
  // Scalar gate: g[t, h] broadcast over the key channels, dt_bias[h] a scalar.
  const auto scalar = x.run(GateMode::kSoftplus, 0.f, true, true, false, false, false, true);
  EXPECT_NEAR(scalar.gamma[0], -std::exp(double(x.A_log)) * std::log1p(std::exp(0.25)), 1e-12);
  EXPECT_EQ(scalar.gamma[1], scalar.gamma[0]);
}

TEST(ReferencePreprocess, L2NormAndBeta) {
  OneToken x;
  x.beta = 0.f;
  const auto in = x.run(GateMode::kPrecomputed, 0.f, false, false, true, true, false, false);
  // q = (3, 4) / sqrt(25 + 1e-6): the eps sits inside the square root.
  EXPECT_NEAR(in.q[0], 3.0 / std::sqrt(25.0 + 1e-6), 1e-15);
  EXPECT_NEAR(in.k[1], -2.0 / std::sqrt(4.0 + 1e-6), 1e-15);
  EXPECT_EQ(in.beta, 0.5);  // sigmoid(0)
  const auto neg = x.run(GateMode::kPrecomputed, 0.f, false, false, false, true, true, false);
  EXPECT_EQ(neg.beta, 1.0);  // 2 sigmoid(0)
  EXPECT_EQ(neg.q[0], 3.0);  // no norm
  x.beta = 0.3f;
  const auto raw = x.run(GateMode::kPrecomputed, 0.f, false, false, false, false, false, false);
  EXPECT_EQ(raw.beta, double(0.3f));
}

// All three gate modes produce gamma = log(0.5) for suitable inputs; the runs must agree with
// the precomputed gate g = log(0.5) to double rounding.
TEST(ReferenceGates, ModesAgreeOnEquivalentInputs) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  testing::PrefillCase base{.name = "gates",
                            .seq_lens = {9, 4},
                            .gate = GateMode::kPrecomputed,
                            .dtype_qkv = DType::kFloat32};
  testing::PrefillTensors t = testing::make_prefill_tensors(base, rng);
  const double log_half = std::log(0.5);
  t.g.fill_storage(double(float(log_half)));
  ASSERT_TRUE(testing::run_prefill_on_host(cpu::prefill_reference, base, t).ok());

  // softplus: -exp(0) softplus(0) = -log 2.  lower bound: (-2 log 2) sigmoid(0) = -log 2.
  for (GateMode mode : {GateMode::kSoftplus, GateMode::kLowerBound}) {
    testing::PrefillCase c = base;
    c.gate = mode;
    c.lower_bound = float(2 * log_half);
    c.has_dt_bias = false;
    c.has_A_log = mode == GateMode::kSoftplus;
    testing::PrefillTensors u = t;
    u.g.fill_storage(0.0);
    if (c.has_A_log) {
      u.A_log = HostTensor::contiguous(DType::kFloat32, {c.HV});
      u.A_log.fill_storage(0.0);
    }
    u.o.poison();
    u.final_state.poison();
    ASSERT_TRUE(testing::run_prefill_on_host(cpu::prefill_reference, c, u).ok());
    // float(log 0.5) vs the exact value: relative 1e-8 differences in gamma.
    EXPECT_TRUE(testing::rel_l2_below(to_string(mode), u.o, t.o, 1e-6));
    EXPECT_TRUE(testing::rel_l2_below(to_string(mode), u.final_state, t.final_state, 1e-6));
  }
}

// GVA: value head h reads q/k head h / (HV / H). Running H = 1, HV = 3 must equal three
// H = HV = 1 runs whose q/k are that one head and whose v, g, beta are head h's.
TEST(ReferenceGva, ValueHeadsShareTheirQkHead) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const testing::PrefillCase gva{
      .name = "gva", .seq_lens = {7, 12}, .H = 1, .HV = 3, .K = 8, .V = 4};
  testing::PrefillTensors t = testing::make_prefill_tensors(gva, rng);
  ASSERT_TRUE(testing::run_prefill_on_host(cpu::prefill_reference, gva, t).ok());
  for (int32_t h = 0; h < 3; ++h) {
    testing::PrefillCase one = gva;
    one.HV = 1;
    testing::PrefillTensors u = testing::make_prefill_tensors(one, rng);
    const int64_t T = gva.tokens_per_row();
    for (int64_t tok = 0; tok < T; ++tok) {
      for (int64_t i = 0; i < gva.K; ++i) {
        u.q.set_at({0, tok, 0, i}, t.q.at({0, tok, 0, i}));
        u.k.set_at({0, tok, 0, i}, t.k.at({0, tok, 0, i}));
        u.g.set_at({0, tok, 0, i}, t.g.at({0, tok, h, i}));
        u.dt_bias.set_at({0, i}, t.dt_bias.at({h, i}));
      }
      for (int64_t j = 0; j < gva.V; ++j) u.v.set_at({0, tok, 0, j}, t.v.at({0, tok, h, j}));
      u.beta.set_at({0, tok, 0}, t.beta.at({0, tok, h}));
    }
    u.A_log.set(0, t.A_log.get(h));
    for (int64_t n = 0; n < 2; ++n) {
      for (int64_t a = 0; a < gva.V; ++a) {
        for (int64_t b = 0; b < gva.K; ++b)
          u.initial_state.set_at({n, 0, a, b}, t.initial_state.at({n, h, a, b}));
      }
    }
    ASSERT_TRUE(testing::run_prefill_on_host(cpu::prefill_reference, one, u).ok());
    for (int64_t tok = 0; tok < T; ++tok) {
      for (int64_t j = 0; j < gva.V; ++j) {
        ASSERT_EQ(u.o.at({0, tok, 0, j}), t.o.at({0, tok, h, j}))
            << "head " << h << " token " << tok;
      }
    }
    for (int64_t n = 0; n < 2; ++n) {
      for (int64_t a = 0; a < gva.V; ++a) {
        for (int64_t b = 0; b < gva.K; ++b) {
          ASSERT_EQ(u.final_state.at({n, 0, a, b}), t.final_state.at({n, h, a, b})) << "head " << h;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kdakit
