// Contract corners of the CPU prefill (both paths): empty sequences pass the state through bit
// for bit, tokens past cu[N] and view padding are never written, pool gather/scatter with
// negative indices equals the dense form and leaves every other slot bit-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "common/prefill_checks.h"
#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

using testing::HostTensor;
using testing::PrefillCase;
using testing::PrefillTensors;
using testing::StateSource;

using testing::kCpuBackends;

// Empty sequences: final = initial bit for bit (even -0.0, subnormals and NaN payloads), zeros
// without an initial state; no output written.
TEST(PrefillContract, EmptySequencesPassTheStateThroughBitForBit) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (DType state_dtype : {DType::kFloat32, DType::kBFloat16}) {
    const PrefillCase c{.name = "empty", .seq_lens = {0, 30, 0, 70, 0}, .dtype_state = state_dtype};
    PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
    // Special values in the states of the empty sequences 0, 2 and 4.
    const int64_t size = cpu::element_bytes(state_dtype);
    const uint32_t nan_payload_f32 = 0x7fc01234u;
    const uint16_t nan_payload_bf16 = 0x7fa1u;
    for (int64_t n : {0, 2, 4}) {
      inputs.initial_state.set_at({n, 0, 0, 0}, -0.0);
      inputs.initial_state.set_at({n, 1, 3, 5}, state_dtype == DType::kFloat32 ? 1e-40 : 1e-39);
      auto* nan_at = static_cast<unsigned char*>(inputs.initial_state.data()) +
                     inputs.initial_state.offset_of({n, 1, 2, 2}) * size;
      if (state_dtype == DType::kFloat32) {
        std::memcpy(nan_at, &nan_payload_f32, 4);
      } else {
        std::memcpy(nan_at, &nan_payload_bf16, 2);
      }
    }
    for (const testing::CpuBackend& backend : kCpuBackends) {
      SCOPED_TRACE(std::string(backend.name) + " " + to_string(state_dtype));
      PrefillTensors t = inputs;
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, t).ok());
      for (int64_t n : {0, 2, 4})
        EXPECT_TRUE(testing::rows_bitwise_equal(t.final_state, n, inputs.initial_state, n));

      // Without an initial state: exact zeros (+0.0).
      PrefillCase no_initial = c;
      no_initial.initial = StateSource::kNone;
      PrefillTensors z = inputs;
      z.initial_state = HostTensor();
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, no_initial, z).ok());
      HostTensor zeros = z.final_state;
      zeros.fill_storage(0.0);
      for (int64_t n : {0, 2, 4}) EXPECT_TRUE(testing::rows_bitwise_equal(z.final_state, n, zeros, n));
      // No output anywhere but in the two non-empty sequences' tokens: all outputs are those.
      for (int64_t e = 0; e < t.o.numel(); ++e)
        ASSERT_FALSE(std::isnan(t.o.get(e))) << t.o.index_string(e);
    }
  }
}

// The first chunk state of a sequence is its initial state bit for bit (-0.0 and fp32
// subnormals included): the fp32 chunked backend flushes subnormals in a chunk's arithmetic only.
TEST(PrefillContract, FirstChunkStateIsTheInitialStateBitForBit) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const PrefillCase c{.name = "chunk_state_0", .seq_lens = {100, 70}, .chunk_state_interval = 64};
  PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
  for (int64_t n : {0, 1}) {
    inputs.initial_state.set_at({n, 0, 0, 0}, -0.0);
    inputs.initial_state.set_at({n, 1, 3, 5}, 1e-40);
    inputs.initial_state.set_at({n, 0, 7, 2}, -3e-42);
  }
  for (const testing::CpuBackend& backend : kCpuBackends) {
    SCOPED_TRACE(backend.name);
    PrefillTensors t = inputs;
    ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, t).ok());
    // entries: sequence 0 at 0 and 1 (tokens 0 and 64), sequence 1 at 2 (token 0)
    EXPECT_TRUE(testing::rows_bitwise_equal(t.chunk_states, 0, inputs.initial_state, 0));
    EXPECT_TRUE(testing::rows_bitwise_equal(t.chunk_states, 2, inputs.initial_state, 1));
  }
}

// Only the logical elements of tokens [0, cu[N]) of o are written: tokens past cu[N] and the
// padding of a strided view keep their poison bit for bit.
TEST(PrefillContract, NothingWrittenPastCuOrIntoViewPadding) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const PrefillCase c{.name = "tail",
                      .seq_lens = {20, 0, 45},
                      .tail = 17,
                      .HV = 2,
                      .pad = 2,
                      .chunk_state_interval = 64};
  const PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
  const int64_t written_tokens = c.tokens_per_row() - c.tail;
  for (const testing::CpuBackend& backend : kCpuBackends) {
    SCOPED_TRACE(backend.name);
    PrefillTensors t = inputs;
    ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, t).ok());
    std::set<int64_t> written;
    for (int64_t tok = 0; tok < written_tokens; ++tok) {
      for (int64_t h = 0; h < c.HV; ++h) {
        for (int64_t j = 0; j < c.V; ++j) written.insert(t.o.offset_of({0, tok, h, j}));
      }
    }
    const int64_t size = cpu::element_bytes(t.o.dtype);
    for (int64_t e = 0; e < t.o.storage_elements(); ++e) {
      const bool same = std::memcmp(t.o.bytes.data() + e * size, inputs.o.bytes.data() + e * size,
                                    size_t(size)) == 0;
      if (written.count(e)) {
        ASSERT_FALSE(same) << "output element at storage offset " << e << " was not written";
      } else {
        ASSERT_TRUE(same) << "storage offset " << e << " outside the written outputs changed";
      }
    }
  }
}

// Pool gather/scatter: running with pool indices (some -1) equals running densely on the
// gathered states (zeros for -1) and scattering by hand; slots nobody writes stay bit-identical.
TEST(PrefillContract, PoolIndicesMatchTheDenseFormAndLeaveOtherSlotsAlone) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (DType state_dtype : {DType::kFloat32, DType::kBFloat16}) {
    PrefillCase pool{
        .name = "pool",
        .seq_lens = {40, 0, 70, 9, 64, 1},
        .dtype_state = state_dtype,
        .layout = state_dtype == DType::kFloat32 ? StateLayout::kVFirst : StateLayout::kKFirst,
        .pad = 3,
        .initial = StateSource::kPool,
        .final_state = StateSource::kPool,
        .extra_slots = 6,
        .negative_indices = true};
    PrefillTensors inputs = testing::make_prefill_tensors(pool, rng);
    const int64_t N = inputs.num_seqs;
    // Make sure both index kinds occur.
    static_cast<int32_t*>(inputs.initial_state_indices.data())[0] = -1;
    static_cast<int32_t*>(inputs.final_state_indices.data())[2] = -1;
    const auto* in_idx = static_cast<const int32_t*>(inputs.initial_state_indices.data());
    const auto* out_idx = static_cast<const int32_t*>(inputs.final_state_indices.data());

    PrefillCase dense = pool;
    dense.initial = StateSource::kDense;
    dense.final_state = StateSource::kDense;
    dense.negative_indices = false;
    dense.extra_slots = 0;
    PrefillTensors dense_inputs = testing::make_prefill_tensors(dense, rng);
    dense_inputs.q = inputs.q;
    dense_inputs.k = inputs.k;
    dense_inputs.v = inputs.v;
    dense_inputs.g = inputs.g;
    dense_inputs.beta = inputs.beta;
    dense_inputs.A_log = inputs.A_log;
    dense_inputs.dt_bias = inputs.dt_bias;
    dense_inputs.initial_state.fill_storage(0.0);
    for (int64_t n = 0; n < N; ++n) {
      if (in_idx[n] >= 0) testing::copy_row(inputs.initial_state, in_idx[n], dense_inputs.initial_state, n);
    }

    for (const testing::CpuBackend& backend : kCpuBackends) {
      SCOPED_TRACE(std::string(backend.name) + " " + to_string(state_dtype));
      PrefillTensors p = inputs;
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, pool, p).ok());
      PrefillTensors d = dense_inputs;
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, dense, d).ok());
      EXPECT_TRUE(testing::bitwise_equal("o", p.o, d.o));
      std::set<int64_t> written;
      for (int64_t n = 0; n < N; ++n) {
        if (out_idx[n] < 0) continue;
        written.insert(out_idx[n]);
        EXPECT_TRUE(testing::rows_bitwise_equal(p.final_state, out_idx[n], d.final_state, n))
            << "sequence " << n;
      }
      for (int64_t slot = 0; slot < inputs.num_slots; ++slot) {
        if (!written.count(slot))
          EXPECT_TRUE(testing::rows_bitwise_equal(p.final_state, slot, inputs.final_state, slot));
      }
      EXPECT_TRUE(testing::storage_equal("initial pool", p.initial_state, inputs.initial_state));
    }
  }
}

// Out-of-range pool indices are treated like negative ones (start from zeros / no write).
TEST(PrefillContract, OutOfRangePoolIndicesActLikeNegativeOnes) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const PrefillCase c{.name = "range",
                      .seq_lens = {30, 12},
                      .initial = StateSource::kPool,
                      .final_state = StateSource::kPool,
                      .extra_slots = 2};
  PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
  for (const testing::CpuBackend& backend : kCpuBackends) {
    SCOPED_TRACE(backend.name);
    PrefillTensors far = inputs;
    static_cast<int32_t*>(far.initial_state_indices.data())[1] = int32_t(inputs.num_slots);
    static_cast<int32_t*>(far.final_state_indices.data())[1] = int32_t(inputs.num_slots + 7);
    PrefillTensors negative = inputs;
    static_cast<int32_t*>(negative.initial_state_indices.data())[1] = -1;
    static_cast<int32_t*>(negative.final_state_indices.data())[1] = -1;
    ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, far).ok());
    ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, negative).ok());
    EXPECT_TRUE(testing::storage_equal("o", far.o, negative.o));
    EXPECT_TRUE(testing::storage_equal("pool", far.final_state, negative.final_state));
  }
}

// A fixed batch with T = 0: every sequence is empty, so final = initial bit for bit.
TEST(PrefillContract, ZeroLengthFixedBatchCopiesTheStates) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const PrefillCase c{.name = "t0", .batch = 3, .seqlen = 0, .dtype_state = DType::kBFloat16};
  const PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
  for (const testing::CpuBackend& backend : kCpuBackends) {
    SCOPED_TRACE(backend.name);
    PrefillTensors t = inputs;
    ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, t).ok());
    EXPECT_TRUE(testing::bitwise_equal("final state", t.final_state, inputs.initial_state));
  }
}

// Chunk-state entries at or past num_chunk_states are not written (packed batches whose count
// the caller bounds without reading cu_seqlens); the ones below are unaffected.
TEST(PrefillContract, ChunkStatesStopAtTheCapacity) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const PrefillCase c{.name = "capacity", .seq_lens = {130, 70, 64}, .chunk_state_interval = 64};
  const PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
  const int64_t count = inputs.chunk_states.shape[0];  // 3 + 2 + 1
  ASSERT_EQ(count, 6);
  for (const testing::CpuBackend& backend : kCpuBackends) {
    SCOPED_TRACE(backend.name);
    PrefillTensors full = inputs;
    ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, full).ok());
    PrefillTensors capped = inputs;
    PrefillParams p = testing::fill_prefill_params(c, capped, testing::host_pointers(capped));
    p.num_chunk_states = count - 2;
    ASSERT_TRUE(backend.fn(p).ok());
    for (int64_t e = 0; e < count; ++e) {
      EXPECT_TRUE(testing::rows_bitwise_equal(capped.chunk_states, e,
                                      e < count - 2 ? full.chunk_states : inputs.chunk_states, e))
          << "entry " << e;
    }
    EXPECT_TRUE(testing::storage_equal("o", capped.o, full.o));
  }
}

}  // namespace
}  // namespace kdakit
