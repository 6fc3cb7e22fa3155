// Prep kernel, lower_bound gate, fp32 g, both CTA shapes.
#include "cuda/sm90/prefill/prep/kernel.cuh"

namespace kdakit::sm90::prefill::prep {
template Status launch_prep_kernel<GateMode::kLowerBound, true, 8>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kLowerBound, true, 16>(const PrepParams&, int64_t, cudaStream_t);
}  // namespace kdakit::sm90::prefill::prep
