// Host launch with programmatic dependent launch (PDL) as an option: the decode kernels
// (decode/direct.cuh, decode/kernel.cuh) and the prefill chain (prefill/common/pdl.h).
//
// NOTE: launched with the attribute, a grid may start while the previous grid of the stream is
// still running, as soon as every CTA of that grid has executed griddepcontrol.launch_dependents
// (or exited). The kernels launched this way call griddepcontrol.wait (ptx_sm90.cuh) before their
// first global-memory access that could depend on the previous grid; the wait returns once that
// grid has completed and its writes are visible, so results are the same with and without the
// attribute. What it saves is the gap between two kernels: the launch latency and the previous
// grid's tail, during which the next grid's CTAs are already resident. Inside stream capture the
// attribute becomes a programmatic edge of the graph.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "kdakit/kdakit.h"

namespace kdakit::cuda {

// Launches `kernel` with `config` (grid, block, shared memory, stream and any attributes of its
// own, at most three, e.g. a cluster shape) and, when `pdl`, the PDL attribute added to them.
template <class... KernelArgs, class... Args>
Status launch_with_pdl(cudaLaunchConfig_t config, bool pdl, const char* name, void (*kernel)(KernelArgs...),
                       const Args&... args) {
  cudaLaunchAttribute attribute[4];
  const unsigned own = config.numAttrs < 4 ? config.numAttrs : 3;
  for (unsigned i = 0; i < own; ++i) attribute[i] = config.attrs[i];
  attribute[own].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[own].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = own + (pdl ? 1 : 0);
  cudaError_t err = cudaLaunchKernelEx(&config, kernel, args...);
  if (err != cudaSuccess && pdl) {
    // NOTE: a PDL launch the runtime refuses is retried as a plain launch (same results); said
    // once per process on stderr, so that a timing run knows it did not measure PDL.
    static std::atomic<bool> reported{false};
    if (!reported.exchange(true, std::memory_order_relaxed)) {
      std::fprintf(stderr,
                   "kdakit: %s: launch with programmatic dependent launch failed (%s), launching "
                   "without it\n",
                   name, cudaGetErrorString(err));
    }
    (void)cudaGetLastError();
    config.numAttrs = own;
    err = cudaLaunchKernelEx(&config, kernel, args...);
  }
  if (err != cudaSuccess) {
    return Status(StatusCode::kCudaError, std::string(name) + " launch failed: " + cudaGetErrorString(err));
  }
  return Status::Ok();
}

// The common case: a 1-D block, no attribute but PDL's.
template <class... KernelArgs, class... Args>
Status launch_pdl_kernel(void (*kernel)(KernelArgs...), const char* name, dim3 grid, int threads, int smem_bytes,
                         cudaStream_t stream, bool pdl, const Args&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = size_t(smem_bytes);
  config.stream = stream;
  return launch_with_pdl(config, pdl, name, kernel, args...);
}

}  // namespace kdakit::cuda
