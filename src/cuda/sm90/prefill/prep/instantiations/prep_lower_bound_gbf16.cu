// Prep kernel, lower_bound gate, bf16 g, both CTA shapes.
#include "cuda/sm90/prefill/prep/kernel.cuh"

namespace kdakit::sm90::prefill::prep {
template Status launch_prep_kernel<GateMode::kLowerBound, false, 8>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kLowerBound, false, 16>(const PrepParams&, int64_t, cudaStream_t);
}  // namespace kdakit::sm90::prefill::prep
