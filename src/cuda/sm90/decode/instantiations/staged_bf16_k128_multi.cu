// Explicit instantiation: staged V-first decode kernel, state bf16, K = V = 128, multi token(s) per sequence.
#include "cuda/sm90/decode/kernel.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_staged<__nv_bfloat16, 128, false, 1>(const RecurrentKernelParams&, cudaStream_t, bool);
}  // namespace kdakit::sm90::recurrent
