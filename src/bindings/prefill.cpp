// kdakit._kdakit.prefill / prefill_workspace_size: DLPack arrays -> kdakit::PrefillParams ->
// kdakit::prefill (CUDA arrays, on the given stream) or kdakit::cpu::prefill_chunked /
// prefill_reference (CPU arrays). Outputs are preallocated by the caller. The plan step:
// prefill_plan (kdakit::prefill_plan into a caller's workspace) and prefill_batch_workspace_size
// (the workspace size from the batch sizes alone).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "common.h"
#include "params_common.h"
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

// The workspace argument (any dtype, dense) as pointer and byte count.
void fill_workspace(PrefillParams& p, Placement& where, const OutArray& workspace) {
  const ArrayView w = view("workspace", workspace);
  expect_same_device(where, w);
  expect_contiguous_from(w, 0, "workspace");
  p.workspace = w.data;
  int64_t elements = 1;
  for (size_t i = 0; i < w.ndim; ++i) elements *= w.size(i);
  p.workspace_bytes = static_cast<size_t>(elements) * ((w.dtype.bits + 7) / 8);
}

// The batch fields of PrefillParams from sizes: N sequences packed into one row of T tokens
// (packed), or B rows of T tokens.
PrefillParams batch_params(int64_t batch, int64_t seqlen, int64_t num_seqs, int64_t num_v_heads) {
  if (num_v_heads < 1 || num_v_heads > INT32_MAX) {
    raise_value_error("num_v_heads: expected a number of value heads HV >= 1, got " +
                      std::to_string(num_v_heads));
  }
  PrefillParams p;
  p.batch = batch;
  p.seqlen = seqlen;
  p.num_seqs = num_seqs;
  p.num_v_heads = static_cast<int32_t>(num_v_heads);
  return p;
}

// kdakit._kdakit.prefill_plan: cu_seqlens (CUDA, or None for a fixed batch) -> the plan region
// of `workspace`, on `stream`.
void prefill_plan_entry(OptIn cu_seqlens_in, OutArray workspace_in, int64_t batch, int64_t seqlen,
                        int64_t num_v_heads, uintptr_t stream) {
  Placement where;
  PrefillParams p = batch_params(batch, seqlen, batch, num_v_heads);
  fill_cu_seqlens(p, where, cu_seqlens_in);
  fill_workspace(p, where, workspace_in);
  if (!where.is_cuda()) {
    raise_value_error("workspace: prefill_plan runs on CUDA arrays; the CPU backend needs no plan");
  }
  Status status;
  {
    const ScopedCudaDevice device(where);
    nb::gil_scoped_release release;
    status = kdakit::prefill_plan(p, reinterpret_cast<cudaStream_t>(stream));
  }
  raise_if_error(status);
}

// kdakit._kdakit.prefill_batch_workspace_size: bytes for N packed sequences of T tokens in
// total (packed), or B rows of T tokens, with HV value heads; 0 for inconsistent sizes (the
// Python layer checks them first) and in a build without CUDA.
size_t batch_workspace_size(int64_t batch, int64_t seqlen, int64_t num_seqs, int64_t num_v_heads,
                            bool packed) {
  PrefillParams p = batch_params(batch, seqlen, num_seqs, num_v_heads);
  // NOTE: the size depends on whether cu_seqlens is given, never on its contents or address:
  // any aligned non-null pointer stands for it.
  alignas(8) static const int64_t kAnyOffsets[1] = {0};
  if (packed) p.cu_seqlens = kAnyOffsets;
  return prefill_workspace_size(p);
}

template <bool kSizeOnly>
auto prefill_entry(InArray q_in, InArray k_in, InArray v_in, InArray g_in, InArray beta_in,
                   OutArray o_in, OptIn A_log_in, OptIn dt_bias_in, OptIn cu_seqlens_in,
                   OptIn initial_state_in, OptIn initial_state_indices_in, OptOut final_state_in,
                   OptIn final_state_indices_in, OptOut chunk_states_in,
                   OptIn chunk_state_indices_in, int64_t chunk_state_interval, int64_t max_seqlen,
                   OptOut workspace_in,
                   bool plan_ready, const std::string& gate, const std::string& state_layout,
                   double scale, double lower_bound, bool use_qk_l2norm, bool use_beta_sigmoid,
                   bool allow_neg_eigval, bool scalar_gate, const std::string& backend,
                   uintptr_t stream) {
  PrefillParams p;
  set_options(p, gate, state_layout, scale, lower_bound, use_qk_l2norm, use_beta_sigmoid,
              allow_neg_eigval, scalar_gate);
  const Backend asked = parse_backend(backend);
  p.chunk_state_interval = static_cast<int32_t>(chunk_state_interval);
  p.max_seqlen = max_seqlen;  // validated with the rest (kdakit::prefill)
  if (chunk_state_interval < 0 || chunk_state_interval > INT32_MAX) {
    raise_value_error("chunk_state_interval: expected a positive multiple of 64 or 0, got " +
                      std::to_string(chunk_state_interval));
  }

  Placement where;
  const ArrayView q = view("q", q_in), k = view("k", k_in), v = view("v", v_in);
  const ArrayView g = view("g", g_in), beta = view("beta", beta_in), o = view("o", o_in);
  for (const ArrayView* a : {&q, &k, &v, &g, &beta, &o}) expect_same_device(where, *a);

  fill_activations(p, where, q, k, v, g, beta, o, A_log_in, dt_bias_in, cu_seqlens_in);

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
    // NOTE: the chunk states keep their own dtype (the kernels may not take every mix; C++
    // says so); a pool given as both chunk_states and a state is checked there too.
    const DType dtype = expect_dtype(s, {DType::kFloat32, DType::kBFloat16});
    p.dtype_chunk_states = dtype;
    p.chunk_states = s.data;
    if (chunk_state_indices_in) {
      // A pool of rows [slots, HV, ...], each state dense, rows any stride apart.
      expect_rank(s, 4, pool_dims);
      expect_shape(s, {s.size(0), p.num_v_heads, d2, d3}, pool_dims);
      expect_contiguous_from(s, 1, "each state [HV, ...]");
      p.num_chunk_state_slots = s.size(0);
      p.stride_chunk_states_n = s.stride(0);
      const ArrayView ix = view("chunk_state_indices", *chunk_state_indices_in);
      expect_same_device(where, ix);
      expect_rank(ix, 1, "[num entries]");
      expect_contiguous_from(ix, 0, "chunk_state_indices");
      expect_dtype(ix, {DType::kInt32});
      p.chunk_state_indices = static_cast<const int32_t*>(ix.data);
      p.num_chunk_states = ix.size(0);
    } else {
      const char* dims = v_first ? "[..., HV, V, K]" : "[..., HV, K, V]";
      if (s.ndim < 4) expect_rank(s, 4, dims);
      const size_t lead = s.ndim - 3;
      if (s.size(lead) != p.num_v_heads || s.size(lead + 1) != d2 || s.size(lead + 2) != d3) {
        raise_value_error(std::string("chunk_states: expected shape ") + dims + " with HV = " +
                          std::to_string(p.num_v_heads) + ", got " + shape_string(s));
      }
      expect_contiguous_from(s, 0, "chunk_states");
      int64_t entries = 1;
      for (size_t i = 0; i < lead; ++i) entries *= s.size(i);
      p.num_chunk_states = entries;
      p.stride_chunk_states_n = int64_t{p.num_v_heads} * p.head_dim_k * p.head_dim_v;
    }
  } else if (chunk_state_indices_in) {
    raise_value_error("chunk_state_indices: given without chunk_states (the rows they index)");
  }
  // NOTE: without initial or final state the chunk states fix the state dtype, so that a
  // bf16 chunk-state buffer alone is not a dtype mix.
  if (state_dtype) {
    p.dtype_state = *state_dtype;
  } else if (p.dtype_chunk_states) {
    p.dtype_state = *p.dtype_chunk_states;
  }

  if (workspace_in) fill_workspace(p, where, *workspace_in);
  p.plan_ready = plan_ready;

  const Backend chosen =
      resolve_backend("prefill", asked, where, Backend::kChunked, /*chunked_available=*/true);

  // NOTE: the size depends on the device's SM count (the segment choice), so it is asked on the
  // arrays' device too.
  const ScopedCudaDevice device(where);  // CPU arrays: a no-op
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
        nb::arg("o"), nb::kw_only(), nb::arg("A_log") = nb::none(), nb::arg("dt_bias") = nb::none(),
        nb::arg("cu_seqlens") = nb::none(), nb::arg("initial_state") = nb::none(),
        nb::arg("initial_state_indices") = nb::none(), nb::arg("final_state") = nb::none(),
        nb::arg("final_state_indices") = nb::none(), nb::arg("chunk_states") = nb::none(),
        nb::arg("chunk_state_indices") = nb::none(), nb::arg("chunk_state_interval") = 0,
        nb::arg("max_seqlen") = 0,
        nb::arg("workspace") = nb::none(), nb::arg("plan_ready") = false,
        nb::arg("gate") = "precomputed", nb::arg("state_layout") = "v_first", nb::arg("scale"),
        nb::arg("lower_bound") = 0.0,
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
  m.def("prefill_plan", &prefill_plan_entry, nb::arg("cu_seqlens").none(), nb::arg("workspace"),
        nb::kw_only(), nb::arg("batch") = 1, nb::arg("seqlen"), nb::arg("num_v_heads"),
        nb::arg("stream") = 0,
        "kdakit::prefill_plan: writes the plan of this batch (cu_seqlens [N + 1] on CUDA, or "
        "None for a fixed batch of `batch` rows) into the plan region of `workspace`, on "
        "`stream` (a cudaStream_t as int).");
  m.def("prefill_batch_workspace_size", &batch_workspace_size, nb::kw_only(), nb::arg("batch"),
        nb::arg("seqlen"), nb::arg("num_seqs"), nb::arg("num_v_heads"), nb::arg("packed"),
        "Bytes of prefill workspace (plan region included) for a batch of these sizes; 0 in a "
        "build without CUDA.");
}

}  // namespace kdakit::bindings
