// kdakit::decode: validate -> (debug-mode metadata check) -> sm_90a dispatch. The run path
// reads no device memory on the host and allocates nothing.
#include "api/check.h"
#include "kdakit/kdakit.h"

#if KDAKIT_WITH_CUDA
#include "api/debug_checks.h"
#include "cuda/sm90/decode/dispatch.h"
#endif

namespace kdakit {

Status decode(const DecodeParams& p, cudaStream_t stream) {
  KDAKIT_RETURN_IF_ERROR(validate(p));
#if KDAKIT_WITH_CUDA
  // NOTE: without sequences or tokens nothing is written: every state passes through in
  // place and there is no output row.
  if (p.num_seqs == 0 || p.seqlen == 0) return Status::Ok();
  if (debug_checks_enabled()) KDAKIT_RETURN_IF_ERROR(debug_check(p, stream));
  return sm90::run_decode(p, stream);
#else
  (void)stream;
  return Status(StatusCode::kUnsupported, "kdakit was built without CUDA");
#endif
}

}  // namespace kdakit
