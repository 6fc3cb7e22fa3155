// Explicit instantiation: direct decode kernel, state fp32, K = V = 64, 8 value rows per warp
// (32 per CTA).
#include "cuda/sm90/decode/direct.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_direct<float, 64, 8>(const FastDecodeParams&, cudaStream_t, bool);
}  // namespace kdakit::sm90::recurrent
