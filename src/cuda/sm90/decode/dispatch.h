// Host-side entry of the sm_90a token-serial (recurrent) kernels: a plain C++ header (no CUDA
// includes) that the API layer (src/api/decode.cpp) and the prefill dispatcher call after
// kdakit::validate() has passed.
#pragma once

#include "kdakit/kdakit.h"

namespace kdakit::sm90 {

// Decode over a state pool (one or a few tokens per sequence, speculative decoding).
Status run_decode(const DecodeParams& p, cudaStream_t stream);

// The same recurrence for short prefill with PrefillParams (dense or pool-indexed state),
// used by run_prefill when it beats the chunked kernel.
Status run_recurrent_prefill(const PrefillParams& p, cudaStream_t stream);

}  // namespace kdakit::sm90
