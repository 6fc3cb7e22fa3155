// Host-only element conversion for the CPU backend and the C++ tests.
//
// bf16 and fp16 are carried as raw uint16_t bits. Narrowing conversions round to nearest,
// ties to even, directly from the wider value (a double is rounded once, not first to float
// and then again), overflow to +-inf and keep NaN a quiet NaN. Widening is exact.
// No CUDA headers: the GPU tests include this too, to build inputs and read results back.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kdakit/kdakit.h"

namespace kdakit::cpu {

// Bytes per element of a dtype, signed for offset arithmetic.
inline int64_t element_bytes(DType dtype) { return static_cast<int64_t>(dtype_size(dtype)); }

inline bool is_float_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

// ------------------------------------------------------------------------------------------
// Widening: exact.
// ------------------------------------------------------------------------------------------

inline float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t bits_from_float(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// bf16 is the upper half of an fp32.
inline float bf16_to_float(uint16_t bits) { return float_from_bits(uint32_t(bits) << 16); }

// fp16: 1 sign, 5 exponent (bias 15), 10 fraction bits.
inline float fp16_to_float(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1u;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t fraction = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(float(fraction), -24);  // zero or subnormal
  } else if (exponent == 0x1f) {
    magnitude = fraction == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(float(fraction | 0x400u), int(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

// ------------------------------------------------------------------------------------------
// Narrowing: round to nearest even.
// ------------------------------------------------------------------------------------------

namespace detail {

// Rounds finite x to a binary format with `precision` significant bits (implicit bit
// included), smallest normal exponent `min_exponent` (value 2^min_exponent) and largest
// finite value `max_finite`; returns +-inf past the overflow threshold. The quantum of x is a
// power of two, so x / quantum is exact and nearbyint (default mode: ties to even) does the
// rounding.
inline double round_to_format(double x, int precision, int min_exponent, double max_finite) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int exp2_of_x;
  std::frexp(x, &exp2_of_x);  // |x| in [2^(e-1), 2^e)
  int exponent = exp2_of_x - 1;
  if (exponent < min_exponent) exponent = min_exponent;  // subnormal: fixed quantum
  const int quantum_exponent = exponent - (precision - 1);
  const double rounded =
      std::ldexp(std::nearbyint(std::ldexp(x, -quantum_exponent)), quantum_exponent);
  if (std::fabs(rounded) > max_finite) return std::copysign(INFINITY, x);
  return rounded;
}

}  // namespace detail

inline uint16_t bf16_from_double(double x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xffc0u : 0x7fc0u;
  // bf16: 8 significant bits, exponent range of fp32. The rounded value is exact in fp32.
  const double max_bf16 = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127
  const double rounded = detail::round_to_format(x, 8, -126, max_bf16);
  return uint16_t(bits_from_float(float(rounded)) >> 16);
}

inline uint16_t bf16_from_float(float x) { return bf16_from_double(double(x)); }

inline uint16_t fp16_from_double(double x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xfe00u : 0x7e00u;
  const double rounded = detail::round_to_format(x, 11, -14, 65504.0);
  const uint16_t sign = std::signbit(rounded) ? 0x8000u : 0u;
  const double magnitude = std::fabs(rounded);
  if (std::isinf(magnitude)) return sign | 0x7c00u;
  if (magnitude < std::ldexp(1.0, -14)) {  // zero or subnormal: fraction counts 2^-24 units
    return sign | uint16_t(std::ldexp(magnitude, 24));
  }
  int exp2_of_m;
  const double mantissa = std::frexp(magnitude, &exp2_of_m);  // [0.5, 1)
  const uint16_t exponent = uint16_t(exp2_of_m - 1 + 15);
  const uint16_t fraction = uint16_t(std::ldexp(mantissa, 11)) & 0x3ffu;
  return sign | uint16_t(exponent << 10) | fraction;
}

inline uint16_t fp16_from_float(float x) { return fp16_from_double(double(x)); }

// ------------------------------------------------------------------------------------------
// Element access by dtype at an element offset of a raw buffer.
// ------------------------------------------------------------------------------------------

inline double load_as_double(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[offset];
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::kFloat16:
      return fp16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::kInt32:
      return static_cast<const int32_t*>(base)[offset];
    case DType::kInt64:
      return double(static_cast<const int64_t*>(base)[offset]);
  }
  return NAN;
}

inline float load_as_float(const void* base, DType dtype, int64_t offset) {
  return float(load_as_double(base, dtype, offset));  // exact for the float dtypes
}

// Stores x rounded to nearest even into a float dtype (integers: truncation toward zero).
inline void store_from_double(void* base, DType dtype, int64_t offset, double x) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(base)[offset] = float(x);
      return;  // RNE
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[offset] = bf16_from_double(x);
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[offset] = fp16_from_double(x);
      return;
    case DType::kInt32:
      static_cast<int32_t*>(base)[offset] = int32_t(x);
      return;
    case DType::kInt64:
      static_cast<int64_t*>(base)[offset] = int64_t(x);
      return;
  }
}

// Integer metadata (cu_seqlens) of either index dtype.
inline int64_t load_index(const void* base, DType dtype, int64_t offset) {
  return dtype == DType::kInt32 ? int64_t(static_cast<const int32_t*>(base)[offset])
                                : static_cast<const int64_t*>(base)[offset];
}

// Copies one element's raw bits (bit-for-bit pass-through of a state).
inline void copy_element_bits(void* dst, int64_t dst_offset, const void* src, int64_t src_offset,
                              DType dtype) {
  const int64_t size = element_bytes(dtype);
  std::memcpy(static_cast<char*>(dst) + dst_offset * size,
              static_cast<const char*>(src) + src_offset * size, size_t(size));
}

}  // namespace kdakit::cpu
