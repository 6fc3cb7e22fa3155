// PTX wrappers for sm_90 used by the decode kernels: programmatic dependent launch (grid
// dependency control), a GPU-scope load and an L2 bulk prefetch for the work a grid may do before
// its grid dependency wait. (The prefill kernels' mbarrier and TMA wrappers are in
// src/cuda/sm90/prefill/common/ptx.cuh.)
//
// Interface:
//   griddep_wait()                            programmatic dependent launch: wait until the
//                                             grids this one depends on have completed and
//                                             their writes are visible (returns at once when
//                                             the grid was launched without the attribute)
//   griddep_launch_dependents()               let the next grid of the stream start launching
//   griddep_exit_after_previous()             an idle grid's exit that completes after the
//                                             previous grid (the last CTA waits for it)
//   load_relaxed_gpu(p)                       a 32-bit load at GPU scope (served by L2, never a
//                                             stale L1 line): safe before griddep_wait() on
//                                             memory the previous grid may still write
//   bulk_prefetch_l2(src, bytes)              cp.async.bulk.prefetch.L2: bring `bytes` (% 16 == 0,
//                                             16-byte aligned) into L2; a hint, no data returned
//
// PTX ISA:
// https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-griddepcontrol
//          https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cp-async-bulk-prefetch
#pragma once

#include <cstdint>

namespace kdakit::cuda::ptx {

// ---- programmatic dependent launch ----------------------------------------------------------

__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// The exit of a grid launched with PDL whose CTAs have no work (the idle side of a routed prefill
// call): its last CTA lets the next grid launch and waits for the previous one, so that this
// grid completes after it (the other CTAs exit at once).
__device__ __forceinline__ void griddep_exit_after_previous() {
  if (blockIdx.x == gridDim.x - 1) {
    griddep_launch_dependents();
    griddep_wait();
  }
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
