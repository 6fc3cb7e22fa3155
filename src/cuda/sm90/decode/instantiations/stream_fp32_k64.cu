// Explicit instantiation: stream decode kernel, state fp32, K = V = 64.
#include "cuda/sm90/decode/stream.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_stream<float, 64>(const FastDecodeParams&, cudaStream_t, bool, int, int);
}  // namespace kdakit::sm90::recurrent
