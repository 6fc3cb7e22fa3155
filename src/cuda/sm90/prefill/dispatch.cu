// The sm_90a prefill dispatcher: checks that a kernel is built for the call's shape and dtypes,
// then runs, on one stream, one of four paths:
//   tile16    plan -> the 16-token-tile kernel (a CTA of 8 warps per sequence and head, the state
//             in registers, two CTAs per SM); the default for short and medium sequences
//   fused     plan (sequence map from cu_seqlens) -> the fused kernel (preparation and
//             recurrence in one CTA, no workspace round trip); when forced or tile16 is off
//   chunked   plan -> prep (per-chunk blocks, token parallel) -> recurrence (chunk-serial)
//   token-serial  decode's kernel, for batches of very short sequences the others do not take
// and, for packed batches whose longest sequence only the device knows, tile16 and chunked both
// launched, the plan's longest length making one of them exit (route_on_device)
// The one place where runtime values turn into template arguments of the prefill kernels
// (gate, consumer warpgroups, value rows per CTA). KDAKIT_PRINT_CONFIGS=1 prints the choice;
// KDAKIT_PREFILL_PATH=tile16|fused|chunked|token_serial forces a path and KDAKIT_FUSED_CONSUMERS=1|2
// the fused kernel's warpgroups (tests, benchmarks).
#include "cuda/sm90/prefill/dispatch.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/common/device_setup.cuh"
#include "cuda/sm90/decode/dispatch.h"
#include "cuda/sm90/prefill/fused/launch.h"
#include "cuda/sm90/prefill/prep/launch.h"
#include "cuda/sm90/prefill/recurrence/launch.h"
#include "cuda/sm90/prefill/tile16/launch.h"
#include "cuda/sm90/prefill/workspace.h"

namespace kdakit::sm90 {
namespace {

prefill::WorkspacePlan plan_for(const PrefillParams& p, int32_t segment_chunks = 0) {
  return prefill::make_workspace_plan(p.batch, p.seqlen, p.num_seqs, p.cu_seqlens != nullptr, p.num_v_heads,
                                      segment_chunks);
}

// SM count of the current device, read once per device (a host attribute query, no sync).
int current_num_sms() { return kdakit::cuda::current_device_sm_count(132); }

Status unsupported(const std::string& what) { return Status(StatusCode::kUnsupported, "prefill (sm_90a): " + what); }

// NOTE: sequences of ~16 tokens on average go to the token-serial kernel (decode's
// run_recurrent_prefill): measured on the H200 at H = 96, T = 8192, 512 x 16 tokens it takes
// 7.9 ms against 9.5 ms for plan + prep + recurrence (a 90 KB block per 16-token chunk and head);
// at 256 x 32 tokens the chunked path wins (4.8 ms against 7.6 ms). Decided from T and N alone:
// the lengths live on the device.
constexpr int64_t kTokenSerialMaxAverageLength = 16;

// NOTE: with the caller's longest-sequence hint (PrefillParams::max_seqlen, packed batches) the
// token-serial and fused kernels also need every sequence within these lengths: the token-serial
// kernel is for short prefill (up to ~64 tokens, issue 4), and the fused kernel's chain costs
// ~19 us a chunk without the two-kernel path's hi + lo splits (Kh, S0, A^M), so a long member of
// a batch of short sequences is slow there and, with slow-decay gates over thousands of tokens,
// past the state bar. 512 tokens: 8 chunks, ~0.15 ms of chain. Without the hint the choice is
// by the average alone (docs/contract.md, "Kernel paths").
constexpr int64_t kTokenSerialMaxLength = 64;
constexpr int64_t kFusedMaxLength = 512;

// Whether the batch's sequences are short enough for a kernel meant for at most `average` tokens
// per sequence on average and, by the caller's hint when there is one, `longest` tokens in any
// (a fixed batch's rows all have the average length).
bool lengths_within(const PrefillParams& p, int64_t average, int64_t longest) {
  const int64_t tokens = p.cu_seqlens != nullptr ? p.seqlen : p.batch * p.seqlen;
  const bool longest_ok = p.cu_seqlens == nullptr || p.max_seqlen == 0 || p.max_seqlen <= longest;
  return tokens <= average * p.num_seqs && longest_ok;
}

bool prefer_token_serial(const PrefillParams& p) {
  return lengths_within(p, kTokenSerialMaxAverageLength, kTokenSerialMaxLength);
}

// The forced path from KDAKIT_PREFILL_PATH (read once), or set_prefill_path's override.
PrefillPath forced_path_env() {
  static const PrefillPath path = [] {
    const char* env = std::getenv("KDAKIT_PREFILL_PATH");
    if (env == nullptr) return PrefillPath::kAuto;
    const std::string v(env);
    if (v == "fused") return PrefillPath::kFused;
    if (v == "chunked") return PrefillPath::kChunked;
    if (v == "token_serial") return PrefillPath::kTokenSerial;
    if (v == "tile16") return PrefillPath::kTile16;
    return PrefillPath::kAuto;
  }();
  return path;
}
PrefillPath path_override = PrefillPath::kAuto;

// KDAKIT_FUSED_CONSUMERS=1|2 forces the fused kernel's consumer warpgroups per CTA (tests run
// both variants on small cases); 0 = the heuristic.
int fused_consumers_override() {
  static const int v = [] {
    const char* env = std::getenv("KDAKIT_FUSED_CONSUMERS");
    return env != nullptr && (env[0] == '1' || env[0] == '2') && env[1] == '\0' ? env[0] - '0' : 0;
  }();
  return v;
}

PrefillPath forced_path() { return path_override != PrefillPath::kAuto ? path_override : forced_path_env(); }

// KDAKIT_PREFILL_SEGMENTS sets the two-kernel path's segments (tests, benchmarks): "auto" the
// cost model's choice, "0" whole sequences, "L" segments of L chunks, "L:rows:summary_rows" also
// the value rows per CTA of the recurrence (16..128) and of the summary pass (64 or 128).
// Unset: kSegmentsByDefault.
//
// Segments are on by default (the cost model decides per call). The H200 run of 2026-12-01
// (build aafe10e) passed the slow-gate cases, whose gates make the (Psi, Phi) chain carry O(1)
// of the state: at T = 32K / 128K and a packed pool in place, the segmented outputs differ
// from the whole-sequence ones (rel. L2 2.9e-3 apart) and their errors against float64 match
// the whole-sequence path's (o 4.32e-3 vs 4.32e-3, state 3.11e-3 vs 3.10e-3).
constexpr bool kSegmentsByDefault = true;
// KDAKIT_PREFILL_COMBINE=whole: the segments' combine pass on the one-CTA-per-head kernel
// (combine.cu) instead of the 8-CTA split default; set_prefill_combine overrides it.
int combine_override = -1;
prefill::CombineKernel combine_kernel() {
  using prefill::CombineKernel;
  if (combine_override >= 0) return combine_override != 0 ? CombineKernel::kWhole : CombineKernel::kSplit;
  static const CombineKernel env = [] {
    const char* e = std::getenv("KDAKIT_PREFILL_COMBINE");
    return e != nullptr && std::strcmp(e, "whole") == 0 ? CombineKernel::kWhole : CombineKernel::kSplit;
  }();
  return env;
}
// On the two-kernel path the prep kernel writes the plan entries of a fixed batch (arithmetic) or
// of one packed sequence (from cu_seqlens[0], [1]) and no plan kernel runs
// (WorkspacePlan::plan_by_prep; one launch and ~2.7 us of a graph's kernel time fewer, session 27's
// --kernels). The default since session 30: measured on the card (H100, 2026-12-06, one process,
// CUDA-graph medians) 0.2-2.3% faster on every row it applies to (H4 T = 8K 0.1312 -> 0.1282 ms,
// H4 T = 32K 0.3402 -> 0.3383, H16 T = 8K 0.3276 -> 0.3252, H96 fixed 1.3696 -> 1.3632), bit for
// bit the plan kernel's results (PrefillPlanByPrepGpu). KDAKIT_PREFILL_PLAN=kernel (read once) runs
// the plan kernel anyway; set_prefill_plan_by_prep overrides both.
int plan_by_prep_override = -1;
bool plan_by_prep_on() {
  if (plan_by_prep_override >= 0) return plan_by_prep_override != 0;
  static const bool env = [] {
    const char* e = std::getenv("KDAKIT_PREFILL_PLAN");
    return e == nullptr || std::strcmp(e, "kernel") != 0;
  }();
  return env;
}
struct ForcedSegments {
  bool set = false;
  bool model = false;  // the cost model's choice
  int32_t chunks = 0;
  int rows = 0;
  int summary_rows = 0;
};
ForcedSegments segments_override;
ForcedSegments forced_segments() {
  if (segments_override.set) return segments_override;
  static const ForcedSegments f = [] {
    ForcedSegments r;
    const char* env = std::getenv("KDAKIT_PREFILL_SEGMENTS");
    if (env == nullptr || *env == '\0') return r;
    if (std::string(env) == "auto") {
      r.set = r.model = true;
      return r;
    }
    int l = 0, rows = 0, srows = 0;
    const int got = std::sscanf(env, "%d:%d:%d", &l, &rows, &srows);
    if (got < 1 || l < 0) return r;
    r.set = true;
    r.chunks = l;
    if (got >= 2 && (rows == 16 || rows == 32 || rows == 64 || rows == 128)) r.rows = rows;
    if (got >= 3 && (srows == 64 || srows == 128)) r.summary_rows = srows;
    return r;
  }();
  return f;
}

// The two-kernel path's segments for this call (cost model in recurrence/launch.h, or forced).
prefill::SegmentChoice segment_choice(const PrefillParams& p) {
  const bool packed = p.cu_seqlens != nullptr;
  prefill::SegmentChoice c =
      prefill::choose_segments(p.batch, p.seqlen, p.num_seqs, packed, p.num_v_heads, current_num_sms());
  const ForcedSegments f = forced_segments();
  const bool model = f.set ? f.model : kSegmentsByDefault;
  const auto whole = [&] {
    return prefill::whole_sequences(p.batch, p.seqlen, p.num_seqs, packed, p.num_v_heads, current_num_sms());
  };
  if (!model && !f.set) {
    c = whole();
  } else if (f.set && !f.model) {
    if (f.chunks == 0) {
      c = whole();
    } else {
      if (c.segment_chunks == 0) c.rows = 64, c.summary_rows = 128;
      c.segment_chunks = f.chunks;
    }
    if (f.rows != 0) c.rows = f.rows;
    if (f.summary_rows != 0) c.summary_rows = f.summary_rows;
  }
  return c;
}

// The chunk blocks' element type (WorkspacePlan::f16_block). fp16 (11 significant bits against
// bf16's 8) lets the wgmma recurrence run one pass per operand where it runs bf16 hi + lo pairs
// (64 m64n64k16 units a chunk and warpgroup become 28), and drops Kh lo from the block (107 KB
// read per chunk and head become 91 KB). Its range needs bounded operands, so the default takes
// it for L2-normed q and k with |scale| in [1/16, 16] (|Qt|, |M| <= |scale|, |Kh|, |W| < 1;
// the state and U are scaled per row in the kernel), and only when both recurrence kernels of
// the call are the wgmma one (64 or 128 value rows). Otherwise bf16.
// KDAKIT_PREFILL_BLOCK=bf16 keeps bf16 (tests, A/B runs); =f16 takes fp16 wherever the kernels
// can (64 or 128 rows), whatever the inputs; set_prefill_block overrides both.
int block_override = -1;
int forced_block() {
  if (block_override >= 0) return block_override;
  static const int env = [] {
    const char* e = std::getenv("KDAKIT_PREFILL_BLOCK");
    if (e == nullptr) return -1;
    if (std::strcmp(e, "bf16") == 0) return 0;
    if (std::strcmp(e, "f16") == 0) return 1;
    return -1;
  }();
  return env;
}
bool f16_block(const PrefillParams& p, const prefill::SegmentChoice& c) {
  const bool wgmma_only = c.rows >= 64;  // summaries always run the wgmma kernel (64 or 128 rows)
  const int forced = forced_block();
  if (!wgmma_only || forced == 0) return false;
  if (forced == 1) return true;
  const float s = p.scale < 0.f ? -p.scale : p.scale;
  return p.use_qk_l2norm && s >= 1.f / 16.f && s <= 16.f;
}

// Segment length the workspace is sized for when only the batch sizes are known: the shortest
// the cost model may pick for these heads (min_segment_chunks: the most slots), for sequences
// long enough to be segmented.
int32_t sizing_segment_chunks(const PrefillParams& p) {
  const ForcedSegments f = forced_segments();
  if (f.set && !f.model) return f.chunks;
  if (!f.set && !kSegmentsByDefault) return 0;
  return (p.seqlen + prefill::kChunk - 1) / prefill::kChunk > 16 ? prefill::min_segment_chunks(p.num_v_heads) : 0;
}

// NOTE: the fused kernel's domain is batches of short sequences, where it measured faster than
// the two-kernel path on the H200 (2026-12-01: H96 64 x 128 2.20 vs 2.27 ms, 32 x 256 4.10 vs
// 4.36, 16 x 512 8.09 vs 8.18 token-serial); the 16-token-tile kernel now takes those batches by
// default (below). On long sequences its producer warpgroup (one warp per SMSP, ~19 us a chunk)
// is slower than the prep kernel's 16 warps per SM (H96 fixed 2.42 vs 1.55 ms);
// docs/design/20261201-prefill-fused.md has the profile.
constexpr int64_t kFusedMaxAverageLength = 64;

bool short_sequences(const PrefillParams& p) { return lengths_within(p, kFusedMaxAverageLength, kFusedMaxLength); }

// Whether the fused kernel takes this call (forced, or its batches when the tile kernel does not
// take them: KDAKIT_TILE16_MAX_AVERAGE below 64).
bool use_fused(const PrefillParams& p) {
  const PrefillPath f = forced_path();
  return (f == PrefillPath::kFused || (f == PrefillPath::kAuto && short_sequences(p))) &&
         prefill::fused_unsupported(p) == nullptr;
}

// NOTE: the 16-token-tile kernel takes what the fused kernel takes (same checks, same plan
// region), and runs by default:
//   - batches averaging at most 64 tokens per sequence (the fused kernel's domain; the longest
//     at most 512 by the caller's hint), whatever their size;
//   - with at least one (sequence, head) pair per SM: batches whose every sequence is known to be
//     at most kTile16MaxLength tokens (a fixed batch, or a packed one with the max_seqlen hint),
//     and, decided on the device, packed batches without the hint averaging over 64 and at most
//     kTile16MaxLength tokens whose every sequence is at most kTile16MaxLength (route_on_device).
// KDAKIT_TILE16_MAX_AVERAGE=L makes the host take it for batches averaging at most L tokens (and
// the longest at most L where the hint gives it), without routing (benchmarks);
// KDAKIT_PREFILL_PATH=tile16 forces it on any batch, KDAKIT_PREFILL_PATH=fused keeps the fused
// kernel.
// Measured on the H200 (2026-12-02, session 15, the kernel of 8 warps per (sequence, head), H = 96,
// T = 8192, fp32 states; tile16 against the other paths in the same call): 16 x 512 2.59 ms
// against the fused kernel's 7.98, 32 x 256 1.88 against 4.03, 64 x 128 1.56 against 2.14,
// 256 x 32 1.36 against the two-kernel path's 1.58, 512 x 16 1.32 against 1.49, 1024 x 8 1.30
// against 1.42 (H64 0.88 against 0.97, H32 0.44 against 0.50). A long sequence in a batch of short
// ones runs tile after tile in one CTA (~6.5 us a tile): 4096 + 8 x 512 took 1.73 ms there against
// 1.45 on the two-kernel path, hence the device-side choice where the lengths are unknown.
// With fewer pairs than SMs the tile kernel's serial chain is not spread over the card (the
// two-kernel path's preparation is token-parallel).
constexpr int64_t kTile16MaxLength = 1024;
int64_t tile16_bound_override() {
  static const int64_t v = [] {
    // a decimal count of tokens; anything else (unset, empty, signs, trailing text) is ignored
    const char* env = std::getenv("KDAKIT_TILE16_MAX_AVERAGE");
    if (env == nullptr || *env < '0' || *env > '9') return int64_t(-1);
    char* end = nullptr;
    const long long x = std::strtoll(env, &end, 10);
    return *end == '\0' ? int64_t(x) : int64_t(-1);
  }();
  return v;
}
bool tile16_by_default(const PrefillParams& p) {
  const int64_t forced_bound = tile16_bound_override();
  const int64_t longest = forced_bound >= 0 ? forced_bound : kTile16MaxLength;
  if (forced_bound < 0 && short_sequences(p)) return true;
  if (p.num_seqs * p.num_v_heads < current_num_sms()) return false;
  const bool lengths_known = p.cu_seqlens == nullptr || p.max_seqlen > 0;
  // unknown lengths: routed on the device (route_on_device) unless the bound is forced
  return (lengths_known || forced_bound >= 0) && lengths_within(p, longest, longest);
}
bool use_tile16(const PrefillParams& p) {
  const PrefillPath f = forced_path();
  return (f == PrefillPath::kTile16 || (f == PrefillPath::kAuto && tile16_by_default(p))) &&
         prefill::fused_unsupported(p) == nullptr;
}

// NOTE: a packed batch without the hint that averages over 64 (the fused kernel's domain, which
// the tile kernel takes whatever the lengths) and at most kTile16MaxLength tokens may or may not
// have a member past kTile16MaxLength, and only the device knows (cu_seqlens). Such a call, with
// at least one (sequence, head) pair per SM, is routed: it is sized and planned for the two-kernel
// path, and launches the tile kernel and then the two-kernel path's kernels; the plan kernel's
// `longest` decides on the device which of them does the work (workspace.h, Route), so no host
// sync is needed and the call stays graph-capturable. The other side's CTAs exit after one load.
// Measured on the H200 (session 19; H = 96, T = 8192, one process): 1024 x 8 routed 1.324 ms
// against 1.306 forced onto the tile kernel and 1.427 on the two-kernel path (H64 0.892 / 0.876 /
// 0.965, H32 0.455 / 0.445 / 0.501, H32 softplus 0.491 / 0.484 / 0.585): the exiting side costs
// ~18 us at H = 96 (the preparation's 13,056 CTAs 15 us, the recurrence's 3 us): 512 x 16 and
// 256 x 32 (averaging 512 and 256, which the host used to send to the tile kernel unrouted) are
// 1.6% and 2.0% slower than that, and in exchange a long member no longer runs tile after tile in
// one CTA (before this, an unhinted batch averaging at most 512 took the tile kernel whatever its
// longest member: 4096 + 8 x 512 at 1.73 ms, a 32K-token member ~13 ms).
// NOTE: on an H100 (session 39) the exiting grids and launch gaps cost 1.9% at H96 1024 x 8 and
// 3.7% at H32 1024 x 8. Two ways to exit fewer CTAs made the rows where the prep does the work
// slower, and neither was kept: a prep grid of two CTAs per SM looping over the items (+5%), and
// the plan kernel launching the prep grid from the device (+30%; docs/design/20261129-prefill.md,
// session 39).
// NOTE: since session 40 the grids after the tile kernel start by programmatic dependent launch
// (prep/kernel.cuh, launch_prep_kernel; recurrence/kernel.cuh, launch), so the side that exits does
// so on the SMs the tile kernel's last wave leaves free: on an H100, H96 1024 x 8 -1.1%, 256 x 32
// -2.2%, H32 1024 x 8 -1.6%, the two-kernel side unchanged (docs/design/20261129-prefill.md,
// session 40).
bool route_on_device(const PrefillParams& p) {
  if (forced_path() != PrefillPath::kAuto || tile16_bound_override() >= 0) return false;
  if (p.cu_seqlens == nullptr || p.max_seqlen > 0) return false;
  if (p.num_seqs * p.num_v_heads < current_num_sms()) return false;
  return !lengths_within(p, kFusedMaxAverageLength, kTile16MaxLength) &&
         lengths_within(p, kTile16MaxLength, kTile16MaxLength) && prefill::fused_unsupported(p) == nullptr;
}

// Whether the prep kernel writes this two-kernel call's plan (no plan kernel). A fixed batch with
// T = 0 has no prep CTA to write it, and a routed call's tile kernel reads it before prep runs:
// the plan kernel writes those.
bool plan_by_prep(const PrefillParams& p) {
  return plan_by_prep_on() && (p.cu_seqlens == nullptr ? p.seqlen > 0 : p.num_seqs == 1 && !route_on_device(p));
}

Status launch_tile16(const PrefillParams& p, const prefill::WorkspacePlan& plan, cudaStream_t stream) {
  switch (p.gate) {
    case GateMode::kPrecomputed:
      return prefill::launch_prefill_tile16<GateMode::kPrecomputed>(p, plan, p.workspace, stream);
    case GateMode::kSoftplus:
      return prefill::launch_prefill_tile16<GateMode::kSoftplus>(p, plan, p.workspace, stream);
    case GateMode::kLowerBound:
      return prefill::launch_prefill_tile16<GateMode::kLowerBound>(p, plan, p.workspace, stream);
  }
  return Status(StatusCode::kInvalidArgument, "prefill: gate must be precomputed, softplus or lower_bound, got " +
                                                  std::to_string(int(p.gate)));
}

}  // namespace

void set_prefill_path(PrefillPath path) { path_override = path; }

namespace {
// The two-kernel path's choices for a call and the workspace they lay out: segments, the block
// type, the plan's writer (prefill_workspace_size and run_prefill take the same).
struct ChunkedCall {
  prefill::SegmentChoice seg;
  prefill::WorkspacePlan plan;
};
// A packed batch of several sequences whose recurrence shape is the cost model's pick (not forced)
// and not whole sequences on 64-row CTAs is shape-routed (workspace.h, Route): the plan kernel
// checks the pick against whole sequences on 64 rows on the actual lengths. The host's packed
// model assumes any one sequence may hold all T tokens (recurrence/launch.h): right for 32K + 8 x
// 1K at H4..H16 and for spread-out batches (H64, H96 mixed), wrong for one long member among short
// ones at many heads (H32 32K + 8 x 1K, ~0.3 ms; with 5 tokens more the host keeps 128-row CTAs).
// NOTE: the 64-row recurrence's exiting CTAs cost the batches that keep the host's shape one
// launch of N x HV x 2 CTAs: ~3 us at H96 for the tile/two-kernel route's exiting recurrence side
// (session 19), whose 13,056 exiting prep CTAs took ~15 us (~1.2 ns a CTA). So a batch of 512
// sequences at HV = 96 (98,304 CTAs) would pay ~0.1 ms, under 1% of its prep; not measured, and
// not bounded on the host (the host cannot tell which side will run).
prefill::ShapeRoute shape_route(const PrefillParams& p, const prefill::SegmentChoice& seg) {
  const ForcedSegments f = forced_segments();
  const bool model = f.set ? f.model : kSegmentsByDefault;
  if (!model || p.cu_seqlens == nullptr || p.num_seqs < 2 || (seg.segment_chunks == 0 && seg.rows == 64)) return {};
  return prefill::ShapeRoute{current_num_sms(), seg.rows, seg.summary_rows, seg.segment_chunks};
}

ChunkedCall chunked_call(const PrefillParams& p) {
  ChunkedCall c;
  c.seg = segment_choice(p);
  c.plan = plan_for(p, c.seg.segment_chunks);
  c.plan.shape_route = shape_route(p, c.seg);
  c.plan.f16_block = f16_block(p, c.seg);
  c.plan.plan_by_prep = plan_by_prep(p);
  return c;
}
}  // namespace

int32_t prefill_segment_chunks(const PrefillParams& p) { return segment_choice(p).segment_chunks; }

prefill::WorkspacePlan prefill_plan_layout(const PrefillParams& p) {
  prefill::WorkspacePlan plan = plan_for(p);
  plan.shape_route = shape_route(p, segment_choice(p));
  return plan;
}

bool prefill_f16_block(const PrefillParams& p) { return f16_block(p, segment_choice(p)); }

bool prefill_plan_by_prep(const PrefillParams& p) { return plan_by_prep(p); }

void set_prefill_block(int f16) { block_override = f16 < 0 ? -1 : f16 != 0 ? 1 : 0; }

void set_prefill_plan_by_prep(int on) { plan_by_prep_override = on < 0 ? -1 : on != 0 ? 1 : 0; }

void set_prefill_combine(int whole) { combine_override = whole < 0 ? -1 : whole != 0 ? 1 : 0; }

void set_prefill_segments(int32_t segment_chunks, int rows) {
  segments_override = ForcedSegments{};
  if (segment_chunks == kSegmentsModel) {
    segments_override.set = segments_override.model = true;
    return;
  }
  if (segment_chunks < 0) return;
  segments_override.set = true;
  segments_override.chunks = segment_chunks;
  if (rows == 16 || rows == 32 || rows == 64 || rows == 128) segments_override.rows = rows;
}

// NOTE: the fused path reads only the plan region; the chunk blocks (104.5 KB per chunk and head)
// are the two-kernel path's. Sized from the batch fields alone (no tensors, head dims unset:
// prefill_plan, engines sizing one buffer for their largest batch), the answer is the two-kernel
// path's, which covers every batch of at most those sizes whichever path it takes (a smaller
// N can move a batch from the fused path to the two-kernel one). Queried with a call's tensors,
// the answer is that call's path's.
// NOTE: segments (few heads, long sequences) add a segment area after the chunk blocks, at most
// 128 KiB per 16 chunks and head (~8% of the blocks; per 8 chunks at most 4 value heads, ~15%); a
// batch-only query includes it at its largest, so one buffer sized for the largest batch covers
// every smaller one.
size_t prefill_workspace_size(const PrefillParams& p) {
  const bool batch_only = p.q == nullptr && p.head_dim_k == 0;
  const PrefillPath f = forced_path();
  if (batch_only) {
    const prefill::WorkspacePlan plan = plan_for(p, sizing_segment_chunks(p));
    return f == PrefillPath::kFused || f == PrefillPath::kTile16 ? plan.chunk_blocks_offset : plan.total_bytes;
  }
  if (f != PrefillPath::kChunked && (use_tile16(p) || use_fused(p))) return plan_for(p).chunk_blocks_offset;
  return chunked_call(p).plan.total_bytes;
}

Status run_prefill(const PrefillParams& p, cudaStream_t stream) {
  // ---- what the chunked kernels support
  if (p.head_dim_k != prefill::kHeadDim || p.head_dim_v != prefill::kHeadDim)
    return unsupported("supported head dims: K = V = 128; got K = " + std::to_string(p.head_dim_k) +
                       ", V = " + std::to_string(p.head_dim_v));
  if (p.dtype_qkv != DType::kBFloat16)
    return unsupported(std::string("supported q/k/v dtype: bfloat16; got ") + to_string(p.dtype_qkv));
  if (p.dtype_state != DType::kFloat32 && p.dtype_state != DType::kBFloat16)
    return unsupported(std::string("supported state dtypes: float32, bfloat16; got ") + to_string(p.dtype_state));
  if (p.num_seqs == 0) return Status::Ok();

  const bool print = std::getenv("KDAKIT_PRINT_CONFIGS") != nullptr;
  const PrefillPath forced = forced_path();
  const bool tile16 = use_tile16(p);
  if (tile16 || use_fused(p)) {  // the two kernels that read the plan region alone
    const prefill::WorkspacePlan plan = plan_for(p);
    const size_t need = plan.chunk_blocks_offset;
    if (p.workspace == nullptr || p.workspace_bytes < need)
      return Status(StatusCode::kInvalidArgument, "workspace: expected at least " + std::to_string(need) +
                                                      " bytes, got " + std::to_string(p.workspace_bytes));
    // NOTE: with plan_ready the plan region already holds this batch's plan (kdakit::prefill_plan).
    Status st = p.plan_ready ? Status::Ok() : prefill::launch_prefill_plan(p, plan, p.workspace, stream);
    if (!st.ok()) return st;
    if (tile16) {
      if (print)
        std::fprintf(stderr, "kdakit prefill: N=%lld HV=%d tile16 path\n", (long long)p.num_seqs, p.num_v_heads);
      return launch_tile16(p, plan, stream);
    }
    const int consumers = fused_consumers_override() != 0 ? fused_consumers_override()
                                                          : prefill::fused_consumers(p.num_seqs, p.num_v_heads,
                                                                                     current_num_sms());
    if (print)
      std::fprintf(stderr, "kdakit prefill: N=%lld HV=%d fused path, %d consumer warpgroup(s) per CTA\n",
                   (long long)p.num_seqs, p.num_v_heads, consumers);
    auto launch = [&](auto gate) -> Status {
      constexpr GateMode kGate = decltype(gate)::value;
      const int sms = current_num_sms();
      return consumers == 2 ? prefill::launch_prefill_fused<kGate, 2>(p, plan, p.workspace, sms, stream)
                            : prefill::launch_prefill_fused<kGate, 1>(p, plan, p.workspace, sms, stream);
    };
    switch (p.gate) {
      case GateMode::kPrecomputed: return launch(std::integral_constant<GateMode, GateMode::kPrecomputed>{});
      case GateMode::kSoftplus: return launch(std::integral_constant<GateMode, GateMode::kSoftplus>{});
      case GateMode::kLowerBound: return launch(std::integral_constant<GateMode, GateMode::kLowerBound>{});
    }
    return Status(StatusCode::kInvalidArgument, "prefill: gate must be precomputed, softplus or lower_bound, got " +
                                                    std::to_string(int(p.gate)));
  }
  if (forced == PrefillPath::kFused || forced == PrefillPath::kTile16) {
    const std::string name = forced == PrefillPath::kFused ? "fused" : "tile16";
    const char* why = prefill::fused_unsupported(p);
    return unsupported("the " + name + " path (KDAKIT_PREFILL_PATH=" + name + ") does not take this call: " +
                       (why != nullptr ? why : "(it does)"));
  }
  if (forced == PrefillPath::kTokenSerial || (forced == PrefillPath::kAuto && prefer_token_serial(p))) {
    const Status st = run_recurrent_prefill(p, stream);
    if (print)
      std::fprintf(stderr, "kdakit prefill: N=%lld T=%lld token-serial path (%s)\n", (long long)p.num_seqs,
                   (long long)p.seqlen, st.ok() ? "ok" : st.message().c_str());
    // a case the token-serial kernel does not take goes the chunked way
    if (st.code() != StatusCode::kUnsupported) return st;
  }

  const ChunkedCall call = chunked_call(p);
  const prefill::SegmentChoice& seg = call.seg;
  prefill::WorkspacePlan plan = call.plan;
  const bool routed = route_on_device(p);
  if (routed) plan.route_bound = int32_t(kTile16MaxLength);
  if (p.workspace == nullptr || p.workspace_bytes < plan.total_bytes) {
    // the message only on the error path: nothing is built or allocated on a call that runs
    const char* unsupported_by_tiles = prefill::fused_unsupported(p);
    const std::string why =
        forced == PrefillPath::kChunked ? std::string(": KDAKIT_PREFILL_PATH=chunked")
        : routed
            ? " unless no sequence is past " + std::to_string(kTile16MaxLength) + " tokens, which only the device knows"
        : unsupported_by_tiles != nullptr ? ", the fused kernel does not take " + std::string(unsupported_by_tiles)
                                        : std::string(", by its lengths");
    return Status(StatusCode::kInvalidArgument,
                  "workspace: expected at least " + std::to_string(plan.total_bytes) + " bytes, got " +
                      std::to_string(p.workspace_bytes) + " (this call takes the two-kernel path" + why +
                      "; size the workspace with prefill_workspace_size of this call's tensors)");
  }

  // NOTE: with plan_ready the plan region already holds this batch's plan (kdakit::prefill_plan);
  // with plan_by_prep the prep kernel writes it (for the kernels after it).
  Status st = p.plan_ready || plan.plan_by_prep ? Status::Ok()
                                                      : prefill::launch_prefill_plan(p, plan, p.workspace, stream);
  if (!st.ok()) return st;
  if (routed) {
    if (print)
      std::fprintf(stderr, "kdakit prefill: N=%lld HV=%d routed on the device: tile16 if no sequence is past %lld "
                   "tokens, else the two-kernel path below\n", (long long)p.num_seqs, p.num_v_heads,
                   (long long)kTile16MaxLength);
    st = launch_tile16(p, plan, stream);
    if (!st.ok()) return st;
  }
  st = prefill::launch_prefill_prep(p, plan, p.workspace, stream);
  if (!st.ok()) return st;

  const int rows = seg.rows;
  const bool shape_routed = plan.shape_route.num_sms > 0;
  if (print)
    std::fprintf(stderr,
                 "kdakit prefill: N=%lld HV=%d max_chunks=%lld recurrence value_rows=%d segment_chunks=%d "
                 "(summary rows %d; model %.0f us, whole sequences %.0f us) block %s%s\n",
                 (long long)p.num_seqs, p.num_v_heads, (long long)plan.max_chunks, rows, seg.segment_chunks,
                 seg.summary_rows, seg.predicted_us, seg.unsegmented_us, plan.f16_block ? "fp16" : "bf16",
                 shape_routed ? "; shape-routed: the plan kernel picks this shape or whole sequences on 64 value "
                                "rows by the lengths"
                              : "");
  if (plan.segment_chunks > 0) {
    st = seg.summary_rows == 64 ? prefill::launch_prefill_summaries<64>(p, plan, p.workspace, stream)
                                : prefill::launch_prefill_summaries<128>(p, plan, p.workspace, stream);
    if (!st.ok()) return st;
    st = prefill::launch_prefill_combine(p, plan, p.workspace, stream, combine_kernel());
    if (!st.ok()) return st;
  }
  switch (rows) {
    case 16: st = prefill::launch_prefill_recurrence<16>(p, plan, p.workspace, stream); break;
    case 32: st = prefill::launch_prefill_recurrence<32>(p, plan, p.workspace, stream); break;
    case 64: st = prefill::launch_prefill_recurrence<64>(p, plan, p.workspace, stream); break;
    case 128: st = prefill::launch_prefill_recurrence<128>(p, plan, p.workspace, stream); break;
    default: return Status(StatusCode::kInternal, "prefill: value rows per CTA must be 16, 32, 64 or 128, got " +
                                                      std::to_string(rows));
  }
  if (!st.ok() || !shape_routed) return st;
  // the other side of a shape-routed call: whole sequences (no segments in its plan), 64 rows
  prefill::WorkspacePlan whole = plan;
  whole.segment_chunks = 0;
  whole.max_segments = 1;
  whole.other_shape = true;
  return prefill::launch_prefill_recurrence<64>(p, whole, p.workspace, stream);
}

}  // namespace kdakit::sm90
