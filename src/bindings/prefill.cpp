// kdakit._kdakit.prefill / prefill_workspace_size: DLPack arrays -> kdakit::PrefillParams ->
// kdakit::prefill (CUDA arrays, on the given stream) or kdakit::cpu::prefill_chunked /
// prefill_reference (CPU arrays). Outputs are preallocated by the caller.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "common.h"
#include "ops.h"

namespace kdakit::bindings {

namespace {

// Checks one state argument ([slots, HV, K, V] or [slots, HV, V, K], each state contiguous)
// and returns its dtype.
DType check_state(const ArrayView& s, int64_t slots, const PrefillParams& p, const char* dims) {
  const bool v_first = p.state_layout == StateLayout::kVFirst;
  const int64_t d2 = v_first ? p.head_dim_v : p.head_dim_k;
  const int64_t d3 = v_first ? p.head_dim_k : p.head_dim_v;
  expect_rank(s, 4, dims);
  if (slots >= 0) {
    expect_shape(s, {slots, p.num_v_heads, d2, d3}, dims);
  } else {
    expect_shape(s, {s.size(0), p.num_v_heads, d2, d3}, dims);
  }
  expect_contiguous_from(s, 1, "each state [HV, ...]");
  return expect_dtype(s, {DType::kFloat32, DType::kBFloat16});
}

template <bool kSizeOnly>
auto prefill_entry(InArray q_in, InArray k_in, InArray v_in, InArray g_in, InArray beta_in,
                   OutArray o_in, OptIn A_log_in, OptIn dt_bias_in, OptIn cu_seqlens_in,
                   OptIn initial_state_in, OptIn initial_state_indices_in,
                   OptOut final_state_in, OptIn final_state_indices_in,
                   OptOut chunk_states_in, int64_t chunk_state_interval, OptOut workspace_in,
                   const std::string& gate, const std::string& state_layout, double scale,
                   double lower_bound, bool use_qk_l2norm, bool use_beta_sigmoid,
                   bool allow_neg_eigval, bool scalar_gate, const std::string& backend,
                   uintptr_t stream) {
  PrefillParams p;
  p.gate = parse_gate(gate);
  p.state_layout = parse_state_layout(state_layout);
  const Backend asked = parse_backend(backend);
  p.scale = static_cast<float>(scale);
  p.lower_bound = static_cast<float>(lower_bound);
  p.use_qk_l2norm = use_qk_l2norm;
  p.use_beta_sigmoid = use_beta_sigmoid;
  p.allow_neg_eigval = allow_neg_eigval;
  p.scalar_gate = scalar_gate;
  p.chunk_state_interval = static_cast<int32_t>(chunk_state_interval);
  if (chunk_state_interval < 0 || chunk_state_interval > INT32_MAX) {
    raise_value_error("chunk_state_interval: expected a positive multiple of 64 or 0, got " +
                      std::to_string(chunk_state_interval));
  }

  Placement where;
  const ArrayView q = view("q", q_in), k = view("k", k_in), v = view("v", v_in);
  const ArrayView g = view("g", g_in), beta = view("beta", beta_in), o = view("o", o_in);
  for (const ArrayView* a : {&q, &k, &v, &g, &beta, &o}) expect_same_device(where, *a);

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

  // --- states
  const char* state_dims =
      p.state_layout == StateLayout::kVFirst ? "[N, HV, V, K]" : "[N, HV, K, V]";
  const char* pool_dims = p.state_layout == StateLayout::kVFirst
                              ? "[num_slots, HV, V, K]"
                              : "[num_slots, HV, K, V]";
  std::optional<DType> state_dtype;
  auto agree_state_dtype = [&](const char* name, DType d) {
    if (state_dtype && *state_dtype != d) {
      raise_type_error(std::string(name) + ": expected dtype " + to_string(*state_dtype) +
                       " (the state dtype of the other state arguments), got " + to_string(d));
    }
    state_dtype = d;
  };
  auto check_indices = [&](const char* name, const InArray& arr) {
    const ArrayView ix = view(name, arr);
    expect_same_device(where, ix);
    expect_shape(ix, {p.num_seqs}, "[N]");
    expect_contiguous_from(ix, 0, name);
    expect_dtype(ix, {DType::kInt32});
    return static_cast<const int32_t*>(ix.data);
  };
  int64_t initial_slots = -1, final_slots = -1;
  if (initial_state_in) {
    const ArrayView s = view("initial_state", *initial_state_in);
    expect_same_device(where, s);
    const bool pooled = initial_state_indices_in.has_value();
    agree_state_dtype("initial_state",
                      check_state(s, pooled ? -1 : p.num_seqs, p, pooled ? pool_dims : state_dims));
    p.initial_state = s.data;
    p.stride_initial_state_n = s.stride(0);
    initial_slots = s.size(0);
    if (pooled) p.initial_state_indices = check_indices("initial_state_indices", *initial_state_indices_in);
  } else if (initial_state_indices_in) {
    raise_value_error("initial_state_indices: given without initial_state");
  }
  if (final_state_in) {
    const ArrayView s = view("final_state", *final_state_in);
    expect_same_device(where, s);
    const bool pooled = final_state_indices_in.has_value();
    agree_state_dtype("final_state",
                      check_state(s, pooled ? -1 : p.num_seqs, p, pooled ? pool_dims : state_dims));
    p.final_state = s.data;
    p.stride_final_state_n = s.stride(0);
    final_slots = s.size(0);
    if (pooled) p.final_state_indices = check_indices("final_state_indices", *final_state_indices_in);
  } else if (final_state_indices_in) {
    raise_value_error("final_state_indices: given without final_state");
  }
  if (p.initial_state_indices && p.final_state_indices && initial_slots != final_slots) {
    raise_value_error("final_state: an indexed pool must have as many slots as initial_state's (" +
                      std::to_string(initial_slots) + "), got " + std::to_string(final_slots));
  }
  p.num_state_slots = p.initial_state_indices ? initial_slots
                      : p.final_state_indices ? final_slots
                                              : p.num_seqs;

  if (chunk_states_in) {
    const ArrayView s = view("chunk_states", *chunk_states_in);
    expect_same_device(where, s);
    const bool v_first = p.state_layout == StateLayout::kVFirst;
    const int64_t d2 = v_first ? p.head_dim_v : p.head_dim_k;
    const int64_t d3 = v_first ? p.head_dim_k : p.head_dim_v;
    const char* dims = v_first ? "[..., HV, V, K]" : "[..., HV, K, V]";
    if (s.ndim < 4) expect_rank(s, 4, dims);
    const size_t lead = s.ndim - 3;
    if (s.size(lead) != p.num_v_heads || s.size(lead + 1) != d2 || s.size(lead + 2) != d3) {
      raise_value_error(std::string("chunk_states: expected shape ") + dims + " with HV = " +
                        std::to_string(p.num_v_heads) + ", got " + shape_string(s));
    }
    expect_contiguous_from(s, 0, "chunk_states");
    agree_state_dtype("chunk_states", expect_dtype(s, {DType::kFloat32, DType::kBFloat16}));
    int64_t entries = 1;
    for (size_t i = 0; i < lead; ++i) entries *= s.size(i);
    p.num_chunk_states = entries;
    p.chunk_states = s.data;
  }
  if (state_dtype) p.dtype_state = *state_dtype;

  if (workspace_in) {
    const ArrayView w = view("workspace", *workspace_in);
    expect_same_device(where, w);
    expect_contiguous_from(w, 0, "workspace");
    p.workspace = w.data;
    int64_t elements = 1;
    for (size_t i = 0; i < w.ndim; ++i) elements *= w.size(i);
    p.workspace_bytes = static_cast<size_t>(elements) * ((w.dtype.bits + 7) / 8);
  }

  const Backend chosen =
      resolve_backend("prefill", asked, where, Backend::kChunked, /*chunked_available=*/true);

  if constexpr (kSizeOnly) {
    (void)stream;
    (void)chosen;
    return prefill_workspace_size(p);
  } else {
    Status status;
    {
      nb::gil_scoped_release release;
      switch (chosen) {
        case Backend::kCuda:
          status = kdakit::prefill(p, reinterpret_cast<cudaStream_t>(stream));
          break;
        case Backend::kReference: status = cpu::prefill_reference(p); break;
        default: status = cpu::prefill_chunked(p); break;
      }
    }
    raise_if_error(status);
  }
}

template <typename Fn>
void def_prefill(nb::module_& m, const char* name, Fn fn, const char* doc) {
  m.def(name, fn, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
        nb::arg("o"), nb::kw_only(), nb::arg("A_log") = nb::none(),
        nb::arg("dt_bias") = nb::none(), nb::arg("cu_seqlens") = nb::none(),
        nb::arg("initial_state") = nb::none(), nb::arg("initial_state_indices") = nb::none(),
        nb::arg("final_state") = nb::none(), nb::arg("final_state_indices") = nb::none(),
        nb::arg("chunk_states") = nb::none(), nb::arg("chunk_state_interval") = 0,
        nb::arg("workspace") = nb::none(), nb::arg("gate") = "precomputed",
        nb::arg("state_layout") = "v_first", nb::arg("scale"), nb::arg("lower_bound") = 0.0,
        nb::arg("use_qk_l2norm") = false, nb::arg("use_beta_sigmoid") = false,
        nb::arg("allow_neg_eigval") = false, nb::arg("scalar_gate") = false,
        nb::arg("backend") = "auto", nb::arg("stream") = 0, doc);
}

}  // namespace

void register_prefill(nb::module_& m) {
  def_prefill(m, "prefill", &prefill_entry<false>,
              "Low-level chunked KDA prefill over preallocated arrays (kdakit.prefill is the "
              "documented wrapper). CUDA arrays run kdakit::prefill on `stream` (a "
              "cudaStream_t as int); CPU arrays run the fp32 chunked backend "
              "(backend='chunked' or 'auto') or the float64 reference (backend='reference').");
  def_prefill(m, "prefill_workspace_size", &prefill_entry<true>,
              "Bytes of device workspace kdakit::prefill needs for these arguments.");
}

}  // namespace kdakit::bindings
