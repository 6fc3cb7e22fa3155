// The prefill workspace: what the preparation kernel (token-parallel, one CTA per chunk and
// value head) hands to the recurrence kernel (chunk-serial, one CTA per sequence, value head
// and value slice). Host and device code both include this header; it has no CUDA includes.
//
// Chunked form (chunk C = kChunk tokens, rows r, s in [0, C'), C' <= C the chunk's length;
// b2_r = log2(e) * (gamma_0 + ... + gamma_r) per key channel, the base-2 running gate sum):
//   Qt[r, i] = scale * exp2(b2_r[i]) * qn_r[i]               (qn: q after the optional L2 norm)
//   Kh[r, i] = exp2(b2_{C'-1}[i] - b2_r[i]) * kn_r[i]   (stored as bf16 hi + lo: Kh_lo = bf16(Kh - hi))
//   L[r, s]  = sum_i kn_r[i] kn_s[i] exp2(b2_r[i] - b2_s[i])       s < r
//   M[r, s]  = sum_i scale qn_r[i] kn_s[i] exp2(b2_r[i] - b2_s[i]) s <= r, else 0
//   T        = (I + diag(beta) L)^-1
//   W        = T diag(beta) Kt,   Kt[r, i] = exp2(b2_r[i]) kn_r[i]
//   U0       = T diag(beta) V
//   decay[i] = exp2(b2_{C'-1}[i])
// and the recurrence kernel, per chunk, with S0 the state entering the chunk (K x V):
//   U = U0 - W S0,   O = Qt S0 + M U,   S = diag(decay) S0 + Kh^T U.
// NOTE: Kh's lo part is there for the state's accuracy: with Kh rounded to bf16 the fp32 final
// state of slow-decay inputs drifts to ~3.2e-3 relative L2 (bar 2e-3;
// docs/design/20261201-prefill-segments.md, the rounding model).
// Rows r >= C' of every per-token array, and M's columns s >= C', are written as zeros, so the
// recurrence kernel may always run full 64-row products.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kdakit::sm90::prefill {

inline constexpr int kChunk = 64;     // tokens per chunk
inline constexpr int kHeadDim = 128;  // K = V = 128 is the built shape
// Batches of at most this many sequences get their recurrence CTAs launched longest sequence
// first (the plan's seq_order; plan_kernel.cuh ranks the lengths in one CTA of 512 threads).
// NOTE: the recurrence's grid has the sequence slowest, so in index order a long last member
// starts after the others' CTAs have taken the SMs and runs alone at the end: H96 mixed
// [1300, 547, 2048, 963, 271, 3063] at 128 value rows is 12,576 chunk-steps (~0.40 ms over 132
// SMs at ~4.2 us a step) plus the 3063-token member's 48 steps (~0.2 ms) started last.
inline constexpr int64_t kOrderedSeqs = 512;

// One block per (chunk c, value head h), at
//   chunk_blocks + (size_t(c) * HV + h) * kChunkBlockBytes
// with c the global chunk index (sequence n's chunks are [chunk_offsets[n], chunk_offsets[n+1])).
// All arrays row-major, row = token r of the chunk.
// Qt, W, Kh and M are fp16 on an fp16 block (WorkspacePlan::f16_block), whose Kh lo is left
// unwritten.
struct ChunkBlockLayout {
  static constexpr size_t kQtOffset = 0;                                    // bf16 [64][128]
  static constexpr size_t kWOffset = kQtOffset + kChunk * kHeadDim * 2;      // bf16 [64][128]
  static constexpr size_t kKhOffset = kWOffset + kChunk * kHeadDim * 2;      // bf16 [64][128]
  static constexpr size_t kKhLoOffset = kKhOffset + kChunk * kHeadDim * 2;   // bf16 [64][128]
  static constexpr size_t kMOffset = kKhLoOffset + kChunk * kHeadDim * 2;    // bf16 [64][64]
  static constexpr size_t kU0Offset = kMOffset + kChunk * kChunk * 2;        // fp32 [64][128]
  static constexpr size_t kDecayOffset = kU0Offset + kChunk * kHeadDim * 4;  // fp32 [128]
  static constexpr size_t kBytes = kDecayOffset + kHeadDim * 4;
};
inline constexpr size_t kChunkBlockBytes = ChunkBlockLayout::kBytes;  // 107008 = 836 * 128
static_assert(kChunkBlockBytes % 128 == 0, "chunk blocks must stay 128-byte aligned for TMA");

// The plan region at the start of the workspace (written by the plan kernel, read by both):
//   int32 chunk_offsets[N + 1]        first global chunk of each sequence; [N] = total chunks
//   int32 chunk_seq[max_chunks]       sequence of each global chunk (-1 past the total)
//   int64 seq_start[N]                first token (row offset within batch row / packed row)
//   int32 seq_len[N]                  tokens of each sequence (0 for an empty one)
//   int32 longest                     the largest seq_len (0 for N = 0), for a routed call (Route)
//   int32 host_shape                  a shape-routed call's device-side choice (ShapeRoute): 1
//                                     the host's recurrence shape runs, 0 whole sequences on
//                                     64-row CTAs; 1 when the call is not shape-routed
//   int32 seq_order[N]                the sequences in the recurrence's launch order: by length,
//                                     longest first (ties by index), when N <= kOrderedSeqs;
//                                     the identity for more sequences
// followed, 128-byte aligned, by the chunk blocks and, when the call splits its sequences into
// segments (segment_chunks > 0), by the segment area.
// max_chunks bounds the total for any cu_seqlens of this T and N without reading it:
//   fixed batch: B * ceil(T / 64);  packed: ceil(T / 64) + N.
//
// ---- segments (few heads, long sequences; docs/design/20261201-prefill-segments.md)
// A sequence of nc chunks is cut into nseg = max(1, ceil(nc / Ls)) segments of Ls =
// segment_chunks chunks (the last one shorter). Over a segment the state map is affine,
//   S_end^T = S_start^T Phi + Psi      (S^T: V x K, Phi: K x K, Psi: V x K),
// Psi the end state from a zero start, Phi the end state from S_start^T = I with U0 = 0. The
// summary pass writes (Psi, Phi) of every segment but the last, except that segment 0's Psi
// starts from the caller's initial state (it is S_1; there is no Phi_0); the combine pass chains
// them into each later segment's start state, and the recurrence reruns every segment from its
// start state.
// Slot of full segment s of sequence n (global chunks [c0 + s Ls, c0 + (s + 1) Ls), c0 =
// chunk_offsets[n]): the one multiple of Ls in that range, over Ls, so slots of different
// segments never collide and slot < max_chunks / Ls + 1. Per (slot, value head), kSegmentBytes:
//   Psi  fp32 [128][128] V-first; the combine pass overwrites it with the start state of
//        segment s + 1
//   Phi  bf16 hi [128][128] then lo [128][128], each as two column halves [2][128 rows][64]
//        with 16-byte chunk c of row r at c ^ (r % 8) (the combine pass's ldmatrix image);
//        slot(n, 0)'s holds segment 0's start state instead (fp32 [128][128], the summary
//        pass's copy of the caller's initial state), so that no recurrence CTA reads the
//        caller's buffer, which the last segment's CTA may overwrite in place.
struct SegmentLayout {
  static constexpr size_t kPsiOffset = 0;
  static constexpr size_t kPhiHiOffset = kPsiOffset + kHeadDim * kHeadDim * 4;
  static constexpr size_t kPhiLoOffset = kPhiHiOffset + kHeadDim * kHeadDim * 2;
  static constexpr size_t kBytes = kPhiLoOffset + kHeadDim * kHeadDim * 2;  // 128 KiB
};
inline constexpr size_t kSegmentBytes = SegmentLayout::kBytes;

// Slot of full segment s of a sequence whose chunks start at global chunk c0 (segments of ls
// chunks; host and device).
constexpr int64_t segment_slot(int64_t c0, int64_t s, int64_t ls) { return (c0 + s * ls + ls - 1) / ls; }

// A routed call: a packed batch whose path only its lengths decide (no max_seqlen hint, an
// average between the tile kernel's bound for unknown lengths and its bound for known ones;
// dispatch.cu, route_on_device) launches both the tile kernel and the two-kernel path, and the
// plan's `longest` picks one on the device: the tile kernel does the work iff longest <= bound,
// the plan-reading kernels of the two-kernel path (prep, summaries, combine, recurrence) iff not;
// the other side's CTAs exit before reading anything else. longest == nullptr (every other call):
// every kernel runs.
// A shape-routed call: a packed batch of several sequences whose recurrence shape (segments or
// whole sequences, value rows per CTA) the host's cost model picks (recurrence/launch.h,
// choose_segments) as anything but whole sequences on 64-row CTAs. That model must assume any one
// sequence may hold all T tokens; with one long member among short ones it can be far off (H32
// 32K + 8 x 1K: 256-chunk segments, or whole sequences on 128 rows for 5 tokens more). The call
// also launches the whole-sequence recurrence on 64-row CTAs after the host's shape, and the plan
// kernel, which sees the lengths, writes `host_shape` from the known-length cost model on the
// actual chains (host_shape_wins): 1, the host's shape (its summaries, combine and recurrence)
// does the work; 0, the whole-sequence 64-row recurrence does. The prep kernel runs either way.
// Route::host_shape == nullptr (every other call): no such choice.
struct Route {
  const int32_t* longest;
  int32_t bound;
  const int32_t* host_shape;  // the plan's choice of a shape-routed call, or nullptr
  int32_t host_side;          // 1: a kernel of the host's shape; 0: the 64-row whole-sequence recurrence
};

// What the plan kernel needs for a shape-routed call's choice (all zero otherwise): the host's
// shape (segment_chunks 0 for whole sequences) and the SM count it assumed.
struct ShapeRoute {
  int32_t num_sms;  // > 0: a shape-routed call
  int32_t rows;     // value rows per CTA of the host shape's recurrence
  int32_t summary_rows;
  int32_t segment_chunks;
};

struct WorkspacePlan {
  int64_t num_seqs;
  int64_t max_chunks;
  int32_t num_v_heads;
  size_t chunk_offsets_offset;
  size_t chunk_seq_offset;
  size_t seq_start_offset;
  size_t seq_len_offset;
  size_t longest_offset;
  size_t host_shape_offset;  // in longest's 16-byte slot
  size_t seq_order_offset;
  size_t chunk_blocks_offset;
  int32_t segment_chunks;     // Ls; 0 = whole sequences (no segment area)
  int32_t max_segments;       // segments of the longest possible sequence (1 without segments)
  int64_t num_segment_slots;  // max_chunks / Ls + 1
  size_t segments_offset;
  size_t total_bytes;
  int32_t route_bound;  // >= 0: a routed call (Route), set by the dispatcher; -1 otherwise
  // Qt, W, Kh and M of the chunk blocks as fp16, and no Kh lo (the recurrence's fp16 products,
  // docs/design/20261204-prefill-fp16-recurrence.md); set by the dispatcher. false: bf16, Kh hi + lo.
  bool f16_block;
  // A shape-routed call (Route; set by the dispatcher, and by prefill_plan for its plan kernel):
  // num_sms > 0. other_shape: the plan of its 64-row whole-sequence recurrence (the dispatcher's
  // copy for that launch); false for the host shape's kernels and every other call.
  ShapeRoute shape_route;
  bool other_shape;
  // A fixed batch (T > 0) or a packed single sequence (not routed) on the two-kernel path whose
  // plan entries the prep kernel writes (prep/config.h, PrepParams), so that no plan kernel runs
  // (dispatch.cu); set by the dispatcher.
  bool plan_by_prep;
};

inline constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

inline WorkspacePlan make_workspace_plan(int64_t batch, int64_t seqlen, int64_t num_seqs,
                                         bool packed, int32_t num_v_heads, int32_t segment_chunks = 0) {
  WorkspacePlan w{};
  w.num_seqs = num_seqs;
  const int64_t chunks_per_row = (seqlen + kChunk - 1) / kChunk;
  w.max_chunks = packed ? chunks_per_row + num_seqs : batch * chunks_per_row;
  w.num_v_heads = num_v_heads;
  size_t off = 0;
  w.chunk_offsets_offset = off;
  off = align_up(off + sizeof(int32_t) * size_t(num_seqs + 1), 16);
  w.chunk_seq_offset = off;
  off = align_up(off + sizeof(int32_t) * size_t(w.max_chunks), 16);
  w.seq_start_offset = off;
  off = align_up(off + sizeof(int64_t) * size_t(num_seqs), 16);
  w.seq_len_offset = off;
  off = align_up(off + sizeof(int32_t) * size_t(num_seqs), 16);
  w.longest_offset = off;
  w.host_shape_offset = off + sizeof(int32_t);
  off = align_up(off + 2 * sizeof(int32_t), 16);
  w.seq_order_offset = off;
  off = align_up(off + sizeof(int32_t) * size_t(num_seqs), 128);
  w.chunk_blocks_offset = off;
  off += size_t(w.max_chunks) * size_t(num_v_heads) * kChunkBlockBytes;
  // a sequence has at most ceil(T / 64) chunks in either form
  w.segment_chunks = segment_chunks > 0 ? segment_chunks : 0;
  w.max_segments = w.segment_chunks > 0 ? int32_t((chunks_per_row + w.segment_chunks - 1) / w.segment_chunks) : 1;
  if (w.max_segments < 1) w.max_segments = 1;
  w.num_segment_slots = w.segment_chunks > 0 ? w.max_chunks / w.segment_chunks + 1 : 0;
  w.segments_offset = off;
  w.total_bytes = off + size_t(w.num_segment_slots) * size_t(num_v_heads) * kSegmentBytes;
  w.route_bound = -1;
  return w;
}

// The kernels' view of a plan's routes (longest == nullptr unless the call is routed to the tile
// kernel or the two-kernel path, host_shape == nullptr unless it is shape-routed).
inline Route route_of(const WorkspacePlan& w, const void* workspace) {
  const auto* base = static_cast<const uint8_t*>(workspace);
  Route r{nullptr, 0, nullptr, 0};
  if (w.route_bound >= 0) {
    r.longest = reinterpret_cast<const int32_t*>(base + w.longest_offset);
    r.bound = w.route_bound;
  }
  if (w.shape_route.num_sms > 0) {
    r.host_shape = reinterpret_cast<const int32_t*>(base + w.host_shape_offset);
    r.host_side = w.other_shape ? 0 : 1;
  }
  return r;
}

#if defined(__CUDACC__)
// Whether this CTA's side of a routed call does the work (uniform over the grid: one load of a
// value the plan kernel wrote in an earlier launch).
__device__ __forceinline__ bool tile_side_runs(const Route& r) { return r.longest == nullptr || *r.longest <= r.bound; }
__device__ __forceinline__ bool chunk_side_runs(const Route& r) { return r.longest == nullptr || *r.longest > r.bound; }
// The summaries, combine and recurrence kernels: the two-kernel side, and this kernel's side of a
// shape-routed call (the prep kernel serves both shapes: chunk_side_runs). Any value the word may
// hold picks exactly one side (0 the 64-row whole-sequence recurrence, else the host's shape).
__device__ __forceinline__ bool recurrence_side_runs(const Route& r) {
  return chunk_side_runs(r) && (r.host_shape == nullptr || (*r.host_shape != 0) == (r.host_side != 0));
}
#endif

}  // namespace kdakit::sm90::prefill
