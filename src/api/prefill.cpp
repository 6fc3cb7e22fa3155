// kdakit::prefill: validate -> workspace check -> (debug-mode metadata check) -> features the
// kernels build -> sm_90a dispatch. The run path reads no device memory on the host and
// allocates nothing. The workspace size and the plan step live in plan.cpp.
#include "api/check.h"
#include "kdakit/kdakit.h"

#if KDAKIT_WITH_CUDA
#include "api/debug_checks.h"
#include "cuda/sm90/prefill/dispatch.h"
#endif

namespace kdakit {
namespace {

// PrefillParams fields the sm_90a prefill kernels (fused, chunked and token-serial) do not
// read yet; the CPU backend implements them. Each is kUnsupported here rather than a wrong
// answer. When a kernel reads one (docs/design/20261201-prefill-pool.md lists the semantics),
// drop its check.
[[maybe_unused]] Status check_kernel_features(const PrefillParams& p) {
  if (p.chunk_states == nullptr) return Status::Ok();
  KDAKIT_CHECK(p.chunk_state_indices == nullptr, kUnsupported,
               "chunk_state_indices: chunk states written to pool rows are not built into the "
               "sm_90a prefill kernels yet (the CPU backend has them); pass a dense chunk_states "
               "buffer, or gather the wanted entries from it");
  const int64_t state_elems = int64_t{p.num_v_heads} * p.head_dim_k * p.head_dim_v;
  KDAKIT_CHECK(p.num_chunk_states <= 1 || p.stride_chunk_states_n == state_elems, kUnsupported,
               "stride_chunk_states_n: the sm_90a prefill kernels write chunk states densely "
               "(stride HV*K*V = ",
               state_elems, "), got ", p.stride_chunk_states_n);
  KDAKIT_CHECK(chunk_states_dtype(p) == p.dtype_state, kUnsupported,
               "chunk_states: the sm_90a prefill kernels write chunk states in the state dtype (",
               to_string(p.dtype_state), "), got ", to_string(chunk_states_dtype(p)));
  return Status::Ok();
}

}  // namespace

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
  KDAKIT_RETURN_IF_ERROR(check_kernel_features(p));
  return sm90::run_prefill(p, stream);
#else
  (void)stream;
  return Status(StatusCode::kUnsupported, "kdakit was built without CUDA");
#endif
}

}  // namespace kdakit
