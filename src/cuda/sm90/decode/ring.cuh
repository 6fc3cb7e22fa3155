// kda_decode_sm90_ring_kernel: single-token KDA decode over a V-first state pool with a
// persistent grid and a ring of shared-memory stages fed by bulk copies.
//
// Math (as kda_decode_sm90_kernel, kernel.cuh), per (sequence n, value head h) and value row
// j of S^T (a K-vector s_j, contiguous in the V-first pool), one token:
//   s_j <- exp(gamma) * s_j;  pred_j = <s_j, k>;  qd_j = <s_j, q>;  delta_j = beta (v_j - pred_j)
//   s_j <- s_j + delta_j k;   o_j = qd_j + delta_j <k, q>
// with q scaled (and q, k L2-normalised) in preprocessing.
//
// Shapes: q, k [N, 1, H, K]; v, o [N, 1, HV, V]; g [N, 1, HV, K] (or [N, 1, HV]); beta
// [N, 1, HV]; pool [num_slots, HV, V, K] (fp32 or bf16), state_indices [N] (one column).
// K = V = 128.
//
// Work items: (n, h, slice of kValuesPerCta = 32 value rows), slice fastest: a slice is one
// contiguous 32 x K block of the pool (16 KB fp32, 8 KB bf16). Grid: min(items, SMs x CTAs per
// SM); CTA c takes items c, c + grid, c + 2 grid, ... (local item m = 0, 1, ...).
//
// Warp roles (kRingThreads = 160):
//   warp 4 (producer): for local item m in stage s = m % kStages: waits until the consumers
//     released stage s (empty[s]), reads the slot (indices of 32 items at once, one per lane),
//     lane 0 sets the stage's expected bytes and issues one cp.async.bulk of the slice onto
//     full[s], the warp preprocesses the item's token into the stage's token buffer (its raw
//     loads were issued one item earlier), then lane 0 arrives on full[s]. Padding rows
//     (invalid slot) get no copy and a slot of -1.
//   warps 0-3 (consumers): wait on full[s]; warp w runs rows 8w .. 8w + 7 of the slice in two
//     passes over shared memory (decay + partial dots, reduce-scatter over the lanes, then
//     decay again + rank-1 update + streaming store to the pool) and writes its 8 outputs;
//     lane 0 arrives on empty[s]. No barrier between consumer warps.
// Pipeline: kStages stages; the producer runs up to kStages - 1 items ahead of the consumers,
// so while one slice is computed the next ones are in flight, and the slot -> state chain of
// an item overlaps the previous items' math instead of following it.
//
// Untrusted metadata: slots outside [0, num_slots) (or 0 with null_slot_is_padding) are
// padding rows: zero output, the pool is not touched.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "cuda/sm90/decode/kernel.cuh"

namespace kdakit::sm90::recurrent {

// ------------------------------------------------------------------------------------------
// mbarrier and bulk-copy wrappers (PTX ISA 8.0, sm_90)
// ------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the bulk copies' complete_tx).
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Release-arrive: the arriving thread's earlier shared-memory writes are visible to threads
// that observe the phase completing.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Acquire-wait for the phase of the given parity to complete.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}
// One bulk copy global -> shared of `bytes` (multiple of 16, both addresses 16-byte aligned),
// completion counted on `bar` in bytes.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// ------------------------------------------------------------------------------------------
// Kernel
// ------------------------------------------------------------------------------------------

struct RingItem {
  int64_t n;  // sequence (batch row)
  int h;      // value head
  int j0;     // first value row of the slice
};

template <int kSlices>
__device__ __forceinline__ RingItem ring_item(const RecurrentKernelParams& p, int64_t item) {
  RingItem it;
  it.j0 = int(item % kSlices) * kValuesPerCta;
  const int64_t nh = item / kSlices;
  it.h = int(nh % p.num_v_heads);
  it.n = nh / p.num_v_heads;
  return it;
}

template <class StateT, int kHeadDim, bool kDeep>
__global__ void __launch_bounds__(kRingThreads, ring_min_ctas_per_sm(kDeep))
    kda_decode_sm90_ring_kernel(const __grid_constant__ RecurrentKernelParams p) {
  using Plan = SharedMemoryPlan<kHeadDim>;
  using Ring = RingSharedMemoryPlan<StateT, kHeadDim, kDeep>;
  constexpr int kStages = Ring::kStages;
  constexpr int kE = kHeadDim / 32;
  constexpr int kSlices = kHeadDim / kValuesPerCta;
  constexpr int64_t kBlockElems = int64_t(kHeadDim) * kHeadDim;
  static_assert(kRowsPerWarp == 8, "the reduce-scatter is written for 8 rows per warp");
  extern __shared__ float4 smem_raw[];
  char* smem = reinterpret_cast<char*>(smem_raw);
  // NOTE: the preprocessing writes with SharedMemoryPlan<K>'s offsets (which skip the K-first
  // reduction area); the base of stage s's token buffer is shifted back by that area.
  auto token_base = [&](int s) { return reinterpret_cast<float*>(smem + Ring::token(s)) - Plan::kReduceFloats; };
  auto full = [&](int s) { return smem_u32(smem + Ring::full_barrier(s)); };
  auto empty = [&](int s) { return smem_u32(smem + Ring::empty_barrier(s)); };
  auto slot_of = [&](int s) { return reinterpret_cast<int64_t*>(smem + Ring::slot(s)); };

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t grid = gridDim.x;
  const int64_t num_items = p.num_seqs * p.num_v_heads * kSlices;
  const int64_t first = blockIdx.x;
  const int64_t my_items = num_items > first ? (num_items - first + grid - 1) / grid : 0;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), kNumWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (warp == kNumWarps) {
    // ---------------------------------------------------------------- producer warp
    RawToken<kHeadDim> raw[2];
    if (my_items > 0) {
      const RingItem it = ring_item<kSlices>(p, first);
      raw[0] = load_token<kHeadDim, true>(p, it.n, 0, it.h, it.j0, lane);
    }
    int64_t slot_batch = -1;
    // One item in stage s; `cur` holds the item's raw token inputs, `next` receives the next
    // item's (issued here, used one item later: its load latency hides behind this item).
    auto produce = [&](int64_t m, RawToken<kHeadDim>& cur, RawToken<kHeadDim>& next) {
      const int s = int(m % kStages);
      if (m % 32 == 0) {
        // NOTE: one lane per item: the slot indices of the next 32 items in one round trip.
        slot_batch = -1;
        if (m + lane < my_items) {
          const RingItem it = ring_item<kSlices>(p, first + (m + lane) * grid);
          slot_batch = p.state_indices[it.n * p.stride_state_indices_n];
        }
      }
      const int64_t slot = __shfl_sync(0xffffffffu, slot_batch, int(m % 32));
      const RingItem it = ring_item<kSlices>(p, first + m * grid);
      if (m + 1 < my_items) {
        const RingItem nx = ring_item<kSlices>(p, first + (m + 1) * grid);
        next = load_token<kHeadDim, true>(p, nx.n, 0, nx.h, nx.j0, lane);
      }
      if (m >= kStages) mbar_wait(empty(s), uint32_t((m / kStages - 1) & 1));
      const bool valid = slot_valid(slot, p.num_pool_slots, p.null_slot_is_padding);
      if (lane == 0) {
        *slot_of(s) = valid ? slot : -1;
        if (valid) {
          const StateT* src = static_cast<const StateT*>(p.pool) + slot * p.stride_pool_slot +
                              int64_t(it.h) * kBlockElems + int64_t(it.j0) * kHeadDim;
          mbar_expect_tx(full(s), uint32_t(Ring::kSliceBytes));
          bulk_copy_g2s(smem_u32(smem + Ring::stage(s)), src, uint32_t(Ring::kSliceBytes), full(s));
        }
      }
      if (valid) finish_token<kHeadDim, true>(p, cur, it.h, token_base(s), 1, 0, lane);
      __syncwarp();
      if (lane == 0) mbar_arrive(full(s));
    };
    // NOTE: unrolled by two with the raw buffers swapped, so that no register copy of a
    // pending load (which would wait for it) sits in the loop.
#pragma unroll 1
    for (int64_t m = 0; m < my_items; m += 2) {
      produce(m, raw[0], raw[1]);
      if (m + 1 < my_items) produce(m + 1, raw[1], raw[0]);
    }
    return;
  }

  // ------------------------------------------------------------------ consumer warps
  const int row0 = warp * kRowsPerWarp;
  const int my_row = (lane >> 1) & (kRowsPerWarp - 1);
#pragma unroll 1
  for (int64_t m = 0; m < my_items; ++m) {
    const int s = int(m % kStages);
    const RingItem it = ring_item<kSlices>(p, first + m * grid);
    const int64_t o_base = it.n * p.stride_o_b + int64_t(it.h) * p.stride_o_h + it.j0 + row0;
    mbar_wait(full(s), uint32_t((m / kStages) & 1));
    const int64_t slot = *slot_of(s);
    if (slot < 0) {
      if (lane < kRowsPerWarp) store_from_float(p.o, p.dtype_qkv, o_base + lane, 0.f);
    } else {
      const float* tok = token_base(s);
      const StateT* slice = reinterpret_cast<const StateT*>(smem + Ring::stage(s));
      StateT* block = static_cast<StateT*>(p.pool) + slot * p.stride_pool_slot + int64_t(it.h) * kBlockElems +
                      int64_t(it.j0) * kHeadDim;
      float q[kE], k[kE], d[kE];
      load_smem<kE>(tok + Plan::q(1) + lane * kE, q);
      load_smem<kE>(tok + Plan::k(1) + lane * kE, k);
      load_smem<kE>(tok + Plan::decay(1) + lane * kE, d);
      const float beta = tok[Plan::beta(1)];
      const float kq = tok[Plan::kq(1)];

      // Pass 1: decayed rows -> partial <s, k>, <s, q>.
      float part[2 * kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float x[kE];
        load_smem_row<kE>(slice + (row0 + r) * kHeadDim + lane * kE, x);
        part[r] = 0.f;
        part[kRowsPerWarp + r] = 0.f;
#pragma unroll
        for (int e = 0; e < kE; ++e) {
          x[e] *= d[e];
          part[r] = fmaf(x[e], k[e], part[r]);
          part[kRowsPerWarp + r] = fmaf(x[e], q[e], part[kRowsPerWarp + r]);
        }
      }
      reduce_scatter_stage<8>(part, lane);
      reduce_scatter_stage<4>(part, lane);
      reduce_scatter_stage<2>(part, lane);
      reduce_scatter_stage<1>(part, lane);
      const float total = part[0] + __shfl_xor_sync(0xffffffffu, part[0], 1);
      const float my_delta = beta * (tok[Plan::v(1) + row0 + my_row] - total);

      // Pass 2: decay again (identical operations, identical bits), rank-1 update, store.
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float delta = __shfl_sync(0xffffffffu, my_delta, 2 * r);
        const int offset = (row0 + r) * kHeadDim + lane * kE;
        float x[kE];
        load_smem_row<kE>(slice + offset, x);
#pragma unroll
        for (int e = 0; e < kE; ++e) x[e] = fmaf(delta, k[e], x[e] * d[e]);
        kdakit::cuda::store_vec_stream<kE>(block + offset, x);
      }
      const float partner_delta = __shfl_xor_sync(0xffffffffu, my_delta, 16);
      if (lane >= 16 && (lane & 1) == 0) store_from_float(p.o, p.dtype_qkv, o_base + my_row, fmaf(partner_delta, kq, total));
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty(s));
  }
}

// Grid size: SMs x resident CTAs per SM (occupancy of this instantiation), cached per device.
template <class StateT, int kHeadDim, bool kDeep>
Status launch_ring(const RecurrentKernelParams& p, cudaStream_t stream) {
  constexpr int kSlices = kHeadDim / kValuesPerCta;
  const int64_t items = p.num_seqs * p.num_v_heads * kSlices;
  if (items <= 0) return Status::Ok();
  auto kernel = kda_decode_sm90_ring_kernel<StateT, kHeadDim, kDeep>;
  const int smem_bytes = RingSharedMemoryPlan<StateT, kHeadDim, kDeep>::bytes();
  auto cuda_error = [](int line, const char* what, cudaError_t err) {
    return Status(StatusCode::kCudaError, std::string(__FILE__) + ":" + std::to_string(line) + ": " + what + ": " +
                                              cudaGetErrorString(err));
  };
  // NOTE: more than 48 KB of dynamic shared memory needs the opt-in attribute; the largest
  // carveout keeps all ring_min_ctas_per_sm CTAs resident.
  static const cudaError_t attributes = [&] {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (err != cudaSuccess) return err;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                int(cudaSharedmemCarveoutMaxShared));
  }();
  if (attributes != cudaSuccess) return cuda_error(__LINE__, "setting the ring kernel's shared memory failed", attributes);
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_error(__LINE__, "cudaGetDevice", err);
  constexpr int kMaxDevices = 64;
  static std::atomic<int> resident[kMaxDevices] = {};
  int ctas = device < kMaxDevices ? resident[device].load(std::memory_order_relaxed) : 0;
  if (ctas == 0) {
    int sms = 0, per_sm = 0;
    if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); err != cudaSuccess) {
      return cuda_error(__LINE__, "reading the SM count", err);
    }
    if (cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kRingThreads, smem_bytes);
        err != cudaSuccess) {
      return cuda_error(__LINE__, "reading the ring kernel's occupancy", err);
    }
    ctas = sms * (per_sm > 0 ? per_sm : 1);
    if (device < kMaxDevices) resident[device].store(ctas, std::memory_order_relaxed);
  }
  const int grid = int(items < int64_t(ctas) ? items : int64_t(ctas));
  kernel<<<dim3(unsigned(grid)), kRingThreads, smem_bytes, stream>>>(p);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return cuda_error(__LINE__, "kda_decode_sm90_ring_kernel launch failed", err);
  }
  return Status::Ok();
}

}  // namespace kdakit::sm90::recurrent
