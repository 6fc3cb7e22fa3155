// kda_decode_sm90_ring_kernel: single-column V-first decode, K = V = 128, as a persistent
// grid in which every warp streams its own work units through a ring of bulk-copy stages:
// the bandwidth kernel (large batches, where what counts is how many state bytes are in
// flight per SM at every moment).
//
// Shapes: q, k [B, T, H, K]; v, o [B, T, HV, V]; pool [slots, HV, V, K] (V-first); dense
// T = 1 or packed (cu_seqlens, B = 1). Math: warp_token.cuh.
//
// Work unit: (sequence n, value head h, block of kUnitRows consecutive value rows), one
// kRingStageBytes = 8 KB contiguous piece of the slot (16 fp32 rows, 32 bf16 rows). Units are
// numbered with the row block fastest; warp wg = warp * gridDim.x + blockIdx.x of the grid's
// TW warps runs units wg, wg + TW, wg + 2 TW, ... (warp-major, so that a grid with fewer units
// than warps still spreads them over every SM).
//
// Warp roles: none; the warps of a CTA only share the CTA's shared memory. Each warp owns
// kStages stages (8 KB each), one mbarrier per stage (count 1) and one 16-byte unit record
// per stage. Pipeline of one warp, unit k in stage k % kStages, phase parity (k / kStages) & 1:
//   arm(k):  the slot index of unit k comes from a register batch (lane j holds the slot and
//            token range of unit kb + j; the next batch of 32 is loaded one batch ahead, so no
//            arm waits on an index load after the first); lane 0 writes the unit record and
//            either issues one cp.async.bulk of the unit's 8 KB onto the stage's mbarrier
//            (arrive.expect_tx), or, for padding / empty units, a plain arrive (the phase then
//            completes at once: every arm completes exactly one phase);
//   unit k:  issue the raw token loads of unit k + 1 (from its record), wait for stage k,
//            preprocess token k on the warp, then per group of 8 rows: rows to registers, the
//            token step, o, rows to the slot (streaming stores); __syncwarp, proxy fence (the
//            stage's generic reads before the copy engine overwrites it), arm(k + kStages).
// kBulkStore: the updated rows go back into the stage (shared memory) and lane 0 writes the
// unit with one cp.async.bulk store instead of 16 (fp32) or 32 (bf16) 512-byte / 256-byte warp
// stores per unit; the stage is re-armed once the store has read it.
// At the start every warp arms its first kStages units: 24 stages (192 KB) per SM in flight
// from the first microsecond.
//
// A packed sequence of several tokens runs its tokens on each row group's registers (the
// preprocessing of tokens after the first is repeated per row group: correct and rare, as
// decode batches have one token per sequence).
// Untrusted metadata: slots outside [0, num_slots) (or 0 with null_slot_is_padding) are
// padding; cu_seqlens are clamped to [0, T].
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

// Slot and token range of one unit, as a lane of an index batch holds it.
struct UnitIndex {
  int32_t slot;
  int32_t begin;
  int32_t len;
};

}  // namespace fast

template <class StateT, int kWarps, int kStages, bool kBulkStore>
__global__ void __launch_bounds__(kWarps * 32, 1)
    kda_decode_sm90_ring_kernel(const __grid_constant__ FastDecodeParams p) {
  using namespace fast;
  namespace ptx = kdakit::cuda::ptx;
  using Plan = RingSharedMemoryPlan<kWarps, kStages>;
  constexpr int kHeadDim = kRingHeadDim;
  constexpr int kE = kHeadDim / 32;
  constexpr int kUnitRows = kRingStageBytes / (kHeadDim * int(sizeof(StateT)));
  constexpr int kBlocks = kHeadDim / kUnitRows;  // row blocks (units) per head
  constexpr int kGroups = kUnitRows / 8;
  static_assert(kUnitRows % 8 == 0 && kUnitRows <= 32,
                "a unit is 1 to 4 groups of 8 rows; v is one lane per row");
  static_assert(kHeadDim % kUnitRows == 0, "the units must tile the value rows");

  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  unsigned char* stages = smem + warp * kStages * kRingStageBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Plan::kBarrierOffset) + warp * kStages;
  int4* records = reinterpret_cast<int4*>(smem + Plan::kMetaOffset) + warp * kStages;

  // NOTE: the launcher keeps num_units and gridDim.x * kWarps below 2^31, so 32-bit unit math
  // is exact (u = wg + k * TW is only formed for k < my_units, i.e. u < num_units).
  const int grid = int(gridDim.x);
  const int wg = warp * grid + int(blockIdx.x);
  const int total_warps = grid * kWarps;
  const int my_units = wg < p.num_units ? (p.num_units - 1 - wg) / total_warps + 1 : 0;
  const int units_per_seq = kBlocks * p.num_v_heads;

  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  if (my_units == 0) return;  // NOTE: no CTA-wide barrier follows; each warp runs alone

  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(&bars[s], 1);
    ptx::fence_mbarrier_init();
  }
  const uint64_t policy = ptx::l2_evict_first_policy();

  // --- index batches: lane j holds unit batch_base + j (cur) and batch_base + 32 + j (next)
  auto unit_index = [&](int k) -> UnitIndex {
    if (k >= my_units) return UnitIndex{-1, 0, 0};
    const int n = (wg + k * total_warps) / units_per_seq;
    const int32_t slot = p.state_indices[int64_t(n) * p.stride_state_indices_n];
    const FastRange r = fast_range(p, n);
    return UnitIndex{slot, r.begin, r.len};
  };
  int batch_base = 0;
  UnitIndex cur = unit_index(lane);
  UnitIndex next = unit_index(32 + lane);
  __syncwarp();  // the barriers' initialisation before any lane's use

  // arm(k), k < my_units, called by all lanes in increasing k.
  auto arm = [&](int k) {
    if (k - batch_base == 32) {
      cur = next;
      batch_base += 32;
      next = unit_index(batch_base + 32 + lane);
    }
    const int src = k - batch_base;
    const int32_t slot = __shfl_sync(0xffffffffu, cur.slot, src);
    const int32_t begin = __shfl_sync(0xffffffffu, cur.begin, src);
    const int32_t len = __shfl_sync(0xffffffffu, cur.len, src);
    const int head_block = (wg + k * total_warps) % units_per_seq;  // h * kBlocks + row block
    const int stage = k % kStages;
    if (lane == 0) {
      const bool valid = fast_slot_valid(slot, p);
      records[stage] = make_int4(valid ? slot : -1, begin, len, head_block);
      if (valid && len > 0) {
        const StateT* src_rows = static_cast<const StateT*>(p.pool) +
                                 int64_t(slot) * p.stride_pool_slot +
                                 int64_t(head_block) * kUnitRows * kHeadDim;
        ptx::mbarrier_arrive_expect_tx(&bars[stage], kRingStageBytes);
        ptx::bulk_load_g2s(stages + stage * kRingStageBytes, src_rows, kRingStageBytes,
                           &bars[stage], policy);
      } else {
        ptx::mbarrier_arrive(&bars[stage]);
      }
    }
  };

  // Raw inputs of the unit of record m (zeros for padding and empty units: not used).
  auto load_unit = [&](const int4 m) -> RawToken<kE> {
    if (m.x >= 0 && m.z > 0) {
      const int h = m.w / kBlocks;
      const int j0 = (m.w % kBlocks) * kUnitRows;
      return load_raw<kHeadDim>(p, m.y, h, fast_qk_head(p, h), j0 + lane, lane < kUnitRows, lane);
    }
    RawToken<kE> zero = {};
    return zero;
  };

  const int first_arms = my_units < kStages ? my_units : kStages;
#pragma unroll 1
  for (int k = 0; k < first_arms; ++k) arm(k);
  __syncwarp();  // the unit records before any lane reads them
  RawToken<kE> raw = load_unit(records[0]);

#pragma unroll 1
  for (int k = 0; k < my_units; ++k) {
    const int stage = k % kStages;
    const int4 m = records[stage];
    RawToken<kE> raw_next = {};
    if (k + 1 < my_units) raw_next = load_unit(records[(k + 1) % kStages]);
    ptx::mbarrier_wait_parity(&bars[stage], uint32_t(k / kStages) & 1u);

    const int h = m.w / kBlocks;
    const int j0 = (m.w % kBlocks) * kUnitRows;  // first value row of the unit
    const DType dtype_o = FastFlags::dtype_qkv(p.flags);
    if (m.x < 0) {
      // NOTE: a padding row still owns its output rows: zeros, so that no stale value leaks.
      if (lane < kUnitRows) {
        for (int t = 0; t < m.z; ++t) {
          store_from_float(
              p.o, dtype_o,
              int64_t(m.y + t) * p.stride_o_tok + int64_t(h) * p.stride_o_h + j0 + lane, 0.f);
        }
      }
    } else if (m.z > 0) {
      const Token<kE> tok0 = finish(p, raw);
      const StateT* stage_rows =
          reinterpret_cast<const StateT*>(stages + stage * kRingStageBytes) + lane * kE;
      StateT* unit_dst = static_cast<StateT*>(p.pool) + int64_t(m.x) * p.stride_pool_slot +
                         int64_t(m.w) * kUnitRows * kHeadDim;
      StateT* dst = unit_dst + lane * kE;
#pragma unroll 1
      for (int group = 0; group < kGroups; ++group) {
        float s[8][kE];
#pragma unroll
        for (int r = 0; r < 8; ++r)
          kdakit::cuda::load_vec<kE>(stage_rows + (group * 8 + r) * kHeadDim, s[r]);
#pragma unroll 1
        for (int t = 0; t < m.z; ++t) {
          Token<kE> tok = tok0;
          float v = raw.v;
          if (t > 0) {
            const RawToken<kE> x = load_raw<kHeadDim>(p, m.y + t, h, fast_qk_head(p, h), j0 + lane,
                                                      lane < kUnitRows, lane);
            tok = finish(p, x);
            v = x.v;
          }
          const float out = step_rows<8, kE>(s, tok, v, group * 8, lane);
          if (holds_output<8>(lane)) {
            store_from_float(p.o, dtype_o,
                             int64_t(m.y + t) * p.stride_o_tok + int64_t(h) * p.stride_o_h + j0 +
                                 group * 8 + output_row<8>(lane),
                             out);
          }
        }
        if constexpr (kBulkStore) {
          // The rows go back into the stage; one bulk store per unit moves them (below).
          StateT* stage_out = const_cast<StateT*>(stage_rows);
#pragma unroll
          for (int r = 0; r < 8; ++r)
            kdakit::cuda::store_vec<kE>(stage_out + (group * 8 + r) * kHeadDim, s[r]);
        } else {
#pragma unroll
          for (int r = 0; r < 8; ++r)
            kdakit::cuda::store_vec_stream<kE>(dst + (group * 8 + r) * kHeadDim, s[r]);
        }
      }
      if constexpr (kBulkStore) {
        // NOTE: each lane fences its own shared-memory writes before the copy engine reads
        // them (async proxy), __syncwarp orders all lanes' writes before lane 0's store, and
        // lane 0 waits until the store has read the stage before arm() overwrites it.
        ptx::fence_proxy_async_shared();
        __syncwarp();
        if (lane == 0) {
          ptx::bulk_store_s2g(unit_dst, stages + stage * kRingStageBytes, kRingStageBytes, policy);
          ptx::bulk_commit_group();
          ptx::bulk_wait_group_read_0();
        }
      }
    }

    // NOTE: every lane's reads of this stage happen before lane 0 re-arms it: __syncwarp
    // orders them before lane 0's later accesses, and lane 0's proxy fence orders those
    // generic accesses before the copy engine's write (async proxy) into the same bytes.
    __syncwarp();
    if (k + kStages < my_units) {
      if (lane == 0) ptx::fence_proxy_async_shared();
      arm(k + kStages);
      __syncwarp();  // the new record before any lane reads it
    }
    raw = raw_next;
  }
  if constexpr (kBulkStore) {
    if (lane == 0) ptx::bulk_wait_group_0();  // the last unit's writes before the warp exits
  }
}

template <class StateT, int kWarps, int kStages, bool kBulkStore>
Status launch_ring(const FastDecodeParams& p, cudaStream_t stream, bool pdl, int num_sms,
                   int max_ctas) {
  using Plan = RingSharedMemoryPlan<kWarps, kStages>;
  constexpr int kUnitRows = kRingStageBytes / (kRingHeadDim * int(sizeof(StateT)));
  constexpr int kBlocks = kRingHeadDim / kUnitRows;
  const int64_t units = int64_t(p.num_seqs) * p.num_v_heads * kBlocks;
  if (units <= 0) return Status::Ok();
  if (units > int64_t{0x7fffffff}) {
    return Status(StatusCode::kUnsupported,
                  "decode: num_seqs * num_v_heads * " + std::to_string(kBlocks) +
                      " work units exceed 2^31 - 1 (got " + std::to_string(units) + ")");
  }
  auto kernel = kda_decode_sm90_ring_kernel<StateT, kWarps, kStages, kBulkStore>;
  // NOTE: once per instantiation: the dynamic shared-memory opt-in (192 KB) and the resident
  // CTAs per SM that it leaves (1), which sizes the persistent grid.
  static const cudaError_t attr_err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Plan::kBytes);
  if (attr_err != cudaSuccess) {
    return Status(StatusCode::kCudaError,
                  std::string(__FILE__) + ":" + std::to_string(__LINE__) +
                      ": raising the shared-memory limit of kda_decode_sm90_ring_kernel failed: " +
                      cudaGetErrorString(attr_err));
  }
  static const int resident = [&] {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, Plan::kBytes) !=
        cudaSuccess) {
      return 0;
    }
    return blocks;
  }();
  if (resident <= 0 || num_sms <= 0) {
    return Status(StatusCode::kCudaError, std::string(__FILE__) + ":" + std::to_string(__LINE__) +
                                              ": kda_decode_sm90_ring_kernel fits no SM (" +
                                              std::to_string(Plan::kBytes) +
                                              " bytes of shared memory)");
  }
  int64_t grid = std::min<int64_t>(int64_t(num_sms) * resident, units);
  if (max_ctas > 0) grid = std::min<int64_t>(grid, max_ctas);
  FastDecodeParams q = p;
  q.num_units = int32_t(units);
  return launch_pdl_kernel(kernel, "kda_decode_sm90_ring_kernel", dim3(unsigned(grid)),
                            kWarps * 32, Plan::kBytes, stream, pdl, q);
}

}  // namespace kdakit::sm90::recurrent
