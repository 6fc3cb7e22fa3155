// Checks of host copies of device-resident metadata (see metadata_checks.h).
#include "api/metadata_checks.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include "api/check.h"
#include "cuda/sm90/prefill/workspace.h"

namespace kdakit::detail {
namespace {

Status check_cu_seqlens(const std::vector<int64_t>& cu, int64_t num_seqs, int64_t seqlen) {
  KDAKIT_CHECK(cu.size() == static_cast<size_t>(num_seqs + 1), kInternal,
               "cu_seqlens: host copy holds ", cu.size(),
               " offsets, expected N + 1 = ", num_seqs + 1);
  KDAKIT_CHECK(cu[0] == 0, kInvalidArgument, "cu_seqlens: expected cu_seqlens[0] = 0, got ", cu[0]);
  for (size_t i = 1; i < cu.size(); ++i) {
    KDAKIT_CHECK(cu[i] >= cu[i - 1], kInvalidArgument,
                 "cu_seqlens: expected non-decreasing offsets, got cu_seqlens[", i, "] = ", cu[i],
                 " < cu_seqlens[", i - 1, "] = ", cu[i - 1]);
  }
  KDAKIT_CHECK(cu.back() <= seqlen, kInvalidArgument, "cu_seqlens: expected cu_seqlens[",
               cu.size() - 1, "] <= T = ", seqlen, " tokens, got ", cu.back());
  return Status::Ok();
}

// Tokens of sequence n: from cu_seqlens when packed, else T.
int64_t seq_len(const std::vector<int64_t>& cu, int64_t seqlen, int64_t n) {
  return cu.empty() ? seqlen : cu[n + 1] - cu[n];
}

// Records that `slot` is written by sequence n; two sequences writing one slot race.
Status claim_write(const char* name, int32_t slot, int64_t n,
                   std::unordered_map<int32_t, int64_t>& writer) {
  const auto [it, inserted] = writer.emplace(slot, n);
  KDAKIT_CHECK(inserted || it->second == n, kInvalidArgument, name, ": slot ", slot,
               " is written by sequences ", it->second, " and ", n,
               "; expected each written slot to belong to one sequence");
  return Status::Ok();
}

// The rows a prefill call reads and writes, per buffer: a pool given as several of
// initial_state, final_state and chunk_states (validate() only lets them share memory as the
// same pointer and stride) is one buffer here.
class RowAccesses {
 public:
  // Row `row` of `buffer` is written by sequence n (through argument `name`); two sequences
  // writing one row race.
  Status write(const void* buffer, int64_t row, int64_t n, const char* name) {
    const auto [it, inserted] = writers_.emplace(Key{buffer, row}, Writer{n, name});
    if (inserted || it->second.n == n) return Status::Ok();
    return error(StatusCode::kInvalidArgument, name, ": slot ", row, " is written by sequences ",
                 it->second.n, " and ", n,
                 std::string(it->second.name) == name ? "" : cat(" (", it->second.name, ")"),
                 "; expected each written slot to belong to one sequence");
  }
  // Row `row` of `buffer` is read by sequence n; another sequence must not write it.
  Status read(const void* buffer, int64_t row, int64_t n, const char* name) const {
    const auto it = writers_.find(Key{buffer, row});
    if (it == writers_.end() || it->second.n == n) return Status::Ok();
    return error(StatusCode::kInvalidArgument, name, ": slot ", row, " is read by sequence ", n,
                 " and written by sequence ", it->second.n, " (", it->second.name,
                 ") of the same pool");
  }

 private:
  using Key = std::pair<const void*, int64_t>;
  struct Writer {
    int64_t n;
    const char* name;
  };
  std::map<Key, Writer> writers_;
};

}  // namespace

Status check_metadata(const PrefillParams& p, const PrefillMetadata& m) {
  const int64_t N = p.num_seqs;
  if (p.cu_seqlens != nullptr) KDAKIT_RETURN_IF_ERROR(check_cu_seqlens(m.cu_seqlens, N, p.seqlen));
  const std::vector<int32_t>& init = m.initial_state_indices;
  const std::vector<int32_t>& fin = m.final_state_indices;
  const std::vector<int32_t>& chunk = m.chunk_state_indices;
  for (size_t n = 0; n < init.size(); ++n) {
    KDAKIT_CHECK(init[n] < p.num_state_slots, kInvalidArgument,
                 "initial_state_indices: expected a slot < num_state_slots = ", p.num_state_slots,
                 " (or < 0 for a zero initial state), got "
                 "initial_state_indices[",
                 n, "] = ", init[n]);
  }
  RowAccesses rows;
  for (size_t n = 0; n < fin.size(); ++n) {
    KDAKIT_CHECK(fin[n] < p.num_state_slots, kInvalidArgument,
                 "final_state_indices: expected a slot < num_state_slots = ", p.num_state_slots,
                 " (or < 0 to skip the write), got final_state_indices[", n, "] = ", fin[n]);
    if (fin[n] >= 0) {
      KDAKIT_RETURN_IF_ERROR(
          rows.write(p.final_state, fin[n], static_cast<int64_t>(n), "final_state_indices"));
    }
  }
  if (p.chunk_states != nullptr && p.chunk_state_interval > 0) {
    const bool indexed = p.chunk_state_indices != nullptr;
    KDAKIT_CHECK(!indexed || chunk.size() == static_cast<size_t>(p.num_chunk_states), kInternal,
                 "chunk_state_indices: host copy holds ", chunk.size(),
                 " entries, expected num_chunk_states = ", p.num_chunk_states);
    int64_t entry = 0;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t count = (seq_len(m.cu_seqlens, p.seqlen, n) + p.chunk_state_interval - 1) /
                            p.chunk_state_interval;
      for (int64_t e = entry; indexed && e < std::min(entry + count, p.num_chunk_states); ++e) {
        const int32_t row = chunk[static_cast<size_t>(e)];
        KDAKIT_CHECK(row < p.num_chunk_state_slots, kInvalidArgument,
                     "chunk_state_indices: expected a row < num_chunk_state_slots = ",
                     p.num_chunk_state_slots,
                     " (or < 0 to skip the entry), got "
                     "chunk_state_indices[",
                     e, "] = ", row);
        if (row >= 0)
          KDAKIT_RETURN_IF_ERROR(rows.write(p.chunk_states, row, n, "chunk_state_indices"));
      }
      entry += count;
    }
    KDAKIT_CHECK(entry <= p.num_chunk_states, kInvalidArgument,
                 indexed ? "chunk_state_indices" : "chunk_states", ": expected room for the ",
                 entry,
                 " chunk states of these sequences, got num_chunk_states = ", p.num_chunk_states);
  }
  // Sequences run concurrently: no sequence may start from a row another one writes.
  if (p.initial_state != nullptr) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t slot = init.empty() ? n : init[static_cast<size_t>(n)];
      if (slot >= 0) {
        KDAKIT_RETURN_IF_ERROR(rows.read(p.initial_state, slot, n,
                                         init.empty() ? "initial_state" : "initial_state_indices"));
      }
    }
  }
  return Status::Ok();
}

Status check_metadata(const DecodeParams& p, const DecodeMetadata& m) {
  const int64_t N = p.num_seqs;
  const int64_t cols = p.num_index_cols;
  if (p.cu_seqlens != nullptr) KDAKIT_RETURN_IF_ERROR(check_cu_seqlens(m.cu_seqlens, N, p.seqlen));
  const size_t idx_count =
      N == 0 ? 0 : static_cast<size_t>((N - 1) * p.stride_state_indices_n + cols);
  KDAKIT_CHECK(m.state_indices.size() >= idx_count, kInternal, "state_indices: host copy holds ",
               m.state_indices.size(), " entries, expected ", idx_count);
  const auto is_padding = [&](int32_t s) { return s < 0 || (s == 0 && p.null_slot_is_padding); };
  std::unordered_map<int32_t, int64_t> writer;
  std::vector<int32_t> start(static_cast<size_t>(N), -1);  // start slot per row, -1: padding
  for (int64_t n = 0; n < N; ++n) {
    int64_t start_col = 0;
    if (!m.num_accepted_tokens.empty()) {
      const int32_t acc = m.num_accepted_tokens[n];
      KDAKIT_CHECK(acc >= 1 && acc <= cols, kInvalidArgument,
                   "num_accepted_tokens: expected a value in [1, ", cols,
                   "] (the columns of state_indices), got num_accepted_tokens[", n, "] = ", acc);
      start_col = acc - 1;
    }
    const int32_t* row = m.state_indices.data() + n * p.stride_state_indices_n;
    for (int64_t t = 0; t < cols; ++t) {
      KDAKIT_CHECK(row[t] < p.num_state_slots, kInvalidArgument,
                   "state_indices: expected a slot < num_state_slots = ", p.num_state_slots,
                   " (or < 0 for padding), got state_indices[", n, ", ", t, "] = ", row[t]);
    }
    if (is_padding(row[start_col])) continue;
    start[n] = row[start_col];
    if (cols == 1) {
      KDAKIT_RETURN_IF_ERROR(claim_write("state_indices", row[0], n, writer));
      continue;
    }
    const int64_t written = std::min<int64_t>(seq_len(m.cu_seqlens, p.seqlen, n), cols);
    for (int64_t t = 0; t < written; ++t) {
      if (!is_padding(row[t]))
        KDAKIT_RETURN_IF_ERROR(claim_write("state_indices", row[t], n, writer));
    }
  }
  // A row's start slot must not be written by another row: rows run concurrently.
  for (int64_t n = 0; n < N; ++n) {
    if (start[n] < 0) continue;
    const auto it = writer.find(start[n]);
    KDAKIT_CHECK(it == writer.end() || it->second == n, kInvalidArgument, "state_indices: slot ",
                 start[n], " is the start state of sequence ", n, " and written by sequence ",
                 it == writer.end() ? -1 : it->second);
  }
  return Status::Ok();
}

PrefillPlanRegion expected_prefill_plan(const PrefillParams& p, const std::vector<int64_t>& cu,
                                        int64_t chunk, int64_t max_chunks) {
  const int64_t N = p.num_seqs, T = p.seqlen;
  PrefillPlanRegion r;
  r.seq_start.assign(static_cast<size_t>(N), 0);
  r.seq_len.assign(static_cast<size_t>(N), 0);
  r.chunk_offsets.assign(static_cast<size_t>(N + 1), 0);
  r.chunk_seq.assign(static_cast<size_t>(max_chunks), -1);
  std::vector<int64_t> pos(static_cast<size_t>(N + 1), 0);
  for (int64_t m = 0, running = 0; m <= N; ++m) {
    const int64_t raw = cu.empty() ? 0 : cu[static_cast<size_t>(m)];
    running = std::max(running, std::clamp<int64_t>(raw, 0, T));
    pos[static_cast<size_t>(m)] = running;
  }
  int64_t total = 0;
  r.longest.assign(1, 0);
  for (int64_t n = 0; n < N; ++n) {
    const auto i = static_cast<size_t>(n);
    r.seq_start[i] = cu.empty() ? 0 : pos[i];
    r.seq_len[i] = static_cast<int32_t>(cu.empty() ? T : pos[i + 1] - pos[i]);
    r.longest[0] = std::max(r.longest[0], r.seq_len[i]);
    r.chunk_offsets[i] = static_cast<int32_t>(total);
    const int64_t chunks = (r.seq_len[i] + chunk - 1) / chunk;
    for (int64_t c = total; c < total + chunks && c < max_chunks; ++c) {
      r.chunk_seq[static_cast<size_t>(c)] = static_cast<int32_t>(n);
    }
    total += chunks;
  }
  r.chunk_offsets[static_cast<size_t>(N)] = static_cast<int32_t>(total);
  r.seq_order.resize(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) r.seq_order[static_cast<size_t>(n)] = static_cast<int32_t>(n);
  if (N <= sm90::prefill::kOrderedSeqs) {
    std::stable_sort(r.seq_order.begin(), r.seq_order.end(), [&](int32_t a, int32_t b) {
      return r.seq_len[static_cast<size_t>(a)] > r.seq_len[static_cast<size_t>(b)];
    });
  }
  return r;
}

namespace {

template <typename T>
Status compare_plan_array(const char* name, const std::vector<T>& got, const std::vector<T>& want) {
  KDAKIT_CHECK(got.size() == want.size(), kInternal, "plan_ready: host copy of ", name, " holds ",
               got.size(), " entries, expected ", want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    KDAKIT_CHECK(got[i] == want[i], kInvalidArgument,
                 "plan_ready: the plan in workspace does not belong to this batch: ", name, "[", i,
                 "] = ", got[i], ", expected ", want[i],
                 " from cu_seqlens and the sizes; run prefill_plan after every change of "
                 "cu_seqlens, T or N");
  }
  return Status::Ok();
}

}  // namespace

Status check_prefill_plan(const PrefillParams& p, const std::vector<int64_t>& cu, int64_t chunk,
                          const PrefillPlanRegion& got) {
  const PrefillPlanRegion want =
      expected_prefill_plan(p, cu, chunk, static_cast<int64_t>(got.chunk_seq.size()));
  KDAKIT_RETURN_IF_ERROR(compare_plan_array("seq_start", got.seq_start, want.seq_start));
  KDAKIT_RETURN_IF_ERROR(compare_plan_array("seq_len", got.seq_len, want.seq_len));
  KDAKIT_RETURN_IF_ERROR(
      compare_plan_array("chunk_offsets", got.chunk_offsets, want.chunk_offsets));
  KDAKIT_RETURN_IF_ERROR(compare_plan_array("chunk_seq", got.chunk_seq, want.chunk_seq));
  KDAKIT_RETURN_IF_ERROR(compare_plan_array("longest", got.longest, want.longest));
  KDAKIT_RETURN_IF_ERROR(compare_plan_array("seq_order", got.seq_order, want.seq_order));
  return Status::Ok();
}

}  // namespace kdakit::detail
