// Host-only index helpers shared by the CPU backend and the C++ tests: where a sequence's
// tokens are, where an activation element or a state element lives, how many chunk states a
// sequence writes. No CUDA headers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/dtype.h"
#include "kdakit/kdakit.h"

namespace kdakit::cpu {

// Tokens of one sequence: batch row `row`, token range [begin, end) of that row.
struct SeqRange {
  int64_t row = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t length() const { return end - begin; }
};

// Sequence n of a fixed ([B, T], no cu_seqlens) or packed (cu_seqlens, B = 1) batch.
// NOTE: cu_seqlens is untrusted metadata (on the GPU it cannot be checked without a sync), so
// offsets are clamped, never trusted: begin = clamp(cu[n], 0, T), end = clamp(cu[n+1], begin,
// T). A decreasing or out-of-range offset therefore yields a shorter or empty sequence, never
// an access outside [0, T).
inline SeqRange sequence_range(const void* cu_seqlens, DType dtype_cu_seqlens, int64_t n,
                               int64_t seqlen) {
  if (cu_seqlens == nullptr) return SeqRange{n, 0, seqlen};
  const int64_t lo = load_index(cu_seqlens, dtype_cu_seqlens, n);
  const int64_t hi = load_index(cu_seqlens, dtype_cu_seqlens, n + 1);
  const int64_t begin = std::clamp<int64_t>(lo, 0, seqlen);
  const int64_t end = std::clamp<int64_t>(hi, begin, seqlen);
  return SeqRange{0, begin, end};
}

// A [B, T, heads, dim] activation (or [B, T, heads] with dim 1) with element strides for the
// first three dims and a contiguous last dim.
struct ActivationView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t stride_b = 0, stride_t = 0, stride_h = 0;

  int64_t offset(int64_t b, int64_t t, int64_t h) const {
    return b * stride_b + t * stride_t + h * stride_h;
  }
  double load(int64_t b, int64_t t, int64_t h, int64_t i) const {
    return load_as_double(data, dtype, offset(b, t, h) + i);
  }
};

// Element (i, j) of one K x V state S (i: key channel, j: value channel), relative to the
// start of that state: V-first stores S^T row-major ([V, K]), K-first stores S ([K, V]).
inline int64_t state_element_offset(StateLayout layout, int64_t head_dim_k, int64_t head_dim_v,
                                    int64_t i, int64_t j) {
  return layout == StateLayout::kVFirst ? j * head_dim_k + i : i * head_dim_v + j;
}

// Chunk states a sequence of `length` tokens writes with interval C: states before tokens
// 0, C, 2C, ... below `length`, i.e. ceil(length / C) (0 for an empty sequence).
inline int64_t num_chunk_states(int64_t length, int64_t interval) {
  return interval > 0 ? (length + interval - 1) / interval : 0;
}

}  // namespace kdakit::cpu
