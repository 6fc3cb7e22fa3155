// The recurrence kernel with 16 value rows per CTA.
#include "cuda/sm90/prefill/recurrence/kernel.cuh"

namespace kdakit::sm90::prefill {
template Status launch_prefill_recurrence<16>(const PrefillParams&, const WorkspacePlan&, const void*, cudaStream_t);
}  // namespace kdakit::sm90::prefill
