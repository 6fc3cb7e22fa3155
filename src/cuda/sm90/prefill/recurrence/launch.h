// Host entry of the chunk-serial prefill recurrence kernel: a plain C++ header (no CUDA
// includes). The dispatcher (src/cuda/sm90/prefill/dispatch.cu) picks kValueRows with
// choose_segments() (or whole_sequences()) and calls the matching instantiation after the plan
// and prep kernels have filled the workspace.
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
// Which combine kernel runs (combine.cu): the 8-CTA split (the default), or the one-CTA-per-head
// kernel (agrees with it to fp32 rounding).
enum class CombineKernel { kSplit, kWhole };
Status launch_prefill_combine(const PrefillParams& p, const WorkspacePlan& plan, void* workspace,
                              cudaStream_t stream, CombineKernel kernel = CombineKernel::kSplit);

// ---- the recurrence's shape: whole sequences or segments, and value rows per CTA --------------
// A cost model of H200 measurements: dispatch.cu takes choose_segments' answer, or
// whole_sequences' when segments are forced off. One CTA runs per SM at every value-row count
// (shared memory), so a pass costs waves of CTAs times its chain of chunks times a chunk's time.
// Two sets of chunk times (RecurrenceCosts), by what the host knows of the lengths:
// - fixed batches and single sequences (the lengths are known): session 25's. The 64-row wgmma
//   kernel (with its producer warp since c27a0ad) takes ~1.8 us a chunk against 2.9 for the
//   32-row mma.sync one and 3.3 for 128 rows (H200, the whole call minus the prep kernel, whole
//   sequences forced with KDAKIT_PREFILL_SEGMENTS=0:rows, T = 32K: 64 rows 1.79-1.81 us at H4,
//   H8, H16 and H32; 128 rows 3.2-3.3; 32 rows 2.86 at H4 and H32; charged 1.9 and 3.4, what a
//   full card of 64-row CTAs at H96 and 128-row ones take). So V splits into 64-row slices when
//   those fit in one wave and never further: H32 T = 32K 2.635 -> 2.088 ms, T = 128K 10.44 ->
//   8.27, H32 fixed (T = 8K) 0.682 -> 0.547 against the earlier 32-row CTAs, same call.
// - packed batches of several sequences (lengths on the device only): session 11's constants and
//   rules, unchanged. Their pass model charges the longest possible chain (all T tokens in one
//   sequence), and with session 25's chunk times it picked 64-row CTAs for every packed batch.
//   The packed rows measured pull apart (ms, that pick against session 11's, same call): H32 32K
//   + 8 x 1K whole on 64 rows 2.396 against 16-chunk segments 2.938, but H64 mixed 0.909 against
//   0.884 and H4 32K + 8 x 1K 0.479 against 0.417. Not refitted until a model sees the lengths
//   (the plan, on the device).
// NOTE: the times are the bf16 blocks' (session 25). On fp16 blocks (session 26) a chunk takes
// ~1.4 us at 64 rows and ~2.7 at 128; the picks were kept, since on the single-sequence rows they
// measured within 1.2% of the fastest forced choice (docs/design/20261201-prefill-segments.md).
// NOTE: a summary CTA skips the output's products and stores (~25% fewer MMAs; charged 0.75 of a
// chunk). The combine pass costs about 2 us per segment in a sequence's chain for fixed batches
// and is charged 7 us for packed ones (the NOTEs below), each extra launch ~3 us.
// NOTE: the combine cost was 1.5 us per segment until the H200 sweep of forced choices
// (scripts/gpu_segment_sweep.sh, 2026-12-01, ms of the whole call): halving the segments saved
// far more than the model said, H4-T32K 16:64:64 0.666 against 32:64:64 0.557 (109 us for 16
// fewer segments), H4 32K + 8 x 1K 16:128:128 0.742 against 32:128:128 0.608 (134 us for 20),
// i.e. 6.8 and 8.7 us per segment. With 7 us the model's pick is within 1.4% of the fastest forced
// choice on all six few-head rows (H4-T8K, -T32K, -T128K, 32K + 8 x 1K, H8-T32K, H16-T32K); with
// 1.5 it took 16-chunk segments for the packed row, 22% slower than the best.
// NOTE: the combine split over 8 CTAs per head (a cluster then; combine.cu, session 10) took ~5 us off
// each step: same picks, H200 same device call (ms, split / whole-head combine) H4-T8K 0.171 /
// 0.207 (7 steps), H4-T32K 0.441 / 0.520 (15), H4-T128K 1.521 / 1.603 (15). With 2 us per step the
// model's fixed-batch picks changed and measured faster (next call, ms against the 7-us picks):
// H4-T128K 64-chunk segments 1.461 / 1.521, H8-T32K 32: 0.766 / 0.790, H16-T8K 16: 0.426 / 0.460.
// For the packed 32K + 8 x 1K rows 2 us picks 16-chunk segments, which measured slower than 32
// (H4 0.580 / 0.536, H8 0.988 / 0.929, H16 1.882 / 1.744), so packed batches keep 7 us: the
// packed model (longest possible chain, total work spread) does not see what else grows with
// the segment count there. Not swept with the split kernel (the sweep did not fit the session).

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
// The combine pass's steps for a chain of nseg segments: S_2 .. S_{nseg-1} (the summary pass
// runs segment 0 from the initial state, so S_1 is its Psi_0; session 36). Until then it was
// nseg - 1; with nseg - 2 no pick of the benchmark rows changes.
constexpr int64_t combine_steps(int64_t nseg) { return nseg > 2 ? nseg - 2 : 0; }

// A chunk's time on one CTA by value rows, and the smallest rows a pass may take.
struct RecurrenceCosts {
  double us16, us32, us64, us128;
  int min_rows;          // of the recurrence pass; whole sequences split V down to it
  int min_summary_rows;  // of the summary pass (64 or 128)
  constexpr double chunk_us(int rows) const {
    return rows <= 16 ? us16 : rows <= 32 ? us32 : rows <= 64 ? us64 : us128;
  }
};
// Fixed batches and single sequences (session 25; 16 rows untimed since session 11, taken as 32's).
// NOTE: summaries on 128-row CTAs only: the 64-row summary kernel was last timed before its
// producer warp (c27a0ad), and every pick measured since session 11 summarises on 128 rows.
inline constexpr RecurrenceCosts kKnownLengthCosts{2.9, 2.9, 1.9, 3.4, 64, 128};
// Packed batches of several sequences (session 11).
inline constexpr RecurrenceCosts kPackedCosts{2.1, 2.2, 2.4, 3.9, 16, 64};

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

// What the model knows of a batch's chains of chunks: a fixed batch, or one packed sequence (the
// NOTE at choose_segments), has `batch` chains of `chain` chunks; a packed batch of several
// sequences has at most `total` chunks, of which its longest sequence may hold `chain` (all T
// tokens).
struct BatchChains {
  bool packed;  // several sequences whose lengths the host does not know
  int64_t chain;
  int64_t total;
  RecurrenceCosts costs;
};
constexpr BatchChains batch_chains(int64_t batch, int64_t seqlen, int64_t num_seqs, bool packed) {
  const bool several = packed && num_seqs != 1;
  const int64_t nc = (seqlen + 63) / 64;
  return BatchChains{several, nc, several ? nc + num_seqs : (packed ? 1 : batch) * nc,
                     several ? kPackedCosts : kKnownLengthCosts};
}

// Whole sequences: V split in halves while the (sequence, head) pairs' CTAs still fit in one wave,
// down to the costs' smallest rows (128 rows once the pairs cover half the SMs).
constexpr SegmentChoice whole_sequences(int64_t batch, int64_t seqlen, int64_t num_seqs, bool packed,
                                        int32_t num_v_heads, int num_sms) {
  const BatchChains b = batch_chains(batch, seqlen, num_seqs, packed);
  const int64_t pairs = num_seqs * num_v_heads;
  int rows = kHeadDim;
  while (rows > b.costs.min_rows && pairs * (kHeadDim / (rows / 2)) <= num_sms) rows /= 2;
  const int64_t slices = kHeadDim / rows;
  SegmentChoice c{};
  c.rows = rows;
  c.predicted_us = c.unsegmented_us = pass_us(b.packed, pairs * slices, b.chain, b.total * num_v_heads * slices,
                                              b.costs.chunk_us(rows), num_sms);
  return c;
}
static_assert(whole_sequences(1, 8192, 1, false, 96, 132).rows == 128, "H96: one CTA per head");
static_assert(whole_sequences(1, 8192, 1, false, 64, 132).rows == 64, "H64: two V halves per head");
static_assert(whole_sequences(1, 8192, 1, false, 32, 132).rows == 64, "H32: two V halves per head");
static_assert(whole_sequences(1, 32768, 1, true, 4, 132).rows == 64, "one sequence, few heads: 64 value rows");
static_assert(whole_sequences(1, 8192, 6, true, 64, 132).rows == 128, "H64 mixed: one CTA per head");
static_assert(whole_sequences(1, 8192, 8, true, 4, 132).rows == 32, "packed, few heads: as in session 11");

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
// Predicted time of segments of ls chunks (rows and summary rows the cheapest), or nothing when
// ls is not shorter than the longest chain. tight_full: count a packed batch's full segments
// at most total / ls (a full segment holds ls chunks; choose_segments).
constexpr SegmentChoice segments_of(const BatchChains& b, int64_t num_seqs, int32_t num_v_heads, int num_sms,
                                    int32_t ls, bool tight_full) {
  const bool packed = b.packed;
  const RecurrenceCosts costs = b.costs;
  const int64_t nc = b.chain;
  const int64_t total_chunks = b.total;
  const int64_t per_seq = (nc + ls - 1) / ls;
  const int64_t segs = packed ? std::min<int64_t>(num_seqs * per_seq, per_seq + num_seqs) : num_seqs * per_seq;
  int64_t full = packed ? std::min<int64_t>(num_seqs * (per_seq - 1), per_seq - 1 + num_seqs) : num_seqs * (per_seq - 1);
  if (packed && tight_full) full = std::min<int64_t>(full, total_chunks / ls);
  SegmentChoice c{};
  c.segment_chunks = ls;
  double summary = 1e30, rec = 1e30;
  for (int r = costs.min_summary_rows; r <= 128; r *= 2) {
    const int64_t ctas = full * num_v_heads * 2 * (128 / r);
    const double t = pass_us(packed, ctas, ls, ctas * ls, 0.75 * costs.chunk_us(r), num_sms);
    if (t < summary) { summary = t; c.summary_rows = r; }
  }
  for (int r = costs.min_rows < 32 ? 32 : costs.min_rows; r <= 128; r *= 2) {
    const int64_t ctas = segs * num_v_heads * (128 / r);
    const double t = pass_us(packed, ctas, ls, total_chunks * num_v_heads * (128 / r), costs.chunk_us(r), num_sms);
    if (t < rec) { rec = t; c.rows = r; }
  }
  c.predicted_us =
      summary + rec + (packed ? kCombineUsPerSegmentPacked : kCombineUsPerSegment) * double(combine_steps(per_seq)) +
      6.0;
  return c;
}

constexpr SegmentChoice choose_segments(int64_t batch, int64_t seqlen, int64_t num_seqs, bool packed,
                                        int32_t num_v_heads, int num_sms) {
  const SegmentChoice whole = whole_sequences(batch, seqlen, num_seqs, packed, num_v_heads, num_sms);
  const BatchChains b = batch_chains(batch, seqlen, num_seqs, packed);
  if (num_seqs <= 0 || b.chain <= 16) return whole;
  // Whether to segment: the shortest prediction with the loose count of full segments (what the
  // packed rows were fitted with; the tight count makes segments look cheaper than they measure
  // for batches of short sequences, e.g. H32 1024 x 8). Which segments: the tight count.
  SegmentChoice loose = whole, best = whole;
  for (int32_t ls = min_segment_chunks(num_v_heads); ls <= 256 && ls < b.chain; ls *= 2) {
    const SegmentChoice l = segments_of(b, num_seqs, num_v_heads, num_sms, ls, false);
    if (l.predicted_us < loose.predicted_us) loose = l;
    // the tight count differs from the loose one for packed batches only
    const SegmentChoice t = b.packed ? segments_of(b, num_seqs, num_v_heads, num_sms, ls, true) : l;
    if (best.segment_chunks == 0 || t.predicted_us < best.predicted_us) best = t;
  }
  if (loose.segment_chunks == 0 || loose.predicted_us > 0.8 * whole.unsegmented_us) return whole;
  best.unsegmented_us = whole.unsegmented_us;
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
static_assert(choose_segments(1, 8192, 1, true, 16, 132).segment_chunks == 32, "one packed sequence: as a fixed batch");
// NOTE: the picks of the session-25 constants on the single-sequence benchmark rows, with the
// forced choices measured on the H200 (session 25; ms of the whole call, the session-11 pick in
// brackets): H8 T = 32K 64:64:128 0.595 (32:128:128 0.617), H16 T = 8K 32:64:128 0.323 (16:128:128
// 0.348), H4 T = 128K 128:64:128 1.143 (64:128:128 1.173), H32 T = 32K whole on 64 rows 2.088
// (whole on 32 rows 2.635); H4 T = 8K, T = 32K, H8 T = 8K, H16 T = 32K keep their picks.
static_assert(choose_segments(1, 8192, 1, false, 4, 132).segment_chunks == 8 &&
                  choose_segments(1, 8192, 1, false, 4, 132).rows == 64 &&
                  choose_segments(1, 8192, 1, false, 4, 132).summary_rows == 128,
              "H4 T=8K: 8-chunk segments, 64-row recurrence, 128-row summaries (the measured fastest)");
static_assert(choose_segments(1, 32768, 1, false, 4, 132).segment_chunks == 32, "H4 T=32K: 32-chunk segments");
static_assert(choose_segments(1, 131072, 1, false, 4, 132).segment_chunks == 128 &&
                  choose_segments(1, 131072, 1, false, 4, 132).rows == 64,
              "H4 T=128K: 128-chunk segments, 64-row recurrence");
static_assert(choose_segments(1, 40960, 9, true, 4, 132).segment_chunks == 32, "H4 32K + 8 x 1K: 32-chunk segments");
static_assert(choose_segments(1, 8192, 1, false, 8, 132).segment_chunks == 16, "H8 T=8K: 16-chunk segments");
static_assert(choose_segments(1, 32768, 1, false, 8, 132).segment_chunks == 64 &&
                  choose_segments(1, 32768, 1, false, 8, 132).rows == 64,
              "H8 T=32K: 64-chunk segments, 64-row recurrence");
static_assert(choose_segments(1, 8192, 1, false, 16, 132).segment_chunks == 32 &&
                  choose_segments(1, 8192, 1, false, 16, 132).rows == 64,
              "H16 T=8K: 32-chunk segments, 64-row recurrence");
static_assert(choose_segments(1, 32768, 1, false, 16, 132).segment_chunks == 64 &&
                  choose_segments(1, 32768, 1, false, 16, 132).rows == 128,
              "H16 T=32K: 64-chunk segments, 128-row recurrence");
static_assert(choose_segments(1, 32768, 1, false, 32, 132).segment_chunks == 0 &&
                  choose_segments(1, 32768, 1, false, 32, 132).rows == 64,
              "H32 T=32K: whole sequences on 64-row CTAs");
// NOTE: the packed picks below take the tight count of full segments (segments_of). On the H200
// (session 26, fp16 blocks, forced choices in one call, ms) the loose count's picks were H32 32K
// + 8 x 1K 16:128:128 2.754 (128:128:128 2.427, 128:64:128 2.443), H16 32:128:128 1.314
// (64:128:128 1.254, 128:64:128 1.248), H8 32:128:128 0.683 (64:64:128 0.656); H4 keeps 32:64:128
// (0.377, the fastest forced 0.378).
static_assert(choose_segments(1, 40960, 9, true, 32, 132).segment_chunks == 256, "H32 32K + 8 x 1K: 256-chunk segments");
static_assert(choose_segments(1, 40960, 9, true, 16, 132).segment_chunks == 64 &&
                  choose_segments(1, 40960, 9, true, 16, 132).rows == 128,
              "H16 32K + 8 x 1K: 64-chunk segments, 128-row recurrence");
static_assert(choose_segments(1, 40960, 9, true, 8, 132).segment_chunks == 64 &&
                  choose_segments(1, 40960, 9, true, 8, 132).rows == 64,
              "H8 32K + 8 x 1K: 64-chunk segments, 64-row recurrence");

// ---- a shape-routed call's device-side choice (workspace.h, Route) ----------------------------
// The packed model above charges the longest possible chain (one sequence of all T tokens); the
// plan kernel, which sees the lengths, checks the host's shape against whole sequences on 64-row
// CTAs with the known-length chunk times. A whole-sequence pass takes the longer of the work
// spread over the SMs and the stacked chains: with the sequences by length, longest first (the
// launch order), the k longest give n_k CTAs of at least c_k chunks each (c_k the k-th longest
// chain), so some SM runs ceil(n_k / SMs) of them, at least ceil(n_k / SMs) c_k chunks; the
// largest such product over k (k = 1: the longest chain; equal lengths: whole waves). A segmented
// shape takes its summary pass, 2 us a combine step of the longest chain and its recurrence pass,
// each the longer of spread work and one segment's chain (as the packed model).
// NOTE: where the two models disagree (host's packed model, then this one on the lengths, us):
// - H32 32K + 8 x 1K (512 + 8 x 16 chunks): the host picks 256-chunk segments (1251 by this model
//   against 973 for whole on 64 rows; 2.41 ms in session 32, and whole on 64 rows measured 2.396
//   against 2.088 for H32 T = 32K with bf16 blocks, session 25: ~0.3 ms more than its extra
//   tokens' prep). The summary pass on 128-row CTAs over 256 chunks costs what it saves.
// - The same with 5 more tokens (T = 40965): the host keeps whole sequences on 128 rows (1741
//   against 973): 288 (sequence, head) pairs are more than half the SMs, so whole_sequences does
//   not split V, and the long member's 32 CTAs run 512 chunks at 128 rows. Likewise H32 16K +
//   16 x 512 (870 against 486) and H64 16K + 8 x 1K (870 against 707).
// - Spread-bound batches keep the host's shape: H64 mixed (whole, 128 rows: 216 against 241; 0.884
//   ms against 0.909 on 64 rows, session 25) and H96 mixed.
struct KnownChains {
  int64_t longest;        // chunks of the longest sequence
  int64_t total;          // chunks of the batch
  int64_t full_segments;  // segments of the host's segment_chunks chunks that are not a sequence's last
  int64_t stacked64;      // max_k ceil(n_k / SMs) c_k at 64 value rows (2 CTAs per sequence and head)
  int64_t stacked_host;   // the same at the host shape's rows (whole sequences)
};
// The segments of a chain of `chunks` chunks cut into segments of `ls` that are not its last (0
// when ls <= 0 or the chain fits one segment): KnownChains::full_segments' term. The plan kernel
// sums it over the batch on the device (prep/plan_kernel.cuh), known_chains on the host.
constexpr int64_t extra_segments(int64_t chunks, int64_t ls) {
  return ls > 0 && chunks > ls ? (chunks + ls - 1) / ls - 1 : 0;
}
// max_k ceil(n_k / SMs) c_k's term for the sequence of launch rank `rank` (0 the longest) with
// `chain` chunks; with the lengths unranked (more than kOrderedSeqs sequences), the longest's term
// alone.
constexpr int64_t stacked_term(int64_t rank, int64_t chain, int32_t num_v_heads, int rows, int num_sms) {
  const int64_t ctas = (rank + 1) * num_v_heads * (kHeadDim / rows);
  return (ctas + num_sms - 1) / num_sms * chain;
}
// A whole-sequence pass: `stacked` chunk steps on one SM at least, the batch's work spread.
constexpr double known_pass_us(int64_t stacked, int64_t total_cta_chunks, double us, int num_sms) {
  const double spread = double(total_cta_chunks) * us / double(num_sms);
  const double chain = double(stacked) * us;
  return spread > chain ? spread : chain;
}
constexpr double whole_on_64_rows_us(const KnownChains& k, int32_t num_v_heads, int num_sms) {
  constexpr RecurrenceCosts c = kKnownLengthCosts;
  return known_pass_us(k.stacked64, k.total * num_v_heads * 2, c.us64, num_sms);
}
constexpr double host_shape_us(const KnownChains& k, const ShapeRoute& r, int32_t num_v_heads) {
  constexpr RecurrenceCosts c = kKnownLengthCosts;
  const int64_t ls = r.segment_chunks;
  if (ls <= 0)
    return known_pass_us(k.stacked_host, k.total * num_v_heads * (kHeadDim / r.rows), c.chunk_us(r.rows), r.num_sms);
  const int64_t summary_ctas = k.full_segments * num_v_heads * 2 * (kHeadDim / r.summary_rows);
  const double summary = summary_ctas == 0 ? 0.0
                                           : pass_us(true, summary_ctas, ls, summary_ctas * ls,
                                                     0.75 * c.chunk_us(r.summary_rows), r.num_sms);
  const int64_t chain = k.longest < ls ? k.longest : ls;
  const double rec = pass_us(true, 0, chain, k.total * num_v_heads * (kHeadDim / r.rows), c.chunk_us(r.rows),
                             r.num_sms);
  return summary + rec + kCombineUsPerSegment * double(combine_steps((k.longest + ls - 1) / ls)) + 6.0;
}
// Whether the host's shape does the work (the plan's `host_shape`): strictly faster by the model.
constexpr bool host_shape_wins(const KnownChains& k, const ShapeRoute& r, int32_t num_v_heads) {
  return host_shape_us(k, r, num_v_heads) < whole_on_64_rows_us(k, num_v_heads, r.num_sms);
}
// The chains of a batch (n >= 1 lengths in chunks, launch order: longest first), as the plan
// kernel forms them (host copy, for the checks below and the tests).
constexpr KnownChains known_chains(const int64_t* sorted, int n, const ShapeRoute& r, int32_t num_v_heads) {
  KnownChains k{sorted[0], 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    k.total += sorted[i];
    k.full_segments += extra_segments(sorted[i], r.segment_chunks);
    const int64_t t64 = stacked_term(i, sorted[i], num_v_heads, 64, r.num_sms);
    const int64_t th = stacked_term(i, sorted[i], num_v_heads, r.rows, r.num_sms);
    k.stacked64 = t64 > k.stacked64 ? t64 : k.stacked64;
    k.stacked_host = th > k.stacked_host ? th : k.stacked_host;
  }
  return k;
}
template <int kN>
constexpr KnownChains known_chains(const int64_t (&sorted)[kN], const ShapeRoute& r, int32_t num_v_heads) {
  return known_chains(sorted, kN, r, num_v_heads);
}
inline constexpr int64_t k32KPlus8x1K[9] = {512, 16, 16, 16, 16, 16, 16, 16, 16};
inline constexpr int64_t k32KPlus8x1KPlus5[10] = {512, 16, 16, 16, 16, 16, 16, 16, 16, 1};
inline constexpr int64_t kMixed[6] = {48, 32, 21, 16, 9, 5};  // H64 / H96 mixed
// The packed few-head rows with the host's picks (rows, summary rows, segment chunks):
static_assert(!host_shape_wins(known_chains(k32KPlus8x1K, {132, 64, 128, 256}, 32), {132, 64, 128, 256}, 32),
              "H32 32K + 8 x 1K: whole sequences, 64 rows");
static_assert(host_shape_wins(known_chains(k32KPlus8x1K, {132, 128, 128, 64}, 16), {132, 128, 128, 64}, 16),
              "H16 32K + 8 x 1K: 64-chunk segments");
static_assert(host_shape_wins(known_chains(k32KPlus8x1K, {132, 64, 128, 64}, 8), {132, 64, 128, 64}, 8),
              "H8 32K + 8 x 1K: 64-chunk segments");
static_assert(host_shape_wins(known_chains(k32KPlus8x1K, {132, 64, 128, 32}, 4), {132, 64, 128, 32}, 4),
              "H4 32K + 8 x 1K: 32-chunk segments");
// whole sequences at the host's 128 rows: kept where the work is spread, not for one long member
static_assert(host_shape_wins(known_chains(kMixed, {132, 128, 128, 0}, 64), {132, 128, 128, 0}, 64),
              "H64 mixed: whole, 128 rows");
static_assert(host_shape_wins(known_chains(kMixed, {132, 128, 128, 0}, 96), {132, 128, 128, 0}, 96),
              "H96 mixed: whole, 128 rows");
static_assert(!host_shape_wins(known_chains(k32KPlus8x1KPlus5, {132, 128, 128, 0}, 32), {132, 128, 128, 0}, 32),
              "H32 32K + 8 x 1K + 5 tokens: whole, 64 rows");

}  // namespace kdakit::sm90::prefill
