// Explicit instantiation: ring decode kernel, state bf16, K = V = 128, 8 warps per CTA, 3 stages
// per warp, bulk (TMA) stores of each unit.
#include "cuda/sm90/decode/ring.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_ring<__nv_bfloat16, 8, 3, true>(const FastDecodeParams&, cudaStream_t, bool,
                                                       int, int);
}  // namespace kdakit::sm90::recurrent
