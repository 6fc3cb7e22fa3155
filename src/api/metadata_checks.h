// Checks of the metadata a call keeps in device memory (cu_seqlens, slot indices,
// num_accepted_tokens), run on host copies of it. The CUDA entry points use them in debug mode
// (KDAKIT_DEBUG_CHECKS=1, see debug_checks.h), which copies the metadata with a sync; any
// caller that holds the metadata on the host (the CPU backend, tests) can call them directly.
// The kernels themselves never rely on these: out-of-range values are clamped or skipped there.
#pragma once

#include <cstdint>
#include <vector>

#include "kdakit/kdakit.h"

namespace kdakit::detail {

// Host copies of a prefill call's metadata; an empty vector means "not given".
struct PrefillMetadata {
  std::vector<int64_t> cu_seqlens;             // [N + 1], widened to int64
  std::vector<int32_t> initial_state_indices;  // [N]
  std::vector<int32_t> final_state_indices;    // [N]
  std::vector<int32_t> chunk_state_indices;    // [num_chunk_states]
};

// Host copies of a decode call's metadata.
struct DecodeMetadata {
  std::vector<int64_t> cu_seqlens;           // [N + 1], widened to int64
  std::vector<int32_t> state_indices;        // (N - 1) * stride_state_indices_n + num_index_cols
  std::vector<int32_t> num_accepted_tokens;  // [N]
};

// Both require validate(p) to have passed. They check: cu_seqlens[0] = 0, non-decreasing,
// cu_seqlens[N] <= T; every slot index < num_state_slots (chunk_state_indices: <
// num_chunk_state_slots; negative: zero state / skipped write / padding row); prefill chunk
// states fit num_chunk_states; num_accepted_tokens in [1, num_index_cols]; and, per buffer
// (a pool that is both initial_state, final_state or chunk_states counts once), no row written
// by two sequences and no row one sequence reads that another writes (sequences run
// concurrently). The first bad element is named.
Status check_metadata(const PrefillParams& p, const PrefillMetadata& m);
Status check_metadata(const DecodeParams& p, const DecodeMetadata& m);

// The plan region of the prefill workspace (src/cuda/sm90/prefill/workspace.h), as host arrays.
struct PrefillPlanRegion {
  std::vector<int32_t> chunk_offsets;  // [N + 1]
  std::vector<int32_t> chunk_seq;      // [max_chunks]
  std::vector<int64_t> seq_start;      // [N]
  std::vector<int32_t> seq_len;        // [N]
  std::vector<int32_t> longest;        // [1]: the largest seq_len, 0 for N = 0
  std::vector<int32_t> seq_order;      // [N]: launch order, longest first for N <= 512
};

// What the plan kernel writes for the batch fields of p and the host offsets `cu` (empty for a
// fixed batch), with chunks of `chunk` tokens and `max_chunks` chunk_seq entries: offsets
// clamped into [0, T] and made non-decreasing, lengths, exclusive sum of the chunk counts, the
// sequence of every chunk (-1 past the total), the longest length, and the recurrence's launch
// order (the sequences by length descending, ties by index, for at most 512 sequences; the
// identity for more).
PrefillPlanRegion expected_prefill_plan(const PrefillParams& p, const std::vector<int64_t>& cu,
                                        int64_t chunk, int64_t max_chunks);

// kInvalidArgument naming the first entry of `got` that differs from the expected plan: the
// plan_ready check of debug mode (a plan built for other offsets or sizes).
Status check_prefill_plan(const PrefillParams& p, const std::vector<int64_t>& cu, int64_t chunk,
                          const PrefillPlanRegion& got);

}  // namespace kdakit::detail
