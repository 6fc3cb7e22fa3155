// What the fused prefill kernel supports (fused_unsupported): the dispatcher asks before it
// launches, and takes the two-kernel path (plan -> prep -> recurrence) otherwise.
#include <cstdint>
#include <string>

#include "cuda/sm90/prefill/fused/launch.h"

namespace kdakit::sm90::prefill {

namespace {

// A TMA-read activation: 16-byte aligned base, strides (elements) that are multiples of 8.
bool tma_rows(const void* ptr, int64_t sb, int64_t st, int64_t sh, bool packed) {
  return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0 && st % 8 == 0 && sh % 8 == 0 &&
         (packed || sb % 8 == 0);
}

}  // namespace

const char* fused_unsupported(const PrefillParams& p) {
  const bool packed = p.cu_seqlens != nullptr;
  if (p.head_dim_k != kHeadDim || p.head_dim_v != kHeadDim)
    return "head dims other than K = V = 128";
  if (p.dtype_qkv != DType::kBFloat16) return "q/k/v dtypes other than bfloat16";
  if (p.dtype_g != DType::kBFloat16 && p.dtype_g != DType::kFloat32)
    return "g dtypes other than bfloat16/float32";
  if (p.dtype_beta != DType::kBFloat16 && p.dtype_beta != DType::kFloat32)
    return "beta dtypes other than bfloat16/float32";
  if (p.dtype_state != DType::kFloat32 && p.dtype_state != DType::kBFloat16)
    return "state dtypes other than float32/bfloat16";
  if (p.num_qk_heads <= 0 || p.num_v_heads % p.num_qk_heads != 0) return "HV not a multiple of H";
  if (p.gate == GateMode::kSoftplus && p.A_log == nullptr) return "the softplus gate without A_log";
  if (p.chunk_states != nullptr &&
      (p.chunk_state_interval <= 0 || p.chunk_state_interval % kChunk != 0))
    return "a chunk-state interval that is not a multiple of 64";
  if (!tma_rows(p.q, p.stride_q_b, p.stride_q_t, p.stride_q_h, packed) ||
      !tma_rows(p.k, p.stride_k_b, p.stride_k_t, p.stride_k_h, packed) ||
      !tma_rows(p.v, p.stride_v_b, p.stride_v_t, p.stride_v_h, packed))
    return "q/k/v rows that are not 16-byte aligned (TMA)";
  if (p.dtype_g == DType::kBFloat16 && !p.scalar_gate &&
      !tma_rows(p.g, p.stride_g_b, p.stride_g_t, p.stride_g_h, packed))
    return "bfloat16 g rows that are not 16-byte aligned (TMA)";
  if (p.seqlen >= (int64_t(1) << 30) || p.num_seqs >= (int64_t(1) << 30))
    return "T or N of 2^30 or more";
  return nullptr;
}

}  // namespace kdakit::sm90::prefill
