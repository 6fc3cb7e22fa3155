// The 16-token-tile prefill kernel, lower_bound gate.
#include "cuda/sm90/prefill/tile16/kernel.cuh"

namespace kdakit::sm90::prefill {
template Status launch_prefill_tile16<GateMode::kLowerBound>(const PrefillParams&,
                                                             const WorkspacePlan&, const void*,
                                                             cudaStream_t);
}  // namespace kdakit::sm90::prefill
