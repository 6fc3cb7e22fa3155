// PTX wrappers for the sm_80-style warp-level tensor-core path (valid on sm_90a): the
// m16n8k16 bf16 and m16n8k8 tf32 MMAs with fp32 accumulators, ldmatrix (plain and transposed),
// 16- and 4-byte cp.async, bf16x2 packing and tf32 operand rounding.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
// floating point type": https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-fragment-mma-16816-float),
// with g = lane / 4 and t = lane % 4:
//   A (16 x 16, row):  a[0] = (g, 2t..2t+1)   a[1] = (g+8, 2t..2t+1)
//                      a[2] = (g, 2t+8..2t+9) a[3] = (g+8, 2t+8..2t+9)
//   B (16 x 8,  col):  b[0] = (k 2t..2t+1, n g)   b[1] = (k 2t+8..2t+9, n g)
//   C (16 x 8, fp32):  c[0..1] = (g, 2t..2t+1)    c[2..3] = (g+8, 2t..2t+1)
// Each 32-bit register holds two bf16, the lower column in the low half.
//
// mma.m16n8k8 with tf32 inputs (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32), one
// element per register:
//   A (16 x 8, row):  a[0] = (g, t)  a[1] = (g+8, t)  a[2] = (g, t+4)  a[3] = (g+8, t+4)
//   B (8 x 8,  col):  b[0] = (k t, n g)  b[1] = (k t+4, n g)
//   C: as above.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kdakit::cuda {

// D = A * B + D, bf16 inputs, fp32 accumulate.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A * B + D, tf32 inputs (fp32 bit patterns whose low 13 mantissa bits the unit ignores),
// fp32 accumulate.
__device__ __forceinline__ void mma_tf32_1688(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fp32 -> an mma tf32 operand rounded to nearest (ties away from zero): half a tf32 unit added to
// the magnitude bits, whose low 13 bits the mma then ignores. One integer add (cvt.rna.tf32.f32
// compiles to three instructions with an infinity test); for finite x only (an infinity would
// turn into a NaN pattern).
__device__ __forceinline__ uint32_t to_tf32(float x) { return __float_as_uint(x) + 0x1000u; }

// Four 8 x 8 bf16 matrices; lane l supplies the shared address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// Two 8 x 8 bf16 matrices; lanes 0-15 supply the addresses (row l % 8 of matrix l / 8).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr));
}

// The same, each matrix transposed (a B operand from a row-major [k][n] array).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy, bypassing L1 (.cg).
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr), "l"(gmem) : "memory");
}
// 4-byte global -> shared copy (.ca: the only size class .cg does not take).
__device__ __forceinline__ void cp_async_4(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Waits until at most kPending of this thread's newest commit groups are outstanding.
template <int kPending>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Two floats -> bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Two floats -> f16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// x = hi + lo with hi = bf16(x) and lo = bf16(x - hi): two bf16 terms carry ~16 mantissa bits.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = pack_bf16x2(x0 - __low2float(h), x1 - __high2float(h));
}

}  // namespace kdakit::cuda
