// The wgmma recurrence kernel of an overlapped call (64 and 128 value rows per CTA, bf16 and fp16
// chunk blocks): it runs beside the prep grid and reads each chunk block once prep has flagged it
// (wgmma.cuh, kOverlap; dispatch.cu, overlap).
#include "cuda/sm90/prefill/recurrence/wgmma.cuh"

namespace kdakit::sm90::prefill::recurrence {
template Status launch_wgmma<64, false, false, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t);
template Status launch_wgmma<128, false, false, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t);
template Status launch_wgmma<64, false, true, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t);
template Status launch_wgmma<128, false, true, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t);
}  // namespace kdakit::sm90::prefill::recurrence
