// Host entry of the prefill plan and prep kernels: a plain C++ header (no CUDA includes).
// The dispatcher (src/cuda/sm90/prefill/dispatch.cu) calls, on one stream:
//   launch_prefill_plan -> launch_prefill_prep -> launch_prefill_recurrence.
#pragma once

#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill {

// Fills the plan region of `workspace` (laid out per `w`) with one single-CTA kernel: from
// p.cu_seqlens (device, int32 or int64) when given, else from the fixed [B, T] shape.
// cu_seqlens is untrusted: offsets are clamped into [0, T] and made non-decreasing (running
// maximum), so the chunk total never exceeds w.max_chunks and no later kernel reads outside
// q/k/v/g/beta/o. chunk_seq entries past the total are -1.
Status launch_prefill_plan(const PrefillParams& p, const WorkspacePlan& w, void* workspace, cudaStream_t stream);

// Writes the chunk block of every (chunk, value head) pair: grid (w.max_chunks, HV), CTAs past
// the plan's total exit without writing. Needs K = V = 128, bf16 q/k/v, g and beta bf16 or
// fp32, 16-byte aligned rows (strides of q/k/v multiples of 8 elements, of g multiples of 16
// bytes); anything else returns kUnsupported naming what is supported.
Status launch_prefill_prep(const PrefillParams& p, const WorkspacePlan& w, void* workspace, cudaStream_t stream);

namespace prep {
struct PrepParams;
// One file per (gate, g dtype) in instantiations/: kGFp32 selects fp32 g, else bf16.
template <GateMode kGate, bool kGFp32>
Status launch_prep_kernel(const PrepParams& params, int64_t max_chunks, cudaStream_t stream);
}  // namespace prep

}  // namespace kdakit::sm90::prefill
