// Explicit instantiation: direct decode kernel, state bf16, K = V = 64, 8 value rows per warp
// (32 per CTA).
#include "cuda/sm90/decode/direct.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_direct<__nv_bfloat16, 64, 8>(const FastDecodeParams&, cudaStream_t, bool);
}  // namespace kdakit::sm90::recurrent
