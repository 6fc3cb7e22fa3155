// PTX wrappers used by the prefill kernels (recurrence, fused): bf16 packing, mbarrier, and the bulk /
// tensor copies of the TMA unit (the MMA and ldmatrix wrappers come from cuda/common).
//
// Fragment layouts of mma.sync.m16n8k16 (bf16 in, fp32 accumulate), lane = 4 * group + quad:
//   A (16 x 16, row-major): reg0 = (group, 2 quad .. +1), reg1 = (group + 8, same cols),
//                           reg2 = (group, 8 + 2 quad .. +1), reg3 = (group + 8, 8 + 2 quad ..)
//   B (16 x 8, "col"):      reg0 = (k = 2 quad .. +1, n = group), reg1 = (k = 8 + 2 quad .., n)
//   C (16 x 8, fp32):       c0, c1 = (group, 2 quad .. +1), c2, c3 = (group + 8, same cols)
// so two neighbouring C tiles (n-tiles 2s, 2s+1) packed to bf16 pairs are the A fragment of
// k-step s. https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-fragment-mma-16816-float
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda/common/mma_sm80.cuh"

namespace kdakit::sm90::prefill::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Two fp32 -> one register of two bf16 (lo in the low half), round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two fp32 -> one register of two fp16 (lo in the low half), round to nearest even.
using kdakit::cuda::pack_f16x2;

// x ~ hi + lo with hi = bf16(x), lo = bf16(x - hi), for two values at once (16 mantissa bits).
__device__ __forceinline__ void split_bf16(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16(x0, x1);
  const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
  lo = pack_bf16(x0 - h0, x1 - h1);
}

// The warp-level MMA and ldmatrix wrappers are the shared ones (src/cuda/common/mma_sm80.cuh).
using kdakit::cuda::ldmatrix_x4;
using kdakit::cuda::ldmatrix_x4_trans;
using kdakit::cuda::mma_bf16_16816;

// ---- mbarrier -----------------------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Arrive and keep the phase's state token; wait on it (a thread that is both a producer and the
// waiter, with no phase count to carry).
__device__ __forceinline__ uint64_t mbarrier_arrive_state(uint64_t* bar) {
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];"
               : "=l"(state)
               : "r"(smem_addr(bar))
               : "memory");
  return state;
}
__device__ __forceinline__ void mbarrier_wait_state(uint64_t* bar, uint64_t state) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "l"(state)
      : "memory");
}

// ---- TMA ------------------------------------------------------------------------------------
// Orders this thread's view of shared memory (generic proxy) before the async proxy's (TMA).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// 3D tile of `map` at coordinates (c0, c1, c2) into shared memory; completes tx on `bar`.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                            int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
      "%5}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// Contiguous bytes (multiple of 16, both ends 16-byte aligned) into shared memory.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// 4D tile of `map` at coordinates (c0, c1, c2, c3) into shared memory; completes tx on `bar`.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// ---- named barriers, register reallocation ----------------------------------------------------
// bar.sync over `threads` threads (a multiple of 32) on barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- stmatrix -----------------------------------------------------------------------------------
// Four 8 x 8 bf16 matrices from the A/C fragment layout (the inverse of ldmatrix.x4): lane l
// gives the shared address of row l % 8 of matrix l / 8; register i goes to matrix i.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// ---- wgmma ----------------------------------------------------------------------------------------
// https://docs.nvidia.com/cuda/parallel-thread-execution/#asynchronous-warpgroup-level-matrix-instructions
// fence: before the first wgmma that reads registers written by ordinary instructions;
// commit: closes a group of issued wgmma; wait<N>: until at most N groups are pending.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across a wgmma wait.
template <int N>
__device__ __forceinline__ void fence_operands(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(x[i])::"memory");
}

// Shared-memory matrix descriptor of a 128-byte-swizzled bf16 operand (1024-byte aligned tile
// base; start may be offset inside it by the k-step). Fields in 16-byte units: start address
// (bits 0-13), leading byte offset (16-29), stride byte offset (32-45); layout 1 = 128B swizzle
// (bits 62-63).
//   K-major (rows of 64 K-elements, 128 bytes): sbo = 1024 (8 rows), lbo unused (1).
//   MN-major (rows of 64 MN-elements along K):  sbo = 1024 (8 K-rows), lbo = stride between
//   64-element MN blocks.
// NOTE: assembled by a volatile mov at the point of use, so that each descriptor is rebuilt
// from its 32-bit address where the wgmma needs it (added while hunting the consumers' register
// spills; the register count did not change with it, the spills came from elsewhere).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t lo = ((addr >> 4) & 0x3FFFu) | (((lbo_bytes >> 4) & 0x3FFFu) << 16);
  const uint32_t hi = ((sbo_bytes >> 4) & 0x3FFFu) | (1u << 30);
  uint64_t desc;
  asm volatile("mov.b64 %0, {%1, %2};" : "=l"(desc) : "r"(lo), "r"(hi));
  return desc;
}

}  // namespace kdakit::sm90::prefill::ptx
