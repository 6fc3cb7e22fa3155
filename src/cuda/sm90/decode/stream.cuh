// kda_decode_sm90_stream_kernel: single-column V-first decode as a persistent grid of warps,
// each streaming its own work units with the next unit's state already in flight: the
// bandwidth kernel for batches past one wave of the direct kernel.
//
// Shapes: q, k [B, T, H, K]; v, o [B, T, HV, V]; pool [slots, HV, V, K] (V-first), K = V in
// {64, 128}; dense T = 1 or packed (cu_seqlens, B = 1). Math: warp_token.cuh.
//
// Work unit: (sequence n, value head h, block of kUnitRows consecutive value rows: 4 KB of state
// at K = 128, i.e. 8 fp32 or 16 bf16 rows; stream_unit_rows in config.h), the block fastest, so
// u = (n HV + h) (K / kUnitRows) + block; the math runs on groups of 8 rows. Warp wg = warp *
// gridDim.x + blockIdx.x of the grid's TW warps runs units wg, wg + TW, wg + 2 TW, ... (warp-major:
// a grid with fewer units than warps still spreads them over every SM). The grid is at most
// kStreamCtasPerSm CTAs per SM (config.h), so every warp is resident from the start and none waits
// for a CTA slot.
//
// Pipeline of one warp (two register buffers of a unit's rows, A and B, used in turn):
//   while unit k runs from buffer A, the state rows of unit k + 1 are loading into buffer B
//   (issued before unit k's math, with the streaming hint, kept as raw bits so that nothing
//   waits on them until unit k + 1 starts), and the slot index (and token range) of unit
//   k + 2 is loading too, so the state loads of unit k + 2 never wait on an index load.
// Unit k itself: its raw token inputs (small, shared by the head's warps and mostly L2 hits)
// are loaded when it starts, then the token step(s), o, and the rows back to the slot.
//
// NOTE: why a new kernel next to direct.cuh: the direct kernel's chain per CTA is slot index
// -> state -> math -> store, one after another, and its grid runs in waves; here a warp has
// one unit of state in flight nearly all the time, and the grid is one wave. Ring (ring.cuh)
// keeps more in flight through shared memory but measured slower than the staged kernel.
//
// A padding unit (slot outside [0, num_slots), or 0 with null_slot_is_padding) writes zero
// outputs for its rows and touches no state; an empty sequence writes nothing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/common/dtype.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sm90/decode/config.h"
#include "cuda/sm90/decode/fast_launch.cuh"
#include "cuda/sm90/decode/launch.h"
#include "cuda/sm90/decode/warp_token.cuh"

namespace kdakit::sm90::recurrent {

namespace fast {

// A unit's slot and token range, loaded one unit ahead of its rows. Its head and rows follow
// from the unit number (stream_place), recomputed where needed: fewer live registers.
struct StreamUnit {
  int32_t slot;
  FastRange range;
};
struct StreamPlace {
  int32_t h;
  int32_t j0;  // first value row of the block
};

template <int kUnits>
__device__ __forceinline__ int32_t stream_seq(const FastDecodeParams& p, int32_t u) {
  return (u / kUnits) / p.num_v_heads;
}
template <int kUnits>
__device__ __forceinline__ StreamPlace stream_place(const FastDecodeParams& p, int32_t u,
                                                    int32_t unit_rows) {
  const int32_t hn = u / kUnits;
  return StreamPlace{hn % p.num_v_heads, (u % kUnits) * unit_rows};
}

// Issues the slot index (and for packed batches the cu_seqlens) loads of unit u; nothing
// waits on them here.
template <int kUnits>
__device__ __forceinline__ StreamUnit stream_unit(const FastDecodeParams& p, int32_t u) {
  const int32_t n = stream_seq<kUnits>(p, u);
  return StreamUnit{p.state_indices[int64_t(n) * p.stride_state_indices_n], fast_range(p, n)};
}

// One lane's kE elements of kRows state rows as the raw bits of their vector loads.
template <class StateT, int kRows, int kE>
struct RowBits {
  using Vec = typename kdakit::cuda::detail::RawVec<int(sizeof(StateT)) * kE>::Type;
  Vec row[kRows];
};

template <class StateT, int kHeadDim>
__device__ __forceinline__ StateT* stream_rows(const FastDecodeParams& p, int32_t slot,
                                               StreamPlace w, int lane) {
  return static_cast<StateT*>(p.pool) + int64_t(slot) * p.stride_pool_slot +
         int64_t(w.h) * kHeadDim * kHeadDim + int64_t(w.j0) * kHeadDim + lane * (kHeadDim / 32);
}

}  // namespace fast

template <class StateT, int kHeadDim>
__global__ void __launch_bounds__(kStreamThreads, kStreamCtasPerSm)
    kda_decode_sm90_stream_kernel(const __grid_constant__ FastDecodeParams p) {
  using namespace fast;
  using kdakit::cuda::detail::ld_cs;
  using kdakit::cuda::detail::st_cs;
  constexpr int kE = kHeadDim / 32;
  constexpr int kUnitRows = stream_unit_rows(int(sizeof(StateT)), kHeadDim);
  constexpr int kGroupRows = 8;  // the rows of one step_rows call
  constexpr int kUnitGroups = kUnitRows / kGroupRows;
  constexpr int kUnits = kHeadDim / kUnitRows;  // units per head
  static_assert(kUnitRows % kGroupRows == 0 && kUnitRows <= 32 && kHeadDim % kUnitRows == 0,
                "a unit is 1 to 4 groups of 8 rows, v one lane per row");
  using Bits = RowBits<StateT, kUnitRows, kE>;
  using Vec = typename Bits::Vec;
  using Pack = kdakit::cuda::detail::Pack<StateT, kE>;
  const int lane = int(threadIdx.x) % 32;
  const int32_t total_warps = int32_t(gridDim.x) * kStreamWarps;
  int32_t u = (int32_t(threadIdx.x) / 32) * int32_t(gridDim.x) + int32_t(blockIdx.x);

  kdakit::cuda::ptx::griddep_wait();
  kdakit::cuda::ptx::griddep_launch_dependents();
  if (u >= p.num_units) return;

  auto issue_state = [&](int32_t uu, const StreamUnit& x, Bits& b) {
    if (fast_slot_valid(x.slot, p) && x.range.len > 0) {
      const StateT* rows =
          stream_rows<StateT, kHeadDim>(p, x.slot, stream_place<kUnits>(p, uu, kUnitRows), lane);
#pragma unroll
      for (int r = 0; r < kUnitRows; ++r)
        b.row[r] = ld_cs(reinterpret_cast<const Vec*>(rows + r * kHeadDim));
    }
  };
  auto run = [&](int32_t uu, const StreamUnit& x, const Bits& b) {
    const StreamPlace w = stream_place<kUnits>(p, uu, kUnitRows);
    const bool load_v = lane < kUnitRows;
    const int64_t o_col = int64_t(w.h) * p.stride_o_h + w.j0;
    if (!fast_slot_valid(x.slot, p)) {
      // NOTE: a padding row still owns its output rows: zeros, so that no stale value leaks.
      if (load_v) {
        for (int t = 0; t < x.range.len; ++t) {
          store_from_float(p.o, FastFlags::dtype_qkv(p.flags),
                           int64_t(x.range.begin + t) * p.stride_o_tok + o_col + lane, 0.f);
        }
      }
      return;
    }
    if (x.range.len == 0) return;  // an empty sequence: its state passes through untouched
    const int hk = fast_qk_head(p, w.h);
    StateT* rows = stream_rows<StateT, kHeadDim>(p, x.slot, w, lane);
    auto group_rows = [&](int grp, float(&sg)[kGroupRows][kE]) {
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r) {
        Pack pk;
        pk.raw = b.row[grp * kGroupRows + r];
#pragma unroll
        for (int e = 0; e < kE; ++e) sg[r][e] = kdakit::cuda::to_float(pk.elem[e]);
      }
    };
    auto store_rows = [&](int grp, const float(&sg)[kGroupRows][kE]) {
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r) {
        Pack pk;
#pragma unroll
        for (int e = 0; e < kE; ++e) pk.elem[e] = kdakit::cuda::from_float<StateT>(sg[r][e]);
        st_cs(reinterpret_cast<Vec*>(rows + (grp * kGroupRows + r) * kHeadDim), pk.raw);
      }
    };
    auto store_out = [&](int grp, int t, float out) {
      if (holds_output<kGroupRows>(lane)) {
        store_from_float(p.o, FastFlags::dtype_qkv(p.flags),
                         int64_t(x.range.begin + t) * p.stride_o_tok + o_col + grp * kGroupRows +
                             output_row<kGroupRows>(lane),
                         out);
      }
    };
    if (x.range.len == 1) {  // decode: one token, preprocessed once for every group
      const RawToken<kE> raw =
          load_raw<kHeadDim>(p, x.range.begin, w.h, hk, w.j0 + lane, load_v, lane);
      const Token<kE> tok = finish(p, raw);
#pragma unroll
      for (int grp = 0; grp < kUnitGroups; ++grp) {
        float sg[kGroupRows][kE];
        group_rows(grp, sg);
        store_out(grp, 0, step_rows<kGroupRows, kE>(sg, tok, raw.v, grp * kGroupRows, lane));
        store_rows(grp, sg);
      }
    } else {
      // NOTE: a packed sequence of several tokens runs all its tokens on one group's registers
      // before the next group (the state stays fp32 between tokens), preprocessing each token
      // again per group (correct, and rare in decode batches).
#pragma unroll
      for (int grp = 0; grp < kUnitGroups; ++grp) {
        float sg[kGroupRows][kE];
        group_rows(grp, sg);
#pragma unroll 1
        for (int t = 0; t < x.range.len; ++t) {
          const RawToken<kE> raw =
              load_raw<kHeadDim>(p, x.range.begin + t, w.h, hk, w.j0 + lane, load_v, lane);
          const Token<kE> tok = finish(p, raw);
          store_out(grp, t, step_rows<kGroupRows, kE>(sg, tok, raw.v, grp * kGroupRows, lane));
        }
        store_rows(grp, sg);
      }
    }
  };

  // Prologue: unit k = 0 (index, then rows into A) and the index of unit 1.
  // NOTE: two halves per trip so that the row buffers A and B keep fixed registers: moving a
  // buffer whose loads are pending would wait for them. Only the small unit records (whose
  // index loads were issued a whole unit earlier) rotate at the end of a trip.
  Bits ba, bb;
  StreamUnit ua = stream_unit<kUnits>(p, u);
  issue_state(u, ua, ba);
  StreamUnit ub = ua, uc = ua;
  const int32_t tw = total_warps;
  bool has_b = int64_t(u) + tw < p.num_units;
  if (has_b) ub = stream_unit<kUnits>(p, u + tw);
#pragma unroll 1
  for (;;) {
    // Unit k (ua) runs from A; the rows of k + 1 (ub) load into B; the index of k + 2 (uc).
    const bool has_c = has_b && int64_t(u) + 2 * int64_t(tw) < p.num_units;
    if (has_b) issue_state(u + tw, ub, bb);
    if (has_c) uc = stream_unit<kUnits>(p, u + 2 * tw);
    run(u, ua, ba);
    if (!has_b) break;
    u += tw;
    // Unit k + 1 (ub) runs from B; the rows of k + 2 (uc) load into A; the index of k + 3 goes
    // into ua (free since unit k ran).
    const bool has_d = has_c && int64_t(u) + 2 * int64_t(tw) < p.num_units;
    if (has_c) issue_state(u + tw, uc, ba);
    if (has_d) ua = stream_unit<kUnits>(p, u + 2 * tw);
    run(u, ub, bb);
    if (!has_c) break;
    u += tw;
    ub = ua;  // k + 3 becomes the next trip's k + 1
    ua = uc;  // k + 2 becomes its k
    has_b = has_d;
  }
}

template <class StateT, int kHeadDim>
Status launch_stream(const FastDecodeParams& p, cudaStream_t stream, bool pdl, int num_sms,
                     int max_ctas) {
  constexpr int kUnitRows = stream_unit_rows(int(sizeof(StateT)), kHeadDim);
  const int64_t units = int64_t(p.num_seqs) * p.num_v_heads * (kHeadDim / kUnitRows);
  if (units <= 0) return Status::Ok();
  if (units > int64_t{INT32_MAX}) {
    return Status(StatusCode::kUnsupported,
                  "decode: the stream kernel takes at most 2^31 - 1 (sequence, head, " +
                      std::to_string(kUnitRows) + "-row block) units, got " +
                      std::to_string(units));
  }
  FastDecodeParams q = p;
  q.num_units = int32_t(units);
  int64_t ctas = std::min<int64_t>((units + kStreamWarps - 1) / kStreamWarps,
                                   int64_t(std::max(num_sms, 1)) * kStreamCtasPerSm);
  if (max_ctas > 0) ctas = std::min<int64_t>(ctas, max_ctas);
  return launch_fast_kernel(kda_decode_sm90_stream_kernel<StateT, kHeadDim>,
                            "kda_decode_sm90_stream_kernel", dim3(unsigned(ctas)), kStreamThreads,
                            0, stream, pdl, q);
}

}  // namespace kdakit::sm90::recurrent
