// kda_prefill_recurrence_sm90_kernel: the chunk-serial half of the chunked KDA prefill.
//
// Math (per sequence n, value head h, chunk of 64 tokens; workspace.h defines the inputs):
//   S^T is the transposed state (V x K, value rows v, key channels k), kept in fp32 registers.
//   U^T = U0^T - S0^T W^T                      [V x 64]   (the chain's first product)
//   O^T = S0^T Qt^T + U^T M^T                  [V x 64]   (output, off the chain)
//   S^T = S0^T diag(decay) + U^T Kh            [V x K]    (the chain's second product)
// with Qt, W, Kh (hi and lo) [64 tokens][128 keys] bf16, M [64][64] bf16 (lower triangular), U0
// [64][128] fp32 and decay [128] fp32 read from the chunk block (c, h) of the workspace. S0^T
// and U^T are rounded to bf16 only as MMA operands, each as bf16 hi + lo (S0^T against W and Qt,
// U^T against M and Kh); the master state stays fp32 in registers from the first chunk to the last,
// whatever the storage dtype of the initial/final state. (On an fp16 block, which only the wgmma
// kernel reads, Qt, W, Kh and M are fp16, there is no Kh lo, and S0^T and U^T take one fp16 pass
// each: wgmma.cuh.)
//
// Which kernel: CTAs of 64 and 128 value rows run the wgmma version (wgmma.cuh, same math,
// workspace, stages and grid; measured 14% faster at 128 rows, H96 fixed recurrence 0.521 against
// 0.606 ms, and never slower on the prep-timing cases), and so does every summary pass of
// segmented prefill (64 or 128 rows; session 11: H4 T=32K 110 -> ~80 us); this mma.sync kernel
// runs the 16- and 32-row CTAs.
//
// Grid: one CTA per (sequence n, value head h, value slice z), flattened with z fastest; the
// CTA owns value rows [z * kValueRows, (z + 1) * kValueRows). Value rows never mix, so the split
// is exact, and each CTA reads its slice of the initial state before it writes the same slice
// of the final state: in-place state updates are exact.
//
// Warps: kConsumerWarps = kValueRows / 16, all alike. Each owns 16 value rows x 128 key
//   channels of S^T as 16 m16n8 fp32 accumulator tiles (64 registers per thread). The
//   accumulator layout of two neighbouring n-tiles is the A-operand layout of one k16 step, so
//   S0^T and U^T feed the next product from registers. B operands come from shared memory
//   through ldmatrix (.trans for Kh, whose rows are the k dimension of U^T Kh). Thread 0 also
//   issues the TMA loads.
// Pipeline: stage s = j % 2 holds chunk j; full[s] completes when its bytes landed (TMA
// transaction count), empty[s] when every thread has read it; thread 0 then loads chunk j + 2
// into it, so each load has a whole chunk of compute to land. Per chunk and warp: 128 + 128 MMAs
// (W and Qt against S0 as hi + lo), 192 (Kh hi against U hi + lo, Kh lo against U hi), 40
// (M against U as hi + lo, the upper 16x16 blocks of the lower-triangular M skipped).
// NOTE: the two extra passes (S0 lo against W, U against Kh lo) hold the fp32 final state of
// slow-decay inputs under 2e-3 relative L2 (3.2e-3 without them; the rounding model in
// docs/design/20261201-prefill-segments.md puts the pair at 1.8-1.9e-3, and each alone above 2e-3).
// S0 lo against Qt (session 7) takes ~5% off the output error of lower-bound gates, whose
// output sat at the 4e-3 bar on some seeds (4.19e-3 on a 90-token case).
//
// Shared memory (config.h): per stage Qt/W/Kh/Kh lo 64 KiB + M 8 KiB (128B-swizzled, so the 8
// rows of each ldmatrix hit distinct banks) + U0 slice [64][kValueRows] fp32 (each warp stages
// its output in its own U0 columns once it has read them) + decay; the barriers.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/device_setup.cuh"
#include "cuda/common/pdl_launch.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sm90/prefill/recurrence/config.h"
#include "cuda/sm90/prefill/recurrence/launch.h"
#include "cuda/sm90/prefill/common/ptx.cuh"
#include "cuda/sm90/prefill/common/state_io.cuh"
#include "cuda/sm90/prefill/common/tensor_map.h"

namespace kdakit::sm90::prefill::recurrence {

using common::encode_block_map;
using common::load_state;
using common::state_at;
using common::store_state;

// Kernel-side parameters, derived from PrefillParams by the launcher (the state fields in the
// common base).
struct KernelParams : common::StateParams {
  const int32_t* chunk_offsets;  // [N + 1] plan region
  const int64_t* seq_start;      // [N]
  const int32_t* seq_len;        // [N]
  const int32_t* seq_order;      // [N] launch order (longest first), or null: index order
  const uint8_t* chunk_blocks;   // [max_chunks, HV] blocks of kChunkBlockBytes
  int64_t max_chunks;
  int32_t num_v_heads;
  bool packed;                   // cu_seqlens given: every sequence lives in batch row 0

  __nv_bfloat16* o;              // [B, T, HV, V]
  int64_t stride_o_b, stride_o_t, stride_o_h;
  bool o_vec16;                  // o rows are 16-byte aligned: 16-byte stores
  bool o_pairs;                  // two neighbouring value channels are one aligned 4-byte store (wgmma.cuh)

  // segments (workspace.h): segment_chunks = 0 runs whole sequences (max_segments = 1)
  uint8_t* segments;              // the segment area
  int64_t num_segment_slots;
  int32_t segment_chunks;
  int32_t max_segments;           // grid extent of the segment index
  // Launched with PDL right after the combine pass (segments, wgmma kernel): the first stages'
  // loads go out before griddepcontrol.wait, which the consumers pass before the start states
  // (wgmma.cuh). Everything read before it was written two or more grids back (plan, chunk blocks).
  bool stages_before_wait;
};

// The sequence of launch rank i (the grid has the sequence slowest): the plan's seq_order, so
// that the longest sequences' CTAs start first (workspace.h, kOrderedSeqs).
__device__ __forceinline__ int sequence_at(const KernelParams& p, int i) {
  return p.seq_order != nullptr ? p.seq_order[i] : i;
}

__device__ __forceinline__ uint8_t* segment_at(const KernelParams& p, int64_t slot, int h) {
  return p.segments + (size_t(slot) * p.num_v_heads + h) * kSegmentBytes;
}

// Byte offset of element (row, col) of a [128][128] bf16 Phi image (two swizzled column halves).
__device__ __forceinline__ uint32_t phi_offset(int row, int col) {
  return uint32_t(col >> 6) * (kHeadDim * 128u) + uint32_t(row) * 128u +
         uint32_t((((col >> 3) & 7) ^ (row & 7)) << 4) + uint32_t(col & 7) * 2u;
}

struct TmaParams {
  CUtensorMap qwk;  // bf16 [blocks][256 rows = Qt|W|Kh|Kh lo][128], box 64 cols x 256 rows, 128B swizzle
                    // (an fp16 block: 192 rows, Qt|W|Kh)
  CUtensorMap m;    // bf16 (fp16) [blocks][64][64], box 64 x 64, 128B swizzle
  CUtensorMap u0;   // fp32 [blocks][64][128], box kValueRows x 64, no swizzle (16, 32 rows), or
                    // 32 x 64, 128B swizzle (64, 128 rows: Config::kU0Swizzled)
  CUtensorMap wkh;  // summaries: the qwk map with a box of rows 64 .. 255 (W|Kh|Kh lo; fp16: .. 191), no Qt
};

// ---- swizzled shared-memory addresses ---------------------------------------------------------
// Qt/W/Kh/Kh lo tile: two halves [256 rows][64 cols] bf16; 16-byte chunk c of row r sits at
// chunk c ^ (r % 8) (the TMA 128B swizzle; tile base 1024-byte aligned).
__device__ __forceinline__ uint32_t qwk_addr(uint32_t base, int row, int chunk16) {
  constexpr uint32_t kHalfBytes = 4 * kChunk * 128;
  return base + uint32_t(chunk16 >> 3) * kHalfBytes + uint32_t(row) * 128u +
         uint32_t(((chunk16 & 7) ^ (row & 7)) << 4);
}
__device__ __forceinline__ uint32_t m_addr(uint32_t base, int row, int chunk16) {
  return base + uint32_t(row) * 128u + uint32_t(((chunk16 & 7) ^ (row & 7)) << 4);
}
// Byte offset of U0 element (token tok, value column col of the CTA's slice) in the stage's
// swizzled U0 tile (Config::kU0Swizzled: column blocks of 32, 128-byte rows, 16-byte chunk c at
// c ^ (tok % 8)): the accumulator read of a warp (tokens 2t + {0, 1}, columns g) hits 32 distinct
// banks. Tokens 8 n + tok lie 1024 n bytes past token tok < 8 (same swizzle phase), so the
// kernels form the four offsets of (tok in {2t, 2t + 1}, col in {c, c + 8}) once (below).
__device__ __forceinline__ uint32_t u0_offset(int tok, int col) {
  return uint32_t(col >> 5) * (kChunk * 128u) + uint32_t(tok) * 128u + uint32_t((((col >> 2) & 7) ^ (tok & 7)) << 4) +
         uint32_t(col & 3) * 4u;
}
// The four offsets of a thread's accumulator fragment: off[hr][par] for token 2 quad + par and
// value column col + 8 hr; tokens 8 n + 2 quad + par are n * 1024 bytes further.
__device__ __forceinline__ void u0_fragment_offsets(uint32_t (&off)[2][2], int quad, int col) {
  #pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    off[hr][0] = u0_offset(2 * quad, col + 8 * hr);
    off[hr][1] = u0_offset(2 * quad + 1, col + 8 * hr);
  }
}
// Byte offset of output element (token tok, value column col < 16) in a warp's staging band: U0
// row tok (kRowBytes apart), the warp's 64 bytes of it, 16-byte piece (col / 8 + tok / 2) mod 4
// of those. NOTE: the 4 tokens of one fragment store (2 quad + {0, 1} apart) then use 4 distinct
// pieces: rows kRowBytes apart share banks whenever kRowBytes is a multiple of 128.
template <int kRowBytes>
__device__ __forceinline__ uint32_t o_stage_offset(int tok, int col) {
  return uint32_t(tok) * kRowBytes + uint32_t(((col >> 3) * 2 + (tok >> 1)) & 3) * 16u + uint32_t(col & 7) * 2u;
}
// The same in a swizzled 32-column U0 tile (32 value rows), from the tile's base: piece p of the
// band of warp w in row tok is the 16-byte chunk that holds U0 columns 16 w + 4 p .. + 3 there.
__device__ __forceinline__ uint32_t o_stage_offset_swizzled(int warp, int tok, int col) {
  const uint32_t piece = uint32_t(((col >> 3) * 2 + (tok >> 1)) & 3);
  return uint32_t(tok) * 128u + (((4u * uint32_t(warp) + piece) ^ uint32_t(tok & 7)) << 4) + uint32_t(col & 7) * 2u;
}

// ---- pieces shared with the wgmma version (wgmma.cuh) -----------------------------------------
// The CTA's share of sequence n: chunks [j_begin, j_begin + num_chunks) of segment seg (nseg
// segments of ls chunks; the whole sequence without segments).
// NOTE: plan values are device data: clamped so that no load leaves the workspace.
struct SegmentWork {
  int chunk_begin, ls, nseg, j_begin, num_chunks;
};
__device__ __forceinline__ SegmentWork segment_work(const KernelParams& p, int n, int seg) {
  int chunk_begin = p.chunk_offsets[n];
  int seq_chunks = p.chunk_offsets[n + 1] - chunk_begin;
  chunk_begin = max(0, min(chunk_begin, int(p.max_chunks)));
  seq_chunks = max(0, min(seq_chunks, int(p.max_chunks) - chunk_begin));
  SegmentWork w;
  w.chunk_begin = chunk_begin;
  w.ls = p.segment_chunks > 0 ? p.segment_chunks : max(seq_chunks, 1);
  w.nseg = max(1, (seq_chunks + w.ls - 1) / w.ls);
  w.j_begin = seg * w.ls;
  w.num_chunks = min(seq_chunks - w.j_begin, w.ls);
  return w;
}

// The TMA loads of chunk block `block` into one stage (U0 columns v0 ..), completing on `full`.
// kOutput = false (summary passes: no output) leaves Qt and M out (the wkh map's box starts at
// W's row 64, a 1024-byte multiple, so the swizzle is the one the readers expect); with_u0 =
// false (Phi, whose U0 is zero) U0; kKhLo = false (an fp16 block, whose maps' boxes end at Kh)
// Kh lo, whose rows of the stage stay unwritten.
template <class Smem, bool kOutput = true, bool kKhLo = true>
__device__ __forceinline__ void issue_block_loads(uint8_t* stage, uint64_t* full, const TmaParams& tma,
                                                  const KernelParams& p, int block, int v0, bool with_u0 = true) {
  constexpr uint32_t kQtBytes = 2 * kChunk * 128;  // Qt's (or Kh lo's) 64 rows of both column halves
  ptx::mbarrier_arrive_expect_tx(full, Smem::kStageTxBytes - (kOutput ? 0u : uint32_t(Smem::kMBytes) + kQtBytes) -
                                           (kKhLo ? 0u : kQtBytes) - (with_u0 ? 0u : uint32_t(Smem::kU0Bytes)));
  if constexpr (kOutput) {
    ptx::tma_load_3d(stage + Smem::kQwkOffset, &tma.qwk, full, 0, 0, block);
    ptx::tma_load_3d(stage + Smem::kQwkOffset + Smem::kQwkBytes / 2, &tma.qwk, full, 64, 0, block);
    ptx::tma_load_3d(stage + Smem::kMOffset, &tma.m, full, 0, 0, block);
  } else {
    ptx::tma_load_3d(stage + Smem::kQwkOffset + kQtBytes / 2, &tma.wkh, full, 0, kChunk, block);
    ptx::tma_load_3d(stage + Smem::kQwkOffset + Smem::kQwkBytes / 2 + kQtBytes / 2, &tma.wkh, full, 64, kChunk, block);
  }
  if (with_u0) {
#pragma unroll
    for (int b = 0; b < Smem::kU0Boxes; ++b)
      ptx::tma_load_3d(stage + Smem::kU0Offset + b * Smem::kU0BoxBytes, &tma.u0, full,
                       v0 + b * Smem::kU0BoxCols, 0, block);
  }
  ptx::bulk_load(stage + Smem::kDecayOffset,
                 p.chunk_blocks + size_t(block) * kChunkBlockBytes + ChunkBlockLayout::kDecayOffset,
                 uint32_t(Smem::kDecayBytes), full);
}
template <bool kOutput = true>
__device__ __forceinline__ void prefetch_block_maps(const TmaParams& tma) {
  if constexpr (kOutput) {
    ptx::prefetch_tensormap(&tma.qwk);
    ptx::prefetch_tensormap(&tma.m);
  } else {
    ptx::prefetch_tensormap(&tma.wkh);
  }
  ptx::prefetch_tensormap(&tma.u0);
}

// The state entering the CTA's first chunk (value rows vrow, vrow + 8 in the fragment layout):
// with segments the start state in the workspace (segment 0's the summary pass's copy over Phi
// of slot(n, 0), later ones over Psi of the previous segment's slot: segment 1's the summary
// pass's Psi_0, the rest the combine pass's), else the caller's initial state, or zeros.
__device__ __forceinline__ void load_start_state(float (&state)[16][4], const KernelParams& p, int n, int h, int seg,
                                                 const SegmentWork& w, int vrow, int quad) {
  if (w.nseg >= 2) {
    const int64_t slot = segment_slot(w.chunk_begin, seg == 0 ? 0 : seg - 1, w.ls);
    const uint8_t* area = segment_at(p, slot, h) + (seg == 0 ? SegmentLayout::kPhiHiOffset : SegmentLayout::kPsiOffset);
    load_state(state, area, vrow, quad, common::segment_state_view());
  } else {
    common::load_initial_state(state, p, n, h, vrow, quad);
  }
}

// Thread 0, before the CTA's first barrier: the stage barriers (full: one arrival plus the TMA
// bytes; empty: one arrival per thread of the CTA) and the last-segment flag.
// NOTE: every thread arrives on empty for its own reads. With one arrival per warp after a
// __syncwarp, ptxas drops the __syncwarp of a converged warp (a NOP in the SASS), and
// compute-sanitizer's racecheck then reports lanes 1-31's stage reads as racing the refill.
template <int kStages>
__device__ __forceinline__ void init_pipeline(uint64_t* full, uint64_t* empty, int consumer_threads,
                                              volatile int* last_segment_flag, bool last_segment) {
  #pragma unroll
  for (int s = 0; s < kStages; ++s) {
    ptx::mbarrier_init(&full[s], 1);
    ptx::mbarrier_init(&empty[s], consumer_threads);
  }
  *last_segment_flag = last_segment ? 1 : 0;
  ptx::fence_barrier_init();
}

// The chunk state before chunk jg of the sequence (prefix caching), every chunks_per_state chunks.
__device__ __forceinline__ void store_chunk_state(const float (&state)[16][4], const KernelParams& p, int64_t base,
                                                  int jg, int chunks_per_state, int h, int vrow, int quad) {
  if (jg % chunks_per_state != 0) return;
  const int64_t off = common::chunk_state_offset(p, base + jg / chunks_per_state, h);
  if (off >= 0)
    store_state(state, state_at(p.chunk_states, off, p.chunk_bf16), vrow, quad,
                common::StateView{p.k_first, p.chunk_bf16, p.chunk_pairs});
}

// Chunk j of the CTA's range (blocks (first_chunk + j) * HV + h) into stage j % kStages, and,
// by thread 0 before the chunk loop, the maps into cache and the first kStages chunks in flight.
template <class Smem, int kStages, bool kOutput = true, bool kKhLo = true>
__device__ __forceinline__ void issue_chunk_at(uint8_t* smem, uint64_t* full, const TmaParams& tma,
                                               const KernelParams& p, int first_chunk, int h, int v0, int j,
                                               bool with_u0 = true) {
  const int s = j % kStages;
  issue_block_loads<Smem, kOutput, kKhLo>(smem + s * Smem::kStageBytes, &full[s], tma, p,
                                  (first_chunk + j) * p.num_v_heads + h, v0, with_u0);
}
template <class Smem, int kStages, bool kOutput = true, bool kKhLo = true>
__device__ __forceinline__ void issue_first_chunks(uint8_t* smem, uint64_t* full, const TmaParams& tma,
                                                   const KernelParams& p, int first_chunk, int h, int v0,
                                                   int num_chunks, bool with_u0 = true) {
  if (num_chunks <= 0) return;
  prefetch_block_maps<kOutput>(tma);
  for (int j = 0; j < min(kStages, num_chunks); ++j)
    issue_chunk_at<Smem, kStages, kOutput, kKhLo>(smem, full, tma, p, first_chunk, h, v0, j, with_u0);
}

// ---- the kernel -------------------------------------------------------------------------------
// The recurrence over one segment (the whole sequence without segments). The summary pass of
// segmented prefill runs on the wgmma kernel (wgmma.cuh).
template <int kValueRows>
__global__ void __launch_bounds__(Config<kValueRows>::kThreads) __maxnreg__(Config<kValueRows>::kMaxRegisters)
    kda_prefill_recurrence_sm90_kernel(const __grid_constant__ KernelParams p,
                                       const __grid_constant__ TmaParams tma) {
  using Cfg = Config<kValueRows>;
  using Smem = typename Cfg::SharedMemoryPlan;
  constexpr int kStages = Cfg::kStages;

  extern __shared__ uint8_t smem_raw[];
  // NOTE: rounded up by pointer arithmetic on smem_raw, not through an integer: the compiler then
  // still knows every access below is to shared memory (an integer round trip made the u0,
  // decay and output-tile accesses generic loads and stores).
  uint8_t* smem = smem_raw + ((1024u - (ptx::smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::kBarrierOffset);
  uint64_t* empty = full + kStages;
  if (!recurrence_side_runs(p.route)) {  // a routed call whose other side does the work
    kdakit::cuda::ptx::griddep_exit_after_previous();  // launched with PDL (launch, kernel.cuh)
    return;
  }
  kdakit::cuda::ptx::griddep_wait();  // launched with PDL: the chunk blocks (at once otherwise)

  // NOTE: the slices of one (sequence, head) are neighbours in launch order, so they run at the
  // same time and the second one reads the shared Qt/W/Kh/M of each chunk from L2.
  // Grid order (fastest first): slice z, segment, value head, sequence.
  const int64_t cta = blockIdx.x;
  const int z = int(cta % Cfg::kSlices);
  const int64_t rest = cta / Cfg::kSlices;
  const int seg = int(rest % p.max_segments);
  const int h = int((rest / p.max_segments) % p.num_v_heads);
  const int n = sequence_at(p, int(rest / p.max_segments / p.num_v_heads));
  const int v0 = z * kValueRows;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  // This CTA's chunks of the sequence: segment seg; none past the last (the whole grid's early
  // exits are uniform per CTA, before any barrier).
  const SegmentWork work = segment_work(p, n, seg);
  const int chunk_begin = work.chunk_begin, nseg = work.nseg;
  if (seg >= nseg) return;
  // NOTE: whether this is the last segment goes to shared memory and is read back after the
  // chunk loop: kept in a register (nseg) through the loop it was the one value spilled at 16
  // and 32 value rows.
  volatile int* last_segment_flag = reinterpret_cast<volatile int*>(smem + Smem::kFlagsOffset);
  const int j_begin = work.j_begin;
  const int num_chunks = work.num_chunks;

  if (threadIdx.x == 0) init_pipeline<kStages>(full, empty, Cfg::kThreads, last_segment_flag, seg == nseg - 1);
  __syncthreads();

  // Issues the TMA loads of chunk j into stage j % kStages (one lane of warp 0).
  auto issue_chunk = [&](int j) { issue_chunk_at<Smem, kStages>(smem, full, tma, p, chunk_begin + j_begin, h, v0, j); };
  const bool is_issuer = threadIdx.x == 0;
  if (is_issuer) issue_first_chunks<Smem, kStages>(smem, full, tma, p, chunk_begin + j_begin, h, v0, num_chunks);

  // ================================ every warp: 16 value rows ================================
  const int group = lane / 4;
  const int quad = lane % 4;
  const int vrow = v0 + warp * 16 + group;  // value row of c0/c1 (c2/c3: vrow + 8)

  float state[16][4];
  load_start_state(state, p, n, h, seg, work, vrow, quad);

  const int seq_len = p.seq_len[n];
  const int64_t seq_start = p.seq_start[n];
  __nv_bfloat16* o_seq = p.o + (p.packed ? 0 : int64_t(n) * p.stride_o_b) + seq_start * p.stride_o_t +
                         int64_t(h) * p.stride_o_h + v0 + warp * 16;

  const int chunks_per_state = p.chunk_states != nullptr ? p.chunk_state_interval / kChunk : 0;
  const bool write_chunk_states = chunks_per_state > 0;
  const int64_t chunk_state_base = write_chunk_states ? common::chunk_state_base_of(p, n, lane) : 0;

  // Per-lane ldmatrix row/column parts (see ptx.cuh for the fragment layouts).
  //   non-transposed B ([n][k] in smem): matrix i = lane / 8 covers n rows + 8 (i / 2), k chunk + (i % 2)
  //   transposed B ([k][n] in smem):     matrix i covers k rows + 8 (i % 2), n chunk + (i / 2)
  const int ld_row = (lane % 8) + 8 * (lane / 16);
  const int ld_chunk = (lane / 8) % 2;
  const int ldt_row = (lane % 8) + 8 * ((lane / 8) % 2);
  const int ldt_chunk = lane / 16;

  constexpr bool kSwizzledU0 = Smem::kU0Swizzled;
  static_assert(!kSwizzledU0 || Smem::kU0BoxCols == 32, "u0_offset addresses 32-column swizzled U0 tiles");
  uint32_t u0_off[2][2];  // swizzled U0: [value row + 8 hr][token 2 quad + par]
  u0_fragment_offsets(u0_off, quad, warp * 16 + group);

  for (int j = 0; j < num_chunks; ++j) {
    const int jg = j_begin + j;  // chunk of the sequence
    if (write_chunk_states) store_chunk_state(state, p, chunk_state_base, jg, chunks_per_state, h, vrow, quad);

    const int s = j % kStages;
    ptx::mbarrier_wait(&full[s], (j / kStages) & 1);
    const uint8_t* stage = smem + s * Smem::kStageBytes;
    const uint32_t qwk_base = ptx::smem_addr(stage + Smem::kQwkOffset);
    const uint32_t qt_base = qwk_base;                 // rows 0 .. 63
    const uint32_t w_base = qwk_base + kChunk * 128;   // rows 64 .. 127
    const uint32_t kh_base = qwk_base + 2 * kChunk * 128;
    const uint32_t kh_lo_base = qwk_base + 3 * kChunk * 128;
    const uint32_t m_base = ptx::smem_addr(stage + Smem::kMOffset);
    const float* u0 = reinterpret_cast<const float*>(stage + Smem::kU0Offset);
    // this warp's output staging band: its 16 columns of every U0 row (read above first)
    uint8_t* const o_band = smem + s * Smem::kStageBytes + Smem::kU0Offset + (kSwizzledU0 ? 0 : warp * 64);
    const float* decay = reinterpret_cast<const float*>(stage + Smem::kDecayOffset);
    auto o_at = [&](int tok, int col) {
      if constexpr (kSwizzledU0) return o_stage_offset_swizzled(warp, tok, col);
      else return o_stage_offset<int(Smem::kU0RowBytes)>(tok, col);
    };

    // ---- acc_u = -U0^T; it becomes W S0 - U0 = -U^T below
    float acc_u[8][4];
    float acc_o[8][4];
    #pragma unroll
    for (int t = 0; t < 8; ++t) {
      if constexpr (kSwizzledU0) {
        const uint8_t* row = reinterpret_cast<const uint8_t*>(u0) + t * (8 * 128);  // tokens 8 t + 2 quad, + 1
        acc_u[t][0] = -*reinterpret_cast<const float*>(row + u0_off[0][0]);
        acc_u[t][1] = -*reinterpret_cast<const float*>(row + u0_off[0][1]);
        acc_u[t][2] = -*reinterpret_cast<const float*>(row + u0_off[1][0]);
        acc_u[t][3] = -*reinterpret_cast<const float*>(row + u0_off[1][1]);
      } else {
        const int tok = 8 * t + 2 * quad;
        const int col = warp * 16 + group;
        acc_u[t][0] = -u0[tok * kValueRows + col];
        acc_u[t][1] = -u0[(tok + 1) * kValueRows + col];
        acc_u[t][2] = -u0[tok * kValueRows + col + 8];
        acc_u[t][3] = -u0[(tok + 1) * kValueRows + col + 8];
      }
      acc_o[t][0] = acc_o[t][1] = acc_o[t][2] = acc_o[t][3] = 0.f;
    }

    // ---- acc_u += S0^T W^T, acc_o += S0^T Qt^T (S0 as hi + lo in both; k = key channels, n = tokens)
    #pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      uint32_t a[4], a_lo[4];
      ptx::split_bf16(state[2 * ks][0], state[2 * ks][1], a[0], a_lo[0]);
      ptx::split_bf16(state[2 * ks][2], state[2 * ks][3], a[1], a_lo[1]);
      ptx::split_bf16(state[2 * ks + 1][0], state[2 * ks + 1][1], a[2], a_lo[2]);
      ptx::split_bf16(state[2 * ks + 1][2], state[2 * ks + 1][3], a[3], a_lo[3]);
      #pragma unroll
      for (int tp = 0; tp < 4; ++tp) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, qwk_addr(w_base, 16 * tp + ld_row, 2 * ks + ld_chunk));
        ptx::mma_bf16_16816(acc_u[2 * tp], a_lo, b[0], b[1]);
        ptx::mma_bf16_16816(acc_u[2 * tp + 1], a_lo, b[2], b[3]);
        ptx::mma_bf16_16816(acc_u[2 * tp], a, b[0], b[1]);
        ptx::mma_bf16_16816(acc_u[2 * tp + 1], a, b[2], b[3]);
        ptx::ldmatrix_x4(b, qwk_addr(qt_base, 16 * tp + ld_row, 2 * ks + ld_chunk));
        ptx::mma_bf16_16816(acc_o[2 * tp], a_lo, b[0], b[1]);
        ptx::mma_bf16_16816(acc_o[2 * tp + 1], a_lo, b[2], b[3]);
        ptx::mma_bf16_16816(acc_o[2 * tp], a, b[0], b[1]);
        ptx::mma_bf16_16816(acc_o[2 * tp + 1], a, b[2], b[3]);
      }
    }

    // ---- U^T as bf16 A fragments (k = tokens): ua = bf16(U), ua_lo = bf16(U - ua).
    // NOTE: both products with U take ua + ua_lo (16 mantissa bits). With U rounded to bf16 the
    // fp32 final state drifts to ~2.1e-3 rel. L2 over 256 tokens (bar 2e-3; the bf16 workspace
    // alone gives ~1.3e-3), and the end-to-end output sat at 4.0-4.1e-3 on the Python test
    // inputs (bar 4e-3); a float64 mirror puts bf16 U's share of the output error at ~1.6e-3.
    uint32_t ua[4][4], ua_lo[4][4];
    #pragma unroll
    for (int ts = 0; ts < 4; ++ts) {
      ptx::split_bf16(-acc_u[2 * ts][0], -acc_u[2 * ts][1], ua[ts][0], ua_lo[ts][0]);
      ptx::split_bf16(-acc_u[2 * ts][2], -acc_u[2 * ts][3], ua[ts][1], ua_lo[ts][1]);
      ptx::split_bf16(-acc_u[2 * ts + 1][0], -acc_u[2 * ts + 1][1], ua[ts][2], ua_lo[ts][2]);
      ptx::split_bf16(-acc_u[2 * ts + 1][2], -acc_u[2 * ts + 1][3], ua[ts][3], ua_lo[ts][3]);
    }

    // ---- O^T += U^T M^T (k = source tokens s, n = target tokens r); M[r][s] = 0 for s > r,
    // so blocks with ts > tp are skipped.
    #pragma unroll
    for (int tp = 0; tp < 4; ++tp) {
      #pragma unroll
      for (int ts = 0; ts <= tp; ++ts) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, m_addr(m_base, 16 * tp + ld_row, 2 * ts + ld_chunk));
        ptx::mma_bf16_16816(acc_o[2 * tp], ua_lo[ts], b[0], b[1]);
        ptx::mma_bf16_16816(acc_o[2 * tp + 1], ua_lo[ts], b[2], b[3]);
        ptx::mma_bf16_16816(acc_o[2 * tp], ua[ts], b[0], b[1]);
        ptx::mma_bf16_16816(acc_o[2 * tp + 1], ua[ts], b[2], b[3]);
      }
    }

    // ---- O: fragments -> the warp's staging band (frees acc_o before the state update; written
    // to global rows of 32 bytes below). NOTE: every lane of the warp read its U0 columns at the
    // top of the chunk; the syncwarp orders those reads before these stores.
    __syncwarp();
    #pragma unroll
    for (int t = 0; t < 8; ++t) {
      const int tok = 8 * t + 2 * quad;
      *reinterpret_cast<__nv_bfloat16*>(o_band + o_at(tok, group)) = __float2bfloat16_rn(acc_o[t][0]);
      *reinterpret_cast<__nv_bfloat16*>(o_band + o_at(tok + 1, group)) = __float2bfloat16_rn(acc_o[t][1]);
      *reinterpret_cast<__nv_bfloat16*>(o_band + o_at(tok, group + 8)) = __float2bfloat16_rn(acc_o[t][2]);
      *reinterpret_cast<__nv_bfloat16*>(o_band + o_at(tok + 1, group + 8)) = __float2bfloat16_rn(acc_o[t][3]);
    }

    // ---- S^T = S0^T diag(decay) + U^T Kh (k = tokens, n = key channels)
    common::decay_state(state, decay, quad);
    #pragma unroll
    for (int ts = 0; ts < 4; ++ts) {
      #pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t b[4];
        // NOTE: Kh lo goes into the registers of Kh once Kh's four products are issued
        // (separate fragments spilled at 16 and 32 value rows)
        ptx::ldmatrix_x4_trans(b, qwk_addr(kh_base, 16 * ts + ldt_row, 2 * np + ldt_chunk));
        ptx::mma_bf16_16816(state[2 * np], ua_lo[ts], b[0], b[1]);
        ptx::mma_bf16_16816(state[2 * np + 1], ua_lo[ts], b[2], b[3]);
        ptx::mma_bf16_16816(state[2 * np], ua[ts], b[0], b[1]);
        ptx::mma_bf16_16816(state[2 * np + 1], ua[ts], b[2], b[3]);
        ptx::ldmatrix_x4_trans(b, qwk_addr(kh_lo_base, 16 * ts + ldt_row, 2 * np + ldt_chunk));
        ptx::mma_bf16_16816(state[2 * np], ua[ts], b[0], b[1]);
        ptx::mma_bf16_16816(state[2 * np + 1], ua[ts], b[2], b[3]);
      }
    }

    // ---- O: the staging band -> global (before the stage is released: the band is in it)
    {
      __syncwarp();
      const int valid = min(kChunk, seq_len - jg * kChunk);
      __nv_bfloat16* o_chunk = o_seq + int64_t(jg) * kChunk * p.stride_o_t;
      if (p.o_vec16) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tok = 16 * i + lane / 2;
          const int col = 8 * (lane % 2);
          if (tok < valid)
            *reinterpret_cast<uint4*>(o_chunk + tok * p.stride_o_t + col) =
                *reinterpret_cast<const uint4*>(o_band + o_at(tok, col));
        }
      } else {
        #pragma unroll 4
        for (int i = 0; i < 32; ++i) {
          const int tok = 2 * i + lane / 16;
          const int col = lane % 16;
          if (tok < valid)
            o_chunk[tok * p.stride_o_t + col] =
                *reinterpret_cast<const __nv_bfloat16*>(o_band + o_at(tok, col));
        }
      }
    }

    // Every access to this stage is done: release it; the issuer refills it with chunk j + kStages
    // once all warps have released it (a chunk ahead of its use).
    // NOTE: the warp also wrote the stage (its output band): each thread's proxy fence orders
    // its generic-proxy writes before the TMA's async-proxy writes of the refill.
    ptx::fence_proxy_async_shared();
    ptx::mbarrier_arrive(&empty[s]);
    if (is_issuer && j + kStages < num_chunks) {
      ptx::mbarrier_wait(&empty[s], (j / kStages) & 1);
      // NOTE: the warps' generic-proxy reads of the stage are ordered before the TMA's writes
      // by the empty barrier; the proxy fence states it for the async proxy as well.
      ptx::fence_proxy_async_shared();
      issue_chunk(j + kStages);
    }

  }

  // ---- final state, by the last segment (also for an empty sequence: the initial state passes
  // through bit for bit)
  if (*last_segment_flag != 0) {
    void* fin = common::final_state_of(p, n, h);
    if (fin != nullptr) store_state(state, fin, vrow, quad, p);
  }
}

// ---- host launcher ------------------------------------------------------------------------------
inline Status cuda_status(cudaError_t err, const char* what, int line) {
  return Status(StatusCode::kCudaError, std::string("recurrence/kernel.cuh:") + std::to_string(line) + ": " + what +
                                            ": " + cudaGetErrorString(err));
}

// The wgmma version of the 64- and 128-row recurrence and summary pass (wgmma.cuh,
// instantiations/wgmma_*.cu); kF16: on an fp16 block (WorkspacePlan::f16_block).
template <int kValueRows, bool kSummary, bool kF16>
Status launch_wgmma(const KernelParams& kp, const TmaParams& tma, int64_t num_ctas, cudaStream_t stream, bool pdl);

}  // namespace kdakit::sm90::prefill::recurrence

namespace kdakit::sm90::prefill::recurrence {

template <int kValueRows, bool kSummary>
Status launch(const PrefillParams& p, const WorkspacePlan& plan, const void* workspace, cudaStream_t stream) {
  using Cfg = Config<kValueRows>;
  using Smem = typename Cfg::SharedMemoryPlan;
  if (p.num_seqs == 0) return Status::Ok();
  if (p.num_seqs > int64_t(INT32_MAX) || plan.max_chunks * p.num_v_heads > int64_t(INT32_MAX))
    return Status(StatusCode::kUnsupported, "recurrence: more than 2^31 sequences or chunk blocks");
  if (p.chunk_states != nullptr && (p.chunk_state_interval <= 0 || p.chunk_state_interval % kChunk != 0))
    return Status(StatusCode::kInvalidArgument, "chunk_state_interval: expected a positive multiple of 64, got " +
                                                    std::to_string(p.chunk_state_interval));

  const uint8_t* ws = static_cast<const uint8_t*>(workspace);
  const uint8_t* blocks = ws + plan.chunk_blocks_offset;
  // NOTE: a batch of only empty sequences has no chunk block; the maps still need a nonzero
  // extent and are never read then.
  const uint64_t num_blocks = std::max<uint64_t>(1, uint64_t(plan.max_chunks) * uint64_t(p.num_v_heads));

  // An fp16 block (the wgmma kernel only): the Qt/W/Kh box ends before Kh lo, which prep left unwritten.
  const bool f16 = plan.f16_block;
  if (f16 && kValueRows < 64)
    return Status(StatusCode::kInternal, "recurrence: an fp16 chunk block needs the wgmma kernel (64 or 128 rows)");
  const CUtensorMapDataType block_type = f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  TmaParams tma{};
  constexpr int kQwkRows = Config<kValueRows>::SharedMemoryPlan::kQwkArrays * kChunk;  // 256: TMA's box limit
  const uint32_t box_rows = uint32_t(f16 ? kQwkRows - kChunk : kQwkRows);
  static_assert(ChunkBlockLayout::kKhLoOffset == ChunkBlockLayout::kQtOffset + 3 * kChunk * kHeadDim * 2,
                "Qt, W, Kh, Kh lo must be consecutive [64][128] arrays: one TMA box covers them");
  Status st = encode_block_map(&tma.qwk, block_type, blocks + ChunkBlockLayout::kQtOffset,
                               kHeadDim, kQwkRows, num_blocks, kHeadDim * 2, 64, box_rows,
                               CU_TENSOR_MAP_SWIZZLE_128B, "Qt/W/Kh/Kh lo");
  if (!st.ok()) return st;
  st = encode_block_map(&tma.m, block_type, blocks + ChunkBlockLayout::kMOffset, kChunk,
                        kChunk, num_blocks, kChunk * 2, kChunk, kChunk, CU_TENSOR_MAP_SWIZZLE_128B, "M");
  if (!st.ok()) return st;
  st = encode_block_map(&tma.u0, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, blocks + ChunkBlockLayout::kU0Offset, kHeadDim,
                        kChunk, num_blocks, kHeadDim * 4, Smem::kU0BoxCols, kChunk,
                        Smem::kU0Swizzled ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, "U0");
  if (!st.ok()) return st;
  if constexpr (kSummary) {
    st = encode_block_map(&tma.wkh, block_type, blocks + ChunkBlockLayout::kQtOffset,
                          kHeadDim, kQwkRows, num_blocks, kHeadDim * 2, 64, box_rows - kChunk,
                          CU_TENSOR_MAP_SWIZZLE_128B, "W/Kh/Kh lo");
    if (!st.ok()) return st;
  }

  const bool packed = p.cu_seqlens != nullptr;
  const bool o_vec16 = reinterpret_cast<uintptr_t>(p.o) % 16 == 0 && p.stride_o_t % 8 == 0 &&
                       p.stride_o_h % 8 == 0 && (packed || p.stride_o_b % 8 == 0);

  KernelParams kp{};
  kp.chunk_offsets = reinterpret_cast<const int32_t*>(ws + plan.chunk_offsets_offset);
  kp.seq_start = reinterpret_cast<const int64_t*>(ws + plan.seq_start_offset);
  kp.seq_len = reinterpret_cast<const int32_t*>(ws + plan.seq_len_offset);
  // fixed batches: every sequence has the same length, index order
  kp.seq_order = packed && p.num_seqs > 1 ? reinterpret_cast<const int32_t*>(ws + plan.seq_order_offset) : nullptr;
  kp.chunk_blocks = blocks;
  kp.max_chunks = plan.max_chunks;
  kp.num_v_heads = p.num_v_heads;
  kp.packed = packed;
  kp.o = static_cast<__nv_bfloat16*>(p.o);
  kp.stride_o_b = p.stride_o_b;
  kp.stride_o_t = p.stride_o_t;
  kp.stride_o_h = p.stride_o_h;
  kp.o_vec16 = o_vec16;
  kp.o_pairs = reinterpret_cast<uintptr_t>(p.o) % 4 == 0 && p.stride_o_t % 2 == 0 && p.stride_o_h % 2 == 0 &&
               (packed || p.stride_o_b % 2 == 0);
  static_cast<common::StateParams&>(kp) = common::state_params(p);
  kp.route = route_of(plan, workspace);
  kp.segments = const_cast<uint8_t*>(ws) + plan.segments_offset;
  kp.num_segment_slots = plan.num_segment_slots;
  kp.segment_chunks = plan.segment_chunks;
  kp.max_segments = plan.segment_chunks > 0 ? plan.max_segments : 1;
  if (kSummary && plan.segment_chunks <= 0) return Status(StatusCode::kInternal, "recurrence: summaries without segments");

  // NOTE: a routed call's recurrence right after the prep kernel (no segments), or after the other
  // recurrence shape, is launched with PDL: on the side that exits it then exits as the SMs
  // drain instead of after the previous grid; on the side that works its CTAs wait for the
  // previous grid first (griddep_wait).
  // A segmented recurrence pass (wgmma kernel) follows the combine pass, which lets it launch at its
  // start: its CTAs then take the SMs the combine leaves free and load their first stages during
  // the combine (stages_before_wait).
  constexpr bool kWgmma = kValueRows == 64 || kValueRows == 128;
  kp.stages_before_wait = kWgmma && !kSummary && plan.segment_chunks > 0;
  const bool pdl = kp.stages_before_wait || (!kSummary && kp.route.longest != nullptr && plan.segment_chunks <= 0);
  const int64_t num_ctas = p.num_seqs * p.num_v_heads * kp.max_segments * Cfg::kSlices * (kSummary ? 2 : 1);
  if (num_ctas > int64_t(INT32_MAX))
    return Status(StatusCode::kUnsupported, "recurrence: N * HV * segments * slices must stay below 2^31, got " +
                                                std::to_string(num_ctas));
  if constexpr (kWgmma) {
    return f16 ? launch_wgmma<kValueRows, kSummary, true>(kp, tma, num_ctas, stream, pdl)
               : launch_wgmma<kValueRows, kSummary, false>(kp, tma, num_ctas, stream, pdl);
  } else {
    static_assert(!kSummary, "summary passes run on the wgmma kernel (64 or 128 value rows)");
    auto kernel = kda_prefill_recurrence_sm90_kernel<kValueRows>;
    static kdakit::cuda::PerDeviceOnce attr_once;  // per function and device (common/device_setup.cuh)
    cudaError_t err = kdakit::cuda::set_up_once_per_device(attr_once, [&] {
      return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Smem::kAllocBytes));
    });
    if (err != cudaSuccess) return cuda_status(err, "cudaFuncSetAttribute", __LINE__);
    return kdakit::cuda::launch_pdl_kernel(kernel, "kda_prefill_recurrence_sm90_kernel", dim3(unsigned(num_ctas)),
                                           Cfg::kThreads, int(Smem::kAllocBytes), stream, pdl, kp, tma);
  }
}

}  // namespace kdakit::sm90::prefill::recurrence

namespace kdakit::sm90::prefill {

template <int kValueRows>
Status launch_prefill_recurrence(const PrefillParams& p, const WorkspacePlan& plan, const void* workspace,
                                 cudaStream_t stream) {
  return recurrence::launch<kValueRows, false>(p, plan, workspace, stream);
}

template <int kValueRows>
Status launch_prefill_summaries(const PrefillParams& p, const WorkspacePlan& plan, const void* workspace,
                                cudaStream_t stream) {
  return recurrence::launch<kValueRows, true>(p, plan, workspace, stream);
}

}  // namespace kdakit::sm90::prefill
