// parallel_for over independent work items on all cores (std::thread).
//
// Items are handed out through an atomic counter, so which thread runs an item varies between
// runs, but each item's arithmetic is done by one thread in a fixed order: results do not
// depend on the schedule (no sum is split across threads).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace kdakit::cpu {

inline int num_worker_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
}

// Calls fn(i) once for every i in [0, count).
template <class Fn>
void parallel_for(int64_t count, Fn&& fn) {
  if (count <= 0) return;
  const int64_t threads = std::min<int64_t>(num_worker_threads(), count);
  if (threads == 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(size_t(threads - 1));
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& thread : pool) thread.join();
}

}  // namespace kdakit::cpu
