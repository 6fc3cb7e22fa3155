// kda_decode_sm90_direct_kernel: single-column V-first decode with the state slice in
// registers and nothing between a warp's loads and its math: the latency kernel (small
// batches, where one call is one short dependent chain per CTA).
//
// Shapes: q, k [B, T, H, K]; v, o [B, T, HV, V]; pool [slots, HV, V, K] (V-first), K = V in
// {64, 128}; dense T = 1 or packed (cu_seqlens, B = 1). Math: warp_token.cuh.
//
// Grid: one CTA per (sequence n, value head h, slice of kRowsPerCta = 4 x kRowsPerWarp value
// rows): blockIdx.x = h * slices + slice, blockIdx.y = n (N <= 65535, checked by the launcher).
// Block: 4 warps, no warp specialisation, no shared memory, no CTA barrier: warp w owns value rows
// j0 + w kRowsPerWarp .. + kRowsPerWarp - 1 and runs the whole step for them on its own.
//
// Steps of one warp, in issue order (the chain of a call is: slot index -> state -> math ->
// store; everything else overlaps it):
//   0. with PDL (FastFlags::kPrefetchBeforeWait), lane 0 reads the slot index at GPU scope and
//      asks L2 for the warp's rows while the previous kernel finishes; griddepcontrol.wait (a
//      no-op without PDL), then let the next grid launch;
//   1. the slot index load, and for packed batches the two cu_seqlens loads, all at once;
//   2. token 0's raw inputs (q, k, g, dt_bias, A_log, beta, v), issued before the slot is back
//      (dense batches; packed ones need cu_seqlens first);
//   3. a padding slot writes zero outputs and returns; else the state rows (kRowsPerWarp
//      16-byte loads per lane for fp32 K = 128, streaming hint);
//   4. preprocessing on the warp (overlaps the state loads), the token step, o, and for a
//      packed sequence of several tokens the next tokens on the same registers;
//   5. the rows back to the slot (streaming stores).
// Untrusted metadata: slots outside [0, num_slots) (or 0 with null_slot_is_padding) are
// padding; cu_seqlens are clamped to [0, T].
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/common/dtype.cuh"
#include "cuda/common/pdl_launch.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sm90/decode/config.h"
#include "cuda/sm90/decode/launch.h"
#include "cuda/sm90/decode/warp_token.cuh"

namespace kdakit::sm90::recurrent {

template <class StateT, int kHeadDim, int kRowsPerWarp>
__global__ void __launch_bounds__(kDirectThreads, kDirectMinCtasPerSm)
    kda_decode_sm90_direct_kernel(const __grid_constant__ FastDecodeParams p) {
  using namespace fast;
  constexpr int kE = kHeadDim / 32;
  constexpr int kRowsPerCta = kRowsPerWarp * kDirectWarps;
  constexpr int kSlices = kHeadDim / kRowsPerCta;
  static_assert(kHeadDim % kRowsPerCta == 0, "the CTA slices must tile the value rows");
  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  // NOTE: a 2D grid (x: head and slice, y: sequence) so that the slot index address needs no
  // run-time division: it is the first load of the dependent chain.
  const int n = int(blockIdx.y);
  const int h = int(blockIdx.x) / kSlices;
  const int j0 = (int(blockIdx.x) % kSlices) * kRowsPerCta +
                 warp * kRowsPerWarp;  // this warp's first value row
  const int hk = fast_qk_head(p, h);

  const int64_t rows_offset = int64_t(h) * kHeadDim * kHeadDim + j0 * kHeadDim;
  if ((p.flags & FastFlags::kPrefetchBeforeWait) && lane == 0) {
    // NOTE: under PDL this runs while the previous kernel still runs; the index is re-read after
    // the wait (it may change until then), this one only aims the prefetch.
    const int32_t guess = kdakit::cuda::ptx::load_relaxed_gpu(p.state_indices + int64_t(n) * p.stride_state_indices_n);
    if (fast_slot_valid(guess, p)) {
      kdakit::cuda::ptx::bulk_prefetch_l2(
          static_cast<const StateT*>(p.pool) + int64_t(guess) * p.stride_pool_slot + rows_offset,
          uint32_t(kRowsPerWarp * kHeadDim * sizeof(StateT)));
    }
  }
  kdakit::cuda::ptx::griddep_wait();
  kdakit::cuda::ptx::griddep_launch_dependents();

  // --- 1. slot index (and token range)
  const int32_t slot = p.state_indices[int64_t(n) * p.stride_state_indices_n];
  const FastRange range = fast_range(p, n);
  const bool load_v = lane < kRowsPerWarp;

  // --- 2. token 0's raw inputs
  RawToken<kE> raw;
  if (range.len > 0) raw = load_raw<kHeadDim>(p, range.begin, h, hk, j0 + lane, load_v, lane);

  // --- 3. padding rows, empty sequences, state loads
  if (!fast_slot_valid(slot, p)) {
    // NOTE: a padding row still owns its output rows: zeros, so that no stale value leaks.
    if (load_v) {
      for (int t = 0; t < range.len; ++t) {
        store_from_float(
            p.o, FastFlags::dtype_qkv(p.flags),
            int64_t(range.begin + t) * p.stride_o_tok + int64_t(h) * p.stride_o_h + j0 + lane, 0.f);
      }
    }
    return;
  }
  if (range.len == 0) return;  // an empty sequence: its state passes through untouched
  StateT* rows = static_cast<StateT*>(p.pool) + int64_t(slot) * p.stride_pool_slot + rows_offset + lane * kE;
  float s[kRowsPerWarp][kE];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
    kdakit::cuda::load_vec_stream<kE>(rows + r * kHeadDim, s[r]);

    // --- 4. tokens
#pragma unroll 1
  for (int t = 0; t < range.len; ++t) {
    if (t > 0) raw = load_raw<kHeadDim>(p, range.begin + t, h, hk, j0 + lane, load_v, lane);
    const Token<kE> tok = finish(p, raw);
    const float out = step_rows<kRowsPerWarp, kE>(s, tok, raw.v, 0, lane);
    if (holds_output<kRowsPerWarp>(lane)) {
      store_from_float(p.o, FastFlags::dtype_qkv(p.flags),
                       int64_t(range.begin + t) * p.stride_o_tok + int64_t(h) * p.stride_o_h + j0 +
                           output_row<kRowsPerWarp>(lane),
                       out);
    }
  }

  // --- 5. state back to the slot
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
    kdakit::cuda::store_vec_stream<kE>(rows + r * kHeadDim, s[r]);
}

template <class StateT, int kHeadDim, int kRowsPerWarp>
Status launch_direct(const FastDecodeParams& p, cudaStream_t stream, bool pdl) {
  constexpr int kSlices = kHeadDim / (kRowsPerWarp * kDirectWarps);
  if (p.num_seqs <= 0 || p.num_v_heads <= 0) return Status::Ok();
  if (p.num_seqs > kDirectMaxSeqs || int64_t(p.num_v_heads) * kSlices > int64_t{0x7fffffff}) {
    return Status(StatusCode::kUnsupported,
                  "decode: the direct kernel takes at most " + std::to_string(kDirectMaxSeqs) +
                      " sequences (grid y), got " + std::to_string(p.num_seqs));
  }
  return kdakit::cuda::launch_pdl_kernel(kda_decode_sm90_direct_kernel<StateT, kHeadDim, kRowsPerWarp>,
                                         "kda_decode_sm90_direct_kernel",
                                         dim3(unsigned(p.num_v_heads * kSlices), unsigned(p.num_seqs)),
                                         kDirectThreads, 0, stream, pdl, p);
}

}  // namespace kdakit::sm90::recurrent
