// Internal helpers of the host API layer: build a Status message from pieces, and return it
// from the calling function when a condition fails, so that each validation rule is one line:
//
//   KDAKIT_CHECK(p.num_v_heads > 0, kInvalidArgument, "num_v_heads: expected > 0, got ", hv);
//
// No CUDA, torch or nanobind headers: the API layer compiles in every build.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "kdakit/kdakit.h"

namespace kdakit::detail {

// Concatenates the arguments with operator<< into one string.
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
Status error(StatusCode code, Args&&... args) {
  return Status(code, cat(std::forward<Args>(args)...));
}

}  // namespace kdakit::detail

// Returns a Status with `code` (a StatusCode enumerator name) and the concatenated message
// from the enclosing function when `cond` is false.
#define KDAKIT_CHECK(cond, code, ...)                                                     \
  do {                                                                                    \
    if (!(cond)) return ::kdakit::detail::error(::kdakit::StatusCode::code, __VA_ARGS__); \
  } while (0)

// Returns `expr` (a Status) from the enclosing function when it is not ok.
#define KDAKIT_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::kdakit::Status kdakit_status_ = (expr);        \
    if (!kdakit_status_.ok()) return kdakit_status_; \
  } while (0)
