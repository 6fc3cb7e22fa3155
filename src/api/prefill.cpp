// kdakit::prefill: validate -> workspace check -> (debug-mode metadata check) -> sm_90a
// dispatch. The run path reads no device memory on the host and allocates nothing. The workspace size and the plan step live in plan.cpp.
#include "api/check.h"
#include "kdakit/kdakit.h"

#if KDAKIT_WITH_CUDA
#include "api/debug_checks.h"
#include "cuda/sm90/prefill/dispatch.h"
#endif

namespace kdakit {

bool built_with_cuda() {
#if KDAKIT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Status prefill(const PrefillParams& p, cudaStream_t stream) {
  KDAKIT_RETURN_IF_ERROR(validate(p));
#if KDAKIT_WITH_CUDA
  // NOTE: no sequences means no output row and no state to write; the kernels need not see
  // an empty grid.
  if (p.num_seqs == 0) return Status::Ok();
  const size_t needed = sm90::prefill_workspace_size(p);
  KDAKIT_CHECK(needed == 0 || p.workspace != nullptr, kInvalidArgument, "workspace: required (",
               needed, " bytes, see prefill_workspace_size), got None");
  KDAKIT_CHECK(p.workspace_bytes >= needed, kInvalidArgument, "workspace: expected at least ",
               needed, " bytes (prefill_workspace_size), got ", p.workspace_bytes);
  if (debug_checks_enabled()) KDAKIT_RETURN_IF_ERROR(debug_check(p, stream));
  return sm90::run_prefill(p, stream);
#else
  (void)stream;
  return Status(StatusCode::kUnsupported, "kdakit was built without CUDA");
#endif
}

}  // namespace kdakit
