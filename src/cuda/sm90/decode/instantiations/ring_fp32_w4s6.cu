// Explicit instantiation: ring decode kernel, state fp32, K = V = 128, 4 warps per CTA, 6 stages
// per warp.
#include "cuda/sm90/decode/ring.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_ring<float, 4, 6, false>(const FastDecodeParams&, cudaStream_t, bool, int,
                                                int);
}  // namespace kdakit::sm90::recurrent
