// wgmma through CuTe's atoms, with the accumulators as flat register arrays, and the
// instruction shapes the prefill kernels use (fused: the whole chain; recurrence: the chunk
// serial half of the two-kernel path). Moved here from fused/kernel.cuh when the second kernel
// needed them.
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace kdakit::sm90::prefill::common {

template <class Op, size_t... I>
__device__ __forceinline__ void gmma_ss_impl(uint64_t da, uint64_t db, float* d, bool accumulate,
                                             std::index_sequence<I...>) {
  Op::fma(da, db, d[I]...,
          accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
template <class Op, int N>
__device__ __forceinline__ void gmma_ss(uint64_t da, uint64_t db, float (&d)[N], bool accumulate) {
  gmma_ss_impl<Op>(da, db, d, accumulate, std::make_index_sequence<N>{});
}
template <class Op, size_t... I>
__device__ __forceinline__ void gmma_rs_impl(const uint32_t (&a)[4], uint64_t db, float* d,
                                             bool accumulate, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], db, d[I]...,
          accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
template <class Op, int N>
__device__ __forceinline__ void gmma_rs(const uint32_t (&a)[4], uint64_t db, float (&d)[N],
                                        bool accumulate) {
  gmma_rs_impl<Op>(a, db, d, accumulate, std::make_index_sequence<N>{});
}

namespace gmma = cute::SM90::GMMA;
using Major = gmma::Major;
// U0^T += V^T (T diag(beta))^T: A = V (MN-major), B = T diag(beta) [r][s] (K-major), 64 x 64.
using OpU0 = gmma::MMA_64x64x16_F32BF16BF16_SS<Major::MN, Major::K>;
// U^T -= S0^T W^T (A = S0^T registers, negated), O^T += S0^T Qt^T, O^T += U^T M^T: B K-major.
using OpNegRS64 = gmma::MMA_64x64x16_F32BF16BF16_RS<Major::K, Major::K, gmma::ScaleIn::Neg>;
using OpRS64 = gmma::MMA_64x64x16_F32BF16BF16_RS<Major::K, Major::K>;
// S^T += U^T Kh: B = Kh [token][channel] (MN-major), 64 x 128.
using OpState = gmma::MMA_64x128x16_F32BF16BF16_RS<Major::K, Major::MN>;
// The same three products on fp16 operands (the recurrence on an fp16 chunk block).
using OpNegRS64F16 = gmma::MMA_64x64x16_F32F16F16_RS<Major::K, Major::K, gmma::ScaleIn::Neg>;
using OpRS64F16 = gmma::MMA_64x64x16_F32F16F16_RS<Major::K, Major::K>;
using OpStateF16 = gmma::MMA_64x128x16_F32F16F16_RS<Major::K, Major::MN>;
// W = T diag(beta) Kt: A = T diag(beta) (K-major), B = Kt [token][channel] (MN-major), 64 x 128.
using OpW = gmma::MMA_64x128x16_F32BF16BF16_SS<Major::K, Major::MN>;

}  // namespace kdakit::sm90::prefill::common
