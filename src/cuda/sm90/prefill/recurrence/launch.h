// Host entry of the chunk-serial prefill recurrence kernel: a plain C++ header (no CUDA
// includes). The dispatcher (src/cuda/sm90/prefill/dispatch.cu) picks kValueRows with
// recurrence_value_rows() and calls the matching instantiation after the plan and prep kernels
// have filled the workspace.
#pragma once

#include <cstdint>

#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill {

// Reads the plan region and the chunk blocks of `workspace` (laid out per `plan`), writes o,
// the final state and the optional chunk states of `p`. kValueRows in {16, 32, 64, 128}: value
// channels per CTA; the grid is (N, HV, 128 / kValueRows).
template <int kValueRows>
Status launch_prefill_recurrence(const PrefillParams& p, const WorkspacePlan& plan, const void* workspace,
                                 cudaStream_t stream);

// Value rows per CTA: whole heads (one CTA per (sequence, head)) once the (sequence, head)
// pairs cover half the SMs; fewer heads split V so that the CTAs still cover the SMs (each
// CTA needs more than half an SM's shared memory, so one CTA runs per SM).
constexpr int recurrence_value_rows(int64_t num_seqs, int32_t num_v_heads, int num_sms) {
  const int64_t pairs = num_seqs * num_v_heads;
  int rows = kHeadDim;
  while (rows > 16 && pairs * (kHeadDim / (rows / 2)) <= num_sms) rows /= 2;
  return rows;
}
static_assert(recurrence_value_rows(1, 96, 132) == 128, "H=96: one CTA per head");
static_assert(recurrence_value_rows(1, 64, 132) == 64, "H=64: two V halves per head");
static_assert(recurrence_value_rows(1, 4, 132) == 16, "few heads: 16 value rows per CTA");

}  // namespace kdakit::sm90::prefill
