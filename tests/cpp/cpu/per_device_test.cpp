// The per-device caches of the host launchers (src/cuda/common/per_device.h): a set-up step
// (the kernels' cudaFuncSetAttribute calls) runs once per device, again on every device it has
// not succeeded on, and a cached value is per device. No GPU needed: the device ids are given.
#include "cuda/common/per_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kdakit {
namespace {

using cuda::kMaxCachedDevices;
using cuda::PerDeviceOnce;
using cuda::PerDeviceValue;

TEST(PerDeviceOnce, RunsOncePerDevice) {
  PerDeviceOnce once;
  int calls = 0;
  auto step = [&] { return ++calls, 0; };
  EXPECT_EQ(once.run(0, 0, step), 0);
  EXPECT_EQ(once.run(0, 0, step), 0);
  EXPECT_EQ(calls, 1);
  // A second device of the same process runs the step for itself.
  EXPECT_EQ(once.run(1, 0, step), 0);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(once.run(1, 0, step), 0);
  EXPECT_EQ(once.run(0, 0, step), 0);
  EXPECT_EQ(calls, 2);
}

TEST(PerDeviceOnce, RetriesUntilTheStepSucceeds) {
  PerDeviceOnce once;
  int calls = 0;
  int result = 7;  // an error code
  auto step = [&] { return ++calls, result; };
  EXPECT_EQ(once.run(3, 0, step), 7);
  EXPECT_EQ(once.run(3, 0, step), 7);
  EXPECT_EQ(calls, 2);
  result = 0;
  EXPECT_EQ(once.run(3, 0, step), 0);
  EXPECT_EQ(once.run(3, 0, step), 0);
  EXPECT_EQ(calls, 3);
}

TEST(PerDeviceOnce, UncachedDeviceIdsRunEveryTime) {
  PerDeviceOnce once;
  int calls = 0;
  auto step = [&] { return ++calls, 0; };
  for (int device : {-1, kMaxCachedDevices, kMaxCachedDevices + 5}) {
    EXPECT_EQ(once.run(device, 0, step), 0);
    EXPECT_EQ(once.run(device, 0, step), 0);
  }
  EXPECT_EQ(calls, 6);
  // and leave the cached devices alone
  EXPECT_EQ(once.run(kMaxCachedDevices - 1, 0, step), 0);
  EXPECT_EQ(once.run(kMaxCachedDevices - 1, 0, step), 0);
  EXPECT_EQ(calls, 7);
}

TEST(PerDeviceOnce, ConcurrentCallersSeeSuccess) {
  PerDeviceOnce once;
  std::atomic<int> calls{0};
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        if (once.run(t % 2, 0, [&] { return calls.fetch_add(1), 0; }) != 0) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  // Each of the two devices ran the step at least once and at most once per thread.
  EXPECT_GE(calls.load(), 2);
  EXPECT_LE(calls.load(), 8);
}

TEST(PerDeviceValue, ReadsOncePerDeviceAndSkipsBadReads) {
  PerDeviceValue cache;
  int reads = 0;
  EXPECT_EQ(cache.get(0, 132, [&] { return ++reads, 114; }), 114);
  EXPECT_EQ(cache.get(0, 132, [&] { return ++reads, 999; }), 114);
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(cache.get(1, 132, [&] { return ++reads, 132; }), 132);
  EXPECT_EQ(reads, 2);
  // A failed read (<= 0) gives the fallback and is not cached.
  EXPECT_EQ(cache.get(2, 77, [&] { return ++reads, 0; }), 77);
  EXPECT_EQ(cache.get(2, 77, [&] { return ++reads, 16; }), 16);
  EXPECT_EQ(cache.get(2, 77, [&] { return ++reads, 99; }), 16);
  EXPECT_EQ(reads, 4);
  EXPECT_EQ(cache.get(-1, 5, [&] { return ++reads, 8; }), 8);
  EXPECT_EQ(cache.get(-1, 5, [&] { return ++reads, 9; }), 9);
  EXPECT_EQ(reads, 6);
}

}  // namespace
}  // namespace kdakit
