// Prefill straight from a state pool on the CPU backend (both paths): one pool read through
// initial_state_indices and written through other final_state_indices (prefix caching), chunk
// states written into pool rows through chunk_state_indices (their own pool or the state pool
// itself), chunk states in a dtype of their own, and the round trip "prefill, save the state
// at a token offset, prefill the rest from it" against one prefill. Every slot or row the call
// does not own must stay bit-identical.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "common/pieces.h"
#include "common/prefill_checks.h"
#include "cpu/layout.h"
#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

using testing::HostTensor;
using testing::PrefillCase;
using testing::PrefillTensors;
using testing::StateSource;

using testing::copy_row;
using testing::kCpuBackends;
using testing::rows_bitwise_equal;

const int32_t* indices(const HostTensor& t) { return static_cast<const int32_t*>(t.data()); }

// The same inputs as `pool` (a case over state pools), laid out densely: initial states
// gathered by the initial indices (zeros for -1), dense final state, dense chunk states.
PrefillTensors dense_twin(const PrefillCase& pool, const PrefillTensors& t, PrefillCase& dense,
                          testing::Rng& rng) {
  dense = pool;
  dense.name = pool.name + "_dense";
  dense.initial = pool.initial == StateSource::kNone ? StateSource::kNone : StateSource::kDense;
  dense.final_state = StateSource::kDense;
  dense.in_place = dense.write_elsewhere = false;
  dense.chunk_pool = dense.chunk_in_state_pool = false;
  dense.negative_indices = false;
  dense.extra_slots = 0;
  PrefillTensors d = testing::make_prefill_tensors(dense, rng);
  d.q = t.q, d.k = t.k, d.v = t.v, d.g = t.g, d.beta = t.beta;
  d.A_log = t.A_log, d.dt_bias = t.dt_bias, d.cu_seqlens = t.cu_seqlens;
  if (d.initial_state.defined()) {
    d.initial_state.fill_storage(0.0);
    for (int64_t n = 0; n < t.num_seqs; ++n) {
      const int64_t slot =
          t.initial_state_indices.defined() ? indices(t.initial_state_indices)[n] : n;
      if (slot >= 0) copy_row(t.initial_state, slot, d.initial_state, n);
    }
  }
  return d;
}

// Checks a pool run `p` (inputs `before`) against the dense run `d` of the same inputs: the
// same outputs bit for bit, every final slot and chunk row equal to its dense entry bit for
// bit, and every other slot or row of every written buffer as it was.
void expect_pool_matches_dense(const PrefillCase& c, const PrefillTensors& before,
                               const PrefillTensors& p, const PrefillTensors& d) {
  EXPECT_TRUE(testing::storage_equal("o", p.o, d.o));
  const bool in_place = c.in_place;
  const HostTensor& pool_before = in_place ? before.initial_state : before.final_state;
  const HostTensor& pool_after = in_place ? p.initial_state : p.final_state;
  const HostTensor& final_idx =
      in_place && !c.write_elsewhere ? before.initial_state_indices : before.final_state_indices;
  std::set<int64_t> written;
  for (int64_t n = 0; n < before.num_seqs; ++n) {
    const int32_t slot = indices(final_idx)[n];
    if (slot < 0) continue;
    written.insert(slot);
    EXPECT_TRUE(rows_bitwise_equal(pool_after, slot, d.final_state, n)) << "final state of sequence " << n;
  }
  // Chunk rows: their own pool, or the state pool.
  const bool in_state_pool = c.chunk_pool && c.chunk_in_state_pool;
  std::set<int64_t> chunk_written;
  if (c.chunk_pool) {
    const HostTensor& rows_after = in_state_pool ? pool_after : p.chunk_states;
    for (int64_t e = 0; e < before.chunk_state_indices.numel(); ++e) {
      const int32_t row = indices(before.chunk_state_indices)[e];
      if (row < 0) continue;
      (in_state_pool ? written : chunk_written).insert(row);
      EXPECT_TRUE(rows_bitwise_equal(rows_after, row, d.chunk_states, e)) << "chunk entry " << e;
    }
    if (!in_state_pool) {
      for (int64_t row = 0; row < before.chunk_states.shape[0]; ++row) {
        if (!chunk_written.count(row))
          EXPECT_TRUE(rows_bitwise_equal(p.chunk_states, row, before.chunk_states, row)) << "row " << row;
      }
    }
  }
  for (int64_t slot = 0; slot < pool_before.shape[0]; ++slot) {
    if (!written.count(slot))
      EXPECT_TRUE(rows_bitwise_equal(pool_after, slot, pool_before, slot)) << "untouched slot " << slot;
  }
}

// Read a cached slot a, write a new slot b of the same pool: the same as gathering, running
// densely and scattering, bit for bit; the slots read (and every other one) keep their bits.
TEST(PrefillPool, ReadOneSlotWriteAnotherOfTheSamePool) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (DType state_dtype : {DType::kFloat32, DType::kBFloat16}) {
    const PrefillCase c{
        .name = "write_elsewhere",
        .seq_lens = {40, 0, 130, 9, 64},
        .HV = 4,
        .dtype_state = state_dtype,
        .layout = state_dtype == DType::kFloat32 ? StateLayout::kVFirst : StateLayout::kKFirst,
        .pad = 2,
        .initial = StateSource::kPool,
        .final_state = StateSource::kPool,
        .extra_slots = 3,
        .negative_indices = true,
        .in_place = true,
        .write_elsewhere = true};
    const PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
    PrefillCase dense;
    const PrefillTensors dense_inputs = dense_twin(c, inputs, dense, rng);
    for (const testing::CpuBackend& backend : kCpuBackends) {
      SCOPED_TRACE(std::string(backend.name) + " " + to_string(state_dtype));
      PrefillTensors p = inputs;
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, c, p).ok());
      PrefillTensors d = dense_inputs;
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, dense, d).ok());
      expect_pool_matches_dense(c, inputs, p, d);
    }
  }
}

// Chunk states through chunk_state_indices (a third of the entries skipped) equal the dense
// entries bit for bit; rows nobody names keep their bits; the outputs do not change.
TEST(PrefillPool, ChunkStatesIntoPoolRowsMatchTheDenseEntries) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (int32_t interval : {64, 128}) {
    for (bool in_state_pool : {false, true}) {
      const PrefillCase c{.name = "chunk_pool",
                          .seq_lens = {200, 0, 64, 129, 1},
                          .HV = 2,
                          .dtype_state = interval == 64 ? DType::kFloat32 : DType::kBFloat16,
                          .pad = 3,
                          .initial = StateSource::kPool,
                          .final_state = StateSource::kPool,
                          .extra_slots = 2,
                          .negative_indices = true,
                          .in_place = in_state_pool,
                          .write_elsewhere = in_state_pool,
                          .chunk_state_interval = interval,
                          .chunk_pool = true,
                          .chunk_in_state_pool = in_state_pool};
      const PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
      PrefillCase dense;
      const PrefillTensors dense_inputs = dense_twin(c, inputs, dense, rng);
      for (const testing::CpuBackend& backend : kCpuBackends) {
        SCOPED_TRACE(std::string(backend.name) + " interval " + std::to_string(interval) +
                     (in_state_pool ? " in the state pool" : " own pool"));
        PrefillTensors p = inputs;
        const Status st = testing::run_prefill_on_host(backend.fn, c, p);
        ASSERT_TRUE(st.ok()) << st.message();
        PrefillTensors d = dense_inputs;
        ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, dense, d).ok());
        expect_pool_matches_dense(c, inputs, p, d);
      }
    }
  }
}

// Entries at or past num_chunk_states (the length of chunk_state_indices) and rows out of
// range are skipped: the rows they would name keep their bits.
TEST(PrefillPool, ChunkIndicesPastTheCapacityOrOutOfRangeAreSkipped) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const PrefillCase c{.name = "chunk_capacity",
                      .seq_lens = {130, 70},
                      .chunk_state_interval = 64,
                      .chunk_pool = true};
  PrefillTensors inputs = testing::make_prefill_tensors(c, rng);
  ASSERT_EQ(inputs.chunk_state_indices.numel(), 5);
  auto* rows = static_cast<int32_t*>(inputs.chunk_state_indices.data());
  for (int32_t e = 0; e < 5; ++e) rows[e] = e;
  rows[1] = int32_t(inputs.chunk_states.shape[0]);  // out of range
  for (const testing::CpuBackend& backend : kCpuBackends) {
    SCOPED_TRACE(backend.name);
    PrefillTensors t = inputs;
    PrefillParams p = testing::fill_prefill_params(c, t, testing::host_pointers(t));
    p.num_chunk_states = 3;  // entries 3 and 4 are past the capacity
    ASSERT_TRUE(backend.fn(p).ok());
    for (int64_t row = 0; row < t.chunk_states.shape[0]; ++row) {
      const bool written = row == 0 || row == 2;
      EXPECT_EQ(!rows_bitwise_equal(t.chunk_states, row, inputs.chunk_states, row), written)
          << "row " << row;
    }
  }
}

// Chunk states in their own dtype: bf16 entries from an fp32 state (and fp32 entries from a
// bf16 state) are the same states, rounded once to their dtype. The chunked path holds an fp32
// state, so its bf16 entries are exactly the rounded fp32 ones.
TEST(PrefillPool, ChunkStatesInTheirOwnDtype) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  for (DType state_dtype : {DType::kFloat32, DType::kBFloat16}) {
    const DType chunk_dtype = state_dtype == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
    const PrefillCase same{.name = "chunk_dtype",
                           .seq_lens = {150, 64, 3},
                           .HV = 2,
                           .dtype_state = state_dtype,
                           .chunk_state_interval = 64};
    PrefillCase own = same;
    own.dtype_chunk_states = chunk_dtype;
    const PrefillTensors inputs = testing::make_prefill_tensors(same, rng);
    PrefillTensors own_inputs = inputs;
    own_inputs.chunk_states = testing::detail::make_state_tensor(
        chunk_dtype, inputs.chunk_states.shape[0], same.HV, same.K, same.V, same.layout, 0);
    own_inputs.chunk_states.poison();
    for (const testing::CpuBackend& backend : kCpuBackends) {
      SCOPED_TRACE(std::string(backend.name) + " state " + to_string(state_dtype));
      PrefillTensors a = inputs;
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, same, a).ok());
      PrefillTensors b = own_inputs;
      ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, own, b).ok());
      EXPECT_TRUE(testing::storage_equal("o", b.o, a.o));
      EXPECT_TRUE(testing::storage_equal("final state", b.final_state, a.final_state));
      const bool exact = backend.fn == cpu::prefill_chunked && chunk_dtype == DType::kBFloat16;
      if (exact) {
        HostTensor rounded = b.chunk_states;
        for (int64_t e = 0; e < rounded.numel(); ++e) rounded.set(e, a.chunk_states.get(e));
        EXPECT_TRUE(testing::bitwise_equal("bf16 chunk states", b.chunk_states, rounded));
      } else {
        // Each is the same state rounded to its own dtype: within one bf16 rounding.
        EXPECT_TRUE(testing::rel_l2_below("chunk states", b.chunk_states, a.chunk_states, 4e-3));
      }
    }
  }
}

// The prefix-caching round trip, with the boundary states saved at random 64-token offsets
// into pool rows (or densely): the rest run from them gives the whole run's outputs and final
// states, and a run over the first parts ends in the saved states. The chunked path cuts at
// chunk boundaries and keeps an fp32 state, so with an fp32 state every comparison is bitwise;
// the float64 reference rounds the saved state to fp32, so the rest differs by that rounding.
TEST(PrefillPool, PrefillInPiecesEqualsOnePrefill) {
  auto rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  const std::vector<int64_t> lengths = {200, 64, 130, 1, 300};
  for (bool into_pool_rows : {true, false}) {
    for (DType state_dtype : {DType::kFloat32, DType::kBFloat16}) {
      const PrefillCase c{.name = "pieces",
                          .seq_lens = lengths,
                          .H = 1,
                          .HV = 2,
                          .dtype_qkv = DType::kFloat32,
                          .dtype_state = state_dtype,
                          .pad = 1};
      std::vector<int64_t> split = testing::random_splits(lengths, rng);
      split[0] = 128;  // at least one cut inside a sequence, one at its start
      split[1] = 0;
      for (const testing::CpuBackend& backend : kCpuBackends) {
        SCOPED_TRACE(std::string(backend.name) + (into_pool_rows ? " pool rows " : " dense ") +
                     to_string(state_dtype));
        testing::Pieces p = testing::make_pieces(c, split, into_pool_rows, rng);
        ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, p.whole, p.whole_t).ok());
        ASSERT_TRUE(testing::run_prefill_on_host(backend.fn, p.head, p.head_t).ok());
        testing::take_boundary_states(p);
        const Status st = testing::run_prefill_on_host(backend.fn, p.tail, p.tail_t);
        ASSERT_TRUE(st.ok()) << st.message();

        // The first parts end where the whole run saved its states (the same arithmetic).
        EXPECT_TRUE(testing::bitwise_equal("boundary states", testing::boundary_states(p),
                                           p.head_t.final_state));
        const HostTensor stitched = testing::stitched_outputs(p);
        if (backend.fn == cpu::prefill_chunked && state_dtype == DType::kFloat32) {
          EXPECT_TRUE(testing::bitwise_equal("o (pieces)", stitched, p.whole_t.o));
          EXPECT_TRUE(testing::bitwise_equal("final state (pieces)", testing::tail_final_states(p),
                                             p.whole_t.final_state));
        } else {
          // The saved state is rounded to the state dtype once more than in the whole run.
          const double bar = state_dtype == DType::kFloat32 ? 1e-6 : 8e-3;
          EXPECT_TRUE(testing::rel_l2_below("o (pieces)", stitched, p.whole_t.o, bar));
          EXPECT_TRUE(testing::rel_l2_below("final state (pieces)", testing::tail_final_states(p),
                                            p.whole_t.final_state, bar));
        }
      }
    }
  }
}

}  // namespace
}  // namespace kdakit
