// Shared pieces of the nanobind extension kdakit._kdakit: DLPack array inspection (dtype,
// device, shape, strides in elements), string-to-enum parsing, and the mapping from a
// kdakit::Status to a Python exception.
//
// Division of labour: the binding checks what only it can see (each array's rank, shape,
// dtype, device, and the contiguity that the params structs assume because they carry no
// stride for it); kdakit::validate() checks the rules stated on the params (head dims, GVA,
// gate arguments, aliasing, ranges). Every error names the Python argument.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "kdakit/kdakit.h"

namespace kdakit::bindings {

namespace nb = nanobind;

// Inputs are read only (numpy read-only views are accepted); outputs must be writable.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;
using OptIn = std::optional<InArray>;
using OptOut = std::optional<OutArray>;

// DLPack device types accepted here.
inline constexpr int kDeviceCpu = 1;
inline constexpr int kDeviceCuda = 2;

// Highest rank an argument may have (chunk states [B, NT, HV, d, d] have 5).
inline constexpr size_t kMaxRank = 8;

// One argument's array, seen through DLPack, with the Python argument name for messages.
// A zero-element array gets row-major strides: exporters give it arbitrary ones (numpy: 0),
// and nothing is addressed through it.
struct ArrayView {
  const char* name = nullptr;
  void* data = nullptr;
  nb::dlpack::dtype dtype{};
  size_t ndim = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};  // elements
  int device_type = 0;
  int device_id = 0;

  int64_t size(size_t i) const { return shape[i]; }
  int64_t stride(size_t i) const { return strides[i]; }
};

ArrayView view(const char* name, const InArray& a);
ArrayView view(const char* name, const OutArray& a);

// Where the arrays of one call live; the first array seen fixes it.
struct Placement {
  int device_type = 0;
  int device_id = 0;
  const char* first_name = nullptr;

  bool is_cuda() const { return device_type == kDeviceCuda; }
};

// Makes the arrays' CUDA device the current one for its scope and restores the previous one
// after (what torch's device guard does around its own ops), so that arrays on another GPU than
// the caller's current device run on theirs, and the SM-count-dependent choices (segments,
// workspace size) are that device's. No-op for CPU arrays and in a build without CUDA.
// RuntimeError when the device cannot be made current (the GIL must be held).
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(const Placement& where);
  ~ScopedCudaDevice();
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

 private:
  int previous_ = -1;  // the device to restore; -1: nothing was switched
};

// Raise a Python exception (the GIL must be held).
[[noreturn]] void raise_value_error(const std::string& message);
[[noreturn]] void raise_type_error(const std::string& message);
[[noreturn]] void raise_not_implemented(const std::string& message);

// Map a non-OK Status to ValueError (kInvalidArgument), TypeError (kInvalidType),
// NotImplementedError (kUnsupported) or RuntimeError (kCudaError, kInternal).
void raise_if_error(const Status& status);

// The kdakit dtype of an array; TypeError if kdakit has none for it.
DType dtype_of(const ArrayView& a);

// TypeError unless the array's dtype is one of `allowed`; returns it.
DType expect_dtype(const ArrayView& a, std::initializer_list<DType> allowed);

// TypeError unless `a` lives on the device the arrays before it live on. Only CPU and CUDA
// memory are accepted.
void expect_same_device(Placement& where, const ArrayView& a);

// ValueError unless a.ndim == rank; `dims` spells the expected shape, e.g. "[B, T, H, K]".
void expect_rank(const ArrayView& a, size_t rank, const char* dims);

// ValueError unless the shape equals `shape` exactly.
void expect_shape(const ArrayView& a, std::initializer_list<int64_t> shape, const char* dims);

// ValueError unless the last dimension has stride 1 (or extent <= 1).
void expect_unit_last_stride(const ArrayView& a);

// ValueError unless dims [first, ndim) are C-contiguous among themselves.
void expect_contiguous_from(const ArrayView& a, size_t first, const char* why);

// "[1, 7, 4, 128]"
std::string shape_string(const ArrayView& a);

// String-valued options of the Python API.
GateMode parse_gate(const std::string& gate);
StateLayout parse_state_layout(const std::string& layout);

// Which implementation runs a call.
enum class Backend { kAuto, kCuda, kReference, kChunked };
Backend parse_backend(const std::string& backend);

// Checks that the backend fits the arrays' placement and returns the concrete one:
// CUDA arrays -> kCuda; CPU arrays -> `cpu_default` for kAuto, else the one asked for.
// `op` names the operation for messages; `chunked_available` says whether a CPU chunked
// backend exists for it.
Backend resolve_backend(const char* op, Backend asked, const Placement& where,
                        Backend cpu_default, bool chunked_available);

}  // namespace kdakit::bindings
