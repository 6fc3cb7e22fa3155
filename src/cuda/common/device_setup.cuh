// Host helpers of the launchers on top of per_device.h: the current device, its SM count and
// function attributes set once per device.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/per_device.h"

namespace kdakit::cuda {

// The calling thread's current device, or -1 when it cannot be read (then nothing is cached).
inline int current_device() {
  int device = -1;
  return cudaGetDevice(&device) == cudaSuccess ? device : -1;
}

// Runs `set_up` (cudaFuncSetAttribute calls returning cudaError_t) once per device for `once`
// (one static PerDeviceOnce per kernel instantiation at the call site).
template <class F>
cudaError_t set_up_once_per_device(PerDeviceOnce& once, F&& set_up) {
  return once.run(current_device(), cudaSuccess, set_up);
}

// Multiprocessors of the current device (a host attribute query, no sync), read once per
// device; `fallback` when it cannot be read.
inline int current_device_sm_count(int fallback) {
  static PerDeviceValue cache;
  const int device = current_device();
  return cache.get(device, fallback, [device] {
    int n = 0;
    if (device < 0 || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    return n;
  });
}

}  // namespace kdakit::cuda
