// Explicit instantiation: ring decode kernel, state fp32, K = V = 128, 8 warps per CTA, 3 stages
// per warp.
#include "cuda/sm90/decode/ring.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_ring<float, 8, 3, false>(const FastDecodeParams&, cudaStream_t, bool, int,
                                                int);
}  // namespace kdakit::sm90::recurrent
