// Host entry of the fused chunked prefill kernel: a plain C++ header (no CUDA includes). The
// dispatcher (src/cuda/sm90/prefill/dispatch.cu) asks fused_unsupported() first, runs the plan
// kernel (seq_start / seq_len of the workspace's plan region), then one launch_prefill_fused
// instantiation.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill {

// nullptr when the fused kernel (and the tile kernel, which takes the same calls) takes `p`;
// otherwise what it does not support, a static string (the dispatcher then takes the two-kernel
// path). Needs K = V = 128, bf16 q/k/v, g and beta bf16 or fp32, fp32 or bf16 state, q/k/v (and
// bf16 per-channel g) rows 16-byte aligned (TMA).
// NOTE: a static string, not a std::string: the dispatcher asks on every call, and a call the
// tiles do not take would otherwise build (heap-allocate) the message each time on the run path.
const char* fused_unsupported(const PrefillParams& p);

// Consumer warpgroups per CTA: 2 (a CTA per (sequence, head)) once the pairs cover half the SMs,
// else 1 (two CTAs per pair, one per value half).
constexpr int fused_consumers(int64_t num_seqs, int32_t num_v_heads, int num_sms) {
  return 2 * num_seqs * num_v_heads > num_sms ? 2 : 1;
}
static_assert(fused_consumers(1, 96, 132) == 2 && fused_consumers(1, 64, 132) == 1,
              "H=96: whole heads per CTA; H=64: value halves");

// Reads the plan region of `workspace` (laid out per `plan`); writes o, the final state and the
// optional chunk states of `p`. A persistent grid of min(work items, num_sms) CTAs.
template <GateMode kGate, int kConsumers>
Status launch_prefill_fused(const PrefillParams& p, const WorkspacePlan& plan,
                            const void* workspace, int num_sms, cudaStream_t stream);

}  // namespace kdakit::sm90::prefill
