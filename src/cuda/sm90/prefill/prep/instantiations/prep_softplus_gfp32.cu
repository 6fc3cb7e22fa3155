// Prep kernel, softplus gate, fp32 g, every variant.
#include "cuda/sm90/prefill/prep/kernel.cuh"

namespace kdakit::sm90::prefill::prep {
template Status launch_prep_kernel<GateMode::kSoftplus, true, 0>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kSoftplus, true, 1>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kSoftplus, true, 2>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kSoftplus, true, 3>(const PrepParams&, int64_t, cudaStream_t);
}  // namespace kdakit::sm90::prefill::prep
