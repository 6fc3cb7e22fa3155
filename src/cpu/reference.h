// Internal entry of the float64 reference (reference.cpp) for accuracy checks.
#pragma once

#include "kdakit/kdakit.h"

namespace kdakit::cpu {

// prefill_reference with o stored as float32 (p.o points to a float32 tensor with the element
// strides of p.stride_o_*): the float64 result rounded once to fp32 instead of to the
// activation dtype, so that an accuracy check of a bf16 output measures the kernel's error
// against the float64 recurrence (CONTRACT.md section 6), not against a second bf16 rounding.
Status prefill_reference_fp32_output(const PrefillParams& p);

}  // namespace kdakit::cpu
