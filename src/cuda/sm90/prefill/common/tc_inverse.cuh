// T = (I + diag(beta) L)^-1 of a 64-token chunk on tensor cores, in 16 x 16 tiles, shared by
// the prefill kernels (prep and fused): warp R (R = 0..3) inverts the diagonal block R in
// registers and then computes its row of off-diagonal blocks right to left. L (fp32) and the
// diagonal blocks of T live in an fp32 [64][kLdF] shared array; T diag(beta) goes to two bf16
// [64][64] tiles (hi + lo) whose 128-byte rows have their 16-byte chunks XOR-swizzled by
// row & 7 (the TMA / wgmma 128-byte swizzle when the tile is 1024-byte aligned).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/mma_sm80.cuh"

namespace kdakit::sm90::prefill::common {

inline constexpr int kSubBlock = 16;  // rows of an mma tile
// fp32 row pitch (floats) of the L / T arrays: rows 16 bytes apart mod 128, conflict-free.
inline constexpr int kLdF = 64 + 4;

// Byte offset of 16-byte chunk `chunk` of row `row` in a bf16 [rows][64] shared array (the
// T diag(beta) hi/lo tiles): 8 chunks per row, XOR-swizzled by row & 7, so ldmatrix of 8
// consecutive rows at one logical chunk hits 8 distinct bank groups.
__device__ __forceinline__ uint32_t swz64(int row, int chunk) {
  return uint32_t(row) * 128u + (uint32_t(chunk ^ (row & 7)) << 4);
}

// ---- 16 x 16 fp32 tiles on tensor cores (kTcInverse) ---------------------------------------
// A tile X lives in the mma C layout over two n-tiles (mma_sm80.cuh): x[nt][0..1] = X(g, 8 nt +
// 2t .. +1), x[nt][2..3] = X(g + 8, 8 nt + 2t .. +1). That is also the A-operand layout of
// m16n8k16 (a[0] = x[0][0..1], a[1] = x[0][2..3], a[2] = x[1][0..1], a[3] = x[1][2..3]), and
// the B operand of n-tile nt for a product X Y is read from Y^T in C layout:
// b[0] = yt[0][2 nt .. 2 nt + 1], b[1] = yt[1][2 nt .. 2 nt + 1]. So X^2 = X X needs X and X^T,
// and (X^2)^T = X^T X^T needs the same two, with no data movement between lanes.
using Tile16 = float[2][4];

// d += a * b, b given as its transpose bt, in three bf16 passes: a = ah + al, b = bh + bl with
// ah = bf16(a), al = bf16(a - ah) (likewise b); lo x hi and hi x lo first, hi x hi last; al x bl
// (~2^-16 relative) is dropped.
__device__ __forceinline__ void mm16_acc(Tile16& d, const Tile16& a, const Tile16& bt) {
  uint32_t ah[4], al[4];
  kdakit::cuda::split_bf16x2(a[0][0], a[0][1], ah[0], al[0]);
  kdakit::cuda::split_bf16x2(a[0][2], a[0][3], ah[1], al[1]);
  kdakit::cuda::split_bf16x2(a[1][0], a[1][1], ah[2], al[2]);
  kdakit::cuda::split_bf16x2(a[1][2], a[1][3], ah[3], al[3]);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    uint32_t b0h, b0l, b1h, b1l;
    kdakit::cuda::split_bf16x2(bt[0][2 * nt], bt[0][2 * nt + 1], b0h, b0l);
    kdakit::cuda::split_bf16x2(bt[1][2 * nt], bt[1][2 * nt + 1], b1h, b1l);
    kdakit::cuda::mma_bf16_16816(d[nt], al, b0h, b1h);
    kdakit::cuda::mma_bf16_16816(d[nt], ah, b0l, b1l);
    kdakit::cuda::mma_bf16_16816(d[nt], ah, b0h, b1h);
  }
}
__device__ __forceinline__ void mm16(Tile16& d, const Tile16& a, const Tile16& bt) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.f;
  mm16_acc(d, a, bt);
}

// X_JS^T in C layout, X = -diag(beta) L: element (g, 8 nt + 2t + e) = -beta[16 J + 8 nt + 2t + e]
// L[16 J + 8 nt + 2t + e][16 S + g] (rows g + 8 likewise). Lanes read rows 2t apart (68-float
// pitch: banks 8t + g), conflict-free.
__device__ __forceinline__ void load_x_t(const float* Lf, const float* beta_s, int J, int S, int g, int t,
                                         Tile16& xt) {
  constexpr int ld = kLdF;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int k = kSubBlock * J + 8 * nt + 2 * t;
    const float b0 = -beta_s[k], b1 = -beta_s[k + 1];
    const int col = kSubBlock * S + g;
    xt[nt][0] = b0 * Lf[k * ld + col];
    xt[nt][1] = b1 * Lf[(k + 1) * ld + col];
    xt[nt][2] = b0 * Lf[k * ld + col + 8];
    xt[nt][3] = b1 * Lf[(k + 1) * ld + col + 8];
  }
}

// Block (R, S) of an fp32 [64][kLdF] array, in C layout: store and transposed load.
__device__ __forceinline__ void store_tile(float* F, int R, int S, int g, int t, const Tile16& x) {
  constexpr int ld = kLdF;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    float* p = F + (kSubBlock * R + g) * ld + kSubBlock * S + 8 * nt + 2 * t;
    *reinterpret_cast<float2*>(p) = make_float2(x[nt][0], x[nt][1]);
    *reinterpret_cast<float2*>(p + 8 * ld) = make_float2(x[nt][2], x[nt][3]);
  }
}
__device__ __forceinline__ void load_tile(const float* F, int R, int S, int g, int t, Tile16& x) {
  constexpr int ld = kLdF;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const float* p = F + (kSubBlock * R + g) * ld + kSubBlock * S + 8 * nt + 2 * t;
    const float2 lo = *reinterpret_cast<const float2*>(p);
    const float2 hi = *reinterpret_cast<const float2*>(p + 8 * ld);
    x[nt][0] = lo.x;
    x[nt][1] = lo.y;
    x[nt][2] = hi.x;
    x[nt][3] = hi.y;
  }
}
__device__ __forceinline__ void load_tile_t(const float* F, int R, int S, int g, int t, Tile16& xt) {
  constexpr int ld = kLdF;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int k = kSubBlock * R + 8 * nt + 2 * t, col = kSubBlock * S + g;
    xt[nt][0] = F[k * ld + col];
    xt[nt][1] = F[(k + 1) * ld + col];
    xt[nt][2] = F[k * ld + col + 8];
    xt[nt][3] = F[(k + 1) * ld + col + 8];
  }
}

// Block (R, S) of T diag(beta), from T's block in C layout, into the bf16 hi/lo tiles (swz64;
// 4 lanes fill one 16-byte chunk, 8 rows hit 8 distinct chunks: conflict-free).
__device__ __forceinline__ void store_tile_hilo(unsigned char* tb_hi, unsigned char* tb_lo, const float* beta_s,
                                                int R, int S, int g, int t, const Tile16& x) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int c = kSubBlock * S + 8 * nt + 2 * t;
    const float b0 = beta_s[c], b1 = beta_s[c + 1];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const uint32_t off = swz64(kSubBlock * R + g + 8 * hr, 2 * S + nt) + 4u * uint32_t(t);
      uint32_t hi, lo;
      kdakit::cuda::split_bf16x2(x[nt][2 * hr] * b0, x[nt][2 * hr + 1] * b1, hi, lo);
      *reinterpret_cast<uint32_t*>(tb_hi + off) = hi;
      *reinterpret_cast<uint32_t*>(tb_lo + off) = lo;
    }
  }
}

// T_RR = (I - X)^-1 = (I + X)(I + X^2)(I + X^4)(I + X^8) for X = -diag(beta) L_RR, strictly
// lower, so X^16 = 0 (powers of X commute: the factor order is free). 48 mma per warp.
__device__ __forceinline__ void tc_diag_inverse(const float* Lf, const float* beta_s, int R, int g, int t,
                                                Tile16& tr) {
  constexpr int ld = kLdF;
  Tile16 x, xt;
  const int r0 = kSubBlock * R + g;
  const float br0 = -beta_s[r0], br1 = -beta_s[r0 + 8];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const float2 lo = *reinterpret_cast<const float2*>(Lf + r0 * ld + kSubBlock * R + 8 * nt + 2 * t);
    const float2 hi = *reinterpret_cast<const float2*>(Lf + (r0 + 8) * ld + kSubBlock * R + 8 * nt + 2 * t);
    x[nt][0] = br0 * lo.x;
    x[nt][1] = br0 * lo.y;
    x[nt][2] = br1 * hi.x;
    x[nt][3] = br1 * hi.y;
  }
  load_x_t(Lf, beta_s, R, R, g, t, xt);
  // tr = I + X: the diagonal entries are (g, 2t + e) of n-tile 0 and (g + 8, 8 + 2t + e) of n-tile 1.
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) tr[nt][e] = x[nt][e];
  tr[0][0] += g == 2 * t ? 1.f : 0.f;
  tr[0][1] += g == 2 * t + 1 ? 1.f : 0.f;
  tr[1][2] += g == 2 * t ? 1.f : 0.f;
  tr[1][3] += g == 2 * t + 1 ? 1.f : 0.f;
  // NOTE: rolled: the prep kernel is sensitive to its code size (prep/kernel.cuh), and the three
  // steps unrolled were 264 of its instructions; the products and their order are unchanged.
#pragma unroll 1
  for (int step = 0; step < 3; ++step) {  // x = X^(2^step), xt its transpose
    Tile16 xt2;
    mm16(xt2, xt, x);    // (X^2)^T = X^T X^T
    mm16_acc(tr, tr, xt2);  // tr <- tr (I + X^2)
    if (step < 2) {
      Tile16 x2;
      mm16(x2, x, xt);   // X^2 = X X
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[nt][e] = x2[nt][e];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) xt[nt][e] = xt2[nt][e];
  }
}

// Row block R of T left of the diagonal, from T (I - X) = I:
//   T_RS = (sum_{S < J <= R} T_RJ X_JS) T_SS,  S = R - 1 down to 0,
// each T_RJ (J > S) already in registers; T_SS (every warp's diagonal block) from shared memory.
// With kHiLo, each block also goes to the T diag(beta) hi/lo tiles (kBalancedWU), else to Tf.
template <int R, bool kHiLo>
__device__ __forceinline__ void tc_offdiag_row(const float* Lf, float* Tf, const float* beta_s, int g, int t,
                                               const Tile16& trr, unsigned char* tb_hi, unsigned char* tb_lo) {
  float trow[R + 1][2][4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) trow[R][nt][e] = trr[nt][e];
#pragma unroll
  for (int S = R - 1; S >= 0; --S) {
    Tile16 acc;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
    for (int J = S + 1; J <= R; ++J) {
      Tile16 xt;
      load_x_t(Lf, beta_s, J, S, g, t, xt);
      mm16_acc(acc, trow[J], xt);
    }
    Tile16 tss_t;
    load_tile_t(Tf, S, S, g, t, tss_t);
    mm16(trow[S], acc, tss_t);
    if constexpr (kHiLo) {
      store_tile_hilo(tb_hi, tb_lo, beta_s, R, S, g, t, trow[S]);
    } else {
      store_tile(Tf, R, S, g, t, trow[S]);
    }
  }
}

// The off-diagonal blocks of T from the diagonal ones, in three steps of independent 16 x 16
// products spread over six warps (call from every thread of the CTA: it has CTA barriers).
// With A = I + diag(beta) L = I - X and N_RS = T_RR A_RS = -T_RR X_RS (R > S), T A = I gives
// T_RS = -sum_{S <= J < R} N_RJ T_JS, which unrolls to
//   T_10 = -N_10 T_00,  T_21 = -N_21 T_11,  T_32 = -N_32 T_22,
//   T_20 = (N_21 N_10 - N_20) T_00,  T_31 = (N_32 N_21 - N_31) T_11,
//   T_30 = (N_32 N_20 - N_30) T_00 + (N_32 N_21 - N_31) T_10:
// step 1 the six N blocks (in place of L's blocks), step 2 the three distance-1 blocks and the
// products N N (in L's unused upper blocks; T_10 also in fp32 in T's (1, 0) block), step 3 the
// rest. 16 products as in the row-by-row order, but the longest chain is 4 of them instead of 9.
// Every block of T diag(beta) goes to the hi/lo tiles; Tf's diagonal blocks must hold T_RR.
__device__ __forceinline__ void tc_offdiag_blocks(float* Lf, float* Tf, const float* beta_s, int warp, int g,
                                                  int t, unsigned char* tb_hi, unsigned char* tb_lo) {
  if (warp < 6) {  // step 1: N_RS, warps 0..5 -> (1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)
    const int R = warp < 1 ? 1 : warp < 3 ? 2 : 3, S = warp - R * (R - 1) / 2;
    Tile16 trr, xt, n;
    load_tile(Tf, R, R, g, t, trr);
    load_x_t(Lf, beta_s, R, S, g, t, xt);
    mm16(n, trr, xt);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) n[nt][e] = -n[nt][e];
    __syncwarp();                   // every lane's reads of L_RS (above) before any lane's store
    store_tile(Lf, R, S, g, t, n);  // in place: this warp alone reads L_RS
  }
  __syncthreads();
  if (warp < 3) {  // step 2a: T_{R+1,R} = -N_{R+1,R} T_RR
    const int R = warp;
    Tile16 n, tt, d;
    load_tile(Lf, R + 1, R, g, t, n);
    load_tile_t(Tf, R, R, g, t, tt);
    mm16(d, n, tt);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) d[nt][e] = -d[nt][e];
    store_tile_hilo(tb_hi, tb_lo, beta_s, R + 1, R, g, t, d);
    if (R == 0) store_tile(Tf, 1, 0, g, t, d);
  } else if (warp < 6) {  // step 2b: P_20 = N_21 N_10 -> L(0, 1), P_31 = N_32 N_21 -> L(0, 2), P_30 = N_32 N_20 -> L(0, 3)
    const int j = warp - 3;
    const int aR = j == 0 ? 2 : 3, aS = j == 0 ? 1 : 2;
    const int bR = j == 1 ? 2 : 1 + j / 2, bS = j == 1 ? 1 : 0;
    Tile16 a, bt, d;
    load_tile(Lf, aR, aS, g, t, a);
    load_tile_t(Lf, bR, bS, g, t, bt);
    mm16(d, a, bt);
    store_tile(Lf, 0, 1 + j, g, t, d);
  }
  __syncthreads();
  if (warp < 3) {  // step 3: T_20, T_31, T_30
    // (P - N) for (2, 0): L(0, 1) - N_20; (3, 1): L(0, 2) - N_31; (3, 0): L(0, 3) - N_30
    const int R = warp == 0 ? 2 : 3, S = warp == 1 ? 1 : 0;
    Tile16 a, n, tt, d;
    load_tile(Lf, 0, warp == 0 ? 1 : warp == 1 ? 2 : 3, g, t, a);
    load_tile(Lf, R, S, g, t, n);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) a[nt][e] -= n[nt][e];
    load_tile_t(Tf, S, S, g, t, tt);
    mm16(d, a, tt);
    if (warp == 2) {  // + (P_31 - N_31) T_10
      load_tile(Lf, 0, 2, g, t, a);
      load_tile(Lf, 3, 1, g, t, n);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[nt][e] -= n[nt][e];
      load_tile_t(Tf, 1, 0, g, t, tt);
      mm16_acc(d, a, tt);
    }
    store_tile_hilo(tb_hi, tb_lo, beta_s, R, S, g, t, d);
  }
}

}  // namespace kdakit::sm90::prefill::common
