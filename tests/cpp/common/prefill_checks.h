// Checks shared by the prefill and decode tests of every backend: compare the outputs, states
// and chunk states of two runs of the same case (a backend against the reference), and helpers
// that run a CPU entry point on host tensors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "cpu/reference.h"
#include "kdakit/kdakit.h"

namespace kdakit::testing {

// The two CPU prefill backends, for tests that run a property on both.
struct CpuBackend {
  const char* name;
  Status (*fn)(const PrefillParams&);
};
inline constexpr CpuBackend kCpuBackends[] = {{"reference", cpu::prefill_reference},
                                              {"chunked", cpu::prefill_chunked}};

// Relative-L2 bar for a result stored in `dtype`, given the bar `bar` of the computation: the
// larger of `bar` and what storage rounding alone can cost. Against the float64 reference a
// result rounded to bf16 / fp16 differs wherever the computation's error moves a value across
// a rounding boundary, by one ulp (2^-8 relative for bf16, 2^-11 for fp16); for an fp32
// computation (error ~1e-6) that stays well under 1e-3 (bf16) and 2e-4 (fp16).
inline double storage_bar(DType dtype, double bar) {
  switch (dtype) {
    case DType::kBFloat16:
      return std::max(bar, 1e-3);
    case DType::kFloat16:
      return std::max(bar, 2e-4);
    default:
      return bar;
  }
}

// The final-state tensor of a prefill run (the initial one when updated in place).
inline const HostTensor& final_state_of(const PrefillCase& c, const PrefillTensors& t) {
  return c.in_place ? t.initial_state : t.final_state;
}

// Expects `got` (a run of case c) to match `ref` (the reference run of the same inputs):
// outputs (NaN positions included: unwritten tokens stay poisoned in both) against bar_o,
// final states and chunk states against bar_state, each raised by storage_bar for bf16/fp16.
inline void expect_prefill_matches(const PrefillCase& c, const PrefillTensors& got,
                                   const PrefillTensors& ref, double bar_o, double bar_state) {
  EXPECT_TRUE(rel_l2_below("o", got.o, ref.o, storage_bar(c.dtype_qkv, bar_o)));
  const HostTensor& got_final = final_state_of(c, got);
  const HostTensor& ref_final = final_state_of(c, ref);
  if (ref_final.defined()) {
    EXPECT_TRUE(
        rel_l2_below("final state", got_final, ref_final, storage_bar(c.dtype_state, bar_state)));
  }
  if (ref.chunk_states.defined()) {
    EXPECT_TRUE(rel_l2_below("chunk states", got.chunk_states, ref.chunk_states,
                             storage_bar(c.dtype_chunk_states.value_or(c.dtype_state), bar_state)));
  }
}

inline void expect_prefill_matches(const PrefillCase& c, const PrefillTensors& got,
                                   const PrefillTensors& ref, double bar) {
  expect_prefill_matches(c, got, ref, bar, bar);
}

// For a state pool [slots, HV, ...] (decode state, or a prefill final pool): every slot the
// reference run left as it was in `before` must be bit-identical in `got` too (a rel-L2 over
// the whole pool would hide a small write into a slot nobody owns).
inline ::testing::AssertionResult untouched_slots_equal(const HostTensor& before,
                                                        const HostTensor& got,
                                                        const HostTensor& ref) {
  const int64_t size = cpu::element_bytes(before.dtype);
  const int64_t slot_elements = before.numel() / std::max<int64_t>(before.shape[0], 1);
  for (int64_t slot = 0; slot < before.shape[0]; ++slot) {
    bool ref_untouched = true, got_untouched = true;
    for (int64_t e = slot * slot_elements; e < (slot + 1) * slot_elements; ++e) {
      const auto* b = before.bytes.data() + before.offset_of(e) * size;
      ref_untouched = ref_untouched &&
                      std::memcmp(b, ref.bytes.data() + ref.offset_of(e) * size, size_t(size)) == 0;
      got_untouched = got_untouched &&
                      std::memcmp(b, got.bytes.data() + got.offset_of(e) * size, size_t(size)) == 0;
    }
    if (ref_untouched && !got_untouched) {
      return ::testing::AssertionFailure()
             << "slot " << slot << " must stay untouched (the reference leaves it) but changed";
    }
  }
  return ::testing::AssertionSuccess();
}

// Expects decode run `got` to match the reference run `ref` of the same `inputs`: outputs
// (padding rows: zeros in both) against bar_o, the pool against bar_state, and slots the
// reference does not write bit-identical.
inline void expect_decode_matches(const DecodeCase& c, const DecodeTensors& inputs,
                                  const DecodeTensors& got, const DecodeTensors& ref, double bar_o,
                                  double bar_state) {
  EXPECT_TRUE(rel_l2_below("o", got.o, ref.o, storage_bar(c.dtype_qkv, bar_o)));
  EXPECT_TRUE(rel_l2_below("pool", got.state, ref.state, storage_bar(c.dtype_state, bar_state)));
  EXPECT_TRUE(untouched_slots_equal(inputs.state, got.state, ref.state));
}

// Runs `op` (e.g. cpu::prefill_reference) on host tensors `t` of case c.
template <class Op>
Status run_prefill_on_host(Op&& op, const PrefillCase& c, PrefillTensors& t) {
  return op(fill_prefill_params(c, t, host_pointers(t)));
}

// The float64 reference of case c on host tensors `t`, with t.o replaced by a float32 tensor
// of the same shape and strides (NaN-poisoned like the activation-dtype one). Accuracy checks
// of a kernel's bf16 output against it measure the kernel's error against the float64
// recurrence (CONTRACT.md section 6) instead of adding the reference's own bf16 rounding of o
// (~1.1e-3 rel. L2, which by itself took a 3.3e-3 kernel over the 4e-3 bar now and then).
inline Status run_reference_fp32_output(const PrefillCase& c, PrefillTensors& t) {
  t.o = HostTensor::with_strides(DType::kFloat32, t.o.shape, t.o.strides);
  t.o.poison();
  return run_prefill_on_host(cpu::prefill_reference_fp32_output, c, t);
}

template <class Op>
Status run_decode_on_host(Op&& op, const DecodeCase& c, DecodeTensors& t) {
  return op(fill_decode_params(c, t, host_pointers(t)));
}

}  // namespace kdakit::testing
