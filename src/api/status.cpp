// Names of the public enums, as the Python package spells them (torch dtype names, FLA terms).
#include "kdakit/kdakit.h"

namespace kdakit {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "unknown dtype";
}

const char* to_string(GateMode gate) {
  switch (gate) {
    case GateMode::kPrecomputed:
      return "precomputed";
    case GateMode::kSoftplus:
      return "softplus";
    case GateMode::kLowerBound:
      return "lower_bound";
  }
  return "unknown gate mode";
}

const char* to_string(StateLayout layout) {
  switch (layout) {
    case StateLayout::kVFirst:
      return "V-first [V, K]";
    case StateLayout::kKFirst:
      return "K-first [K, V]";
  }
  return "unknown state layout";
}

}  // namespace kdakit
