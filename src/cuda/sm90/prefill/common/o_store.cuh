// The output rows of one warp from an m64n64 fp32 accumulator, shared by the prefill kernels
// that keep O^T in wgmma accumulators (fused, and the wgmma recurrence).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kdakit::sm90::prefill::common {

// acc: the warp's 16 value rows x 8 kTiles tokens (64 by default) of O^T in the accumulator
// layout (value rows g and g + 8, tokens 8 nt + 2t and + 1, at acc[4 nt + 2 hr + e]); o: the warp's first value channel of
// token 0 of the chunk, tokens stride_t apart; tokens at or past `valid` are not written.
// NOTE: with `pairs` (o 4-byte aligned, even strides) lanes g and g ^ 1 swap one value, so each
// stores two neighbouring value channels of one token as a 4-byte word.
template <int kTiles = 8>
__device__ __forceinline__ void store_o_tile(const float (&acc)[4 * kTiles], __nv_bfloat16* o, int64_t stride_t, int valid,
                                             bool pairs, int g, int t) {
  const bool odd = (g & 1) != 0;
  if (pairs) {
    // NOTE: every exchange first, then the stores. Interleaved (shuffle, pack, bounds check,
    // store per pair) the shuffles' latencies were serial behind the stores' branches: the
    // output was a third of the 128-row recurrence's stall samples per chunk (session 24), on
    // the chain, since the state's products finish before it does.
    float other[2 * kTiles];
#pragma unroll
    for (int i = 0; i < 2 * kTiles; ++i) other[i] = __shfl_xor_sync(0xffffffffu, odd ? acc[2 * i] : acc[2 * i + 1], 4);
    // pair i = 2 nt + hr: token 8 nt + 2t + odd, value rows (g & ~1) + 8 hr and + 1
    const int tk0 = 2 * t + (odd ? 1 : 0);
    __nv_bfloat16* base = o + int64_t(tk0) * stride_t + (g & ~1);
    const bool full = valid >= 8 * kTiles;  // warp-uniform
#pragma unroll
    for (int i = 0; i < 2 * kTiles; ++i) {
      const int nt = i / 2, hr = i % 2;
      const __nv_bfloat162 pair =
          odd ? __floats2bfloat162_rn(other[i], acc[2 * i + 1]) : __floats2bfloat162_rn(acc[2 * i], other[i]);
      if (full || 8 * nt + tk0 < valid)
        *reinterpret_cast<__nv_bfloat162*>(base + int64_t(8 * nt) * stride_t + 8 * hr) = pair;
    }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float c0 = acc[4 * nt + 2 * hr], c1 = acc[4 * nt + 2 * hr + 1];
      const int tok = 8 * nt + 2 * t;
      const int row = g + 8 * hr;  // value row within the warp's 16
      if (tok < valid) o[int64_t(tok) * stride_t + row] = __float2bfloat16_rn(c0);
      if (tok + 1 < valid) o[int64_t(tok + 1) * stride_t + row] = __float2bfloat16_rn(c1);
    }
  }
}

}  // namespace kdakit::sm90::prefill::common
