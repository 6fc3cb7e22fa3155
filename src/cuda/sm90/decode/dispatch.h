// Host-side entry of the sm_90a token-serial (recurrent) kernels: a plain C++ header (no CUDA
// includes) that the API layer (src/api/decode.cpp) and the prefill dispatcher call after
// kdakit::validate() has passed.
#pragma once

#include <string>
#include <vector>

#include "kdakit/kdakit.h"

namespace kdakit::sm90 {

// Decode over a state pool (one or a few tokens per sequence, speculative decoding).
Status run_decode(const DecodeParams& p, cudaStream_t stream);

// The same recurrence for short prefill with PrefillParams (dense or pool-indexed state),
// used by run_prefill when it beats the chunked kernel.
Status run_recurrent_prefill(const PrefillParams& p, cudaStream_t stream);

// Which decode kernel run_decode(p) would launch, by its KDAKIT_DECODE_VARIANT name
// ("registers", "staged", "staged64", "direct32", "direct16"), with "+pdl" when it would be
// launched with PDL. Honours KDAKIT_DECODE_VARIANT and KDAKIT_DECODE_PDL as run_decode does; for tests and
// benchmarks (host only, reads no device memory).
std::string decode_variant(const DecodeParams& p);

// Every name KDAKIT_DECODE_VARIANT accepts.
std::vector<std::string> decode_variant_names();

}  // namespace kdakit::sm90
