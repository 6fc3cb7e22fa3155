// Host-side entry of the sm_90a prefill kernels: a plain C++ header (no CUDA includes) that
// the API layer (src/api/prefill.cpp) calls after kdakit::validate() has passed.
#pragma once

#include <cstdint>

#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90 {

// The kernel path of run_prefill; kAuto is the dispatcher's choice (see dispatch.cu).
enum class PrefillPath { kAuto, kFused, kChunked, kTokenSerial, kTile16 };
// For tests and tools that compare paths in one process: forces `path` for later calls (and
// workspace size queries); kAuto removes the override. Not for concurrent use.
void set_prefill_path(PrefillPath path);
// The same for the two-kernel path's segments (few heads, long sequences): segment_chunks > 0
// cuts sequences into segments of that many chunks, 0 runs whole sequences, kSegmentsModel
// takes the cost model's choice, other negatives remove the override (KDAKIT_PREFILL_SEGMENTS
// or the default, see dispatch.cu). rows: the recurrence's value rows per CTA (16, 32, 64,
// 128; else the model's).
inline constexpr int32_t kSegmentsModel = -2;
void set_prefill_segments(int32_t segment_chunks, int rows = 0);
// The combine pass of segmented prefill: 1 runs the one-CTA-per-head kernel, 0 the 8-CTA split
// one (the default), negatives remove the override (KDAKIT_PREFILL_COMBINE=whole, read once, or
// the default). The two agree to fp32 rounding (the split kernel sums its three passes apart);
// tests run both in one process.
void set_prefill_combine(int whole);
// Fixed batches and single packed sequences on the two-kernel path without the plan kernel (the
// prep kernel writes their plan entries): 1 on (the default), 0 off, negatives remove the override
// (KDAKIT_PREFILL_PLAN=kernel, read once, turns it off). Results are bit for bit the same either
// way.
void set_prefill_plan_by_prep(int on);
// Whether the prep kernel writes this two-kernel call's plan now (after the overrides); reads no
// device memory.
bool prefill_plan_by_prep(const PrefillParams& p);
// The two-kernel path's chunk-block element type: 1 fp16 where the call allows it (what the
// default picks), 0 bf16 (Kh hi + lo, the hi + lo recurrence), negatives remove the override
// (KDAKIT_PREFILL_BLOCK=bf16|f16, read once, or the default). Tests run both in one process.
void set_prefill_block(int f16);
// Whether the two-kernel path's chunk blocks are fp16 for this call now (after the overrides);
// reads no device memory.
bool prefill_f16_block(const PrefillParams& p);
// Segment length (chunks) the two-kernel path takes for this call now (0: whole sequences), after
// the overrides; reads no device memory.
int32_t prefill_segment_chunks(const PrefillParams& p);

// The plan region's layout and what the plan kernel decides for this batch: prefill_plan's
// plan is the one run_prefill would write (a segment-routed call's inputs included, workspace.h,
// Route). Reads no device memory.
prefill::WorkspacePlan prefill_plan_layout(const PrefillParams& p);

// Device workspace bytes run_prefill needs for these sizes (reads no device memory).
size_t prefill_workspace_size(const PrefillParams& p);

// Chooses the kernel (chunked, or the token-serial path for short sequences), turns runtime
// values into template arguments, and launches on `stream`. Returns kUnsupported naming the
// supported values for a shape or dtype no kernel is built for.
Status run_prefill(const PrefillParams& p, cudaStream_t stream);

}  // namespace kdakit::sm90
