// DLPack inspection, option parsing and Status-to-exception mapping for kdakit._kdakit.
#include "common.h"

#include <Python.h>

#if KDAKIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <sstream>

namespace kdakit::bindings {

namespace {

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

template <typename Array>
ArrayView make_view(const char* name, const Array& a) {
  ArrayView v;
  v.name = name;
  if (a.ndim() > kMaxRank) {
    raise(PyExc_ValueError, std::string(name) + ": expected at most " +
                                std::to_string(kMaxRank) + " dimensions, got " +
                                std::to_string(a.ndim()));
  }
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = a.dtype();
  v.ndim = a.ndim();
  bool empty = false;
  for (size_t i = 0; i < v.ndim; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.strides[i] = a.stride(i);
    empty = empty || v.shape[i] == 0;
  }
  if (empty) {
    int64_t stride = 1;
    for (size_t i = v.ndim; i-- > 0;) {
      v.strides[i] = stride;
      stride *= v.shape[i] > 0 ? v.shape[i] : 1;
    }
  }
  v.device_type = a.device_type();
  v.device_id = a.device_id();
  return v;
}

const char* device_name(int device_type) {
  switch (device_type) {
    case kDeviceCpu: return "cpu";
    case kDeviceCuda: return "cuda";
    case 3: return "cuda_host";
    case 13: return "cuda_managed";
    default: return "unsupported device";
  }
}

std::string dlpack_dtype_string(nb::dlpack::dtype t) {
  const char* kind = "unknown";
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
  }
  return std::string(kind) + std::to_string(t.bits);
}

}  // namespace

ArrayView view(const char* name, const InArray& a) { return make_view(name, a); }
ArrayView view(const char* name, const OutArray& a) { return make_view(name, a); }

void raise_value_error(const std::string& message) { raise(PyExc_ValueError, message); }
void raise_type_error(const std::string& message) { raise(PyExc_TypeError, message); }
void raise_not_implemented(const std::string& message) {
  raise(PyExc_NotImplementedError, message);
}

void raise_if_error(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return;
    case StatusCode::kInvalidArgument: raise(PyExc_ValueError, status.message());
    case StatusCode::kInvalidType: raise(PyExc_TypeError, status.message());
    case StatusCode::kUnsupported: raise(PyExc_NotImplementedError, status.message());
    case StatusCode::kCudaError:
      raise(PyExc_RuntimeError, "kdakit CUDA error: " + status.message());
    case StatusCode::kInternal:
      raise(PyExc_RuntimeError, "kdakit internal error: " + status.message());
  }
  raise(PyExc_RuntimeError, "kdakit: unknown status code: " + status.message());
}

DType dtype_of(const ArrayView& a) {
  const auto code = static_cast<nb::dlpack::dtype_code>(a.dtype.code);
  if (a.dtype.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && a.dtype.bits == 32) return DType::kFloat32;
    if (code == nb::dlpack::dtype_code::Bfloat && a.dtype.bits == 16) return DType::kBFloat16;
    if (code == nb::dlpack::dtype_code::Float && a.dtype.bits == 16) return DType::kFloat16;
    if (code == nb::dlpack::dtype_code::Int && a.dtype.bits == 32) return DType::kInt32;
    if (code == nb::dlpack::dtype_code::Int && a.dtype.bits == 64) return DType::kInt64;
  }
  raise_type_error(std::string(a.name) + ": dtype " + dlpack_dtype_string(a.dtype) +
                   " is not supported by kdakit (float32, bfloat16, float16, int32, int64)");
}

DType expect_dtype(const ArrayView& a, std::initializer_list<DType> allowed) {
  const DType got = dtype_of(a);
  std::string expected;
  for (DType d : allowed) {
    if (d == got) return got;
    expected += expected.empty() ? "" : " or ";
    expected += to_string(d);
  }
  raise_type_error(std::string(a.name) + ": expected dtype " + expected + ", got " +
                   to_string(got));
}

ScopedCudaDevice::ScopedCudaDevice(const Placement& where) {
#if KDAKIT_WITH_CUDA
  if (!where.is_cuda()) return;
  int current = -1;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess && current == where.device_id) return;
  if (err == cudaSuccess) err = cudaSetDevice(where.device_id);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    raise(PyExc_RuntimeError, "kdakit: cannot make CUDA device " + std::to_string(where.device_id) +
                                  " (the arrays' device) current: " + cudaGetErrorString(err));
  }
  previous_ = current;
#else
  (void)where;
#endif
}

ScopedCudaDevice::~ScopedCudaDevice() {
#if KDAKIT_WITH_CUDA
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
#endif
}

void expect_same_device(Placement& where, const ArrayView& a) {
  if (a.device_type != kDeviceCpu && a.device_type != kDeviceCuda) {
    raise_type_error(std::string(a.name) + ": arrays must be in CPU or CUDA device memory, got " +
                     device_name(a.device_type));
  }
  if (where.first_name == nullptr) {
    where.device_type = a.device_type;
    where.device_id = a.device_id;
    where.first_name = a.name;
    return;
  }
  if (a.device_type != where.device_type || a.device_id != where.device_id) {
    std::ostringstream os;
    os << a.name << ": expected device " << device_name(where.device_type) << ":"
       << where.device_id << " (the device of " << where.first_name << "), got "
       << device_name(a.device_type) << ":" << a.device_id;
    raise_type_error(os.str());
  }
}

std::string shape_string(const ArrayView& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape[i]);
  }
  return s + "]";
}

void expect_rank(const ArrayView& a, size_t rank, const char* dims) {
  if (a.ndim != rank) {
    raise_value_error(std::string(a.name) + ": expected " + std::to_string(rank) +
                      " dimensions " + dims + ", got shape " + shape_string(a));
  }
}

void expect_shape(const ArrayView& a, std::initializer_list<int64_t> shape, const char* dims) {
  bool same = a.ndim == shape.size();
  size_t i = 0;
  for (int64_t extent : shape) {
    if (same && a.shape[i] != extent) same = false;
    ++i;
  }
  if (!same) {
    std::string want = "[";
    i = 0;
    for (int64_t extent : shape) want += (i++ ? ", " : "") + std::to_string(extent);
    raise_value_error(std::string(a.name) + ": expected shape " + dims + " = " + want +
                      "], got " + shape_string(a));
  }
}

void expect_unit_last_stride(const ArrayView& a) {
  if (a.ndim == 0) return;
  const size_t last = a.ndim - 1;
  if (a.shape[last] > 1 && a.strides[last] != 1) {
    raise_value_error(std::string(a.name) +
                      ": the last dimension must be contiguous (stride 1), got stride " +
                      std::to_string(a.strides[last]));
  }
}

void expect_contiguous_from(const ArrayView& a, size_t first, const char* why) {
  int64_t expected = 1;
  for (size_t i = a.ndim; i-- > first;) {
    if (a.shape[i] > 1 && a.strides[i] != expected) {
      std::string strides = "[";
      for (size_t j = 0; j < a.ndim; ++j) strides += (j ? ", " : "") + std::to_string(a.strides[j]);
      raise_value_error(std::string(a.name) + ": " + why + " must be contiguous; shape " +
                        shape_string(a) + " has strides " + strides + "]");
    }
    expected *= a.shape[i];
  }
}

GateMode parse_gate(const std::string& gate) {
  if (gate == "precomputed") return GateMode::kPrecomputed;
  if (gate == "softplus") return GateMode::kSoftplus;
  if (gate == "lower_bound") return GateMode::kLowerBound;
  raise_value_error("gate: expected 'precomputed', 'softplus' or 'lower_bound', got '" + gate +
                    "'");
}

StateLayout parse_state_layout(const std::string& layout) {
  if (layout == "v_first") return StateLayout::kVFirst;
  if (layout == "k_first") return StateLayout::kKFirst;
  raise_value_error("state_layout: expected 'v_first' or 'k_first', got '" + layout + "'");
}

Backend parse_backend(const std::string& backend) {
  if (backend == "auto") return Backend::kAuto;
  if (backend == "cuda") return Backend::kCuda;
  if (backend == "reference") return Backend::kReference;
  if (backend == "chunked") return Backend::kChunked;
  raise_value_error("backend: expected 'auto', 'cuda', 'reference' or 'chunked', got '" +
                    backend + "'");
}

Backend resolve_backend(const char* op, Backend asked, const Placement& where,
                        Backend cpu_default, bool chunked_available) {
  if (where.is_cuda()) {
    if (asked != Backend::kAuto && asked != Backend::kCuda) {
      raise_value_error(std::string("backend: the CPU backends of ") + op +
                        " take CPU arrays; the arrays are on CUDA");
    }
    return Backend::kCuda;
  }
  if (asked == Backend::kCuda) {
    raise_value_error(std::string("backend: 'cuda' needs CUDA arrays; the arrays are on the CPU"));
  }
  if (asked == Backend::kChunked && !chunked_available) {
    raise_value_error(std::string("backend: ") + op +
                      " has no chunked CPU backend; use 'reference' or 'auto'");
  }
  return asked == Backend::kAuto ? cpu_default : asked;
}

}  // namespace kdakit::bindings
