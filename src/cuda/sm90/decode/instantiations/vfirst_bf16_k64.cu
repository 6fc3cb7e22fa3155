// Explicit instantiation: state bf16, v-first layout, K = V = 64.
#include "cuda/sm90/decode/kernel.cuh"

namespace kdakit::sm90::recurrent {
template Status launch_recurrent<__nv_bfloat16, StateLayout::kVFirst, 64>(const RecurrentKernelParams&, cudaStream_t);
}  // namespace kdakit::sm90::recurrent
