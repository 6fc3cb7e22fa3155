// Device-side element types and vectorised loads/stores for the kdakit kernels.
//
// Every kernel does its math in fp32 registers. Storage types are float, __nv_bfloat16 and
// __half; this header converts between them and fp32 and moves short runs of consecutive
// elements with one memory instruction (N * sizeof(T) bytes, which must be 4, 8 or 16 and
// naturally aligned: callers guarantee the alignment by construction, e.g. a lane reading
// elements [4 * lane, 4 * lane + 4) of a 16-byte-aligned row).
//
// Interface (stable; the prefill kernels include it too):
//   to_float(x), from_float<T>(f)                  scalar conversions (round to nearest even)
//   load_vec<N>(const T* p, float (&out)[N])        N consecutive elements -> fp32
//   store_vec<N>(T* p, const float (&in)[N])        N fp32 values -> N consecutive elements
//   load_vec_stream / store_vec_stream              the same with the streaming cache hint
//                                                   (ld/st.global.cs: data touched once)
//   load_as_float(const void* p, DType, int64_t i)  one element of a runtime dtype
//   store_from_float(void* p, DType, int64_t i, f)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kdakit/kdakit.h"

namespace kdakit::cuda {

// ------------------------------------------------------------------------------------------
// Scalar conversions
// ------------------------------------------------------------------------------------------

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// ------------------------------------------------------------------------------------------
// Raw vector types of 4, 8 and 16 bytes
// ------------------------------------------------------------------------------------------

namespace detail {

template <int kBytes>
struct RawVec;
template <>
struct RawVec<2> { using Type = uint16_t; };
template <>
struct RawVec<4> { using Type = uint32_t; };
template <>
struct RawVec<8> { using Type = uint2; };
template <>
struct RawVec<16> { using Type = uint4; };

// Union view of a raw vector as N elements of T.
template <typename T, int N>
union Pack {
  static constexpr int kBytes = int(sizeof(T)) * N;
  static_assert(kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16,
                "vector accesses move 2, 4, 8 or 16 bytes");
  typename RawVec<kBytes>::Type raw;
  T elem[N];
};

__device__ __forceinline__ uint16_t ld_cs(const uint16_t* p) {
  uint16_t v;
  asm volatile("ld.global.cs.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_cs(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.global.cs.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_cs(const uint2* p) {
  uint2 v;
  asm volatile("ld.global.cs.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_cs(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void st_cs(uint16_t* p, uint16_t v) {
  asm volatile("st.global.cs.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
}
__device__ __forceinline__ void st_cs(uint32_t* p, uint32_t v) {
  asm volatile("st.global.cs.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_cs(uint2* p, uint2 v) {
  asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void st_cs(uint4* p, uint4 v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

}  // namespace detail

// ------------------------------------------------------------------------------------------
// Vector loads and stores: N consecutive elements of T <-> N floats
// ------------------------------------------------------------------------------------------

template <int N, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[N]) {
  using P = detail::Pack<T, N>;
  P pack;
  pack.raw = *reinterpret_cast<const typename detail::RawVec<P::kBytes>::Type*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(pack.elem[i]);
}

template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[N]) {
  using P = detail::Pack<T, N>;
  P pack;
#pragma unroll
  for (int i = 0; i < N; ++i) pack.elem[i] = from_float<T>(in[i]);
  *reinterpret_cast<typename detail::RawVec<P::kBytes>::Type*>(p) = pack.raw;
}

// NOTE: the streaming hint (evict-first in L1 and L2) suits data read or written once per
// kernel, such as a decode state row; it changes no result.
template <int N, typename T>
__device__ __forceinline__ void load_vec_stream(const T* p, float (&out)[N]) {
  using P = detail::Pack<T, N>;
  P pack;
  pack.raw = detail::ld_cs(reinterpret_cast<const typename detail::RawVec<P::kBytes>::Type*>(p));
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(pack.elem[i]);
}

template <int N, typename T>
__device__ __forceinline__ void store_vec_stream(T* p, const float (&in)[N]) {
  using P = detail::Pack<T, N>;
  P pack;
#pragma unroll
  for (int i = 0; i < N; ++i) pack.elem[i] = from_float<T>(in[i]);
  detail::st_cs(reinterpret_cast<typename detail::RawVec<P::kBytes>::Type*>(p), pack.raw);
}

// ------------------------------------------------------------------------------------------
// Runtime-dtype scalar access (preprocessing of small per-token tensors, where a switch on
// the dtype costs nothing next to the state traffic). Integer dtypes are not float data and
// read as 0 here; metadata is read through typed pointers.
// ------------------------------------------------------------------------------------------

__device__ __forceinline__ float load_as_float(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kBFloat16: return to_float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kFloat16: return to_float(static_cast<const __half*>(base)[i]);
    default: return 0.f;
  }
}

__device__ __forceinline__ void store_from_float(void* base, DType dtype, int64_t i, float x) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[i] = x; return;
    case DType::kBFloat16: static_cast<__nv_bfloat16*>(base)[i] = from_float<__nv_bfloat16>(x); return;
    case DType::kFloat16: static_cast<__half*>(base)[i] = from_float<__half>(x); return;
    default: return;
  }
}

// Loads N consecutive elements of a runtime float dtype with one vector access per dtype.
template <int N>
__device__ __forceinline__ void load_vec_as_float(const void* base, DType dtype, int64_t i,
                                                  float (&out)[N]) {
  switch (dtype) {
    case DType::kFloat32: load_vec<N>(static_cast<const float*>(base) + i, out); return;
    case DType::kBFloat16: load_vec<N>(static_cast<const __nv_bfloat16*>(base) + i, out); return;
    case DType::kFloat16: load_vec<N>(static_cast<const __half*>(base) + i, out); return;
    default:
#pragma unroll
      for (int j = 0; j < N; ++j) out[j] = 0.f;
      return;
  }
}

// Storage type of a float DType, for templates.
template <DType kDType>
struct StorageOf;
template <>
struct StorageOf<DType::kFloat32> { using Type = float; };
template <>
struct StorageOf<DType::kBFloat16> { using Type = __nv_bfloat16; };
template <>
struct StorageOf<DType::kFloat16> { using Type = __half; };

}  // namespace kdakit::cuda
