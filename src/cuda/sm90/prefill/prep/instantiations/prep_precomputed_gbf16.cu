// Prep kernel, precomputed gate, bf16 g, every variant.
#include "cuda/sm90/prefill/prep/kernel.cuh"

namespace kdakit::sm90::prefill::prep {
template Status launch_prep_kernel<GateMode::kPrecomputed, false, 0>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kPrecomputed, false, 1>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kPrecomputed, false, 2>(const PrepParams&, int64_t, cudaStream_t);
template Status launch_prep_kernel<GateMode::kPrecomputed, false, 3>(const PrepParams&, int64_t, cudaStream_t);
}  // namespace kdakit::sm90::prefill::prep
