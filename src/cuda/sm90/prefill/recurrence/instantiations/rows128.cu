// The recurrence kernel with 128 value rows per CTA, and the summary pass of segmented prefill.
#include "cuda/sm90/prefill/recurrence/kernel.cuh"

namespace kdakit::sm90::prefill {
template Status launch_prefill_recurrence<128>(const PrefillParams&, const WorkspacePlan&, const void*, cudaStream_t);
template Status launch_prefill_summaries<128>(const PrefillParams&, const WorkspacePlan&, const void*, cudaStream_t);
}  // namespace kdakit::sm90::prefill
