// Checks shared by the prefill tests of every backend: compare the outputs, final states and
// chunk states of two runs of the same case (a backend against the reference), and helpers to
// copy the results a run produced.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "kdakit/kdakit.h"

namespace kdakit::testing {

// Relative-L2 bar for comparing an fp32 computation with the float64 reference when the result
// is stored in `dtype`: fp32 rounding for fp32, else a few storage rounding steps. A rounding
// flip costs one ulp of that element (2^-8 relative for bf16, 2^-11 for fp16), and only the
// elements within the fp32 error of a rounding boundary flip.
inline double storage_bar(DType dtype, double fp32_bar) {
  switch (dtype) {
    case DType::kBFloat16:
      return 1e-3;
    case DType::kFloat16:
      return 2e-4;
    default:
      return fp32_bar;
  }
}

// The final-state tensor of a prefill run (the initial one when updated in place).
inline const HostTensor& final_state_of(const PrefillCase& c, const PrefillTensors& t) {
  return c.in_place ? t.initial_state : t.final_state;
}

// Expects `got` (a run of case c) to match `ref` (the reference run of the same inputs):
// outputs (NaN positions included: unwritten tokens stay poisoned in both), final states,
// chunk states. bar_fp32 applies to fp32 storage; bf16/fp16 storage uses storage_bar.
inline void expect_prefill_matches(const PrefillCase& c, const PrefillTensors& got,
                                   const PrefillTensors& ref, double bar_fp32) {
  EXPECT_TRUE(rel_l2_below("o", got.o, ref.o, storage_bar(c.dtype_qkv, bar_fp32)));
  const HostTensor& got_final = final_state_of(c, got);
  const HostTensor& ref_final = final_state_of(c, ref);
  if (ref_final.defined()) {
    EXPECT_TRUE(
        rel_l2_below("final state", got_final, ref_final, storage_bar(c.dtype_state, bar_fp32)));
  }
  if (ref.chunk_states.defined()) {
    EXPECT_TRUE(rel_l2_below("chunk states", got.chunk_states, ref.chunk_states,
                             storage_bar(c.dtype_state, bar_fp32)));
  }
}

// Runs `op` (e.g. cpu::prefill_reference) on host tensors `t` of case c.
template <class Op>
Status run_prefill_on_host(Op&& op, const PrefillCase& c, PrefillTensors& t) {
  return op(fill_prefill_params(c, t, host_pointers(t)));
}

template <class Op>
Status run_decode_on_host(Op&& op, const DecodeCase& c, DecodeTensors& t) {
  return op(fill_decode_params(c, t, host_pointers(t)));
}

}  // namespace kdakit::testing
