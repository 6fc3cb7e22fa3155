// The argument handling that kdakit._kdakit.prefill and .decode share: the
// option scalars and the activations (q, k, v, g, beta, o), gate parameters
// (A_log, dt_bias) and cu_seqlens, which both params structs carry under the
// same field names.
#pragma once

#include <string>

#include "common.h"

namespace kdakit::bindings {

// Gate mode, state layout and the preprocessing scalars, from the Python
// options.
template <typename Params>
void set_options(Params &p, const std::string &gate, const std::string &state_layout, double scale,
                 double lower_bound, bool use_qk_l2norm, bool use_beta_sigmoid,
                 bool allow_neg_eigval, bool scalar_gate) {
  p.gate = parse_gate(gate);
  p.state_layout = parse_state_layout(state_layout);
  p.scale = static_cast<float>(scale);
  p.lower_bound = static_cast<float>(lower_bound);
  p.use_qk_l2norm = use_qk_l2norm;
  p.use_beta_sigmoid = use_beta_sigmoid;
  p.allow_neg_eigval = allow_neg_eigval;
  p.scalar_gate = scalar_gate;
}

// Checks the activation arrays ([B, T, heads, dim], last dim contiguous),
// A_log, dt_bias and cu_seqlens, and fills sizes, pointers, dtypes and strides;
// p.scalar_gate must be set. N = B without cu_seqlens, len(cu_seqlens) - 1
// with.
// cu_seqlens (when given): device, rank, contiguity, dtype; sets num_seqs to its length - 1.
template <typename Params>
void fill_cu_seqlens(Params &p, Placement &where, const OptIn &cu_seqlens_in) {
  if (!cu_seqlens_in) return;
  const ArrayView c = view("cu_seqlens", *cu_seqlens_in);
  expect_same_device(where, c);
  expect_rank(c, 1, "[N + 1]");
  if (c.size(0) < 1) raise_value_error("cu_seqlens: expected at least one offset, got none");
  expect_contiguous_from(c, 0, "cu_seqlens");
  p.dtype_cu_seqlens = expect_dtype(c, {DType::kInt32, DType::kInt64});
  p.cu_seqlens = c.data;
  p.num_seqs = c.size(0) - 1;
}

template <typename Params>
void fill_activations(Params &p, Placement &where, const ArrayView &q, const ArrayView &k,
                      const ArrayView &v, const ArrayView &g, const ArrayView &beta,
                      const ArrayView &o, const OptIn &A_log_in, const OptIn &dt_bias_in,
                      const OptIn &cu_seqlens_in) {
  expect_rank(q, 4, "[B, T, H, K]");
  p.batch = q.size(0);
  p.seqlen = q.size(1);
  p.num_qk_heads = static_cast<int32_t>(q.size(2));
  p.head_dim_k = static_cast<int32_t>(q.size(3));
  expect_shape(k, {p.batch, p.seqlen, p.num_qk_heads, p.head_dim_k}, "[B, T, H, K] (as q)");
  expect_rank(v, 4, "[B, T, HV, V]");
  expect_shape(v, {p.batch, p.seqlen, v.size(2), v.size(3)}, "[B, T, HV, V] (B, T as q)");
  p.num_v_heads = static_cast<int32_t>(v.size(2));
  p.head_dim_v = static_cast<int32_t>(v.size(3));
  if (p.scalar_gate) {
    expect_shape(g, {p.batch, p.seqlen, p.num_v_heads}, "[B, T, HV] (scalar gate)");
  } else {
    expect_shape(g, {p.batch, p.seqlen, p.num_v_heads, p.head_dim_k}, "[B, T, HV, K]");
  }
  expect_shape(beta, {p.batch, p.seqlen, p.num_v_heads}, "[B, T, HV]");
  expect_shape(o, {p.batch, p.seqlen, p.num_v_heads, p.head_dim_v}, "[B, T, HV, V]");
  for (const ArrayView *a : {&q, &k, &v, &g, &o}) expect_unit_last_stride(*a);

  p.dtype_qkv = expect_dtype(q, {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  for (const ArrayView *a : {&k, &v, &o}) {
    if (dtype_of(*a) != p.dtype_qkv) {
      raise_type_error(std::string(a->name) + ": expected dtype " + to_string(p.dtype_qkv) +
                       " (the dtype of q), got " + to_string(dtype_of(*a)));
    }
  }
  p.dtype_g = expect_dtype(g, {DType::kBFloat16, DType::kFloat32, DType::kFloat16});
  p.dtype_beta = expect_dtype(beta, {DType::kBFloat16, DType::kFloat32, DType::kFloat16});

  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.g = g.data;
  p.beta = beta.data;
  p.o = o.data;
  p.stride_q_b = q.stride(0);
  p.stride_q_t = q.stride(1);
  p.stride_q_h = q.stride(2);
  p.stride_k_b = k.stride(0);
  p.stride_k_t = k.stride(1);
  p.stride_k_h = k.stride(2);
  p.stride_v_b = v.stride(0);
  p.stride_v_t = v.stride(1);
  p.stride_v_h = v.stride(2);
  p.stride_g_b = g.stride(0);
  p.stride_g_t = g.stride(1);
  p.stride_g_h = g.stride(2);
  p.stride_beta_b = beta.stride(0);
  p.stride_beta_t = beta.stride(1);
  p.stride_beta_h = beta.stride(2);
  p.stride_o_b = o.stride(0);
  p.stride_o_t = o.stride(1);
  p.stride_o_h = o.stride(2);

  // --- gate parameters
  if (A_log_in) {
    const ArrayView a = view("A_log", *A_log_in);
    expect_same_device(where, a);
    expect_shape(a, {p.num_v_heads}, "[HV]");
    expect_contiguous_from(a, 0, "A_log");
    expect_dtype(a, {DType::kFloat32});
    p.A_log = static_cast<const float *>(a.data);
  }
  if (dt_bias_in) {
    const ArrayView d = view("dt_bias", *dt_bias_in);
    expect_same_device(where, d);
    if (p.scalar_gate) {
      expect_shape(d, {p.num_v_heads}, "[HV] (scalar gate)");
    } else if (d.ndim == 1) {
      expect_shape(d, {int64_t{p.num_v_heads} * p.head_dim_k}, "[HV * K]");
    } else {
      expect_shape(d, {p.num_v_heads, p.head_dim_k}, "[HV, K]");
    }
    expect_contiguous_from(d, 0, "dt_bias");
    expect_dtype(d, {DType::kFloat32});
    p.dt_bias = static_cast<const float *>(d.data);
  }

  // --- packed batch
  p.num_seqs = p.batch;
  fill_cu_seqlens(p, where, cu_seqlens_in);
}

}  // namespace kdakit::bindings
