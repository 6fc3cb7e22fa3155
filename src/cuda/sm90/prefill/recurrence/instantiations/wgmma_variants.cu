// The opt-in variant of the wgmma kernel (64 and 128 value rows per CTA, bf16 and fp16 chunk
// blocks; wgmma.cuh): the summary pass writing Phi as mma B fragments for the direct combine
// kernel (kPhiFragments).
#include "cuda/sm90/prefill/recurrence/wgmma.cuh"

namespace kdakit::sm90::prefill::recurrence {
template Status launch_wgmma<64, true, false, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t);
template Status launch_wgmma<128, true, false, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t);
template Status launch_wgmma<64, true, true, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t);
template Status launch_wgmma<128, true, true, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t);
}  // namespace kdakit::sm90::prefill::recurrence
