// PTX wrappers for sm_90: mbarriers, bulk (TMA) copies between global and shared memory, L2
// cache policies, and programmatic dependent launch (grid dependency control).
//
// Interface (additions welcome; keep these signatures, other kernels may include this file):
//   smem_u32(p)                               shared-window address of a generic pointer
//   mbarrier_init(bar, count)                 one thread; then fence_mbarrier_init() before use
//   mbarrier_arrive(bar)                      one arrival, no transaction bytes
//   mbarrier_arrive_expect_tx(bar, bytes)     one arrival that also expects `bytes` of copies
//   mbarrier_wait_parity(bar, parity)         spin until the phase of that parity has completed
//   fence_proxy_async_shared()                this thread's generic shared-memory accesses are
//                                             ordered before its later async-proxy (TMA) ones
//   l2_evict_first_policy()                   a cache policy for data touched once
//   bulk_load_g2s(dst, src, bytes, bar, pol)  cp.async.bulk global -> shared (bytes % 16 == 0,
//                                             both addresses 16-byte aligned), completes on bar
//   bulk_store_s2g(dst, src, bytes, pol)      cp.async.bulk shared -> global in a bulk group;
//                                             the writers of src need fence_proxy_async_shared()
//                                             and a barrier (or __syncwarp) first
//   bulk_commit_group()                       close this thread's bulk group
//   bulk_wait_group_read_0()                  this thread's bulk stores have read shared memory
//   bulk_wait_group_0()                       ... and completed their writes
//   griddep_wait()                            programmatic dependent launch: wait until the
//                                             grids this one depends on have completed and
//                                             their writes are visible (returns at once when
//                                             the grid was launched without the attribute)
//   griddep_launch_dependents()               let the next grid of the stream start launching
//   load_relaxed_gpu(p)                       a 32-bit load at GPU scope (served by L2, never a
//                                             stale L1 line): safe before griddep_wait() on
//                                             memory the previous grid may still write
//   bulk_prefetch_l2(src, bytes)              cp.async.bulk.prefetch.L2: bring `bytes` (% 16 == 0,
//                                             16-byte aligned) into L2; a hint, no data returned
//
// PTX ISA:
// https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-mbarrier
//          https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cp-async-bulk
//          https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-griddepcontrol
#pragma once

#include <cstdint>

namespace kdakit::cuda::ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier -------------------------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

// Makes the initialised barriers visible to the async proxy (the copy engine) and to other
// threads; they still need a thread barrier (or __syncwarp for a warp's own barriers).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "KDAKIT_MBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra KDAKIT_MBAR_WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// ---- async proxy ----------------------------------------------------------------------------

__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// NOTE: the .shared::cluster destination is the form sm_90 has; a CTA's own shared::cta
// address is a valid shared::cluster address of that CTA, cluster launch or not.
__device__ __forceinline__ void bulk_load_g2s(void* dst, const void* src, uint32_t bytes,
                                              uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], "
      "%4;" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void bulk_store_s2g(void* dst, const void* src, uint32_t bytes,
                                               uint64_t policy) {
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;" ::"l"(dst),
      "r"(smem_u32(src)), "r"(bytes), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

__device__ __forceinline__ void bulk_wait_group_read_0() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

__device__ __forceinline__ void bulk_wait_group_0() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// ---- programmatic dependent launch ----------------------------------------------------------

__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// NOTE: what a grid may do before griddep_wait(): nothing that depends on the previous grid's
// writes for correctness. A relaxed GPU-scope load may race with such a write and return the old
// or the new value (never a torn or cached one); an L2 prefetch only moves lines into L2, which
// is the point of coherence, so a later load after griddep_wait() still sees the final data.
__device__ __forceinline__ int32_t load_relaxed_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

}  // namespace kdakit::cuda::ptx
