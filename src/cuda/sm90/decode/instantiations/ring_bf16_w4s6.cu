// Explicit instantiation: ring decode kernel, state bf16, K = V = 128, 4 warps per CTA, 6 stages
// per warp.
#include "cuda/sm90/decode/ring.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_ring<__nv_bfloat16, 4, 6, false>(const FastDecodeParams&, cudaStream_t, bool,
                                                        int, int);
}  // namespace kdakit::sm90::recurrent
