// kdakit::prefill_plan and kdakit::prefill_workspace_size: the per-batch part of prefill, which
// depends on the batch fields alone (batch, seqlen, num_seqs, num_v_heads, cu_seqlens). Validate
// those -> workspace check -> (debug-mode cu_seqlens check) -> the sm_90a plan kernel. Like the
// run path it reads no device memory on the host and allocates nothing.
#include "api/check.h"
#include "api/validate.h"
#include "kdakit/kdakit.h"

#if KDAKIT_WITH_CUDA
#include "api/debug_checks.h"
#include "cuda/sm90/prefill/dispatch.h"
#include "cuda/sm90/prefill/prep/launch.h"
#include "cuda/sm90/prefill/workspace.h"
#endif

namespace kdakit {

// NOTE: invalid batch fields size no workspace (0 bytes): the sizes may be negative or absurd,
// and the prefill or prefill_plan call that follows reports the validation error.
size_t prefill_workspace_size(const PrefillParams& p) {
#if KDAKIT_WITH_CUDA
  if (!detail::validate_batch(p).ok()) return 0;
  return sm90::prefill_workspace_size(p);
#else
  (void)p;
  return 0;
#endif
}

Status prefill_plan(const PrefillParams& p, cudaStream_t stream) {
  KDAKIT_RETURN_IF_ERROR(detail::validate_batch(p));
#if KDAKIT_WITH_CUDA
  // NOTE: prefill returns before any launch for N = 0, so there is no plan to write either.
  if (p.num_seqs == 0) return Status::Ok();
  const size_t needed = sm90::prefill_workspace_size(p);
  KDAKIT_CHECK(p.workspace != nullptr, kInvalidArgument, "workspace: required (", needed,
               " bytes, see prefill_workspace_size), got None");
  KDAKIT_CHECK(p.workspace_bytes >= needed, kInvalidArgument, "workspace: expected at least ",
               needed, " bytes (prefill_workspace_size), got ", p.workspace_bytes);
  if (debug_checks_enabled()) KDAKIT_RETURN_IF_ERROR(debug_check_plan(p, stream));
  // NOTE: the same region layout and kernel that prefill's own plan step uses (dispatch.cu),
  // so a plan written here is what prefill with plan_ready = false would have written.
  const sm90::prefill::WorkspacePlan layout = sm90::prefill_plan_layout(p);
  return sm90::prefill::launch_prefill_plan(p, layout, p.workspace, stream);
#else
  (void)stream;
  return Status(StatusCode::kUnsupported,
                "prefill_plan: kdakit was built without CUDA (the CPU backend needs no plan)");
#endif
}

}  // namespace kdakit
