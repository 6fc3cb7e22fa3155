// GPU test helpers (CUDA builds only): device copies of a case's host tensors, and
// kdakit::prefill run on them with its workspace, results copied back into the host tensors.
//
//   PrefillTensors t = make_prefill_tensors(c, rng);
//   const Status st = run_prefill_on_gpu(c, t);  // t.o, states, chunk states now hold results
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "kdakit/kdakit.h"

namespace kdakit::testing {

// Whether device 0 is an sm_90 GPU (what the prefill kernels are built for).
inline bool have_sm90() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
}

// Device copies of host tensors, freed at scope exit; copy_back() brings every one home.
class DeviceCopies {
 public:
  DeviceCopies() = default;
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;
  ~DeviceCopies() {
    for (auto& b : buffers_) cudaFree(b.second);
  }
  void* map(HostTensor& x) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, x.nbytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, x.data(), x.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    buffers_.emplace_back(&x, d);
    return d;
  }
  void copy_back() {
    for (auto& b : buffers_) {
      EXPECT_EQ(cudaMemcpy(b.first->data(), b.second, b.first->nbytes(), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
  }

 private:
  std::vector<std::pair<HostTensor*, void*>> buffers_;
};

// Runs case c through kdakit::prefill on device copies of t (on the default stream, with a
// workspace of prefill_workspace_size bytes, every byte set to workspace_fill first when it is
// 0..255); on success the results are copied back into t, and with workspace_head the first
// workspace_head->size() bytes of the workspace (the plan region) into it.
inline Status run_prefill_on_gpu(const PrefillCase& c, PrefillTensors& t, int workspace_fill = -1,
                                 std::vector<unsigned char>* workspace_head = nullptr) {
  DeviceCopies dev;
  const PrefillPointers ptr = map_pointers(t, [&](HostTensor& x) { return dev.map(x); });
  PrefillParams p = fill_prefill_params(c, t, ptr);
  p.workspace_bytes = prefill_workspace_size(p);
  void* ws = nullptr;
  if (p.workspace_bytes > 0) {
    EXPECT_EQ(cudaMalloc(&ws, p.workspace_bytes), cudaSuccess);
    if (workspace_fill >= 0 && workspace_fill <= 255)
      EXPECT_EQ(cudaMemset(ws, workspace_fill, p.workspace_bytes), cudaSuccess);
  }
  p.workspace = ws;
  // What the stream runs after the call must see its finished output: a copy of o enqueued right
  // after it has to equal o after the synchronisation. (A grid still writing o when the call's
  // last grid completes, e.g. the tile kernel of a routed call whose later grids start early by
  // programmatic dependent launch, would leave the copy with the poison.) Allocated before the
  // call: cudaMalloc may synchronise.
  void* o_next = nullptr;
  if (t.o.nbytes() > 0) EXPECT_EQ(cudaMalloc(&o_next, t.o.nbytes()), cudaSuccess);
  const Status st = prefill(p, nullptr);
  if (st.ok() && o_next != nullptr)
    EXPECT_EQ(cudaMemcpyAsync(o_next, ptr.o, t.o.nbytes(), cudaMemcpyDeviceToDevice, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (st.ok() && o_next != nullptr) {
    std::vector<unsigned char> after(t.o.nbytes()), next(t.o.nbytes());
    EXPECT_EQ(cudaMemcpy(after.data(), ptr.o, after.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(next.data(), o_next, next.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(after == next) << "the stream's next operation saw o before the call had finished writing it";
  }
  if (o_next != nullptr) cudaFree(o_next);
  if (st.ok() && workspace_head != nullptr && ws != nullptr && workspace_head->size() <= p.workspace_bytes)
    EXPECT_EQ(cudaMemcpy(workspace_head->data(), ws, workspace_head->size(), cudaMemcpyDeviceToHost), cudaSuccess);
  if (ws != nullptr) cudaFree(ws);
  if (st.ok()) dev.copy_back();
  return st;
}

}  // namespace kdakit::testing
