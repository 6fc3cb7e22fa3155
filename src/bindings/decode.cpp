// kdakit._kdakit.decode: DLPack arrays -> kdakit::DecodeParams -> kdakit::decode (CUDA arrays,
// on the given stream) or kdakit::cpu::decode_reference (CPU arrays). The state pool is
// updated in place; the output is preallocated by the caller.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "common.h"
#include "ops.h"

namespace kdakit::bindings {

namespace {

void decode_entry(InArray q_in, InArray k_in, InArray v_in, InArray g_in, InArray beta_in,
                  OutArray o_in, OutArray state_in, InArray state_indices_in, OptIn A_log_in,
                  OptIn dt_bias_in, OptIn cu_seqlens_in, OptIn num_accepted_tokens_in,
                  const std::string& gate, const std::string& state_layout, double scale,
                  double lower_bound, bool use_qk_l2norm, bool use_beta_sigmoid,
                  bool allow_neg_eigval, bool scalar_gate, bool null_slot_is_padding,
                  const std::string& backend, uintptr_t stream) {
  DecodeParams p;
  p.gate = parse_gate(gate);
  p.state_layout = parse_state_layout(state_layout);
  const Backend asked = parse_backend(backend);
  p.scale = static_cast<float>(scale);
  p.lower_bound = static_cast<float>(lower_bound);
  p.use_qk_l2norm = use_qk_l2norm;
  p.use_beta_sigmoid = use_beta_sigmoid;
  p.allow_neg_eigval = allow_neg_eigval;
  p.scalar_gate = scalar_gate;
  p.null_slot_is_padding = null_slot_is_padding;

  Placement where;
  const ArrayView q = view("q", q_in), k = view("k", k_in), v = view("v", v_in);
  const ArrayView g = view("g", g_in), beta = view("beta", beta_in), o = view("o", o_in);
  const ArrayView state = view("state", state_in);
  const ArrayView indices = view("state_indices", state_indices_in);
  for (const ArrayView* a : {&q, &k, &v, &g, &beta, &o, &state, &indices}) {
    expect_same_device(where, *a);
  }

  // --- activations: [B, T, heads, dim], last dim contiguous
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
  if (scalar_gate) {
    expect_shape(g, {p.batch, p.seqlen, p.num_v_heads}, "[B, T, HV] (scalar gate)");
  } else {
    expect_shape(g, {p.batch, p.seqlen, p.num_v_heads, p.head_dim_k}, "[B, T, HV, K]");
  }
  expect_shape(beta, {p.batch, p.seqlen, p.num_v_heads}, "[B, T, HV]");
  expect_shape(o, {p.batch, p.seqlen, p.num_v_heads, p.head_dim_v}, "[B, T, HV, V]");
  for (const ArrayView* a : {&q, &k, &v, &g, &o}) expect_unit_last_stride(*a);

  p.dtype_qkv = expect_dtype(q, {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  for (const ArrayView* a : {&k, &v, &o}) {
    if (dtype_of(*a) != p.dtype_qkv) {
      raise_type_error(std::string(a->name) + ": expected dtype " + to_string(p.dtype_qkv) +
                       " (the dtype of q), got " + to_string(dtype_of(*a)));
    }
  }
  p.dtype_g = expect_dtype(g, {DType::kBFloat16, DType::kFloat32, DType::kFloat16});
  p.dtype_beta = expect_dtype(beta, {DType::kBFloat16, DType::kFloat32, DType::kFloat16});

  p.q = q.data; p.k = k.data; p.v = v.data; p.g = g.data; p.beta = beta.data; p.o = o.data;
  p.stride_q_b = q.stride(0); p.stride_q_t = q.stride(1); p.stride_q_h = q.stride(2);
  p.stride_k_b = k.stride(0); p.stride_k_t = k.stride(1); p.stride_k_h = k.stride(2);
  p.stride_v_b = v.stride(0); p.stride_v_t = v.stride(1); p.stride_v_h = v.stride(2);
  p.stride_g_b = g.stride(0); p.stride_g_t = g.stride(1); p.stride_g_h = g.stride(2);
  p.stride_beta_b = beta.stride(0); p.stride_beta_t = beta.stride(1);
  p.stride_beta_h = beta.stride(2);
  p.stride_o_b = o.stride(0); p.stride_o_t = o.stride(1); p.stride_o_h = o.stride(2);

  // --- gate parameters
  if (A_log_in) {
    const ArrayView a = view("A_log", *A_log_in);
    expect_same_device(where, a);
    expect_shape(a, {p.num_v_heads}, "[HV]");
    expect_contiguous_from(a, 0, "A_log");
    expect_dtype(a, {DType::kFloat32});
    p.A_log = static_cast<const float*>(a.data);
  }
  if (dt_bias_in) {
    const ArrayView d = view("dt_bias", *dt_bias_in);
    expect_same_device(where, d);
    if (scalar_gate) {
      expect_shape(d, {p.num_v_heads}, "[HV] (scalar gate)");
    } else if (d.ndim == 1) {
      expect_shape(d, {int64_t{p.num_v_heads} * p.head_dim_k}, "[HV * K]");
    } else {
      expect_shape(d, {p.num_v_heads, p.head_dim_k}, "[HV, K]");
    }
    expect_contiguous_from(d, 0, "dt_bias");
    expect_dtype(d, {DType::kFloat32});
    p.dt_bias = static_cast<const float*>(d.data);
  }

  // --- packed batch
  p.num_seqs = p.batch;
  if (cu_seqlens_in) {
    const ArrayView c = view("cu_seqlens", *cu_seqlens_in);
    expect_same_device(where, c);
    expect_rank(c, 1, "[N + 1]");
    if (c.size(0) < 1) raise_value_error("cu_seqlens: expected at least one offset, got none");
    expect_contiguous_from(c, 0, "cu_seqlens");
    p.dtype_cu_seqlens = expect_dtype(c, {DType::kInt32, DType::kInt64});
    p.cu_seqlens = c.data;
    p.num_seqs = c.size(0) - 1;
  }

  // --- state pool and slot indices
  const bool v_first = p.state_layout == StateLayout::kVFirst;
  const char* pool_dims = v_first ? "[num_slots, HV, V, K]" : "[num_slots, HV, K, V]";
  expect_rank(state, 4, pool_dims);
  expect_shape(state,
               {state.size(0), p.num_v_heads, v_first ? p.head_dim_v : p.head_dim_k,
                v_first ? p.head_dim_k : p.head_dim_v},
               pool_dims);
  expect_contiguous_from(state, 1, "each state [HV, ...]");
  p.dtype_state = expect_dtype(state, {DType::kFloat32, DType::kBFloat16});
  p.state = state.data;
  p.num_state_slots = state.size(0);
  p.stride_state_slot = state.stride(0);

  expect_dtype(indices, {DType::kInt32});
  if (indices.ndim == 1) {
    expect_shape(indices, {p.num_seqs}, "[N]");
    p.num_index_cols = 1;
    p.stride_state_indices_n = p.num_seqs > 1 ? indices.stride(0) : 1;
  } else if (indices.ndim == 2) {
    expect_shape(indices, {p.num_seqs, indices.size(1)}, "[N, 1 + S]");
    expect_unit_last_stride(indices);
    p.num_index_cols = static_cast<int32_t>(indices.size(1));
    p.stride_state_indices_n = p.num_seqs > 1 ? indices.stride(0) : p.num_index_cols;
  } else {
    raise_value_error("state_indices: expected shape [N] or [N, 1 + S], got " +
                      shape_string(indices));
  }
  p.state_indices = static_cast<const int32_t*>(indices.data);

  if (num_accepted_tokens_in) {
    const ArrayView a = view("num_accepted_tokens", *num_accepted_tokens_in);
    expect_same_device(where, a);
    expect_shape(a, {p.num_seqs}, "[N]");
    expect_contiguous_from(a, 0, "num_accepted_tokens");
    expect_dtype(a, {DType::kInt32});
    p.num_accepted_tokens = static_cast<const int32_t*>(a.data);
  }

  const Backend chosen =
      resolve_backend("decode", asked, where, Backend::kReference, /*chunked_available=*/false);
  Status status;
  {
    nb::gil_scoped_release release;
    if (chosen == Backend::kCuda) {
      status = kdakit::decode(p, reinterpret_cast<cudaStream_t>(stream));
    } else {
      status = cpu::decode_reference(p);
    }
  }
  raise_if_error(status);
}

}  // namespace

void register_decode(nb::module_& m) {
  m.def("decode", &decode_entry, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
        nb::arg("beta"), nb::arg("o"), nb::arg("state"), nb::arg("state_indices"),
        nb::kw_only(), nb::arg("A_log") = nb::none(), nb::arg("dt_bias") = nb::none(),
        nb::arg("cu_seqlens") = nb::none(), nb::arg("num_accepted_tokens") = nb::none(),
        nb::arg("gate") = "precomputed", nb::arg("state_layout") = "v_first",
        nb::arg("scale"), nb::arg("lower_bound") = 0.0, nb::arg("use_qk_l2norm") = false,
        nb::arg("use_beta_sigmoid") = false, nb::arg("allow_neg_eigval") = false,
        nb::arg("scalar_gate") = false, nb::arg("null_slot_is_padding") = false,
        nb::arg("backend") = "auto", nb::arg("stream") = 0,
        "Low-level token-serial KDA decode over a state pool updated in place "
        "(kdakit.decode is the documented wrapper). CUDA arrays run kdakit::decode on "
        "`stream` (a cudaStream_t as int); CPU arrays run the float64 reference.");
}

}  // namespace kdakit::bindings
