// The part of the CPU prefill shared by the float64 reference and the fp32 chunked mirror:
// validation, sequence ranges, initial-state gather, chunk-state placement (dense or into pool
// rows, in their own dtype), final-state scatter, parallel loop over (sequence, value head).
// The per-sequence math is a callback.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "cpu/layout.h"
#include "cpu/parallel.h"
#include "cpu/preprocess.h"
#include "cpu/state_io.h"
#include "kdakit/kdakit.h"

namespace kdakit::cpu {

// Collects the chunk states of one (sequence, value head): entry e is the state before token
// e * chunk_state_interval of the sequence, global entry first_entry + e of the call. A
// global entry at or past `capacity` (num_chunk_states) is not written: a packed batch's count
// depends on cu_seqlens, which the caller may not know. The entry goes to row `entry` of
// chunk_states, or with chunk_state_indices to row indices[entry] (skipped when negative or
// not below num_chunk_state_slots). Writes are deferred (see state_io.h) so that chunk_states
// may be the state pool the call also reads.
class ChunkStateSink {
 public:
  ChunkStateSink(const PrefillParams& p, const StateFormat& format, DeferredStateWrites* writes,
                 int64_t n, int32_t h, int64_t first_entry)
      : p_(p), format_(format), writes_(writes), n_(n), h_(h), first_entry_(first_entry) {}

  bool enabled() const { return writes_ != nullptr; }
  void operator()(int64_t e, const double* S) const {
    const int64_t entry = first_entry_ + e;
    if (entry >= p_.num_chunk_states) return;
    int64_t row = entry;
    if (p_.chunk_state_indices != nullptr) {
      row = p_.chunk_state_indices[entry];
      if (!slot_in_range(row, p_.num_chunk_state_slots)) return;
    }
    format_.store(S, writes_->add(n_, h_, row));
  }

 private:
  const PrefillParams& p_;
  const StateFormat& format_;
  DeferredStateWrites* writes_;
  int64_t n_;
  int32_t h_;
  int64_t first_entry_;
};

// run_sequence(const KdaProblem&, SeqRange, int32_t h, double* S, const ChunkStateSink&) runs
// the recurrence over the non-empty sequence `range` for value head h, starting from S
// ([K * V], S[i * V + j]) and leaving the final state in S; it writes the outputs and the
// chunk states (when sink.enabled()).
// dtype_o, when given, is the storage dtype of p.o instead of dtype_qkv (same element strides).
template <class SequenceFn>
Status run_prefill(const PrefillParams& p, SequenceFn&& run_sequence, std::optional<DType> dtype_o = std::nullopt) {
  const Status status = validate(p);
  if (!status.ok()) return status;

  KdaProblem m = make_problem(p);
  if (dtype_o.has_value()) m.dtype_o = *dtype_o;
  const StateFormat format{p.dtype_state, p.state_layout, p.num_v_heads, p.head_dim_k,
                           p.head_dim_v};
  const StateFormat chunk_format{chunk_states_dtype(p), p.state_layout, p.num_v_heads, p.head_dim_k,
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
  DeferredStateWrites chunks(N, HV, chunk_format);
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
    const ChunkStateSink sink(p, chunk_format, interval > 0 ? &chunks : nullptr, n, h,
                              first_chunk_entry[size_t(n)]);
    run_sequence(m, range, h, S.data(), sink);
    if (out_slot >= 0) format.store(S.data(), finals.add(n, h, out_slot));
  });

  // NOTE: chunk states first, final states last: a sequence whose final slot is also one of
  // its chunk-state rows ends with its final state there, as on the GPU (program order).
  auto parallel = [](int64_t count, auto&& fn) { parallel_for(count, fn); };
  if (interval > 0) chunks.apply(p.chunk_states, p.stride_chunk_states_n, parallel);
  if (p.final_state != nullptr) finals.apply(p.final_state, p.stride_final_state_n, parallel);
  return Status::Ok();
}

}  // namespace kdakit::cpu
