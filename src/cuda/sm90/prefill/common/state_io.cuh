// Recurrent-state I/O of the chunked prefill kernels (recurrence, fused): one warp's 16 value
// rows of S^T (V x K) in the mma / wgmma accumulator layout, read from and written to a state
// stored V-first [V][K] or K-first [K][V], in fp32 or bf16. P is any kernel-side params struct
// with the flags k_first, state_bf16 and state_pairs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill::common {

// ---- state fields of a call --------------------------------------------------------------
// What every chunked prefill kernel reads of the initial, final and chunk states: the base of
// their kernel-side params structs, filled once by state_params.
struct StateParams {
  const void* initial_state;             // [slots, HV, state], nullable
  const int32_t* initial_state_indices;  // [N], nullable
  int64_t stride_initial_state_n;
  void* final_state;                     // [slots, HV, state], nullable
  const int32_t* final_state_indices;    // [N], nullable
  int64_t stride_final_state_n;
  int64_t num_state_slots;               // slots when indexed, else N
  void* chunk_states;                    // [rows, HV, state], nullable
  int64_t num_chunk_states;              // entries
  const int32_t* chunk_state_indices;    // [num_chunk_states] destination rows, nullable (dense)
  int64_t num_chunk_state_slots;         // rows when indexed
  int64_t stride_chunk_states_n;         // between rows (elements); 0 = HV * K * V
  int32_t chunk_state_interval;          // multiple of 64 when chunk_states is set
  bool chunk_bf16;                       // chunk states stored as bf16
  bool chunk_pairs;                      // ... with aligned pair stores
  bool state_bf16;
  bool k_first;
  bool state_pairs;  // two neighbouring key channels of a V-first state are one aligned access
  // Not a state field: which side of a routed call (workspace.h, Route) the kernel is on; set
  // by the launchers from the plan (state_params leaves it off: every kernel runs).
  Route route;
};

inline StateParams state_params(const PrefillParams& p) {
  const bool bf16 = p.dtype_state == DType::kBFloat16;
  const size_t elem = bf16 ? 2 : 4;
  auto pairs_ok = [&](const void* ptr, int64_t stride) {
    return ptr == nullptr || (reinterpret_cast<uintptr_t>(ptr) % (2 * elem) == 0 && stride % 2 == 0);
  };
  StateParams s{};
  s.initial_state = p.initial_state;
  s.initial_state_indices = p.initial_state_indices;
  s.stride_initial_state_n = p.stride_initial_state_n;
  s.final_state = p.final_state;
  s.final_state_indices = p.final_state_indices;
  s.stride_final_state_n = p.stride_final_state_n;
  s.num_state_slots =
      (p.initial_state_indices != nullptr || p.final_state_indices != nullptr) ? p.num_state_slots : p.num_seqs;
  s.chunk_states = p.chunk_states;
  s.num_chunk_states = p.num_chunk_states;
  s.chunk_state_indices = p.chunk_state_indices;
  s.num_chunk_state_slots = p.num_chunk_state_slots;
  s.stride_chunk_states_n = p.stride_chunk_states_n;
  s.chunk_state_interval = p.chunk_state_interval;
  s.chunk_bf16 = chunk_states_dtype(p) == DType::kBFloat16;
  s.chunk_pairs = p.chunk_states == nullptr ||
                  (reinterpret_cast<uintptr_t>(p.chunk_states) % (s.chunk_bf16 ? 4 : 8) == 0 &&
                   p.stride_chunk_states_n % 2 == 0);
  s.state_bf16 = bf16;
  s.k_first = p.state_layout == StateLayout::kKFirst;
  s.state_pairs = pairs_ok(p.initial_state, p.stride_initial_state_n) && pairs_ok(p.final_state, p.stride_final_state_n);
  return s;
}

// ---- state fragments ------------------------------------------------------------------------
// Thread (group, quad) of a warp owning value rows vrow .. vrow + 15 holds, in tile j (key
// channels 8 j .. 8 j + 7): S^T[vrow + group][8 j + 2 quad + {0, 1}] in c0, c1 and the same
// for vrow + group + 8 in c2, c3. kTiles < 16: tiles tile0 .. tile0 + kTiles - 1 only (a warp
// that owns a column block of the rows).
// NOTE: load_state and store_state branch once on the layout flags and then run one unrolled
// sequence of accesses (load_state_as, store_state_as). With the flags tested per element pair,
// nvcc 13.0 kept three uniform branches around each of the 32 pairs of a 16-tile state: ~11
// instructions a pair, ~350 for a state, run by every CTA that starts from the caller's state
// (a whole-sequence recurrence, segment 0's summary) or writes the final state.
//
// with_state_layout runs f.template operator()<kKFirst, kBf16, kPairs>() for the call's state
// layout: the one branch on the flags that load_state and store_state take. K-first states have
// no pair path.
template <class P, class F>
__device__ __forceinline__ void with_state_layout(const P& p, F&& f) {
  if (p.k_first) {
    if (p.state_bf16) {
      f.template operator()<true, true, false>();
    } else {
      f.template operator()<true, false, false>();
    }
  } else if (p.state_bf16) {
    if (p.state_pairs) {
      f.template operator()<false, true, true>();
    } else {
      f.template operator()<false, true, false>();
    }
  } else if (p.state_pairs) {
    f.template operator()<false, false, true>();
  } else {
    f.template operator()<false, false, false>();
  }
}

template <bool kKFirst, bool kBf16, bool kPairs, int kTiles>
__device__ __forceinline__ void load_state_as(float (&s)[kTiles][4], const void* base, int vrow, int quad,
                                              int tile0) {
  #pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int v = vrow + 8 * half;
      const int k = 8 * (tile0 + j) + 2 * quad;
      float x0, x1;
      if constexpr (kKFirst) {
        const int64_t i0 = int64_t(k) * kHeadDim + v, i1 = i0 + kHeadDim;
        if constexpr (kBf16) {
          x0 = __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i0]);
          x1 = __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i1]);
        } else {
          x0 = static_cast<const float*>(base)[i0];
          x1 = static_cast<const float*>(base)[i1];
        }
      } else {
        const int64_t i0 = int64_t(v) * kHeadDim + k;
        if constexpr (kBf16) {
          const __nv_bfloat16* b = static_cast<const __nv_bfloat16*>(base) + i0;
          if constexpr (kPairs) {
            const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(b);
            x0 = __low2float(pair);
            x1 = __high2float(pair);
          } else {
            x0 = __bfloat162float(b[0]);
            x1 = __bfloat162float(b[1]);
          }
        } else {
          const float* f = static_cast<const float*>(base) + i0;
          if constexpr (kPairs) {
            const float2 pair = *reinterpret_cast<const float2*>(f);
            x0 = pair.x;
            x1 = pair.y;
          } else {
            x0 = f[0];
            x1 = f[1];
          }
        }
      }
      s[j][2 * half] = x0;
      s[j][2 * half + 1] = x1;
    }
  }
}

template <int kTiles, class P>
__device__ __forceinline__ void load_state(float (&s)[kTiles][4], const void* base, int vrow, int quad,
                                           const P& p, int tile0 = 0) {
  with_state_layout(p, [&]<bool kKFirst, bool kBf16, bool kPairs>() {
    load_state_as<kKFirst, kBf16, kPairs>(s, base, vrow, quad, tile0);
  });
}

template <bool kKFirst, bool kBf16, bool kPairs, int kTiles>
__device__ __forceinline__ void store_state_as(const float (&s)[kTiles][4], void* base, int vrow, int quad,
                                               int tile0) {
  #pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int v = vrow + 8 * half;
      const int k = 8 * (tile0 + j) + 2 * quad;
      const float x0 = s[j][2 * half], x1 = s[j][2 * half + 1];
      if constexpr (kKFirst) {
        const int64_t i0 = int64_t(k) * kHeadDim + v, i1 = i0 + kHeadDim;
        if constexpr (kBf16) {
          static_cast<__nv_bfloat16*>(base)[i0] = __float2bfloat16_rn(x0);
          static_cast<__nv_bfloat16*>(base)[i1] = __float2bfloat16_rn(x1);
        } else {
          static_cast<float*>(base)[i0] = x0;
          static_cast<float*>(base)[i1] = x1;
        }
      } else {
        const int64_t i0 = int64_t(v) * kHeadDim + k;
        if constexpr (kBf16) {
          __nv_bfloat16* b = static_cast<__nv_bfloat16*>(base) + i0;
          if constexpr (kPairs) {
            *reinterpret_cast<__nv_bfloat162*>(b) = __floats2bfloat162_rn(x0, x1);
          } else {
            b[0] = __float2bfloat16_rn(x0);
            b[1] = __float2bfloat16_rn(x1);
          }
        } else {
          float* f = static_cast<float*>(base) + i0;
          if constexpr (kPairs) {
            *reinterpret_cast<float2*>(f) = make_float2(x0, x1);
          } else {
            f[0] = x0;
            f[1] = x1;
          }
        }
      }
    }
  }
}

template <int kTiles, class P>
__device__ __forceinline__ void store_state(const float (&s)[kTiles][4], void* base, int vrow, int quad,
                                            const P& p, int tile0 = 0) {
  with_state_layout(p, [&]<bool kKFirst, bool kBf16, bool kPairs>() {
    store_state_as<kKFirst, kBf16, kPairs>(s, base, vrow, quad, tile0);
  });
}

// Address of one (slot, head) state: `elements` counted in the storage dtype.
__device__ __forceinline__ void* state_at(void* base, int64_t elements, bool bf16) {
  return static_cast<uint8_t*>(base) + elements * (bf16 ? 2 : 4);
}

// Value head h of sequence n's initial state (its slot, or row n), or nullptr: no initial
// state, or a slot index out of range (start from zeros).
__device__ __forceinline__ const void* initial_state_of(const StateParams& p, int64_t n, int h) {
  if (p.initial_state == nullptr) return nullptr;
  const int64_t slot = p.initial_state_indices != nullptr ? p.initial_state_indices[n] : n;
  if (slot < 0 || slot >= p.num_state_slots) return nullptr;
  return state_at(const_cast<void*>(p.initial_state),
                  slot * p.stride_initial_state_n + int64_t(h) * kHeadDim * kHeadDim, p.state_bf16);
}
// The same for the final state (nullptr: not written).
__device__ __forceinline__ void* final_state_of(const StateParams& p, int64_t n, int h) {
  if (p.final_state == nullptr) return nullptr;
  const int64_t slot = p.final_state_indices != nullptr ? p.final_state_indices[n] : n;
  if (slot < 0 || slot >= p.num_state_slots) return nullptr;
  return state_at(p.final_state, slot * p.stride_final_state_n + int64_t(h) * kHeadDim * kHeadDim, p.state_bf16);
}

// The initial state of sequence n, value head h into the fragments (load_state's layout), or
// zeros when there is none (initial_state_of).
template <int kTiles, class P>
__device__ __forceinline__ void load_initial_state(float (&s)[kTiles][4], const P& p, int64_t n, int h, int vrow,
                                                   int quad, int tile0 = 0) {
  const void* init = initial_state_of(p, n, h);
  if (init != nullptr) {
    load_state(s, init, vrow, quad, p, tile0);
  } else {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
  }
}

// A field of a record in shared memory written by another thread, read where it is used
// (a volatile load: not kept in a register across the loop that reads it).
template <class T>
__device__ __forceinline__ T vld(const T* ptr) {
  return *static_cast<const volatile T*>(ptr);
}

// The layout flags of a chunk-state store, which may differ from the state's dtype.
struct StateView {
  bool k_first;
  bool state_bf16;
  bool state_pairs;
};

// The segment area's states (workspace.h): fp32, V-first, aligned pairs.
__device__ __forceinline__ StateView segment_state_view() { return StateView{false, false, true}; }

// Element offset of chunk-state entry `entry` of value head h in chunk_states, or -1 to skip it:
// row = entry (dense) or chunk_state_indices[entry] (pool rows; out of range: skipped), rows
// stride_chunk_states_n apart (0: dense, HV * K * V).
template <class P>
__device__ __forceinline__ int64_t chunk_state_offset(const P& p, int64_t entry, int h) {
  if (entry >= p.num_chunk_states) return -1;
  int64_t row = entry;
  if (p.chunk_state_indices != nullptr) {
    row = p.chunk_state_indices[entry];
    if (row < 0 || row >= p.num_chunk_state_slots) return -1;
  }
  const int64_t head = int64_t(kHeadDim) * kHeadDim;
  const int64_t stride = p.stride_chunk_states_n != 0 ? p.stride_chunk_states_n : int64_t(p.num_v_heads) * head;
  return row * stride + int64_t(h) * head;
}

// S^T <- S^T diag(decay) in the fragment layout (key channels 8 j + 2 quad, + 1 of tile j).
__device__ __forceinline__ void decay_state(float (&s)[16][4], const float* decay, int quad) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 d = *reinterpret_cast<const float2*>(decay + 8 * j + 2 * quad);
    s[j][0] *= d.x;
    s[j][1] *= d.y;
    s[j][2] *= d.x;
    s[j][3] *= d.y;
  }
}

// First chunk-state entry of sequence n: the sum over earlier sequences of ceil(len / interval)
// (one warp; every lane gets the total). P: kernel params with seq_len [N] and the StateParams.
template <class P>
__device__ __forceinline__ int64_t chunk_state_base_of(const P& p, int n, int lane) {
  int64_t base = 0;
  for (int m = lane; m < n; m += 32) {
    const int len = max(p.seq_len[m], 0);
    base += (len + p.chunk_state_interval - 1) / p.chunk_state_interval;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) base += __shfl_xor_sync(0xffffffffu, base, off);
  return base;
}

}  // namespace kdakit::sm90::prefill::common
