// The wgmma recurrence kernel (64 and 128 value rows per CTA) and summary pass on a bf16 chunk
// block (Kh hi + lo, bf16 hi + lo operands; wgmma.cuh).
#include "cuda/sm90/prefill/recurrence/wgmma.cuh"

namespace kdakit::sm90::prefill::recurrence {
template Status launch_wgmma<64, false, false>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t, bool);
template Status launch_wgmma<128, false, false>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t, bool);
template Status launch_wgmma<64, true, false>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t, bool);
template Status launch_wgmma<128, true, false>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t, bool);
}  // namespace kdakit::sm90::prefill::recurrence
