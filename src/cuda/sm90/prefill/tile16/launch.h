// Host entry of the 16-token-tile prefill kernel (tile16/kernel.cuh): a plain C++ header (no CUDA
// includes). The dispatcher (src/cuda/sm90/prefill/dispatch.cu) takes it for batches of short
// sequences, after the plan kernel (seq_start / seq_len of the workspace's plan region); it
// supports what the fused kernel supports (fused_unsupported).
#pragma once

#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill {

// Reads the plan region of `workspace` (laid out per `plan`); writes o, the final state and the
// optional chunk states of `p`. One CTA of 8 warps per (sequence, value head).
template <GateMode kGate>
Status launch_prefill_tile16(const PrefillParams& p, const WorkspacePlan& plan,
                             const void* workspace, cudaStream_t stream);

}  // namespace kdakit::sm90::prefill
