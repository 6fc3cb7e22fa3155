// State handling shared by the CPU prefill and decode paths: gather, scatter, chunk states.
//
// A (sequence, value head) computation works on S as a dense double array S[i * V + j]
// (i: key channel, j: value channel). Stored states are K x V blocks in dtype_state and
// state_layout, dense inside one slot (HV blocks per slot, slots stride_*_n apart).
//
// Ordering: every work item first reads its initial state and runs; its chunk states and
// final state are kept as ready-to-store bytes and written only after all items finished, per
// value head in sequence order, chunk states before final states. So a pool that is read and
// written (initial_state == final_state, or chunk states into the state pool) has every state
// read before any is written, whatever the indices, and a slot named by two writes ends up
// with the later one, deterministically. (The GPU kernels only promise the result when no
// sequence writes a slot another one reads or writes: see kdakit.h.)
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/dtype.h"
#include "cpu/layout.h"
#include "kdakit/kdakit.h"

namespace kdakit::cpu {

struct StateFormat {
  DType dtype = DType::kFloat32;
  StateLayout layout = StateLayout::kVFirst;
  int32_t HV = 0, K = 0, V = 0;

  int64_t block_elements() const { return int64_t(K) * V; }
  int64_t block_bytes() const { return block_elements() * element_bytes(dtype); }

  // Pointer to the K x V block of value head h in slot `slot` of a buffer with slot stride
  // `stride_slot` (elements).
  const char* block(const void* base, int64_t slot, int64_t stride_slot, int32_t h) const {
    return static_cast<const char*>(base) +
           (slot * stride_slot + int64_t(h) * block_elements()) * element_bytes(dtype);
  }
  char* block(void* base, int64_t slot, int64_t stride_slot, int32_t h) const {
    return static_cast<char*>(base) +
           (slot * stride_slot + int64_t(h) * block_elements()) * element_bytes(dtype);
  }

  // Stored block -> S (exact: fp32 and bf16 widen exactly).
  void load(const char* stored, double* S) const {
    for (int32_t i = 0; i < K; ++i) {
      for (int32_t j = 0; j < V; ++j) {
        S[int64_t(i) * V + j] =
            load_as_double(stored, dtype, state_element_offset(layout, K, V, i, j));
      }
    }
  }

  // S -> stored block, rounded to nearest even.
  void store(const double* S, char* stored) const {
    for (int32_t i = 0; i < K; ++i) {
      for (int32_t j = 0; j < V; ++j) {
        store_from_double(stored, dtype, state_element_offset(layout, K, V, i, j),
                          S[int64_t(i) * V + j]);
      }
    }
  }
};

// Slot validity for untrusted indices: in range, and not the null slot when slot 0 is one.
inline bool slot_in_range(int64_t slot, int64_t num_slots, bool null_slot_is_padding = false) {
  return slot >= 0 && slot < num_slots && !(null_slot_is_padding && slot == 0);
}

// Final states produced by the work items, written after all of them ran. Each item appends
// (slot, stored block) pairs in the order they must be applied.
class DeferredStateWrites {
 public:
  DeferredStateWrites(int64_t num_seqs, int32_t HV, const StateFormat& format)
      : HV_(HV), format_(format), items_(size_t(num_seqs * HV)) {}

  // Reserves a block for item (n, h) going to `slot`; the caller fills the returned bytes.
  char* add(int64_t n, int32_t h, int64_t slot) {
    Item& item = items_[size_t(n * HV_ + h)];
    item.slots.push_back(slot);
    item.bytes.resize(item.bytes.size() + size_t(format_.block_bytes()));
    return item.bytes.data() + item.bytes.size() - size_t(format_.block_bytes());
  }

  // Applies all writes: value heads in parallel (they never share memory), sequences and
  // their writes in order.
  template <class ParallelFor>
  void apply(void* base, int64_t stride_slot, ParallelFor&& parallel) {
    const int64_t num_seqs = int64_t(items_.size()) / HV_;
    parallel(HV_, [&](int64_t h) {
      for (int64_t n = 0; n < num_seqs; ++n) {
        const Item& item = items_[size_t(n * HV_ + h)];
        for (size_t w = 0; w < item.slots.size(); ++w) {
          std::memcpy(format_.block(base, item.slots[w], stride_slot, int32_t(h)),
                      item.bytes.data() + w * size_t(format_.block_bytes()),
                      size_t(format_.block_bytes()));
        }
      }
    });
  }

 private:
  struct Item {
    std::vector<int64_t> slots;
    std::vector<char> bytes;
  };
  int32_t HV_;
  StateFormat format_;
  std::vector<Item> items_;
};

}  // namespace kdakit::cpu
