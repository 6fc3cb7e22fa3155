// Explicit instantiation: ring V-first decode kernel (deep ring), state bf16, K = V = 128.
#include "cuda/sm90/decode/ring.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_ring<__nv_bfloat16, 128, true>(const RecurrentKernelParams&, cudaStream_t);
}  // namespace kdakit::sm90::recurrent
