// Prefill in pieces, the prefix-caching round trip: one prefill of a packed batch saves each
// sequence's state at a caller-chosen token offset (a multiple of 64) as a chunk state written
// into a pool row; a second prefill runs the rest of every sequence from that row. The rest's
// outputs and final states must equal those of the whole run, and a run over the first parts
// alone must end in the saved states. Shared by the CPU and GPU tests.
//
//   whole: tokens [0, L_n) of each sequence, dense initial and final state, chunk states every
//          64 tokens. into_pool_rows: through chunk_state_indices, the entry before token
//          split[n] goes to row n of a pool and every other entry is skipped (-1); else all
//          entries are written densely and the test picks the boundary ones on the host.
//   head:  tokens [0, split[n]), same initial state, dense final state (the boundary).
//   tail:  tokens [split[n], L_n), initial state from the boundary states: rows n of the
//          whole run's pool (into_pool_rows), else a dense copy of the boundary entries.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "cpu/layout.h"
#include "kdakit/kdakit.h"

namespace kdakit::testing {

struct Pieces {
  PrefillCase whole, head, tail;
  std::vector<int64_t> split;           // per sequence, a multiple of 64 below its length
  std::vector<int64_t> boundary_entry;  // per sequence, its entry before token split[n]
  bool into_pool_rows = true;
  PrefillTensors whole_t, head_t, tail_t;
};

namespace detail {

// First token of sequence n in a packed case.
inline int64_t first_token(const PrefillCase& c, int64_t n) {
  int64_t t = 0;
  for (int64_t m = 0; m < n; ++m) t += c.seq_lens[size_t(m)];
  return t;
}

// Copies tokens [from_t, from_t + count) of row 0 of `from` to tokens starting at to_t of `to`
// (any rank >= 3: [1, T, heads(, dim)]).
inline void copy_tokens(const HostTensor& from, int64_t from_t, HostTensor& to, int64_t to_t,
                        int64_t count) {
  int64_t per_token = 1;
  for (size_t d = 2; d < from.shape.size(); ++d) per_token *= from.shape[d];
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t e = 0; e < per_token; ++e) {
      to.set((to_t + t) * per_token + e, from.get((from_t + t) * per_token + e));
    }
  }
}

}  // namespace detail

// Builds the three runs of a packed case `c` (no empty sequence; c.chunk_state_interval,
// c.initial, c.final_state and the chunk knobs are set here) cut at `split`. The head and tail
// tensors hold the whole run's inputs; the tail's initial state is filled by
// take_boundary_states once the whole run has written its chunk states.
inline Pieces make_pieces(PrefillCase c, std::vector<int64_t> split, bool into_pool_rows,
                          Rng& rng) {
  Pieces p;
  p.split = std::move(split);
  p.into_pool_rows = into_pool_rows;
  c.initial = StateSource::kDense;
  c.final_state = StateSource::kDense;
  c.in_place = false;
  c.write_elsewhere = false;
  c.chunk_state_interval = 64;
  c.chunk_pool = into_pool_rows;
  c.chunk_in_state_pool = false;
  c.dtype_chunk_states.reset();
  c.tail = 0;
  p.whole = c;
  p.whole.name = c.name + "_whole";
  p.whole_t = make_prefill_tensors(p.whole, rng);

  // Entry before token split[n] of sequence n (-> row n of the pool); the others skipped.
  int64_t entry = 0;
  for (size_t n = 0; n < c.seq_lens.size(); ++n) {
    const int64_t count = cpu::num_chunk_states(c.seq_lens[n], 64);
    p.boundary_entry.push_back(entry + p.split[n] / 64);
    if (into_pool_rows) {
      auto* rows = static_cast<int32_t*>(p.whole_t.chunk_state_indices.data());
      for (int64_t e = 0; e < count; ++e) rows[entry + e] = e * 64 == p.split[n] ? int32_t(n) : -1;
    }
    entry += count;
  }

  p.head = c;
  p.head.name = c.name + "_head";
  p.head.chunk_state_interval = 0;
  p.head.chunk_pool = false;
  p.tail = p.head;
  p.tail.name = c.name + "_tail";
  p.tail.initial = into_pool_rows ? StateSource::kPool : StateSource::kDense;
  p.tail.extra_slots =
      into_pool_rows ? p.whole_t.chunk_states.shape[0] - int64_t(c.seq_lens.size()) : 0;
  for (size_t n = 0; n < c.seq_lens.size(); ++n) {
    p.head.seq_lens[n] = p.split[n];
    p.tail.seq_lens[n] = c.seq_lens[n] - p.split[n];
  }
  p.head_t = make_prefill_tensors(p.head, rng);
  p.tail_t = make_prefill_tensors(p.tail, rng);
  p.head_t.initial_state = p.whole_t.initial_state;
  for (HostTensor* dst : {&p.head_t.A_log, &p.tail_t.A_log}) *dst = p.whole_t.A_log;
  for (HostTensor* dst : {&p.head_t.dt_bias, &p.tail_t.dt_bias}) *dst = p.whole_t.dt_bias;
  for (size_t n = 0; n < c.seq_lens.size(); ++n) {
    if (into_pool_rows)
      static_cast<int32_t*>(p.tail_t.initial_state_indices.data())[n] = int32_t(n);
    const int64_t w0 = detail::first_token(c, int64_t(n));
    const int64_t h0 = detail::first_token(p.head, int64_t(n));
    const int64_t t0 = detail::first_token(p.tail, int64_t(n));
    const int64_t head_len = p.split[n], tail_len = c.seq_lens[n] - p.split[n];
    const PrefillTensors& w = p.whole_t;
    for (auto [from, to_head, to_tail] :
         {std::tuple{&w.q, &p.head_t.q, &p.tail_t.q}, std::tuple{&w.k, &p.head_t.k, &p.tail_t.k},
          std::tuple{&w.v, &p.head_t.v, &p.tail_t.v}, std::tuple{&w.g, &p.head_t.g, &p.tail_t.g},
          std::tuple{&w.beta, &p.head_t.beta, &p.tail_t.beta}}) {
      detail::copy_tokens(*from, w0, *to_head, h0, head_len);
      detail::copy_tokens(*from, w0 + head_len, *to_tail, t0, tail_len);
    }
  }
  return p;
}

// After the whole run: the tail starts from the boundary states it saved.
inline void take_boundary_states(Pieces& p) {
  if (p.into_pool_rows) {
    p.tail_t.initial_state = p.whole_t.chunk_states;
    return;
  }
  const HostTensor& from = p.whole_t.chunk_states;
  HostTensor& to = p.tail_t.initial_state;
  for (size_t n = 0; n < p.split.size(); ++n) copy_row(from, p.boundary_entry[n], to, int64_t(n));
}

// The boundary states the whole run saved, as a dense [N, HV, a, b] tensor.
inline HostTensor boundary_states(const Pieces& p) {
  const HostTensor& from = p.whole_t.chunk_states;
  const int64_t N = int64_t(p.split.size());
  HostTensor out =
      HostTensor::contiguous(from.dtype, {N, from.shape[1], from.shape[2], from.shape[3]});
  for (int64_t n = 0; n < N; ++n) {
    copy_row(from, p.into_pool_rows ? n : p.boundary_entry[size_t(n)], out, n);
  }
  return out;
}

// The whole run's outputs re-assembled from the head's and the tail's.
inline HostTensor stitched_outputs(const Pieces& p) {
  HostTensor o = p.whole_t.o;
  for (size_t n = 0; n < p.split.size(); ++n) {
    const int64_t w0 = detail::first_token(p.whole, int64_t(n));
    detail::copy_tokens(p.head_t.o, detail::first_token(p.head, int64_t(n)), o, w0, p.split[n]);
    detail::copy_tokens(p.tail_t.o, detail::first_token(p.tail, int64_t(n)), o, w0 + p.split[n],
                        p.whole.seq_lens[n] - p.split[n]);
  }
  return o;
}

// The tail's final states, rows [0, N) (a case with a pool sizes its dense final state to the
// pool), as a dense [N, HV, a, b] tensor.
inline HostTensor tail_final_states(const Pieces& p) {
  const HostTensor& from = p.tail_t.final_state;
  const int64_t N = int64_t(p.split.size());
  HostTensor out =
      HostTensor::contiguous(from.dtype, {N, from.shape[1], from.shape[2], from.shape[3]});
  for (int64_t n = 0; n < N; ++n) copy_row(from, n, out, n);
  return out;
}

// Random split points: a multiple of 64 below each length.
inline std::vector<int64_t> random_splits(const std::vector<int64_t>& lengths, Rng& rng) {
  std::vector<int64_t> split;
  for (int64_t len : lengths) split.push_back(64 * rng.integer(0, (len - 1) / 64));
  return split;
}

}  // namespace kdakit::testing
