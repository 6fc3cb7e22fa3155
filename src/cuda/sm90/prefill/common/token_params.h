// The per-token fields that the plan-region prefill kernels (fused, tile16) copy from
// PrefillParams into their kernel-side params structs: the plan's sequence map, the gate and
// beta inputs, the output and the preprocessing flags. Host code (the launchers).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill::common {

// kp: a kernel params struct with these fields (fused::KernelParams, tile16::KernelParams);
// workspace holds the plan region laid out per `plan`.
template <class KP>
void fill_token_params(KP& kp, const PrefillParams& p, const WorkspacePlan& plan,
                       const void* workspace) {
  const auto* ws = static_cast<const uint8_t*>(workspace);
  const bool packed = p.cu_seqlens != nullptr;
  kp.seq_start = reinterpret_cast<const int64_t*>(ws + plan.seq_start_offset);
  kp.seq_len = reinterpret_cast<const int32_t*>(ws + plan.seq_len_offset);
  kp.num_seqs = int32_t(p.num_seqs);
  kp.num_v_heads = p.num_v_heads;
  kp.v_heads_per_qk_head = p.num_v_heads / p.num_qk_heads;
  kp.packed = packed;
  kp.g = p.g;
  kp.stride_g_b = p.stride_g_b;
  kp.stride_g_t = p.stride_g_t;
  kp.stride_g_h = p.stride_g_h;
  kp.g_fp32 = p.dtype_g == DType::kFloat32;
  kp.scalar_gate = p.scalar_gate;
  kp.beta = p.beta;
  kp.stride_beta_b = p.stride_beta_b;
  kp.stride_beta_t = p.stride_beta_t;
  kp.stride_beta_h = p.stride_beta_h;
  kp.beta_fp32 = p.dtype_beta == DType::kFloat32;
  kp.A_log = p.A_log;
  kp.dt_bias = p.dt_bias;
  kp.o = static_cast<__nv_bfloat16*>(p.o);
  kp.stride_o_b = p.stride_o_b;
  kp.stride_o_t = p.stride_o_t;
  kp.stride_o_h = p.stride_o_h;
  kp.o_pairs = reinterpret_cast<uintptr_t>(p.o) % 4 == 0 && p.stride_o_t % 2 == 0 &&
               p.stride_o_h % 2 == 0 && (packed || p.stride_o_b % 2 == 0);
  kp.scale = p.scale;
  kp.lower_bound = p.lower_bound;
  kp.use_qk_l2norm = p.use_qk_l2norm;
  kp.use_beta_sigmoid = p.use_beta_sigmoid;
  kp.allow_neg_eigval = p.allow_neg_eigval;
}

}  // namespace kdakit::sm90::prefill::common
