// Prep kernel, lower_bound gate, bf16 g, every variant.
#include "cuda/sm90/prefill/prep/kernel.cuh"

namespace kdakit::sm90::prefill::prep {
template Status launch_prep_kernel<GateMode::kLowerBound, false, 0>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kLowerBound, false, 1>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kLowerBound, false, 2>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kLowerBound, false, 3>(const PrepParams&, int64_t, cudaStream_t);
}  // namespace kdakit::sm90::prefill::prep
