// launch_prefill_prep: checks what the prep kernel supports, builds its kernel-side params
// and picks the (gate, g dtype) instantiation. Runtime flags that do not change the inner loop
// (norms, beta activation, scalar gate, beta dtype) stay runtime arguments.
#include <algorithm>
#include <cstdint>
#include <string>

#include "api/check.h"
#include "cuda/sm90/prefill/prep/config.h"
#include "cuda/sm90/prefill/prep/launch.h"

namespace kdakit::sm90::prefill {

namespace {

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// Rows of `elems_per_16b` elements per 16 bytes start 16-byte aligned at every (b, t, h).
bool rows_aligned(const void* ptr, int64_t elems_per_16b, int64_t sb, int64_t st, int64_t sh) {
  return aligned16(ptr) && sb % elems_per_16b == 0 && st % elems_per_16b == 0 && sh % elems_per_16b == 0;
}

}  // namespace

Status launch_prefill_prep(const PrefillParams& p, const WorkspacePlan& w, void* workspace, cudaStream_t stream) {
  KDAKIT_CHECK(workspace != nullptr, kInvalidArgument, "prefill prep: workspace is null");
  KDAKIT_CHECK(p.head_dim_k == kHeadDim && p.head_dim_v == kHeadDim, kUnsupported,
               "prefill prep: supports K = V = 128, got K = ", p.head_dim_k, ", V = ", p.head_dim_v);
  KDAKIT_CHECK(p.dtype_qkv == DType::kBFloat16, kUnsupported,
               "prefill prep: q, k, v must be bfloat16 on the chunked path, got ", to_string(p.dtype_qkv));
  KDAKIT_CHECK(p.dtype_g == DType::kBFloat16 || p.dtype_g == DType::kFloat32, kUnsupported,
               "prefill prep: g must be bfloat16 or float32, got ", to_string(p.dtype_g));
  KDAKIT_CHECK(p.dtype_beta == DType::kBFloat16 || p.dtype_beta == DType::kFloat32, kUnsupported,
               "prefill prep: beta must be bfloat16 or float32, got ", to_string(p.dtype_beta));
  KDAKIT_CHECK(p.num_qk_heads > 0 && p.num_v_heads % p.num_qk_heads == 0, kInvalidArgument,
               "prefill prep: num_v_heads (", p.num_v_heads, ") must be a multiple of num_qk_heads (",
               p.num_qk_heads, ")");
  KDAKIT_CHECK(p.num_v_heads <= 65535, kUnsupported, "prefill prep: supports up to 65535 value heads, got ",
               p.num_v_heads);
  KDAKIT_CHECK(w.max_chunks <= INT32_MAX && w.num_seqs <= INT32_MAX && p.seqlen <= INT32_MAX, kUnsupported,
               "prefill prep: supports up to 2^31 - 1 chunks, sequences and tokens per row");
  KDAKIT_CHECK(p.gate != GateMode::kSoftplus || p.A_log != nullptr, kInvalidArgument,
               "prefill prep: the softplus gate needs A_log");
  KDAKIT_CHECK(rows_aligned(p.q, 8, p.stride_q_b, p.stride_q_t, p.stride_q_h) &&
                   rows_aligned(p.k, 8, p.stride_k_b, p.stride_k_t, p.stride_k_h) &&
                   rows_aligned(p.v, 8, p.stride_v_b, p.stride_v_t, p.stride_v_h),
               kUnsupported,
               "prefill prep: q, k, v need 16-byte aligned rows (pointers 16-byte aligned, strides multiples of 8 "
               "elements)");
  const int64_t g_per_16b = p.dtype_g == DType::kFloat32 ? 4 : 8;
  KDAKIT_CHECK(p.scalar_gate || rows_aligned(p.g, g_per_16b, p.stride_g_b, p.stride_g_t, p.stride_g_h),
               kUnsupported, "prefill prep: g needs 16-byte aligned rows (pointer 16-byte aligned, strides multiples of ",
               g_per_16b, " elements)");
  KDAKIT_CHECK(p.scalar_gate || p.dt_bias == nullptr || aligned16(p.dt_bias), kUnsupported,
               "prefill prep: dt_bias must be 16-byte aligned");

  auto* base = static_cast<unsigned char*>(workspace);
  const bool packed = p.cu_seqlens != nullptr;
  // a fixed batch's chunks per row (1 when packed: the divisor is then unused) and the value
  // heads per q/k head (the contract checks have made both at least 1)
  const int32_t chunks_per_row = packed ? 0 : int32_t((p.seqlen + kChunk - 1) / kChunk);
  const int32_t v_per_qk = p.num_v_heads / std::max(p.num_qk_heads, 1);
  const prep::PrepParams params{
      .q = p.q,
      .k = p.k,
      .v = p.v,
      .g = p.g,
      .beta = p.beta,
      .A_log = p.A_log,
      .dt_bias = p.dt_bias,
      .stride_q_b = p.stride_q_b, .stride_q_t = p.stride_q_t, .stride_q_h = p.stride_q_h,
      .stride_k_b = p.stride_k_b, .stride_k_t = p.stride_k_t, .stride_k_h = p.stride_k_h,
      .stride_v_b = p.stride_v_b, .stride_v_t = p.stride_v_t, .stride_v_h = p.stride_v_h,
      .stride_g_b = p.stride_g_b, .stride_g_t = p.stride_g_t, .stride_g_h = p.stride_g_h,
      .stride_beta_b = p.stride_beta_b, .stride_beta_t = p.stride_beta_t, .stride_beta_h = p.stride_beta_h,
      .chunk_offsets = reinterpret_cast<const int32_t*>(base + w.chunk_offsets_offset),
      .chunk_seq = reinterpret_cast<const int32_t*>(base + w.chunk_seq_offset),
      .seq_start = reinterpret_cast<const int64_t*>(base + w.seq_start_offset),
      .seq_len = reinterpret_cast<const int32_t*>(base + w.seq_len_offset),
      .chunk_blocks = base + w.chunk_blocks_offset,
      .num_seqs = int32_t(w.num_seqs),
      .seqlen = packed ? 0 : int32_t(p.seqlen),
      .chunks_per_row = chunks_per_row,
      .num_v_heads = p.num_v_heads,
      .div_v_heads = kdakit::cuda::make_fast_div(uint32_t(std::max(p.num_v_heads, 1))),
      .div_chunks_per_row = kdakit::cuda::make_fast_div(uint32_t(std::max(chunks_per_row, 1))),
      .div_v_heads_per_qk = kdakit::cuda::make_fast_div(uint32_t(std::max(v_per_qk, 1))),
      .packed = packed,
      .beta_fp32 = p.dtype_beta == DType::kFloat32,
      .scalar_gate = p.scalar_gate,
      .use_qk_l2norm = p.use_qk_l2norm,
      .use_beta_sigmoid = p.use_beta_sigmoid,
      .allow_neg_eigval = p.allow_neg_eigval,
      .scale = p.scale,
      .lower_bound = p.lower_bound,
      .f16_block = w.f16_block,
      .route = route_of(w, workspace),
      .fixed_chunk_offsets = w.plan_by_prep ? reinterpret_cast<int32_t*>(base + w.chunk_offsets_offset) : nullptr,
      .fixed_seq_start = w.plan_by_prep ? reinterpret_cast<int64_t*>(base + w.seq_start_offset) : nullptr,
      .fixed_seq_len = w.plan_by_prep ? reinterpret_cast<int32_t*>(base + w.seq_len_offset) : nullptr,
      .single_cu = w.plan_by_prep && packed ? p.cu_seqlens : nullptr,
      .single_cu_int64 = p.dtype_cu_seqlens == DType::kInt64,
      .row_tokens = int32_t(p.seqlen),
  };
  KDAKIT_CHECK(!w.plan_by_prep || (packed ? w.num_seqs == 1 && w.route_bound < 0 : p.seqlen > 0), kInternal,
               "prefill prep: only a fixed batch with T > 0 or one packed sequence (not routed) has its plan "
               "written by the prep kernel");
  const bool g_fp32 = p.dtype_g == DType::kFloat32;
  switch (p.gate) {
    case GateMode::kPrecomputed:
      return g_fp32 ? prep::launch_prep_kernel<GateMode::kPrecomputed, true>(params, w.max_chunks, stream)
                    : prep::launch_prep_kernel<GateMode::kPrecomputed, false>(params, w.max_chunks, stream);
    case GateMode::kSoftplus:
      return g_fp32 ? prep::launch_prep_kernel<GateMode::kSoftplus, true>(params, w.max_chunks, stream)
                    : prep::launch_prep_kernel<GateMode::kSoftplus, false>(params, w.max_chunks, stream);
    case GateMode::kLowerBound:
      return g_fp32 ? prep::launch_prep_kernel<GateMode::kLowerBound, true>(params, w.max_chunks, stream)
                    : prep::launch_prep_kernel<GateMode::kLowerBound, false>(params, w.max_chunks, stream);
  }
  return Status(StatusCode::kUnsupported, "prefill prep: gate must be kPrecomputed, kSoftplus or kLowerBound, got " +
                                              std::to_string(int(p.gate)));
}

}  // namespace kdakit::sm90::prefill
