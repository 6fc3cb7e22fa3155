// Programmatic dependent launch (PDL) along one prefill call's chain of kernels:
//   plan -> [tile16 ->] prep -> [summaries -> combine ->] recurrence     (two-kernel path)
//   plan -> tile16                                                       (tile path)
// Every kernel after the plan kernel is launched with the attribute (cuda/common/pdl_launch.cuh)
// and, in each CTA, executes pdl_enter() before anything else that touches global memory.
//
// NOTE: the order inside pdl_enter() is what makes the chain safe: wait first (this grid's
// predecessor has completed, and by induction every kernel before it, the caller's included),
// then trigger (the next grid may launch). Had a kernel triggered before its wait, the next
// grid could start while this one's predecessor was still running. The plan kernel, launched
// without the attribute after whatever the caller ran, triggers at its start (it has no wait:
// a plain launch starts after all earlier work of the stream has completed). The last kernel of
// a call does not trigger: a caller's kernel launched with PDL after it starts only when it
// completes. With plan_ready (no plan kernel) the first kernel of the call waits on the caller's
// last kernel, which is correct whatever that kernel is.
// KDAKIT_PREFILL_PDL=0 launches the chain without the attribute (A/B timing; same results).
#pragma once

#include <cstdlib>

#include "cuda/common/pdl_launch.cuh"
#include "cuda/common/ptx_sm90.cuh"

namespace kdakit::sm90::prefill {

inline bool prefill_pdl() {
  static const bool on = [] {
    const char* e = std::getenv("KDAKIT_PREFILL_PDL");
    return !(e != nullptr && e[0] == '0' && e[1] == '\0');
  }();
  return on;
}

#if defined(__CUDACC__)
// Wait for the previous grid of the stream (a no-op when launched without PDL), then, unless
// this is the last kernel of the chain (trigger = false), let the next one launch.
__device__ __forceinline__ void pdl_enter(bool trigger = true) {
  kdakit::cuda::ptx::griddep_wait();
  if (trigger) kdakit::cuda::ptx::griddep_launch_dependents();
}
#endif

}  // namespace kdakit::sm90::prefill
