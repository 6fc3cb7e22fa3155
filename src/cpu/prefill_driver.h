// The part of the CPU prefill shared by the float64 reference and the fp32 chunked mirror:
// validation, sequence ranges, initial-state gather, chunk-state placement, final-state
// scatter, parallel loop over (sequence, value head). The per-sequence math is a callback.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/layout.h"
#include "cpu/parallel.h"
#include "cpu/preprocess.h"
#include "cpu/state_io.h"
#include "kdakit/kdakit.h"

namespace kdakit::cpu {

// Writes the chunk states of one (sequence, value head): entry e is the state before token
// e * chunk_state_interval of the sequence, stored at entry first_entry + e of chunk_states
// (entries of [HV, state], contiguous). Entries at or past `capacity` (num_chunk_states) are
// not written: a packed batch's count depends on cu_seqlens, which the caller may not know.
class ChunkStateSink {
 public:
  ChunkStateSink(const StateFormat& format, void* chunk_states, int64_t capacity,
                 int64_t first_entry, int32_t h)
      : format_(format),
        chunk_states_(chunk_states),
        capacity_(capacity),
        first_entry_(first_entry),
        h_(h) {}

  bool enabled() const { return chunk_states_ != nullptr; }
  void operator()(int64_t e, const double* S) const {
    const int64_t entry = first_entry_ + e;
    if (entry >= capacity_) return;
    format_.store(
        S, format_.block(chunk_states_, entry, int64_t(format_.HV) * format_.block_elements(), h_));
  }

 private:
  const StateFormat& format_;
  void* chunk_states_;
  int64_t capacity_;
  int64_t first_entry_;
  int32_t h_;
};

// run_sequence(const KdaProblem&, SeqRange, int32_t h, double* S, const ChunkStateSink&) runs
// the recurrence over the non-empty sequence `range` for value head h, starting from S
// ([K * V], S[i * V + j]) and leaving the final state in S; it writes the outputs and the
// chunk states (when sink.enabled()).
template <class SequenceFn>
Status run_prefill(const PrefillParams& p, SequenceFn&& run_sequence) {
  const Status status = validate(p);
  if (!status.ok()) return status;

  const KdaProblem m = make_problem(p);
  const StateFormat format{p.dtype_state, p.state_layout, p.num_v_heads, p.head_dim_k,
                           p.head_dim_v};
  const int64_t N = p.num_seqs;
  const int32_t HV = p.num_v_heads;
  const int64_t interval = p.chunk_states != nullptr ? p.chunk_state_interval : 0;

  std::vector<SeqRange> ranges(static_cast<size_t>(N));
  std::vector<int64_t> first_chunk_entry(size_t(N), 0);
  int64_t entries = 0;
  for (int64_t n = 0; n < N; ++n) {
    ranges[size_t(n)] = sequence_range(p.cu_seqlens, p.dtype_cu_seqlens, n, p.seqlen);
    first_chunk_entry[size_t(n)] = entries;
    entries += num_chunk_states(ranges[size_t(n)].length(), interval);
  }

  // Slot of sequence n in the initial / final buffer; -1: none (zeros / no write).
  auto initial_slot = [&](int64_t n) -> int64_t {
    if (p.initial_state == nullptr) return -1;
    if (p.initial_state_indices == nullptr) return n;
    const int64_t slot = p.initial_state_indices[n];
    return slot_in_range(slot, p.num_state_slots) ? slot : -1;
  };
  auto final_slot = [&](int64_t n) -> int64_t {
    if (p.final_state == nullptr) return -1;
    if (p.final_state_indices == nullptr) return n;
    const int64_t slot = p.final_state_indices[n];
    return slot_in_range(slot, p.num_state_slots) ? slot : -1;
  };

  DeferredStateWrites finals(N, HV, format);
  parallel_for(N * int64_t(HV), [&](int64_t item) {
    const int64_t n = item / HV;
    const int32_t h = int32_t(item % HV);
    const SeqRange range = ranges[size_t(n)];
    const int64_t in_slot = initial_slot(n);
    const int64_t out_slot = final_slot(n);
    const char* initial = in_slot >= 0
                              ? format.block(p.initial_state, in_slot, p.stride_initial_state_n, h)
                              : nullptr;

    if (range.length() == 0) {
      // Empty sequence: the state passes through bit for bit (zeros without one); no output.
      if (out_slot >= 0) {
        char* stored = finals.add(n, h, out_slot);
        if (initial != nullptr) {
          std::memcpy(stored, initial, size_t(format.block_bytes()));
        } else {
          std::memset(stored, 0, size_t(format.block_bytes()));
        }
      }
      return;
    }

    std::vector<double> S(size_t(format.block_elements()), 0.0);
    if (initial != nullptr) format.load(initial, S.data());
    const ChunkStateSink sink(format, interval > 0 ? p.chunk_states : nullptr, p.num_chunk_states,
                              first_chunk_entry[size_t(n)], h);
    run_sequence(m, range, h, S.data(), sink);
    if (out_slot >= 0) format.store(S.data(), finals.add(n, h, out_slot));
  });

  if (p.final_state != nullptr) {
    finals.apply(p.final_state, p.stride_final_state_n,
                 [](int64_t count, auto&& fn) { parallel_for(count, fn); });
  }
  return Status::Ok();
}

}  // namespace kdakit::cpu
