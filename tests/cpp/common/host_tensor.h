// Host tensors for the C++ tests: typed strided buffers, random fills, NaN poison, and the
// comparisons every test uses (relative L2 with NaN/inf position match and worst-element
// report, bitwise equality).
//
// A HostTensor owns its bytes; element (0, ..., 0) sits at the first byte, so a device copy
// is one memcpy of `bytes` and the device pointer plays the role of data(). Strides are in
// elements, as in PrefillParams/DecodeParams. Padded views (padded()) leave gaps after every
// dim, so a kernel that ignores a stride reads or writes the wrong place.
//
// Namespace: kdakit::testing. Inside namespace kdakit, `testing::` names this library and
// `::testing::` GoogleTest; at global scope, `using namespace kdakit` makes `testing::`
// ambiguous, so write `kdakit::testing::` (or a namespace alias) there.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/dtype.h"
#include "kdakit/kdakit.h"

namespace kdakit::testing {

// ------------------------------------------------------------------------------------------
// Random numbers: fresh per test, seed printed on failure (SCOPED_TRACE(rng.trace())).
// KDAKIT_TEST_SEED=<n> in the environment replays one seed.
// ------------------------------------------------------------------------------------------
struct Rng {
  uint64_t seed = 0;
  std::mt19937_64 engine;

  explicit Rng(uint64_t s) : seed(s), engine(s) {}
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(engine);
  }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine);
  }
  bool coin(double p_true = 0.5) { return uniform(0.0, 1.0) < p_true; }
  std::string trace() const {
    return "random seed " + std::to_string(seed) + " (KDAKIT_TEST_SEED replays it)";
  }
};

inline Rng make_rng() {
  if (const char* env = std::getenv("KDAKIT_TEST_SEED"))
    return Rng(std::strtoull(env, nullptr, 10));
  std::random_device device;
  return Rng((uint64_t(device()) << 32) ^ uint64_t(device()));
}

// ------------------------------------------------------------------------------------------
// HostTensor
// ------------------------------------------------------------------------------------------
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;    // logical shape
  std::vector<int64_t> strides;  // element strides; the storage holds every addressed element
  std::vector<unsigned char> bytes;

  // Row-major contiguous.
  static HostTensor contiguous(DType dtype, std::vector<int64_t> shape) {
    return padded(dtype, std::move(shape), 0);
  }

  // Every dim d is laid out as if it had shape[d] + pad elements (the last one too, so rows
  // are further apart than their length); the last dim stays contiguous (stride 1).
  static HostTensor padded(DType dtype, std::vector<int64_t> shape, int64_t pad) {
    std::vector<int64_t> strides(shape.size());
    int64_t stride = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= shape[d] + pad;
    }
    return with_strides(dtype, std::move(shape), std::move(strides));
  }

  // Explicit strides (non-negative). The storage ends after the last addressed element.
  static HostTensor with_strides(DType dtype, std::vector<int64_t> shape,
                                 std::vector<int64_t> strides) {
    HostTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.strides = std::move(strides);
    int64_t extent = 1;
    bool empty = false;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] == 0) empty = true;
      extent += (t.shape[d] - 1) * t.strides[d];
    }
    t.bytes.assign(size_t(empty ? 0 : extent) * size_t(cpu::element_bytes(dtype)), 0);
    return t;
  }

  bool defined() const { return !shape.empty(); }
  int64_t numel() const {
    if (shape.empty()) return 0;
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  int64_t storage_elements() const { return int64_t(bytes.size()) / cpu::element_bytes(dtype); }
  size_t nbytes() const { return bytes.size(); }
  void* data() { return bytes.empty() ? nullptr : bytes.data(); }
  const void* data() const { return bytes.empty() ? nullptr : bytes.data(); }
  int64_t stride(size_t d) const { return strides.at(d); }

  // Storage offset of the element with row-major logical index `linear`.
  int64_t offset_of(int64_t linear) const {
    int64_t offset = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      offset += (linear % shape[d]) * strides[d];
      linear /= shape[d];
    }
    return offset;
  }
  int64_t offset_of(std::initializer_list<int64_t> index) const {
    int64_t offset = 0;
    size_t d = 0;
    for (int64_t i : index) offset += i * strides.at(d++);
    return offset;
  }
  std::string index_string(int64_t linear) const {
    std::vector<int64_t> index(shape.size());
    for (size_t d = shape.size(); d-- > 0;) {
      index[d] = linear % shape[d];
      linear /= shape[d];
    }
    std::ostringstream out;
    out << "[";
    for (size_t d = 0; d < index.size(); ++d) out << (d ? ", " : "") << index[d];
    out << "]";
    return out.str();
  }

  double get(int64_t linear) const { return cpu::load_as_double(data(), dtype, offset_of(linear)); }
  void set(int64_t linear, double x) {
    cpu::store_from_double(data(), dtype, offset_of(linear), x);
  }
  double at(std::initializer_list<int64_t> index) const {
    return cpu::load_as_double(data(), dtype, offset_of(index));
  }
  void set_at(std::initializer_list<int64_t> index, double x) {
    cpu::store_from_double(data(), dtype, offset_of(index), x);
  }

  // Logical elements drawn uniformly from [lo, hi), rounded to the dtype.
  void fill_uniform(Rng& rng, double lo, double hi) {
    for (int64_t e = 0; e < numel(); ++e) set(e, rng.uniform(lo, hi));
  }
  // Every storage element (padding included) set to x.
  void fill_storage(double x) {
    for (int64_t e = 0; e < storage_elements(); ++e) cpu::store_from_double(data(), dtype, e, x);
  }
  // NaN everywhere, padding included: an output that is not written stays NaN.
  void poison() { fill_storage(NAN); }
};

// ------------------------------------------------------------------------------------------
// Comparisons
// ------------------------------------------------------------------------------------------
struct ErrorReport {
  double rel_l2 = 0.0;              // ||got - ref|| / ||ref|| over elements finite in both
  int64_t count = 0;                // logical elements compared
  int64_t nonfinite_mismatch = -1;  // first index whose NaN/inf pattern differs, else -1
  int64_t worst_index = -1;         // largest |got - ref|
  double worst_got = 0.0, worst_ref = 0.0;
  std::string worst_where;  // multi-index of the worst (or mismatching) element

  std::string str() const {
    std::ostringstream out;
    out.precision(9);
    out << "rel_l2 " << rel_l2 << " over " << count << " elements";
    if (nonfinite_mismatch >= 0) {
      out << "; NaN/inf position mismatch at " << worst_where << ": got " << worst_got << ", ref "
          << worst_ref;
    } else if (worst_index >= 0) {
      out << "; worst element " << worst_where << ": got " << worst_got << ", ref " << worst_ref;
    }
    return out.str();
  }
};

// Relative L2 error of `got` against `ref` (same logical shape; dtypes and strides may differ).
// NaN must sit where NaN sits, and inf where an inf of the same sign sits.
inline ErrorReport relative_l2(const HostTensor& got, const HostTensor& ref) {
  ErrorReport r;
  r.count = got.numel();
  if (got.shape != ref.shape) {
    r.nonfinite_mismatch = 0;
    r.worst_where = "(shape mismatch)";
    r.rel_l2 = INFINITY;
    return r;
  }
  double diff2 = 0.0, ref2 = 0.0, worst = -1.0;
  for (int64_t e = 0; e < r.count; ++e) {
    const double a = got.get(e), b = ref.get(e);
    const bool a_finite = std::isfinite(a), b_finite = std::isfinite(b);
    if (!a_finite || !b_finite) {
      const bool same = (std::isnan(a) && std::isnan(b)) ||
                        (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0));
      if (!same && r.nonfinite_mismatch < 0) {
        r.nonfinite_mismatch = e;
        r.worst_got = a;
        r.worst_ref = b;
        r.worst_where = got.index_string(e);
      }
      continue;
    }
    diff2 += (a - b) * (a - b);
    ref2 += b * b;
    if (r.nonfinite_mismatch < 0 && std::fabs(a - b) > worst) {
      worst = std::fabs(a - b);
      r.worst_index = e;
      r.worst_got = a;
      r.worst_ref = b;
      r.worst_where = got.index_string(e);
    }
  }
  r.rel_l2 = ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return r;
}

// gtest predicate: EXPECT_TRUE(rel_l2_below("output", got, ref, 1e-5)). The message prints the
// measured error next to the bar.
inline ::testing::AssertionResult rel_l2_below(const std::string& what, const HostTensor& got,
                                               const HostTensor& ref, double bar) {
  const ErrorReport r = relative_l2(got, ref);
  if (r.nonfinite_mismatch < 0 && r.rel_l2 <= bar) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << r.str() << " (bar " << bar << ")";
}

// Bit-for-bit equality of the logical elements (dtypes must match).
inline ::testing::AssertionResult bitwise_equal(const std::string& what, const HostTensor& got,
                                                const HostTensor& ref) {
  if (got.dtype != ref.dtype || got.shape != ref.shape) {
    return ::testing::AssertionFailure() << what << ": dtype or shape differ";
  }
  const int64_t size = cpu::element_bytes(got.dtype);
  const auto* a = static_cast<const unsigned char*>(got.data());
  const auto* b = static_cast<const unsigned char*>(ref.data());
  for (int64_t e = 0; e < got.numel(); ++e) {
    if (std::memcmp(a + got.offset_of(e) * size, b + ref.offset_of(e) * size, size_t(size)) != 0) {
      return ::testing::AssertionFailure()
             << what << ": first bit difference at " << got.index_string(e) << ": got "
             << got.get(e) << ", ref " << ref.get(e);
    }
  }
  return ::testing::AssertionSuccess();
}

// Bit-for-bit equality of the whole storage, padding included (e.g. "nothing written outside
// the logical elements", or "the pool did not change").
inline ::testing::AssertionResult storage_equal(const std::string& what, const HostTensor& got,
                                                const HostTensor& ref) {
  if (got.bytes.size() != ref.bytes.size()) {
    return ::testing::AssertionFailure() << what << ": storage sizes differ";
  }
  const int64_t size = cpu::element_bytes(got.dtype);
  for (size_t byte = 0; byte < got.bytes.size(); ++byte) {
    if (got.bytes[byte] != ref.bytes[byte]) {
      const int64_t element = int64_t(byte) / size;
      return ::testing::AssertionFailure()
             << what << ": storage element " << element << " differs: got "
             << cpu::load_as_double(got.data(), got.dtype, element) << ", ref "
             << cpu::load_as_double(ref.data(), ref.dtype, element);
    }
  }
  return ::testing::AssertionSuccess();
}

// Rows of [rows, HV, a, b] state tensors (pool slots, chunk-state rows, dense states).
// copy_row: the values of row `from` of x into row `to` of y (any dtypes, any strides).
inline void copy_row(const HostTensor& x, int64_t from, HostTensor& y, int64_t to) {
  for (int64_t h = 0; h < x.shape[1]; ++h) {
    for (int64_t a = 0; a < x.shape[2]; ++a) {
      for (int64_t b = 0; b < x.shape[3]; ++b) y.set_at({to, h, a, b}, x.at({from, h, a, b}));
    }
  }
}

// Bitwise comparison of row rx of x and row ry of y (same dtype), naming the first difference.
inline ::testing::AssertionResult rows_bitwise_equal(const HostTensor& x, int64_t rx,
                                                     const HostTensor& y, int64_t ry) {
  if (x.dtype != y.dtype) return ::testing::AssertionFailure() << "dtypes differ";
  const int64_t size = cpu::element_bytes(x.dtype);
  for (int64_t h = 0; h < x.shape[1]; ++h) {
    for (int64_t a = 0; a < x.shape[2]; ++a) {
      for (int64_t b = 0; b < x.shape[3]; ++b) {
        const auto* px =
            static_cast<const unsigned char*>(x.data()) + x.offset_of({rx, h, a, b}) * size;
        const auto* py =
            static_cast<const unsigned char*>(y.data()) + y.offset_of({ry, h, a, b}) * size;
        if (std::memcmp(px, py, size_t(size)) != 0) {
          return ::testing::AssertionFailure()
                 << "row " << rx << " vs " << ry << " differ at head " << h << " [" << a << ", "
                 << b << "]: " << x.at({rx, h, a, b}) << " vs " << y.at({ry, h, a, b});
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kdakit::testing
