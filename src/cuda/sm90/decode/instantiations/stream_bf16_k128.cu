// Explicit instantiation: stream decode kernel, state bf16, K = V = 128.
#include "cuda/sm90/decode/stream.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_stream<__nv_bfloat16, 128>(const FastDecodeParams&, cudaStream_t, bool, int,
                                                  int);
}  // namespace kdakit::sm90::recurrent
