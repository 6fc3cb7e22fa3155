// Per-device caches for the host launchers. Function attributes (cudaFuncSetAttribute) and
// device properties belong to one device's context, so a launcher that sets or reads them once
// has to do so once per device: a process-wide "once" leaves the second GPU of a multi-GPU
// process without the shared-memory opt-in, and its launches fail. Plain C++ (no CUDA headers),
// so that the CPU tests cover it.
#pragma once

#include <atomic>

namespace kdakit::cuda {

constexpr int kMaxCachedDevices = 64;

// Runs a set-up step once per device: until it has succeeded on a device, every call for that
// device runs it again; a device id outside [0, kMaxCachedDevices) runs it on every call.
// Thread-safe: two threads may both run it the first time, so the step must be idempotent
// (cudaFuncSetAttribute with a fixed value is).
class PerDeviceOnce {
 public:
  template <class R, class F>
  R run(int device, R ok, F&& set_up) {
    const bool cached = device >= 0 && device < kMaxCachedDevices;
    if (cached && done_[device].load(std::memory_order_acquire)) return ok;
    const R result = set_up();
    if (cached && result == ok) done_[device].store(true, std::memory_order_release);
    return result;
  }

 private:
  std::atomic<bool> done_[kMaxCachedDevices] = {};
};

// A positive per-device value (e.g. the SM count) read once per device; a read that gives
// <= 0 is not cached and the call returns `fallback`.
class PerDeviceValue {
 public:
  template <class F>
  int get(int device, int fallback, F&& read) {
    const bool cached = device >= 0 && device < kMaxCachedDevices;
    if (cached) {
      if (const int v = value_[device].load(std::memory_order_relaxed); v > 0) return v;
    }
    const int v = read();
    if (v <= 0) return fallback;
    if (cached) value_[device].store(v, std::memory_order_relaxed);
    return v;
  }

 private:
  std::atomic<int> value_[kMaxCachedDevices] = {};
};

}  // namespace kdakit::cuda
