// Explicit instantiation: ring V-first decode kernel (deep ring), state fp32, K = V = 128.
#include "cuda/sm90/decode/ring.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_ring<float, 128, true>(const RecurrentKernelParams&, cudaStream_t);
}  // namespace kdakit::sm90::recurrent
