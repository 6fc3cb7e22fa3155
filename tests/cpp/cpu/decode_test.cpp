// The float64 decode reference against the float64 prefill reference stepped by hand: each
// row's tokens run as a one-sequence prefill from its start slot; speculative rows get one
// prefix run per written slot. Also: padding rows, chained decode steps = one prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "common/prefill_checks.h"
#include "cpu/layout.h"
#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

using testing::DecodeCase;
using testing::DecodeTensors;
using testing::HostTensor;

const char* shifted(const HostTensor& x, int64_t row, int64_t token) {
  return static_cast<const char*>(x.data()) +
         (row * x.stride(0) + token * x.stride(1)) * cpu::element_bytes(x.dtype);
}
char* shifted(HostTensor& x, int64_t row, int64_t token) {
  return static_cast<char*>(x.data()) +
         (row * x.stride(0) + token * x.stride(1)) * cpu::element_bytes(x.dtype);
}

// A one-sequence prefill over `length` tokens of row `row` starting at token `begin` of the
// decode tensors t, from the state block at `initial` into the state block at `final_state`
// (both [HV, state]), outputs into `o` (same layout as t.o).
PrefillParams row_prefill(const DecodeCase& c, const DecodeTensors& t, int64_t row, int64_t begin,
                          int64_t length, const void* initial, void* final_state, HostTensor& o) {
  return PrefillParams{.batch = 1,
                       .seqlen = length,
                       .num_seqs = 1,
                       .num_state_slots = 1,
                       .num_qk_heads = c.H,
                       .num_v_heads = c.HV,
                       .head_dim_k = c.K,
                       .head_dim_v = c.V,
                       .q = shifted(t.q, row, begin),
                       .k = shifted(t.k, row, begin),
                       .v = shifted(t.v, row, begin),
                       .g = shifted(t.g, row, begin),
                       .beta = shifted(t.beta, row, begin),
                       .A_log = static_cast<const float*>(t.A_log.data()),
                       .dt_bias = static_cast<const float*>(t.dt_bias.data()),
                       .o = shifted(o, row, begin),
                       .initial_state = initial,
                       .final_state = final_state,
                       .stride_q_b = t.q.stride(0),
                       .stride_q_t = t.q.stride(1),
                       .stride_q_h = t.q.stride(2),
                       .stride_k_b = t.k.stride(0),
                       .stride_k_t = t.k.stride(1),
                       .stride_k_h = t.k.stride(2),
                       .stride_v_b = t.v.stride(0),
                       .stride_v_t = t.v.stride(1),
                       .stride_v_h = t.v.stride(2),
                       .stride_g_b = t.g.stride(0),
                       .stride_g_t = t.g.stride(1),
                       .stride_g_h = t.g.stride(2),
                       .stride_beta_b = t.beta.stride(0),
                       .stride_beta_t = t.beta.stride(1),
                       .stride_beta_h = t.beta.stride(2),
                       .stride_o_b = o.stride(0),
                       .stride_o_t = o.stride(1),
                       .stride_o_h = o.stride(2),
                       .stride_initial_state_n = t.state.stride(0),
                       .stride_final_state_n = t.state.stride(0),
                       .dtype_qkv = c.dtype_qkv,
                       .dtype_g = c.dtype_g,
                       .dtype_beta = c.dtype_beta,
                       .dtype_state = c.dtype_state,
                       .gate = c.gate,
                       .state_layout = c.layout,
                       .scale = c.effective_scale(),
                       .lower_bound = c.gate == GateMode::kLowerBound ? c.lower_bound : 0.f,
                       .use_qk_l2norm = c.l2norm,
                       .use_beta_sigmoid = c.beta_sigmoid,
                       .allow_neg_eigval = c.neg_eigval,
                       .scalar_gate = c.scalar_gate};
}

bool valid_slot(int64_t slot, const DecodeTensors& t, const DecodeCase& c) {
  return slot >= 0 && slot < t.num_slots && !(c.null_slot_is_padding && slot == 0);
}

// The pool and outputs decode must produce, built from prefill runs (see file comment).
void expected_decode(const DecodeCase& c, const DecodeTensors& t, HostTensor& o, HostTensor& pool) {
  const int64_t cols = c.num_index_cols;
  const auto* idx = static_cast<const int32_t*>(t.state_indices.data());
  const auto* acc = static_cast<const int32_t*>(t.num_accepted_tokens.data());
  const int64_t slot_bytes = t.state.stride(0) * cpu::element_bytes(c.dtype_state);
  const int64_t block_bytes =
      int64_t(c.HV) * c.K * c.V * cpu::element_bytes(c.dtype_state);  // slot minus padding
  HostTensor scratch = HostTensor::contiguous(c.dtype_state, {1, c.HV, c.K * c.V});
  for (int64_t n = 0; n < t.num_seqs; ++n) {
    const cpu::SeqRange r =
        cpu::sequence_range(t.cu_seqlens.data(), c.dtype_cu, n, c.tokens_per_row());
    const int64_t a = acc != nullptr ? std::clamp<int64_t>(acc[n], 1, cols) : 1;
    const int64_t start = idx[n * t.state_indices.stride(0) + a - 1];
    if (!valid_slot(start, t, c)) {
      for (int64_t tok = r.begin; tok < r.end; ++tok) {
        for (int64_t h = 0; h < c.HV; ++h) {
          for (int64_t j = 0; j < c.V; ++j) o.set_at({r.row, tok, h, j}, 0.0);
        }
      }
      continue;
    }
    const char* initial =
        static_cast<const char*>(t.state.data()) + start * slot_bytes;  // original pool
    if (r.length() == 0) continue;
    ASSERT_TRUE(cpu::prefill_reference(
                    row_prefill(c, t, r.row, r.begin, r.length(), initial, scratch.data(), o))
                    .ok());
    if (cols == 1) {
      std::memcpy(static_cast<char*>(pool.data()) + start * slot_bytes, scratch.data(),
                  size_t(block_bytes));
      continue;
    }
    HostTensor o_prefix = o;
    for (int64_t tok = 0; tok < std::min(r.length(), cols); ++tok) {
      const int64_t slot = idx[n * t.state_indices.stride(0) + tok];
      if (!valid_slot(slot, t, c)) continue;
      ASSERT_TRUE(cpu::prefill_reference(
                      row_prefill(c, t, r.row, r.begin, tok + 1, initial, scratch.data(), o_prefix))
                      .ok());
      std::memcpy(static_cast<char*>(pool.data()) + slot * slot_bytes, scratch.data(),
                  size_t(block_bytes));
    }
  }
}

class DecodeVsPrefill : public ::testing::TestWithParam<DecodeCase> {};

void expect_decode_matches_prefill(const DecodeCase& c, testing::Rng& rng) {
  SCOPED_TRACE(c.name);
  const DecodeTensors inputs = testing::make_decode_tensors(c, rng);
  DecodeTensors got = inputs;
  const Status status = testing::run_decode_on_host(cpu::decode_reference, c, got);
  ASSERT_TRUE(status.ok()) << status.message();
  HostTensor o = inputs.o;
  HostTensor pool = inputs.state;
  expected_decode(c, inputs, o, pool);
  EXPECT_TRUE(testing::storage_equal("o", got.o, o));
  EXPECT_TRUE(testing::storage_equal("pool", got.state, pool));
}

TEST_P(DecodeVsPrefill, OutputsAndPoolBitwise) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  expect_decode_matches_prefill(GetParam(), rng);
}

// Random cases: every knob drawn at random, a fresh draw each run.
TEST(DecodeVsPrefillRandom, RandomCases) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const testing::RandomCaseLimits limits;
  for (int i = 0; i < 40; ++i) {
    expect_decode_matches_prefill(testing::random_decode_case(rng, limits, i), rng);
    if (::testing::Test::HasFailure()) break;
  }
}

auto case_name = [](const ::testing::TestParamInfo<DecodeCase>& info) { return info.param.name; };
INSTANTIATE_TEST_SUITE_P(Regular, DecodeVsPrefill,
                         ::testing::ValuesIn(testing::decode_regular_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Corner, DecodeVsPrefill,
                         ::testing::ValuesIn(testing::decode_corner_cases()), case_name);

std::vector<DecodeCase> decode_variants() {
  return {
      {.name = "spec_bf16_state_kfirst",
       .batch = 5,
       .seqlen = 4,
       .dtype_state = DType::kBFloat16,
       .layout = StateLayout::kKFirst,
       .num_index_cols = 4,
       .accepted = true,
       .padding_rows = 1,
       .negative_write_slots = true},
      {.name = "spec_fewer_cols_than_tokens",
       .batch = 3,
       .seqlen = 5,
       .num_index_cols = 2,
       .accepted = true},
      {.name = "spec_no_accepted", .batch = 3, .seqlen = 3, .num_index_cols = 3},
      {.name = "gdn_scalar_gate",
       .batch = 4,
       .seqlen = 1,
       .gate = GateMode::kSoftplus,
       .scalar_gate = true},
      {.name = "precomputed_fp32_no_flags",
       .batch = 4,
       .seqlen = 2,
       .gate = GateMode::kPrecomputed,
       .dtype_qkv = DType::kFloat32,
       .l2norm = false,
       .beta_sigmoid = false},
      {.name = "fp16_neg_eigval_int64_cu",
       .seq_lens = {2, 0, 1},
       .dtype_qkv = DType::kFloat16,
       .dtype_cu = DType::kInt64,
       .neg_eigval = true,
       .padding_rows = 1},
      {.name = "packed_tail", .seq_lens = {1, 1, 1}, .tail = 2},
      {.name = "null_slot_spec",
       .batch = 4,
       .seqlen = 2,
       .num_index_cols = 2,
       .accepted = true,
       .padding_rows = 2,
       .null_slot_is_padding = true},
  };
}
INSTANTIATE_TEST_SUITE_P(Variants, DecodeVsPrefill, ::testing::ValuesIn(decode_variants()),
                         case_name);

// A batch of padding rows only: zero outputs, the pool untouched bit for bit.
TEST(DecodePadding, AllPaddingRowsTouchNoState) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (bool null_slot : {false, true}) {
    const DecodeCase c{.name = "all_padding",
                       .batch = 6,
                       .seqlen = 2,
                       .num_index_cols = 2,
                       .accepted = true,
                       .padding_rows = 6,
                       .null_slot_is_padding = null_slot};
    const DecodeTensors inputs = testing::make_decode_tensors(c, rng);
    DecodeTensors t = inputs;
    ASSERT_TRUE(testing::run_decode_on_host(cpu::decode_reference, c, t).ok());
    EXPECT_TRUE(testing::storage_equal("pool", t.state, inputs.state));
    for (int64_t e = 0; e < t.o.numel(); ++e) {
      ASSERT_EQ(t.o.get(e), 0.0) << t.o.index_string(e);
      ASSERT_FALSE(std::signbit(t.o.get(e))) << t.o.index_string(e);
    }
  }
}

// L decode calls of one token each, updating the pool in place, equal one prefill over the L
// tokens (reference: to fp32 state rounding per step; chunked: to the chunked bar).
TEST(DecodeChain, StepsEqualOnePrefill) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const int64_t L = 9;
  const DecodeCase c{.name = "chain",
                     .batch = 3,
                     .seqlen = L,
                     .HV = 2,
                     .K = 16,
                     .V = 32,
                     .gate = GateMode::kSoftplus,
                     .dtype_qkv = DType::kFloat32};
  const DecodeTensors inputs = testing::make_decode_tensors(c, rng);
  DecodeCase step = c;
  step.seqlen = 1;
  DecodeTensors t = inputs;
  for (int64_t tok = 0; tok < L; ++tok) {
    testing::DecodePointers ptr = testing::host_pointers(t);
    ptr.q = shifted(t.q, 0, tok);
    ptr.k = shifted(t.k, 0, tok);
    ptr.v = shifted(t.v, 0, tok);
    ptr.g = shifted(t.g, 0, tok);
    ptr.beta = shifted(t.beta, 0, tok);
    ptr.o = shifted(t.o, 0, tok);
    ASSERT_TRUE(cpu::decode_reference(testing::fill_decode_params(step, t, ptr)).ok());
  }

  // One prefill per backend: initial = gathered start slots, final dense.
  const testing::PrefillCase pc{.name = "chain_prefill",
                                .batch = c.batch,
                                .seqlen = L,
                                .H = c.H,
                                .HV = c.HV,
                                .K = c.K,
                                .V = c.V,
                                .gate = c.gate,
                                .dtype_qkv = c.dtype_qkv};
  testing::PrefillTensors pt = testing::make_prefill_tensors(pc, rng);
  pt.q = inputs.q;
  pt.k = inputs.k;
  pt.v = inputs.v;
  pt.g = inputs.g;
  pt.beta = inputs.beta;
  pt.A_log = inputs.A_log;
  pt.dt_bias = inputs.dt_bias;
  pt.o = inputs.o;
  const auto* idx = static_cast<const int32_t*>(inputs.state_indices.data());
  HostTensor decoded_final = pt.final_state;
  for (int64_t n = 0; n < c.batch; ++n) {
    for (int64_t h = 0; h < c.HV; ++h) {
      for (int64_t a = 0; a < c.V; ++a) {
        for (int64_t b = 0; b < c.K; ++b) {
          pt.initial_state.set_at({n, h, a, b}, inputs.state.at({idx[n], h, a, b}));
          decoded_final.set_at({n, h, a, b}, t.state.at({idx[n], h, a, b}));
        }
      }
    }
  }
  using PrefillFn = Status (*)(const PrefillParams&);
  for (auto [name, fn, bar] :
       {std::tuple<const char*, PrefillFn, double>{"reference", cpu::prefill_reference, 1e-6},
        {"chunked", cpu::prefill_chunked, 1e-5}}) {
    SCOPED_TRACE(name);
    testing::PrefillTensors run = pt;
    ASSERT_TRUE(testing::run_prefill_on_host(fn, pc, run).ok());
    EXPECT_TRUE(testing::rel_l2_below("o", t.o, run.o, bar));
    EXPECT_TRUE(testing::rel_l2_below("final state", decoded_final, run.final_state, bar));
  }
}

TEST(DecodeDeterminism, RepeatedRunsAreBitwiseEqual) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const DecodeCase c{.name = "det",
                     .batch = 8,
                     .seqlen = 3,
                     .HV = 4,
                     .num_index_cols = 3,
                     .accepted = true,
                     .padding_rows = 2};
  const DecodeTensors inputs = testing::make_decode_tensors(c, rng);
  DecodeTensors first = inputs;
  ASSERT_TRUE(testing::run_decode_on_host(cpu::decode_reference, c, first).ok());
  for (int repeat = 0; repeat < 5; ++repeat) {
    DecodeTensors again = inputs;
    ASSERT_TRUE(testing::run_decode_on_host(cpu::decode_reference, c, again).ok());
    ASSERT_TRUE(testing::storage_equal("o", again.o, first.o));
    ASSERT_TRUE(testing::storage_equal("pool", again.state, first.state));
  }
}

}  // namespace
}  // namespace kdakit
