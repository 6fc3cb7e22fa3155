// Host entry of the chunk-serial prefill recurrence kernel: a plain C++ header (no CUDA
// includes). The dispatcher (src/cuda/sm90/prefill/dispatch.cu) picks kValueRows with
// recurrence_value_rows() and calls the matching instantiation after the plan and prep kernels
// have filled the workspace.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill {

// Reads the plan region and the chunk blocks of `workspace` (laid out per `plan`), writes o,
// the final state and the optional chunk states of `p`. kValueRows in {16, 32, 64, 128}: value
// channels per CTA; the grid is (N, HV, 128 / kValueRows).
// With segments in the plan (plan.segment_chunks > 0) each CTA runs one segment from the start
// state the combine pass left in the segment area, and the grid is (N, HV, max_segments, slices).
template <int kValueRows>
Status launch_prefill_recurrence(const PrefillParams& p, const WorkspacePlan& plan, const void* workspace,
                                 cudaStream_t stream);

// Segmented prefill, before the recurrence (workspace.h): the summary pass writes (Psi, Phi) of
// every full segment, 2 x 128 / kValueRows CTAs per segment (kValueRows in {64, 128}); the
// combine pass chains them into start states (one CTA per (sequence, value head)).
template <int kValueRows>
Status launch_prefill_summaries(const PrefillParams& p, const WorkspacePlan& plan, const void* workspace,
                                cudaStream_t stream);
// whole: the one-CTA-per-head kernel instead of the cluster-split default (bit-identical results).
Status launch_prefill_combine(const PrefillParams& p, const WorkspacePlan& plan, void* workspace,
                              cudaStream_t stream, bool whole = false);

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

// ---- segments: the choice from a cost model of the H200 measurements -------------------------
// NOTE: one CTA per SM at every value-row count (shared memory), and a chunk costs a CTA about
// 2.1 / 2.2 / 2.4 / 3.9 us at 16 / 32 / 64 / 128 value rows (docs/design/20261129-prefill-
// recurrence.md, H4-H96). A summary CTA skips the output's products and stores (~25% fewer
// MMAs; charged 0.75 of a chunk). The combine pass costs about 2 us per segment in a sequence's
// chain for fixed batches and is charged 7 us for packed ones (the NOTEs below), each extra
// launch ~3 us.
// NOTE: the combine cost was 1.5 us per segment until the H200 sweep of forced choices
// (scripts/gpu_segment_sweep.sh, 2026-12-01, ms of the whole call): halving the segments saved
// far more than the model said, H4-T32K 16:64:64 0.666 against 32:64:64 0.557 (109 us for 16
// fewer segments), H4 32K + 8 x 1K 16:128:128 0.742 against 32:128:128 0.608 (134 us for 20),
// i.e. 6.8 and 8.7 us per segment. With 7 us the model's pick is within 1.4% of the fastest forced
// choice on all six few-head rows (H4-T8K, -T32K, -T128K, 32K + 8 x 1K, H8-T32K, H16-T32K); with
// 1.5 it took 16-chunk segments for the packed row, 22% slower than the best.
// NOTE: the combine split over a cluster of 8 CTAs per head (combine.cu, session 10) took ~5 us off
// each step: same picks, H200 same device call (ms, split / whole-head combine) H4-T8K 0.171 /
// 0.207 (7 steps), H4-T32K 0.441 / 0.520 (15), H4-T128K 1.521 / 1.603 (15). With 2 us per step the
// model's fixed-batch picks changed and measured faster (next call, ms against the 7-us picks):
// H4-T128K 64-chunk segments 1.461 / 1.521, H8-T32K 32: 0.766 / 0.790, H16-T8K 16: 0.426 / 0.460.
// For the packed 32K + 8 x 1K rows 2 us picks 16-chunk segments, which measured slower than 32
// (H4 0.580 / 0.536, H8 0.988 / 0.929, H16 1.882 / 1.744), so packed batches keep 7 us: the
// packed model (longest possible chain, total work spread) does not see what else grows with
// the segment count there. Not swept with the split kernel (the sweep did not fit the session).
// NOTE: since session 11 the summaries run on the wgmma kernel and skip Qt, M (and Phi's U0):
// measured 2.45 us per chunk at 128 rows and 1.86 at 64, against the 0.75 x t(rows) charged here,
// while the recurrence's chunks now cost 2.9-3.3 us at 32 rows, 3.1 at 64 and 4.2-6.0 at 128 (more
// with more CTAs sharing DRAM). The constants are kept: a host copy refitted to those numbers
// changes H4 T=32K's pick and would segment the H32 rows, and without a bandwidth term and a sweep
// those picks are not checked (docs/design/20261201-prefill-segments.md, session 11).

struct SegmentChoice {
  int32_t segment_chunks = 0;  // 0: whole sequences
  int summary_rows = 128;
  int rows = 128;              // value rows per CTA of the recurrence
  double predicted_us = 0;
  double unsegmented_us = 0;
};

// Combine cost per segment step: fixed batches 2 us, packed batches 7 us (see the NOTE above).
constexpr double kCombineUsPerSegment = 2.0;
constexpr double kCombineUsPerSegmentPacked = 7.0;

constexpr double recurrence_chunk_us(int rows) {
  return rows <= 16 ? 2.1 : rows <= 32 ? 2.2 : rows <= 64 ? 2.4 : 3.9;
}
constexpr double waves(int64_t ctas, int num_sms) { return double((ctas + num_sms - 1) / num_sms); }

// Predicted time of one pass: `ctas` CTAs with chains of at most `chain` chunks at `us` per chunk.
// Fixed batches: every CTA has the same chain, so whole waves. Packed batches (lengths unknown on
// the host): the longest chain, or the total chunk work spread over the SMs, whichever is longer
// (short sequences' CTAs finish early and others take their SMs).
constexpr double pass_us(bool packed, int64_t ctas, int64_t chain, int64_t total_cta_chunks, double us,
                         int num_sms) {
  if (!packed) return waves(ctas, num_sms) * double(chain) * us;
  const double spread = double(total_cta_chunks) * us / double(num_sms);
  const double longest = double(chain) * us;
  return spread > longest ? spread : longest;
}

// Shortest segment the model considers: 8 chunks for at most 4 value heads, else 16.
// NOTE: H200 (session 11, forced choices, ms of the whole call): H4 T=8K 8:64:128 0.147 against
// the 16-chunk pick 16:32:64 0.161, H8 T=8K 8:64:128 0.248 against 16:64:128 0.224. The model
// with 8-chunk segments allowed picks exactly those two (8 at H4, 16 at H8) and changes no other
// few-head pick; the guard keeps the workspace's segment area (sized for the shortest segment a
// batch-only query's batches may take, dispatch.cu) at its 16-chunk size from 5 heads on.
constexpr int32_t min_segment_chunks(int32_t num_v_heads) { return num_v_heads <= 4 ? 8 : 16; }

// Shortest predicted recurrence time over segment lengths of 8 or 16 .. 256 chunks, or whole
// sequences when segmenting does not save a fifth. Packed batches: the longest sequence may
// hold all T tokens, and the total chunks are at most T / 64 + N.
// NOTE: one packed sequence (cu_seqlens of length 2, how engines pass a single prompt) is
// modelled as a fixed batch of one: it holds at most T tokens, one chain, like a batch row. The
// packed model's 7-us combine step was fitted on the 32K + 8 x 1K rows (many chains) and, applied
// to one sequence, kept the session-10 fixed-batch picks off the benchmark's single-sequence rows
// (they are packed), which measured faster forced: H4 T=128K 64-chunk segments 1.461 ms against
// 1.521, H8 T=32K 32: 0.766 / 0.790, H16 T=8K 16: 0.426 / 0.460; session 12, H4 T=8K 8:64:128
// 0.148 against 16:32:64 0.162.
constexpr SegmentChoice choose_segments(int64_t batch, int64_t seqlen, int64_t num_seqs, bool packed,
                                        int32_t num_v_heads, int num_sms) {
  if (packed && num_seqs == 1) {
    packed = false;
    batch = 1;
  }
  SegmentChoice best{};
  const int64_t nc = (seqlen + 63) / 64;  // chunks of the longest sequence
  const int64_t total_chunks = packed ? nc + num_seqs : batch * nc;
  const int rows0 = recurrence_value_rows(num_seqs, num_v_heads, num_sms);
  best.rows = rows0;
  best.unsegmented_us = pass_us(packed, num_seqs * num_v_heads * (128 / rows0), nc,
                                total_chunks * num_v_heads * (128 / rows0), recurrence_chunk_us(rows0), num_sms);
  best.predicted_us = best.unsegmented_us;
  if (num_seqs <= 0 || nc <= 16) return best;
  for (int32_t ls = min_segment_chunks(num_v_heads); ls <= 256; ls *= 2) {
    if (ls >= nc) break;
    const int64_t per_seq = (nc + ls - 1) / ls;
    const int64_t segs = packed ? std::min<int64_t>(num_seqs * per_seq, per_seq + num_seqs) : num_seqs * per_seq;
    const int64_t full = packed ? std::min<int64_t>(num_seqs * (per_seq - 1), per_seq - 1 + num_seqs)
                                : num_seqs * (per_seq - 1);
    SegmentChoice c{};
    c.segment_chunks = ls;
    double summary = 1e30, rec = 1e30;
    for (int r = 64; r <= 128; r *= 2) {
      const int64_t ctas = full * num_v_heads * 2 * (128 / r);
      const double t = pass_us(packed, ctas, ls, ctas * ls, 0.75 * recurrence_chunk_us(r), num_sms);
      if (t < summary) { summary = t; c.summary_rows = r; }
    }
    for (int r = 32; r <= 128; r *= 2) {
      const int64_t ctas = segs * num_v_heads * (128 / r);
      const double t = pass_us(packed, ctas, ls, total_chunks * num_v_heads * (128 / r), recurrence_chunk_us(r),
                               num_sms);
      if (t < rec) { rec = t; c.rows = r; }
    }
    c.predicted_us = summary + rec + (packed ? kCombineUsPerSegmentPacked : kCombineUsPerSegment) * double(per_seq - 1) + 6.0;
    c.unsegmented_us = best.unsegmented_us;
    if (c.predicted_us < best.predicted_us) best = c;
  }
  if (best.segment_chunks > 0 && best.predicted_us > 0.8 * best.unsegmented_us) {
    best.segment_chunks = 0;
    best.rows = rows0;
    best.predicted_us = best.unsegmented_us;
  }
  return best;
}
static_assert(choose_segments(1, 8192, 1, false, 96, 132).segment_chunks == 0, "H96: whole sequences");
static_assert(choose_segments(1, 8192, 1, false, 64, 132).segment_chunks == 0, "H64: whole sequences");
// NOTE: packed many-head batches keep whole sequences (a first model, waves x the longest
// possible chain, took segments for H96 mixed and measured 5-20% slower on every packed TARGETS
// row of H96/H64/H32)
static_assert(choose_segments(1, 8192, 6, true, 96, 132).segment_chunks == 0, "H96 mixed: whole sequences");
static_assert(choose_segments(1, 8192, 8, true, 96, 132).segment_chunks == 0, "H96 1024x8: whole sequences");
static_assert(choose_segments(1, 8192, 9, true, 96, 132).segment_chunks == 0, "H96 4096+8x512");
static_assert(choose_segments(1, 8192, 6, true, 64, 132).segment_chunks == 0, "H64 mixed: whole sequences");
static_assert(choose_segments(1, 8192, 8, true, 32, 132).segment_chunks == 0, "H32 1024x8: whole sequences");
static_assert(choose_segments(1, 8192, 1, true, 4, 132).segment_chunks == 8, "one packed sequence: as a fixed batch");
static_assert(choose_segments(1, 131072, 1, true, 4, 132).segment_chunks == 64, "one packed sequence: as a fixed batch");
static_assert(choose_segments(1, 32768, 1, true, 8, 132).segment_chunks == 32, "one packed sequence: as a fixed batch");
static_assert(choose_segments(1, 8192, 1, true, 16, 132).segment_chunks == 16, "one packed sequence: as a fixed batch");
static_assert(choose_segments(1, 40960, 9, true, 4, 132).segment_chunks == 32, "H4 32K + 8 x 1K: 32-chunk segments");
static_assert(choose_segments(1, 40960, 9, true, 16, 132).segment_chunks == 32, "H16 32K + 8 x 1K: 32-chunk segments");
static_assert(choose_segments(1, 8192, 1, false, 16, 132).segment_chunks == 16, "H16 T=8K: 16-chunk segments");
static_assert(choose_segments(1, 8192, 1, false, 8, 132).segment_chunks == 16, "H8 T=8K: 16-chunk segments");
static_assert(choose_segments(1, 8192, 1, false, 4, 132).segment_chunks == 8 &&
                  choose_segments(1, 8192, 1, false, 4, 132).rows == 64 &&
                  choose_segments(1, 8192, 1, false, 4, 132).summary_rows == 128,
              "H4 T=8K: 8-chunk segments, 64-row recurrence, 128-row summaries (the measured fastest)");
static_assert(choose_segments(1, 32768, 1, false, 4, 132).segment_chunks == 32, "H4 T=32K: 32-chunk segments");
static_assert(choose_segments(1, 131072, 1, false, 4, 132).segment_chunks == 64, "H4 T=128K: 64-chunk segments");
static_assert(choose_segments(1, 32768, 1, false, 8, 132).segment_chunks == 32, "H8 T=32K: 32-chunk segments");

}  // namespace kdakit::sm90::prefill
