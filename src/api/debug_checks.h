// Debug mode of the CUDA entry points: with the environment variable KDAKIT_DEBUG_CHECKS=1,
// kdakit::prefill and kdakit::decode copy the device-resident metadata (cu_seqlens, slot
// indices, num_accepted_tokens) to the host before launching and reject values the kernels
// would otherwise clamp or skip, and a prefill with plan_ready whose plan does not match. This
// synchronises the stream, so it is off by default and refuses to run under CUDA graph capture.
// Compiled only when KDAKIT_WITH_CUDA.
#pragma once

#include "kdakit/kdakit.h"

namespace kdakit {

// KDAKIT_DEBUG_CHECKS=1 in the environment, read once per process.
bool debug_checks_enabled();

// Both run after validate(p) has passed. With plan_ready, the prefill check also copies the
// plan region of the workspace and compares it with the plan of cu_seqlens and the sizes.
Status debug_check(const PrefillParams& p, cudaStream_t stream);
Status debug_check(const DecodeParams& p, cudaStream_t stream);

// prefill_plan's check, after detail::validate_batch(p) has passed: cu_seqlens only.
Status debug_check_plan(const PrefillParams& p, cudaStream_t stream);

}  // namespace kdakit
