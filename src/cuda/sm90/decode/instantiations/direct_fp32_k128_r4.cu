// Explicit instantiation: direct decode kernel, state fp32, K = V = 128, 4 value rows per warp
// (16 per CTA).
#include "cuda/sm90/decode/direct.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_direct<float, 128, 4>(const FastDecodeParams&, cudaStream_t, bool);
}  // namespace kdakit::sm90::recurrent
