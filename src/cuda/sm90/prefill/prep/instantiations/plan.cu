// The plan kernel and its host launcher (launch.h).
#include "cuda/sm90/prefill/prep/kernel.cuh"
#include "cuda/sm90/prefill/prep/plan_kernel.cuh"

namespace kdakit::sm90::prefill {

Status launch_prefill_plan(const PrefillParams& p, const WorkspacePlan& w, void* workspace, cudaStream_t stream) {
  if (workspace == nullptr) return Status(StatusCode::kInvalidArgument, "prefill plan: workspace is null");
  if (p.cu_seqlens != nullptr && p.dtype_cu_seqlens != DType::kInt32 && p.dtype_cu_seqlens != DType::kInt64) {
    return Status(StatusCode::kInvalidType, std::string("prefill plan: cu_seqlens must be int32 or int64, got ") +
                                                to_string(p.dtype_cu_seqlens));
  }
  if (w.max_chunks > INT32_MAX || p.seqlen > INT32_MAX) {
    return Status(StatusCode::kUnsupported, "prefill plan: supports up to 2^31 - 1 chunks and tokens per row");
  }
  auto* base = static_cast<unsigned char*>(workspace);
  const prep::PlanParams params{
      .cu_seqlens = p.cu_seqlens,
      .cu_int64 = p.dtype_cu_seqlens == DType::kInt64,
      .num_seqs = w.num_seqs,
      .seqlen = p.seqlen,
      .max_chunks = w.max_chunks,
      .chunk_offsets = reinterpret_cast<int32_t*>(base + w.chunk_offsets_offset),
      .chunk_seq = reinterpret_cast<int32_t*>(base + w.chunk_seq_offset),
      .seq_start = reinterpret_cast<int64_t*>(base + w.seq_start_offset),
      .seq_len = reinterpret_cast<int32_t*>(base + w.seq_len_offset),
      .longest = reinterpret_cast<int32_t*>(base + w.longest_offset),
      .seq_order = reinterpret_cast<int32_t*>(base + w.seq_order_offset),
      .host_shape = reinterpret_cast<int32_t*>(base + w.host_shape_offset),
      .shape_route = w.shape_route,
      .num_v_heads = p.num_v_heads,
  };
  prep::kda_prefill_plan_sm90_kernel<<<1, prep::kPlanThreads, 0, stream>>>(params);
  return prep::cuda_status(cudaGetLastError(), __LINE__, "kda_prefill_plan_sm90_kernel launch");
}

}  // namespace kdakit::sm90::prefill
