// Explicit instantiation: state fp32, k-first layout, K = V = 128.
#include "cuda/sm90/decode/kernel.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_recurrent<float, StateLayout::kKFirst, 128>(const RecurrentKernelParams&, cudaStream_t);
}  // namespace kdakit::sm90::recurrent
