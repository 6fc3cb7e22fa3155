// Debug-mode checks of device-resident metadata (see debug_checks.h). Everything here runs
// only when KDAKIT_DEBUG_CHECKS=1: it allocates host vectors and synchronises `stream`, which
// the normal run path never does. The rules themselves live in metadata_checks.cpp.
#include "api/debug_checks.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "api/check.h"
#include "api/metadata_checks.h"
#include "cuda/sm90/prefill/workspace.h"

namespace kdakit {
namespace {

Status refuse_under_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  KDAKIT_CHECK(err == cudaSuccess, kCudaError,
               "KDAKIT_DEBUG_CHECKS: cudaStreamIsCapturing failed: ", cudaGetErrorString(err));
  KDAKIT_CHECK(capture == cudaStreamCaptureStatusNone, kUnsupported,
               "KDAKIT_DEBUG_CHECKS=1 reads metadata with a stream synchronisation, which CUDA "
               "graph capture forbids; unset it to capture");
  return Status::Ok();
}

// Copies `count` elements of T from device memory at `src` into `dst`, then syncs `stream`.
template <typename T>
Status copy_to_host(const char* name, const void* src, size_t count, cudaStream_t stream,
                    std::vector<T>& dst) {
  dst.resize(count);
  if (count == 0) return Status::Ok();
  cudaError_t err =
      cudaMemcpyAsync(dst.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  KDAKIT_CHECK(err == cudaSuccess, kCudaError, "KDAKIT_DEBUG_CHECKS: reading ", name,
               " to the host failed: ", cudaGetErrorString(err));
  return Status::Ok();
}

// cu_seqlens [N + 1] in either integer dtype, widened to int64.
Status copy_cu_seqlens(const void* cu, DType dtype, int64_t num_seqs, cudaStream_t stream,
                       std::vector<int64_t>& out) {
  const size_t count = static_cast<size_t>(num_seqs + 1);
  if (dtype == DType::kInt64) return copy_to_host("cu_seqlens", cu, count, stream, out);
  std::vector<int32_t> narrow;
  KDAKIT_RETURN_IF_ERROR(copy_to_host("cu_seqlens", cu, count, stream, narrow));
  out.assign(narrow.begin(), narrow.end());
  return Status::Ok();
}

// The plan region of p.workspace (laid out as workspace.h says for these sizes).
Status copy_plan_region(const PrefillParams& p, cudaStream_t stream,
                        detail::PrefillPlanRegion& out) {
  const sm90::prefill::WorkspacePlan w = sm90::prefill::make_workspace_plan(
      p.batch, p.seqlen, p.num_seqs, p.cu_seqlens != nullptr, p.num_v_heads);
  const auto* base = static_cast<const unsigned char*>(p.workspace);
  const size_t N = static_cast<size_t>(p.num_seqs);
  KDAKIT_RETURN_IF_ERROR(copy_to_host("the plan's chunk_offsets", base + w.chunk_offsets_offset,
                                      N + 1, stream, out.chunk_offsets));
  KDAKIT_RETURN_IF_ERROR(copy_to_host("the plan's chunk_seq", base + w.chunk_seq_offset,
                                      static_cast<size_t>(w.max_chunks), stream, out.chunk_seq));
  KDAKIT_RETURN_IF_ERROR(
      copy_to_host("the plan's seq_start", base + w.seq_start_offset, N, stream, out.seq_start));
  KDAKIT_RETURN_IF_ERROR(
      copy_to_host("the plan's seq_len", base + w.seq_len_offset, N, stream, out.seq_len));
  KDAKIT_RETURN_IF_ERROR(
      copy_to_host("the plan's longest", base + w.longest_offset, 1, stream, out.longest));
  KDAKIT_RETURN_IF_ERROR(
      copy_to_host("the plan's seq_order", base + w.seq_order_offset, N, stream, out.seq_order));
  return Status::Ok();
}

}  // namespace

bool debug_checks_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("KDAKIT_DEBUG_CHECKS");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return enabled;
}

Status debug_check(const PrefillParams& p, cudaStream_t stream) {
  KDAKIT_RETURN_IF_ERROR(refuse_under_capture(stream));
  const size_t N = static_cast<size_t>(p.num_seqs);
  detail::PrefillMetadata m;
  if (p.cu_seqlens != nullptr) {
    KDAKIT_RETURN_IF_ERROR(
        copy_cu_seqlens(p.cu_seqlens, p.dtype_cu_seqlens, p.num_seqs, stream, m.cu_seqlens));
  }
  if (p.initial_state_indices != nullptr) {
    KDAKIT_RETURN_IF_ERROR(copy_to_host("initial_state_indices", p.initial_state_indices, N, stream,
                                        m.initial_state_indices));
  }
  if (p.final_state_indices != nullptr) {
    KDAKIT_RETURN_IF_ERROR(copy_to_host("final_state_indices", p.final_state_indices, N, stream,
                                        m.final_state_indices));
  }
  if (p.chunk_state_indices != nullptr) {
    KDAKIT_RETURN_IF_ERROR(copy_to_host("chunk_state_indices", p.chunk_state_indices,
                                        static_cast<size_t>(p.num_chunk_states), stream,
                                        m.chunk_state_indices));
  }
  KDAKIT_RETURN_IF_ERROR(detail::check_metadata(p, m));
  if (p.plan_ready) {
    detail::PrefillPlanRegion plan;
    KDAKIT_RETURN_IF_ERROR(copy_plan_region(p, stream, plan));
    KDAKIT_RETURN_IF_ERROR(
        detail::check_prefill_plan(p, m.cu_seqlens, sm90::prefill::kChunk, plan));
  }
  return Status::Ok();
}

Status debug_check_plan(const PrefillParams& p, cudaStream_t stream) {
  KDAKIT_RETURN_IF_ERROR(refuse_under_capture(stream));
  detail::PrefillMetadata m;
  if (p.cu_seqlens != nullptr) {
    KDAKIT_RETURN_IF_ERROR(
        copy_cu_seqlens(p.cu_seqlens, p.dtype_cu_seqlens, p.num_seqs, stream, m.cu_seqlens));
  }
  // NOTE: the batch fields alone. prefill_plan reads no state, index or chunk-state argument
  // (each prefill that uses the plan checks those), and the per-buffer row rules would need
  // host copies of index arrays that this check does not make.
  PrefillParams batch;
  batch.batch = p.batch;
  batch.seqlen = p.seqlen;
  batch.num_seqs = p.num_seqs;
  batch.num_v_heads = p.num_v_heads;
  batch.cu_seqlens = p.cu_seqlens;
  batch.dtype_cu_seqlens = p.dtype_cu_seqlens;
  return detail::check_metadata(batch, m);
}

Status debug_check(const DecodeParams& p, cudaStream_t stream) {
  KDAKIT_RETURN_IF_ERROR(refuse_under_capture(stream));
  const int64_t N = p.num_seqs;
  detail::DecodeMetadata m;
  if (p.cu_seqlens != nullptr) {
    KDAKIT_RETURN_IF_ERROR(
        copy_cu_seqlens(p.cu_seqlens, p.dtype_cu_seqlens, N, stream, m.cu_seqlens));
  }
  const size_t idx_count =
      N == 0 ? 0 : static_cast<size_t>((N - 1) * p.stride_state_indices_n + p.num_index_cols);
  KDAKIT_RETURN_IF_ERROR(
      copy_to_host("state_indices", p.state_indices, idx_count, stream, m.state_indices));
  if (p.num_accepted_tokens != nullptr) {
    KDAKIT_RETURN_IF_ERROR(copy_to_host("num_accepted_tokens", p.num_accepted_tokens,
                                        static_cast<size_t>(N), stream, m.num_accepted_tokens));
  }
  return detail::check_metadata(p, m);
}

}  // namespace kdakit
