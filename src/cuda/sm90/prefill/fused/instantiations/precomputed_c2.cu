// The fused prefill kernel, precomputed gate, 2 consumer warpgroup(s).
#include "cuda/sm90/prefill/fused/kernel.cuh"

namespace kdakit::sm90::prefill {
template Status launch_prefill_fused<GateMode::kPrecomputed, 2>(const PrefillParams&, const WorkspacePlan&, const void*, int,
                                                           cudaStream_t);
}  // namespace kdakit::sm90::prefill
