// Host launch of a kernel with the programmatic-dependent-launch attribute optional (PDL: the
// kernel may start while the previous kernel of the stream is finishing). Used by the decode
// kernels (sm90/decode: direct.cuh and the staged kernel of kernel.cuh), by a routed prefill
// call's prep and recurrence kernels, and by a segmented call's recurrence pass after the combine
// pass (sm90/prefill: prep/kernel.cuh, recurrence/kernel.cuh and wgmma.cuh).
//
// NOTE: the decode kernels call griddepcontrol.wait before their first global-memory access that
// could depend on the previous kernel (before it they only read a slot index at GPU scope to aim
// an L2 prefetch), which returns once that kernel has completed and its writes are visible, so
// results are the same with and without it. What it saves is the launch latency between two
// kernels (small batches are latency-bound). Inside stream capture the attribute becomes a
// programmatic edge of the graph.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "kdakit/kdakit.h"

namespace kdakit::cuda {

template <class Kernel, class... Params>
Status launch_pdl_kernel(Kernel kernel, const char* name, dim3 grid, int threads, int smem_bytes,
                         cudaStream_t stream, bool pdl, const Params&... p) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = size_t(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  cudaError_t err = cudaLaunchKernelEx(&config, kernel, p...);
  if (err != cudaSuccess && pdl) {
    // NOTE: a PDL launch the runtime refuses is retried as a plain launch (same results); said
    // once on stderr, so that a timing run knows it did not measure PDL.
    static std::atomic<bool> reported{false};
    if (!reported.exchange(true, std::memory_order_relaxed)) {
      std::fprintf(stderr,
                   "kdakit: %s: launch with programmatic dependent launch failed (%s), launching "
                   "without it\n",
                   name, cudaGetErrorString(err));
    }
    (void)cudaGetLastError();
    config.numAttrs = 0;
    err = cudaLaunchKernelEx(&config, kernel, p...);
  }
  if (err != cudaSuccess) {
    return Status(StatusCode::kCudaError, std::string(__FILE__) + ":" + std::to_string(__LINE__) +
                                              ": " + name +
                                              " launch failed: " + cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace kdakit::cuda
