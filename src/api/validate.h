// Validation entry points of the API layer beyond the public kdakit::validate(): the checks of
// the batch fields alone, which size the prefill workspace and determine its plan
// (prefill_workspace_size, prefill_plan). No device memory is read.
#pragma once

#include "kdakit/kdakit.h"

namespace kdakit::detail {

// The batch fields of PrefillParams (kdakit.h): batch, seqlen, num_seqs (N = B without
// cu_seqlens, B = 1 with), num_v_heads > 0, the dtype and alignment of cu_seqlens. The same
// rules and messages as the corresponding checks of validate(p).
Status validate_batch(const PrefillParams& p);

}  // namespace kdakit::detail
