// Explicit instantiation: ring decode kernel, state fp32, K = V = 128, 12 warps per CTA, 2 stages
// per warp.
#include "cuda/sm90/decode/ring.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_ring<float, 12, 2, false>(const FastDecodeParams&, cudaStream_t, bool, int,
                                                 int);
}  // namespace kdakit::sm90::recurrent
