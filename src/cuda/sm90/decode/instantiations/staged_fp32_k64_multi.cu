// Explicit instantiation: staged V-first decode kernel, state fp32, K = V = 64, multi token(s) per sequence.
#include "cuda/sm90/decode/kernel.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_staged<float, 64, false, 1>(const RecurrentKernelParams&, cudaStream_t, bool);
}  // namespace kdakit::sm90::recurrent
