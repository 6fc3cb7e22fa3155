// Test cases for prefill and decode: a case struct (a name and every knob of the contract),
// the host tensors a case needs filled with fresh random inputs, and the builders that turn a
// case plus memory pointers into PrefillParams / DecodeParams.
//
// Where the memory lives is kept apart from the params: build the host tensors once
// (make_prefill_tensors), then either use them directly (host_pointers) or map each tensor to
// a device copy (map_pointers with a callback that allocates and copies) and fill the params
// from those pointers. The strides come from the host tensors in both cases.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "cpu/layout.h"
#include "kdakit/kdakit.h"

namespace kdakit::testing {

enum class StateSource { kNone, kDense, kPool };

// ------------------------------------------------------------------------------------------
// Prefill case
// ------------------------------------------------------------------------------------------
struct PrefillCase {
  std::string name;  // letters, digits and '_' (a gtest parameter name)
  // Sequences: packed (cu_seqlens, B = 1) when seq_lens is non-empty, else fixed [batch, seqlen].
  int64_t batch = 1;
  int64_t seqlen = 0;
  std::vector<int64_t> seq_lens;  // packed lengths; 0 is an empty sequence
  int64_t tail = 0;               // packed: tokens after cu[N] (outside the contract, untouched)
  int32_t H = 2, HV = 2, K = 32, V = 32;
  GateMode gate = GateMode::kLowerBound;
  float lower_bound = -5.f;
  bool has_A_log = true;    // optional for the lower-bound gate, required by softplus
  bool has_dt_bias = true;  // null dt_bias means zeros
  bool scalar_gate = false;
  // precomputed gate only: decay rates exp(U(-10, -6)) per token instead of exp(U(-6, 0)), so
  // the state outlives thousands of tokens (segment chains then carry O(1) of it)
  bool slow_gate = false;
  DType dtype_qkv = DType::kBFloat16;
  DType dtype_g = DType::kFloat32;
  DType dtype_beta = DType::kFloat32;
  DType dtype_state = DType::kFloat32;
  DType dtype_cu = DType::kInt32;
  StateLayout layout = StateLayout::kVFirst;
  bool l2norm = true;
  bool beta_sigmoid = true;
  bool neg_eigval = false;
  int64_t pad = 0;  // > 0: q, k, v, g, beta, o are padded views; state slots lie pad apart
  StateSource initial = StateSource::kDense;
  StateSource final_state = StateSource::kDense;
  int64_t extra_slots = 0;        // pool slots beyond N
  bool negative_indices = false;  // pool: about a third of the indices are -1
  bool in_place = false;          // final state buffer (and indices) = initial ones
  bool write_elsewhere = false;   // pool in place: final slots no sequence reads (prefix caching:
                                  // read cached slot a, write new slot b of the same pool)
  int32_t chunk_state_interval = 0;
  bool chunk_pool = false;           // chunk states into pool rows through chunk_state_indices
                                     // (some -1), rows pad apart; other rows must stay untouched
  bool chunk_in_state_pool = false;  // chunk_pool rows are slots of the in-place state pool
                                     // (initial kPool, in_place) no sequence reads or writes
  std::optional<DType> dtype_chunk_states;  // unset: dtype_state
  float scale = 0.f;                        // 0: K^-0.5

  bool packed() const { return !seq_lens.empty(); }
  int64_t num_seqs() const { return packed() ? int64_t(seq_lens.size()) : batch; }
  int64_t rows() const { return packed() ? 1 : batch; }
  int64_t tokens_per_row() const {
    return packed() ? std::accumulate(seq_lens.begin(), seq_lens.end(), int64_t(0)) + tail : seqlen;
  }
  float effective_scale() const { return scale != 0.f ? scale : float(1.0 / std::sqrt(double(K))); }
};

// Host tensors of a prefill call. Undefined (empty-shape) tensors are absent (null pointer).
struct PrefillTensors {
  int64_t num_seqs = 0;
  int64_t num_slots = 0;  // state slots (N when dense)
  HostTensor q, k, v, g, beta, A_log, dt_bias, cu_seqlens;
  HostTensor o;
  HostTensor initial_state, initial_state_indices;
  HostTensor final_state, final_state_indices;  // final_state undefined when in_place (shares
                                                // initial_state); indices too unless
                                                // write_elsewhere
  HostTensor chunk_states;                      // undefined when chunk_in_state_pool
  HostTensor chunk_state_indices;               // chunk_pool only
  int64_t num_chunk_entries = 0;                // entries the sequences have (all of them)
};

// Memory pointers of a prefill call, one per tensor of PrefillTensors.
struct PrefillPointers {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr, *beta = nullptr;
  const void *A_log = nullptr, *dt_bias = nullptr, *cu_seqlens = nullptr;
  void* o = nullptr;
  void *initial_state = nullptr, *initial_state_indices = nullptr;
  void *final_state = nullptr, *final_state_indices = nullptr;
  void *chunk_states = nullptr, *chunk_state_indices = nullptr;
};

// ------------------------------------------------------------------------------------------
// Decode case
// ------------------------------------------------------------------------------------------
struct DecodeCase {
  std::string name;
  // Tokens: packed (cu_seqlens, B = 1) when seq_lens is non-empty, else dense [batch, seqlen].
  int64_t batch = 4;
  int64_t seqlen = 1;
  std::vector<int64_t> seq_lens;
  int64_t tail = 0;
  int32_t H = 2, HV = 2, K = 32, V = 32;
  GateMode gate = GateMode::kLowerBound;
  float lower_bound = -5.f;
  bool has_A_log = true;
  bool has_dt_bias = true;
  bool scalar_gate = false;
  bool slow_gate = false;  // as PrefillCase::slow_gate
  DType dtype_qkv = DType::kBFloat16;
  DType dtype_g = DType::kFloat32;
  DType dtype_beta = DType::kFloat32;
  DType dtype_state = DType::kFloat32;
  DType dtype_cu = DType::kInt32;
  StateLayout layout = StateLayout::kVFirst;
  bool l2norm = true;
  bool beta_sigmoid = true;
  bool neg_eigval = false;
  int64_t pad = 0;
  int32_t num_index_cols = 1;  // 1 + S for speculative decoding
  bool accepted = false;       // pass num_accepted_tokens (random in [1, num_index_cols])
  int64_t padding_rows = 0;    // rows whose start slot is padding (-1, out of range, or null 0)
  bool null_slot_is_padding = false;
  bool negative_write_slots = false;  // spec: some non-start write slots are -1 (skipped)
  int64_t extra_slots = 3;            // pool slots nobody indexes (must stay bit-identical)
  float scale = 0.f;

  bool packed() const { return !seq_lens.empty(); }
  int64_t num_seqs() const { return packed() ? int64_t(seq_lens.size()) : batch; }
  int64_t rows() const { return packed() ? 1 : batch; }
  int64_t tokens_per_row() const {
    return packed() ? std::accumulate(seq_lens.begin(), seq_lens.end(), int64_t(0)) + tail : seqlen;
  }
  float effective_scale() const { return scale != 0.f ? scale : float(1.0 / std::sqrt(double(K))); }
};

struct DecodeTensors {
  int64_t num_seqs = 0;
  int64_t num_slots = 0;
  HostTensor q, k, v, g, beta, A_log, dt_bias, cu_seqlens, state_indices, num_accepted_tokens;
  HostTensor o;
  HostTensor state;
};

struct DecodePointers {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr, *beta = nullptr;
  const void *A_log = nullptr, *dt_bias = nullptr, *cu_seqlens = nullptr;
  const void *state_indices = nullptr, *num_accepted_tokens = nullptr;
  void* o = nullptr;
  void* state = nullptr;
};

// gtest prints a parameterised case by its name.
inline void PrintTo(const PrefillCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

// ------------------------------------------------------------------------------------------
// Random inputs (shared by prefill and decode cases)
// ------------------------------------------------------------------------------------------
namespace detail {

// State tensor [slots, HV, a, b] (a, b = V, K for V-first, K, V for K-first), dense inside a
// slot, slots `pad` elements apart.
inline HostTensor make_state_tensor(DType dtype, int64_t slots, int32_t HV, int32_t K, int32_t V,
                                    StateLayout layout, int64_t pad) {
  const int64_t a = layout == StateLayout::kVFirst ? V : K;
  const int64_t b = layout == StateLayout::kVFirst ? K : V;
  return HostTensor::with_strides(dtype, {slots, HV, a, b}, {HV * a * b + pad, a * b, b, 1});
}

// q, k: uniform in [-1, 1). Without the in-kernel L2 norm every (token, head) vector is
// normalised here, so the delta rule stays contractive (||k|| = 1, beta in (0, 2)).
inline void fill_qk(HostTensor& x, bool l2norm_in_kernel, Rng& rng) {
  const int64_t dim = x.shape.back();
  std::vector<double> row(static_cast<size_t>(dim));
  for (int64_t base = 0; base < x.numel(); base += dim) {
    double norm2 = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      row[size_t(i)] = rng.uniform(-1.0, 1.0);
      norm2 += row[size_t(i)] * row[size_t(i)];
    }
    const double inv = l2norm_in_kernel ? 1.0 : 1.0 / std::sqrt(norm2);
    for (int64_t i = 0; i < dim; ++i) x.set(base + i, row[size_t(i)] * inv);
  }
}

// Fills the activations and per-head parameters shared by prefill and decode cases.
template <class Case, class Tensors>
void make_activations(const Case& c, Tensors& t, Rng& rng) {
  const int64_t B = c.rows(), T = c.tokens_per_row();
  t.q = HostTensor::padded(c.dtype_qkv, {B, T, c.H, c.K}, c.pad);
  t.k = HostTensor::padded(c.dtype_qkv, {B, T, c.H, c.K}, c.pad);
  t.v = HostTensor::padded(c.dtype_qkv, {B, T, c.HV, c.V}, c.pad);
  t.o = HostTensor::padded(c.dtype_qkv, {B, T, c.HV, c.V}, c.pad);
  t.g = c.scalar_gate ? HostTensor::padded(c.dtype_g, {B, T, c.HV}, c.pad)
                      : HostTensor::padded(c.dtype_g, {B, T, c.HV, c.K}, c.pad);
  t.beta = HostTensor::padded(c.dtype_beta, {B, T, c.HV}, c.pad);
  fill_qk(t.q, c.l2norm, rng);
  fill_qk(t.k, c.l2norm, rng);
  t.v.fill_uniform(rng, -1.0, 1.0);
  if (c.gate == GateMode::kPrecomputed) {
    // gamma in [-1, -0.0025]: log-uniform decay rates (slow_gate: [-0.0025, -4.5e-5]).
    const double lo = c.slow_gate ? -10.0 : -6.0, hi = c.slow_gate ? -6.0 : 0.0;
    for (int64_t e = 0; e < t.g.numel(); ++e) t.g.set(e, -std::exp(rng.uniform(lo, hi)));
  } else {
    t.g.fill_uniform(rng, -4.0, 4.0);  // raw gate pre-activation
  }
  if (c.beta_sigmoid) {
    t.beta.fill_uniform(rng, -4.0, 4.0);  // logits
  } else {
    t.beta.fill_uniform(rng, 0.02, 1.0);
  }
  if (c.gate != GateMode::kPrecomputed && c.has_A_log) {
    t.A_log = HostTensor::contiguous(DType::kFloat32, {c.HV});
    t.A_log.fill_uniform(rng, -1.5, 0.5);
  }
  if (c.gate != GateMode::kPrecomputed && c.has_dt_bias) {
    t.dt_bias = c.scalar_gate ? HostTensor::contiguous(DType::kFloat32, {c.HV})
                              : HostTensor::contiguous(DType::kFloat32, {c.HV, c.K});
    t.dt_bias.fill_uniform(rng, -1.0, 1.0);
  }
  t.o.poison();
}

// cu_seqlens [N + 1] for packed cases.
template <class Case>
HostTensor make_cu_seqlens(const Case& c) {
  HostTensor cu = HostTensor::contiguous(c.dtype_cu, {int64_t(c.seq_lens.size()) + 1});
  int64_t offset = 0;
  cu.set(0, 0.0);
  for (size_t n = 0; n < c.seq_lens.size(); ++n) {
    offset += c.seq_lens[n];
    cu.set(int64_t(n) + 1, double(offset));
  }
  return cu;
}

// Distinct random slots for `count` indices out of [first, num_slots), some replaced by -1.
inline std::vector<int32_t> random_slots(int64_t count, int64_t first, int64_t num_slots,
                                         bool some_negative, Rng& rng) {
  std::vector<int32_t> slots(static_cast<size_t>(num_slots - first));
  std::iota(slots.begin(), slots.end(), int32_t(first));
  std::shuffle(slots.begin(), slots.end(), rng.engine);
  slots.resize(size_t(count));
  if (some_negative) {
    for (auto& s : slots) {
      if (rng.coin(1.0 / 3.0)) s = -1;
    }
  }
  return slots;
}

inline HostTensor int32_tensor(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
  HostTensor t = HostTensor::contiguous(DType::kInt32, std::move(shape));
  std::copy(values.begin(), values.end(), static_cast<int32_t*>(t.data()));
  return t;
}

}  // namespace detail

inline PrefillTensors make_prefill_tensors(const PrefillCase& c, Rng& rng) {
  PrefillTensors t;
  t.num_seqs = c.num_seqs();
  for (int64_t n = 0; n < t.num_seqs; ++n) {
    const int64_t length = c.packed() ? c.seq_lens[size_t(n)] : c.seqlen;
    t.num_chunk_entries += cpu::num_chunk_states(length, c.chunk_state_interval);
  }
  const bool pool = c.initial == StateSource::kPool || c.final_state == StateSource::kPool;
  const bool in_state_pool =
      c.chunk_pool && c.chunk_in_state_pool && c.initial == StateSource::kPool && c.in_place;
  // Slots [0, N + extra_slots) are drawn for the reads (and the writes of an ordinary pool);
  // write_elsewhere writes and chunk rows in the state pool get slots of their own after them.
  const int64_t read_slots = t.num_seqs + c.extra_slots;
  t.num_slots = !pool ? t.num_seqs
                      : read_slots + (c.write_elsewhere ? t.num_seqs : 0) +
                            (in_state_pool ? t.num_chunk_entries : 0);
  detail::make_activations(c, t, rng);
  if (c.packed()) t.cu_seqlens = detail::make_cu_seqlens(c);

  if (c.initial != StateSource::kNone) {
    t.initial_state =
        detail::make_state_tensor(c.dtype_state, t.num_slots, c.HV, c.K, c.V, c.layout, c.pad);
    t.initial_state.fill_storage(0.0);
    t.initial_state.fill_uniform(rng, -1.0, 1.0);
  }
  if (c.initial == StateSource::kPool) {
    t.initial_state_indices = detail::int32_tensor(
        detail::random_slots(t.num_seqs, 0, read_slots, c.negative_indices, rng), {t.num_seqs});
  }
  if (c.in_place && c.write_elsewhere) {
    t.final_state_indices =
        detail::int32_tensor(detail::random_slots(t.num_seqs, read_slots, read_slots + t.num_seqs,
                                                  c.negative_indices, rng),
                             {t.num_seqs});
  } else if (!c.in_place && c.final_state != StateSource::kNone) {
    t.final_state =
        detail::make_state_tensor(c.dtype_state, t.num_slots, c.HV, c.K, c.V, c.layout, c.pad);
    if (c.final_state == StateSource::kPool) {
      // Slots nobody writes must keep these values bit for bit.
      t.final_state.fill_storage(0.0);
      t.final_state.fill_uniform(rng, -1.0, 1.0);
      t.final_state_indices = detail::int32_tensor(
          detail::random_slots(t.num_seqs, 0, t.num_slots, c.negative_indices, rng), {t.num_seqs});
    } else {
      t.final_state.poison();
    }
  }
  if (c.chunk_state_interval > 0) {
    const int64_t count = t.num_chunk_entries;
    const DType dtype = c.dtype_chunk_states.value_or(c.dtype_state);
    if (!c.chunk_pool) {
      t.chunk_states = detail::make_state_tensor(dtype, count, c.HV, c.K, c.V, c.layout, 0);
      t.chunk_states.poison();
    } else {
      // Each entry gets a distinct row (about a third are skipped with -1); the rows nobody
      // writes keep their random values.
      const int64_t first_row = in_state_pool ? t.num_slots - count : 0;
      const int64_t rows = in_state_pool ? t.num_slots : count + 3;
      t.chunk_state_indices =
          detail::int32_tensor(detail::random_slots(count, first_row, rows, true, rng), {count});
      if (!in_state_pool) {
        t.chunk_states = detail::make_state_tensor(dtype, rows, c.HV, c.K, c.V, c.layout, c.pad);
        t.chunk_states.fill_storage(0.0);
        t.chunk_states.fill_uniform(rng, -1.0, 1.0);
      }
    }
  }
  return t;
}

// Applies `map(HostTensor&) -> void*` to every defined tensor (e.g. allocate a device buffer
// of t.nbytes() and copy t.bytes into it); absent tensors map to nullptr.
template <class Map>
PrefillPointers map_pointers(PrefillTensors& t, Map&& map) {
  auto m = [&](HostTensor& x) -> void* { return x.defined() ? map(x) : nullptr; };
  PrefillPointers p;
  p.q = m(t.q);
  p.k = m(t.k);
  p.v = m(t.v);
  p.g = m(t.g);
  p.beta = m(t.beta);
  p.A_log = m(t.A_log);
  p.dt_bias = m(t.dt_bias);
  p.cu_seqlens = m(t.cu_seqlens);
  p.o = m(t.o);
  p.initial_state = m(t.initial_state);
  p.initial_state_indices = m(t.initial_state_indices);
  p.final_state = m(t.final_state);
  p.final_state_indices = m(t.final_state_indices);
  p.chunk_states = m(t.chunk_states);
  p.chunk_state_indices = m(t.chunk_state_indices);
  return p;
}

inline PrefillPointers host_pointers(PrefillTensors& t) {
  return map_pointers(t, [](HostTensor& x) { return x.data(); });
}

// PrefillParams of case `c` over tensors `t` (for sizes and strides) at pointers `ptr`.
inline PrefillParams fill_prefill_params(const PrefillCase& c, const PrefillTensors& t,
                                         const PrefillPointers& ptr) {
  const bool in_place = c.in_place && c.initial != StateSource::kNone;
  const HostTensor& final_tensor = in_place ? t.initial_state : t.final_state;
  const bool chunk_indexed = t.chunk_state_indices.defined();
  // The chunk-state rows: their own tensor, or the in-place state pool.
  const bool in_state_pool = chunk_indexed && !t.chunk_states.defined();
  const HostTensor& chunk_tensor = in_state_pool ? t.initial_state : t.chunk_states;
  return PrefillParams{
      .batch = c.rows(),
      .seqlen = c.tokens_per_row(),
      .num_seqs = t.num_seqs,
      .num_state_slots = t.num_slots,
      .num_chunk_states = chunk_indexed              ? t.chunk_state_indices.shape[0]
                          : t.chunk_states.defined() ? t.chunk_states.shape[0]
                                                     : 0,
      .num_chunk_state_slots = chunk_indexed ? chunk_tensor.shape[0] : 0,
      .num_qk_heads = c.H,
      .num_v_heads = c.HV,
      .head_dim_k = c.K,
      .head_dim_v = c.V,
      .q = ptr.q,
      .k = ptr.k,
      .v = ptr.v,
      .g = ptr.g,
      .beta = ptr.beta,
      .A_log = static_cast<const float*>(ptr.A_log),
      .dt_bias = static_cast<const float*>(ptr.dt_bias),
      .cu_seqlens = ptr.cu_seqlens,
      .o = ptr.o,
      .initial_state = ptr.initial_state,
      .initial_state_indices = static_cast<const int32_t*>(ptr.initial_state_indices),
      .final_state = in_place ? ptr.initial_state : ptr.final_state,
      .final_state_indices = static_cast<const int32_t*>(
          in_place && !c.write_elsewhere ? ptr.initial_state_indices : ptr.final_state_indices),
      .chunk_states = in_state_pool ? ptr.initial_state : ptr.chunk_states,
      .chunk_state_indices = static_cast<const int32_t*>(ptr.chunk_state_indices),
      .stride_q_b = t.q.stride(0),
      .stride_q_t = t.q.stride(1),
      .stride_q_h = t.q.stride(2),
      .stride_k_b = t.k.stride(0),
      .stride_k_t = t.k.stride(1),
      .stride_k_h = t.k.stride(2),
      .stride_v_b = t.v.stride(0),
      .stride_v_t = t.v.stride(1),
      .stride_v_h = t.v.stride(2),
      .stride_g_b = t.g.stride(0),
      .stride_g_t = t.g.stride(1),
      .stride_g_h = t.g.stride(2),
      .stride_beta_b = t.beta.stride(0),
      .stride_beta_t = t.beta.stride(1),
      .stride_beta_h = t.beta.stride(2),
      .stride_o_b = t.o.stride(0),
      .stride_o_t = t.o.stride(1),
      .stride_o_h = t.o.stride(2),
      .stride_initial_state_n = t.initial_state.defined() ? t.initial_state.stride(0) : 0,
      .stride_final_state_n = final_tensor.defined() ? final_tensor.stride(0) : 0,
      .stride_chunk_states_n = chunk_tensor.defined() ? chunk_tensor.stride(0) : 0,
      .dtype_qkv = c.dtype_qkv,
      .dtype_g = c.dtype_g,
      .dtype_beta = c.dtype_beta,
      .dtype_state = c.dtype_state,
      .dtype_chunk_states = c.dtype_chunk_states,
      .dtype_cu_seqlens = c.dtype_cu,
      .gate = c.gate,
      .state_layout = c.layout,
      .scale = c.effective_scale(),
      .lower_bound = c.gate == GateMode::kLowerBound ? c.lower_bound : 0.f,
      .use_qk_l2norm = c.l2norm,
      .use_beta_sigmoid = c.beta_sigmoid,
      .allow_neg_eigval = c.neg_eigval,
      .scalar_gate = c.scalar_gate,
      .chunk_state_interval = c.chunk_state_interval,
  };
}

// ------------------------------------------------------------------------------------------
// Decode tensors and params
// ------------------------------------------------------------------------------------------
inline DecodeTensors make_decode_tensors(const DecodeCase& c, Rng& rng) {
  DecodeTensors t;
  t.num_seqs = c.num_seqs();
  const int64_t N = t.num_seqs, cols = c.num_index_cols;
  const int64_t first_slot = c.null_slot_is_padding ? 1 : 0;
  t.num_slots = first_slot + N * cols + c.extra_slots;
  detail::make_activations(c, t, rng);
  if (c.packed()) t.cu_seqlens = detail::make_cu_seqlens(c);

  t.state = detail::make_state_tensor(c.dtype_state, t.num_slots, c.HV, c.K, c.V, c.layout, c.pad);
  t.state.fill_storage(0.0);
  t.state.fill_uniform(rng, -1.0, 1.0);

  std::vector<int32_t> slots = detail::random_slots(N * cols, first_slot, t.num_slots, false, rng);
  std::vector<int32_t> accepted(static_cast<size_t>(N), 1);
  for (int64_t n = 0; n < N; ++n) {
    if (c.accepted) accepted[size_t(n)] = int32_t(rng.integer(1, cols));
    if (c.negative_write_slots) {
      for (int64_t col = 0; col < cols; ++col) {
        if (col != accepted[size_t(n)] - 1 && rng.coin(1.0 / 3.0))
          slots[size_t(n * cols + col)] = -1;
      }
    }
  }
  // Padding rows: the start slot is negative, out of range, or the null slot 0.
  std::vector<int64_t> rows(static_cast<size_t>(N));
  std::iota(rows.begin(), rows.end(), int64_t(0));
  std::shuffle(rows.begin(), rows.end(), rng.engine);
  for (int64_t r = 0; r < std::min(c.padding_rows, N); ++r) {
    const int64_t n = rows[size_t(r)];
    const int64_t choice = rng.integer(0, c.null_slot_is_padding ? 2 : 1);
    const int32_t slot = choice == 0   ? -1
                         : choice == 1 ? int32_t(t.num_slots + rng.integer(0, 5))
                                       : 0;
    slots[size_t(n * cols + accepted[size_t(n)] - 1)] = slot;
  }
  t.state_indices = detail::int32_tensor(slots, {N, cols});
  if (c.accepted) t.num_accepted_tokens = detail::int32_tensor(accepted, {N});
  return t;
}

template <class Map>
DecodePointers map_pointers(DecodeTensors& t, Map&& map) {
  auto m = [&](HostTensor& x) -> void* { return x.defined() ? map(x) : nullptr; };
  DecodePointers p;
  p.q = m(t.q);
  p.k = m(t.k);
  p.v = m(t.v);
  p.g = m(t.g);
  p.beta = m(t.beta);
  p.A_log = m(t.A_log);
  p.dt_bias = m(t.dt_bias);
  p.cu_seqlens = m(t.cu_seqlens);
  p.state_indices = m(t.state_indices);
  p.num_accepted_tokens = m(t.num_accepted_tokens);
  p.o = m(t.o);
  p.state = m(t.state);
  return p;
}

inline DecodePointers host_pointers(DecodeTensors& t) {
  return map_pointers(t, [](HostTensor& x) { return x.data(); });
}

inline DecodeParams fill_decode_params(const DecodeCase& c, const DecodeTensors& t,
                                       const DecodePointers& ptr) {
  return DecodeParams{
      .batch = c.rows(),
      .seqlen = c.tokens_per_row(),
      .num_seqs = t.num_seqs,
      .num_state_slots = t.num_slots,
      .num_index_cols = c.num_index_cols,
      .num_qk_heads = c.H,
      .num_v_heads = c.HV,
      .head_dim_k = c.K,
      .head_dim_v = c.V,
      .q = ptr.q,
      .k = ptr.k,
      .v = ptr.v,
      .g = ptr.g,
      .beta = ptr.beta,
      .A_log = static_cast<const float*>(ptr.A_log),
      .dt_bias = static_cast<const float*>(ptr.dt_bias),
      .cu_seqlens = ptr.cu_seqlens,
      .state_indices = static_cast<const int32_t*>(ptr.state_indices),
      .num_accepted_tokens = static_cast<const int32_t*>(ptr.num_accepted_tokens),
      .o = ptr.o,
      .state = ptr.state,
      .stride_q_b = t.q.stride(0),
      .stride_q_t = t.q.stride(1),
      .stride_q_h = t.q.stride(2),
      .stride_k_b = t.k.stride(0),
      .stride_k_t = t.k.stride(1),
      .stride_k_h = t.k.stride(2),
      .stride_v_b = t.v.stride(0),
      .stride_v_t = t.v.stride(1),
      .stride_v_h = t.v.stride(2),
      .stride_g_b = t.g.stride(0),
      .stride_g_t = t.g.stride(1),
      .stride_g_h = t.g.stride(2),
      .stride_beta_b = t.beta.stride(0),
      .stride_beta_t = t.beta.stride(1),
      .stride_beta_h = t.beta.stride(2),
      .stride_o_b = t.o.stride(0),
      .stride_o_t = t.o.stride(1),
      .stride_o_h = t.o.stride(2),
      .stride_state_slot = t.state.stride(0),
      .stride_state_indices_n = t.state_indices.stride(0),
      .dtype_qkv = c.dtype_qkv,
      .dtype_g = c.dtype_g,
      .dtype_beta = c.dtype_beta,
      .dtype_state = c.dtype_state,
      .dtype_cu_seqlens = c.dtype_cu,
      .gate = c.gate,
      .state_layout = c.layout,
      .scale = c.effective_scale(),
      .lower_bound = c.gate == GateMode::kLowerBound ? c.lower_bound : 0.f,
      .use_qk_l2norm = c.l2norm,
      .use_beta_sigmoid = c.beta_sigmoid,
      .allow_neg_eigval = c.neg_eigval,
      .scalar_gate = c.scalar_gate,
      .null_slot_is_padding = c.null_slot_is_padding,
  };
}

// ------------------------------------------------------------------------------------------
// Random cases: every knob drawn from the rng (flag combinations no hand-written list has).
// ------------------------------------------------------------------------------------------
struct RandomCaseLimits {
  std::vector<int32_t> head_dims = {16, 32, 64};  // K and V are drawn from these
  bool equal_head_dims = false;                   // K = V (GPU kernels built for K = V only)
  int64_t max_seqs = 5;
  int64_t max_len = 200;
  int32_t max_qk_heads = 2;
  int32_t max_gva = 3;  // HV / H in [1, max_gva]
};

namespace detail {
template <class T>
T pick(Rng& rng, std::initializer_list<T> values) {
  return *(values.begin() + rng.integer(0, int64_t(values.size()) - 1));
}

template <class Case>
void random_common(Case& c, Rng& rng, const RandomCaseLimits& lim) {
  c.H = int32_t(rng.integer(1, lim.max_qk_heads));
  c.HV = c.H * int32_t(rng.integer(1, lim.max_gva));
  c.K = lim.head_dims[size_t(rng.integer(0, int64_t(lim.head_dims.size()) - 1))];
  c.V = lim.equal_head_dims
            ? c.K
            : lim.head_dims[size_t(rng.integer(0, int64_t(lim.head_dims.size()) - 1))];
  c.gate = pick(rng, {GateMode::kPrecomputed, GateMode::kSoftplus, GateMode::kLowerBound});
  c.lower_bound = float(rng.uniform(-5.0, -0.5));
  c.has_A_log = c.gate == GateMode::kSoftplus || rng.coin();
  c.has_dt_bias = rng.coin(0.7);
  c.scalar_gate = rng.coin(0.25);
  c.dtype_qkv = pick(rng, {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  c.dtype_g = pick(rng, {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  c.dtype_beta = pick(rng, {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  c.dtype_state = pick(rng, {DType::kFloat32, DType::kBFloat16});
  c.dtype_cu = pick(rng, {DType::kInt32, DType::kInt64});
  c.layout = pick(rng, {StateLayout::kVFirst, StateLayout::kKFirst});
  c.l2norm = rng.coin(0.7);
  c.beta_sigmoid = rng.coin(0.7);
  c.neg_eigval = c.beta_sigmoid && rng.coin(0.3);
  c.pad = rng.coin(0.3) ? rng.integer(1, 3) : 0;
  c.scale = rng.coin(0.2) ? float(rng.uniform(0.05, 0.3)) : 0.f;
}
}  // namespace detail

// The name carries the draw index and the knobs that matter most for reading a failure.
inline PrefillCase random_prefill_case(Rng& rng, const RandomCaseLimits& lim, int index) {
  PrefillCase c;
  detail::random_common(c, rng, lim);
  if (rng.coin(0.7)) {
    c.seq_lens.resize(size_t(rng.integer(1, lim.max_seqs)));
    for (auto& len : c.seq_lens) len = rng.coin(0.15) ? 0 : rng.integer(1, lim.max_len);
    c.tail = rng.coin(0.2) ? rng.integer(1, 9) : 0;
  } else {
    c.batch = rng.integer(1, 3);
    c.seqlen = rng.integer(1, lim.max_len);
  }
  c.initial = detail::pick(rng, {StateSource::kNone, StateSource::kDense, StateSource::kPool});
  c.final_state = detail::pick(rng, {StateSource::kNone, StateSource::kDense, StateSource::kPool});
  c.extra_slots = rng.integer(0, 3);
  c.negative_indices = rng.coin(0.5);
  if (c.initial == c.final_state && c.initial != StateSource::kNone) c.in_place = rng.coin(0.5);
  bool any_tokens = !c.packed();
  for (int64_t len : c.seq_lens) any_tokens = any_tokens || len > 0;
  if (any_tokens && rng.coin(0.3)) c.chunk_state_interval = rng.coin() ? 64 : 128;
  const bool pool_in_place = c.in_place && c.initial == StateSource::kPool;
  c.write_elsewhere = pool_in_place && rng.coin(0.4);
  if (c.chunk_state_interval > 0) {
    c.chunk_pool = rng.coin(0.4);
    if (rng.coin(0.2)) c.dtype_chunk_states = rng.coin() ? DType::kFloat32 : DType::kBFloat16;
    c.chunk_in_state_pool = c.chunk_pool && pool_in_place && !c.dtype_chunk_states && rng.coin(0.5);
  }
  c.name = "random" + std::to_string(index) + "_" + to_string(c.gate) + "_K" + std::to_string(c.K) +
           "_V" + std::to_string(c.V) + "_" + to_string(c.dtype_qkv);
  for (char& ch : c.name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return c;
}

inline DecodeCase random_decode_case(Rng& rng, const RandomCaseLimits& lim, int index) {
  DecodeCase c;
  detail::random_common(c, rng, lim);
  c.num_index_cols = rng.coin(0.4) ? int32_t(rng.integer(2, 4)) : 1;
  if (rng.coin(0.5)) {
    c.seq_lens.resize(size_t(rng.integer(1, lim.max_seqs)));
    for (auto& len : c.seq_lens) len = rng.integer(0, c.num_index_cols + 1);
    c.tail = rng.coin(0.2) ? rng.integer(1, 3) : 0;
  } else {
    c.batch = rng.integer(1, lim.max_seqs);
    c.seqlen = rng.integer(1, c.num_index_cols + 1);
  }
  c.accepted = c.num_index_cols > 1 && rng.coin(0.7);
  c.padding_rows = rng.integer(0, 2);
  c.null_slot_is_padding = rng.coin(0.3);
  c.negative_write_slots = c.num_index_cols > 1 && rng.coin(0.5);
  c.extra_slots = rng.integer(0, 3);
  c.name = "random" + std::to_string(index) + "_" + to_string(c.gate) + "_K" + std::to_string(c.K) +
           "_cols" + std::to_string(c.num_index_cols);
  for (char& ch : c.name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return c;
}

// ------------------------------------------------------------------------------------------
// Case groups. Sizes are small enough for the float64 CPU reference; GPU tests may copy a
// group and raise K, V, the head counts or the lengths.
// ------------------------------------------------------------------------------------------

// Regular: the serving shapes and flags, lengths that are not multiples of 64.
inline std::vector<PrefillCase> prefill_regular_cases() {
  return {
      {.name = "fixed_lowerbound_bf16",
       .batch = 2,
       .seqlen = 100,
       .H = 2,
       .HV = 2,
       .K = 64,
       .V = 64},
      {.name = "packed_lowerbound_bf16",
       .seq_lens = {37, 130, 64, 1},
       .H = 2,
       .HV = 2,
       .K = 64,
       .V = 64},
      {.name = "packed_softplus_bf16",
       .seq_lens = {70, 5, 129},
       .gate = GateMode::kSoftplus,
       .dtype_g = DType::kBFloat16,
       .dtype_beta = DType::kBFloat16},
      {.name = "packed_precomputed_fp32",
       .seq_lens = {65, 63},
       .gate = GateMode::kPrecomputed,
       .dtype_qkv = DType::kFloat32,
       .l2norm = false,
       .beta_sigmoid = false},
      {.name = "fixed_k128", .batch = 1, .seqlen = 90, .H = 1, .HV = 1, .K = 128, .V = 128},
      {.name = "packed_kfirst", .seq_lens = {50, 80}, .layout = StateLayout::kKFirst},
  };
}

// Irregular: GVA, odd lengths, empty sequences, scalar gate, every dtype, strided views.
inline std::vector<PrefillCase> prefill_irregular_cases() {
  return {
      {.name = "gva_4x", .seq_lens = {33, 97}, .H = 1, .HV = 4, .K = 16, .V = 16},
      {.name = "empty_sequences", .seq_lens = {0, 40, 0, 0, 67, 0}, .dtype_cu = DType::kInt64},
      {.name = "scalar_gate_gdn",
       .seq_lens = {75, 20},
       .gate = GateMode::kSoftplus,
       .scalar_gate = true},
      {.name = "scalar_gate_precomputed",
       .batch = 2,
       .seqlen = 66,
       .gate = GateMode::kPrecomputed,
       .scalar_gate = true},
      {.name = "lowerbound_no_alog_no_dtbias",
       .seq_lens = {81},
       .lower_bound = -2.5f,
       .has_A_log = false,
       .has_dt_bias = false},
      {.name = "fp16_qkv_neg_eigval",
       .seq_lens = {45, 70},
       .dtype_qkv = DType::kFloat16,
       .neg_eigval = true},
      {.name = "strided_views", .seq_lens = {29, 100}, .H = 2, .HV = 4, .pad = 3},
      {.name = "bf16_state", .seq_lens = {100, 3}, .dtype_state = DType::kBFloat16},
      {.name = "k_neq_v", .seq_lens = {70}, .K = 16, .V = 64},
      {.name = "fp16_gate_and_beta",
       .seq_lens = {66, 2},
       .dtype_g = DType::kFloat16,
       .dtype_beta = DType::kFloat16},
  };
}

// Corner: pools with negative indices, in place, no states, chunk states, tails past cu[N].
inline std::vector<PrefillCase> prefill_corner_cases() {
  return {
      {.name = "pool_negative_indices",
       .seq_lens = {30, 0, 70, 9},
       .initial = StateSource::kPool,
       .final_state = StateSource::kPool,
       .extra_slots = 5,
       .negative_indices = true},
      {.name = "pool_in_place",
       .seq_lens = {30, 70},
       .initial = StateSource::kPool,
       .final_state = StateSource::kPool,
       .extra_slots = 3,
       .in_place = true},
      {.name = "dense_in_place", .batch = 2, .seqlen = 77, .in_place = true},
      {.name = "no_states",
       .seq_lens = {10, 0, 90},
       .initial = StateSource::kNone,
       .final_state = StateSource::kNone},
      {.name = "zero_init_final_only", .seq_lens = {0, 66}, .initial = StateSource::kNone},
      {.name = "chunk_states_64", .seq_lens = {64, 0, 129, 1}, .chunk_state_interval = 64},
      {.name = "chunk_states_128_bf16",
       .seq_lens = {200, 128},
       .dtype_state = DType::kBFloat16,
       .chunk_state_interval = 128},
      {.name = "tail_past_cu", .seq_lens = {20, 50}, .tail = 13},
  };
}

// Pools for prefix caching: one pool read and written through two index arrays, chunk states
// into pool rows (their own, or slots of the state pool), chunk states in their own dtype. The
// CUDA kernels may not build each of these (kUnsupported).
inline std::vector<PrefillCase> prefill_pool_cases() {
  const PrefillCase shared{.initial = StateSource::kPool,
                           .final_state = StateSource::kPool,
                           .extra_slots = 2,
                           .negative_indices = true,
                           .in_place = true,
                           .write_elsewhere = true};
  PrefillCase write_elsewhere = shared;
  write_elsewhere.name = "pool_write_elsewhere";
  write_elsewhere.seq_lens = {30, 0, 70, 9};
  PrefillCase write_elsewhere_bf16 = write_elsewhere;
  write_elsewhere_bf16.name = "pool_write_elsewhere_bf16_kfirst_padded";
  write_elsewhere_bf16.dtype_state = DType::kBFloat16;
  write_elsewhere_bf16.layout = StateLayout::kKFirst;
  write_elsewhere_bf16.pad = 2;
  PrefillCase all_in_one = shared;
  all_in_one.name = "chunk_rows_in_the_state_pool";
  all_in_one.seq_lens = {200, 128, 0, 5};
  all_in_one.chunk_state_interval = 128;
  all_in_one.chunk_pool = all_in_one.chunk_in_state_pool = true;
  return {
      write_elsewhere,
      write_elsewhere_bf16,
      all_in_one,
      {.name = "chunk_rows_own_pool",
       .seq_lens = {64, 0, 129, 1},
       .pad = 2,
       .chunk_state_interval = 64,
       .chunk_pool = true},
      {.name = "chunk_states_bf16_from_fp32_state",
       .seq_lens = {100, 65},
       .chunk_state_interval = 64,
       .dtype_chunk_states = DType::kBFloat16},
      {.name = "chunk_states_fp32_from_bf16_state",
       .batch = 2,
       .seqlen = 130,
       .dtype_state = DType::kBFloat16,
       .chunk_state_interval = 64,
       .chunk_pool = true,
       .dtype_chunk_states = DType::kFloat32},
  };
}

inline std::vector<DecodeCase> decode_regular_cases() {
  return {
      {.name = "dense_one_token", .batch = 5, .seqlen = 1, .K = 64, .V = 64},
      {.name = "dense_two_tokens_softplus", .batch = 3, .seqlen = 2, .gate = GateMode::kSoftplus},
      {.name = "packed_kfirst", .seq_lens = {1, 3, 0, 2}, .layout = StateLayout::kKFirst},
      {.name = "k128", .batch = 2, .seqlen = 1, .H = 1, .HV = 2, .K = 128, .V = 128},
  };
}

inline std::vector<DecodeCase> decode_corner_cases() {
  return {
      {.name = "padding_rows", .batch = 6, .seqlen = 1, .padding_rows = 3},
      {.name = "null_slot",
       .batch = 6,
       .seqlen = 1,
       .padding_rows = 3,
       .null_slot_is_padding = true},
      {.name = "spec_accepted", .batch = 4, .seqlen = 3, .num_index_cols = 3, .accepted = true},
      {.name = "spec_packed",
       .seq_lens = {4, 1, 0, 3},
       .num_index_cols = 4,
       .accepted = true,
       .padding_rows = 1,
       .negative_write_slots = true},
      {.name = "bf16_state_gva_strided",
       .batch = 3,
       .seqlen = 2,
       .H = 1,
       .HV = 3,
       .dtype_state = DType::kBFloat16,
       .pad = 2},
  };
}

}  // namespace kdakit::testing
