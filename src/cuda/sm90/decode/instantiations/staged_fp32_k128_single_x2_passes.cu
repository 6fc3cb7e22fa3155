// Explicit instantiation: staged V-first decode kernel, state fp32, K = V = 128, single token per sequence,
// two 32-row groups (64 value rows) per pass, two passes per CTA (the whole 128-row head).
#include "cuda/sm90/decode/kernel.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_staged<float, 128, true, 2, 2>(const RecurrentKernelParams&, cudaStream_t, bool);
}  // namespace kdakit::sm90::recurrent
