// kdakit._kdakit.decode: DLPack arrays -> kdakit::DecodeParams -> kdakit::decode (CUDA arrays,
// on the given stream) or kdakit::cpu::decode_reference (CPU arrays). The state pool is
// updated in place; the output is preallocated by the caller.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "common.h"
#include "params_common.h"
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
  set_options(p, gate, state_layout, scale, lower_bound, use_qk_l2norm, use_beta_sigmoid,
              allow_neg_eigval, scalar_gate);
  const Backend asked = parse_backend(backend);
  p.null_slot_is_padding = null_slot_is_padding;

  Placement where;
  const ArrayView q = view("q", q_in), k = view("k", k_in), v = view("v", v_in);
  const ArrayView g = view("g", g_in), beta = view("beta", beta_in), o = view("o", o_in);
  const ArrayView state = view("state", state_in);
  const ArrayView indices = view("state_indices", state_indices_in);
  for (const ArrayView* a : {&q, &k, &v, &g, &beta, &o, &state, &indices}) {
    expect_same_device(where, *a);
  }

  fill_activations(p, where, q, k, v, g, beta, o, A_log_in, dt_bias_in, cu_seqlens_in);

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
    const ScopedCudaDevice device(where);  // CPU arrays: a no-op
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
