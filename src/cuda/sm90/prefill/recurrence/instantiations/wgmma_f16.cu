// The wgmma recurrence kernel (64 and 128 value rows per CTA) and summary pass on an fp16 chunk
// block (one fp16 pass per operand, the state rows scaled by powers of two; wgmma.cuh).
#include "cuda/sm90/prefill/recurrence/wgmma.cuh"

namespace kdakit::sm90::prefill::recurrence {
template Status launch_wgmma<64, false, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t, bool);
template Status launch_wgmma<128, false, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t, bool);
template Status launch_wgmma<64, true, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t, bool);
template Status launch_wgmma<128, true, true>(const KernelParams&, const TmaParams&, int64_t, cudaStream_t, bool);
}  // namespace kdakit::sm90::prefill::recurrence
