// float64 token-by-token KDA recurrence: the specification every other path is tested against.
//
// Per (sequence n, value head h), state S (K x V, float64), for each token t in order:
//   S <- diag(exp(gamma_t)) S                      decay (row i by exp(gamma_t[i]))
//   S <- S + beta_t k_t (v_t - S^T k_t)^T           delta rule on the decayed state
//   o_t = S^T (scale q_t)                           the output sees the token's own update
// Inputs are widened exactly to double, preprocessing (norms, gate, beta) is done in double,
// outputs are rounded once to dtype_qkv and states once to dtype_state (nearest even).
//
// Prefill: see prefill_driver.h for state gather/scatter. Decode: one pass per (row, head)
// over a state pool; padding rows write zero outputs and touch no state; with several index
// columns (speculative decoding) the state after token t goes to slot state_indices[n, t].
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/dtype.h"
#include "cpu/layout.h"
#include "cpu/parallel.h"
#include "cpu/prefill_driver.h"
#include "cpu/preprocess.h"
#include "cpu/reference.h"
#include "cpu/state_io.h"
#include "kdakit/kdakit.h"

namespace kdakit::cpu {
namespace {

// Scratch for one token of one head.
struct TokenScratch {
  std::vector<double> q, k, v, gamma, delta, out;
  explicit TokenScratch(const KdaProblem& m)
      : q(size_t(m.K)),
        k(size_t(m.K)),
        v(size_t(m.V)),
        gamma(size_t(m.K)),
        delta(size_t(m.V)),
        out(size_t(m.V)) {}
  TokenInputs<double> inputs() {
    return TokenInputs<double>{q.data(), k.data(), v.data(), gamma.data(), 0.0};
  }
};

// One recurrence step on S (S[i * V + j]) for token t of row b, value head h; writes o_t.
// Two sweeps over S, row by row (every sum runs over i in increasing order):
//   1. S[i, :] *= exp(gamma_i);  pred += S[i, :] k_i          (prediction on the decayed S)
//   2. S[i, :] += k_i delta;     out  += S[i, :] scale q_i     (delta = beta (v - pred))
void step(const KdaProblem& m, int64_t b, int64_t t, int32_t h, double* S, TokenScratch& scratch) {
  const int32_t K = m.K, V = m.V;
  TokenInputs<double> in = scratch.inputs();
  load_token(m, b, t, h, in);
  double* delta = scratch.delta.data();
  double* out = scratch.out.data();

  for (int32_t j = 0; j < V; ++j) delta[j] = 0.0;
  for (int32_t i = 0; i < K; ++i) {
    double* row = S + int64_t(i) * V;
    const double decay = std::exp(in.gamma[i]);
    const double k_i = in.k[i];
    for (int32_t j = 0; j < V; ++j) {
      row[j] *= decay;
      delta[j] += row[j] * k_i;
    }
  }
  for (int32_t j = 0; j < V; ++j) delta[j] = in.beta * (in.v[j] - delta[j]);

  for (int32_t j = 0; j < V; ++j) out[j] = 0.0;
  for (int32_t i = 0; i < K; ++i) {
    double* row = S + int64_t(i) * V;
    const double k_i = in.k[i];
    const double qs_i = double(m.scale) * in.q[i];
    for (int32_t j = 0; j < V; ++j) {
      row[j] += k_i * delta[j];
      out[j] += row[j] * qs_i;
    }
  }
  const int64_t o_base = m.o_offset(b, t, h);
  for (int32_t j = 0; j < V; ++j) store_from_double(m.o, m.dtype_o, o_base + j, out[j]);
}

Status prefill_reference_impl(const PrefillParams& p, std::optional<DType> dtype_o) {
  const int64_t interval = p.chunk_state_interval;
  return run_prefill(
      p,
      [interval](const KdaProblem& m, SeqRange range, int32_t h, double* S, const ChunkStateSink& sink) {
        TokenScratch scratch(m);
        for (int64_t t = range.begin; t < range.end; ++t) {
          const int64_t local = t - range.begin;
          if (sink.enabled() && local % interval == 0) sink(local / interval, S);
          step(m, range.row, t, h, S, scratch);
        }
      },
      dtype_o);
}

}  // namespace

Status prefill_reference(const PrefillParams& p) { return prefill_reference_impl(p, std::nullopt); }

Status prefill_reference_fp32_output(const PrefillParams& p) {
  return prefill_reference_impl(p, DType::kFloat32);
}

Status decode_reference(const DecodeParams& p) {
  const Status status = validate(p);
  if (!status.ok()) return status;

  const KdaProblem m = make_problem(p);
  const StateFormat format{p.dtype_state, p.state_layout, p.num_v_heads, p.head_dim_k,
                           p.head_dim_v};
  const int64_t N = p.num_seqs;
  const int32_t HV = p.num_v_heads;
  const int64_t cols = p.num_index_cols;
  auto index = [&](int64_t n, int64_t col) -> int64_t {
    return p.state_indices[n * p.stride_state_indices_n + col];
  };

  DeferredStateWrites writes(N, HV, format);
  parallel_for(N * int64_t(HV), [&](int64_t item) {
    const int64_t n = item / HV;
    const int32_t h = int32_t(item % HV);
    const SeqRange range = sequence_range(p.cu_seqlens, p.dtype_cu_seqlens, n, p.seqlen);
    const int64_t accepted = p.num_accepted_tokens != nullptr
                                 ? std::clamp<int64_t>(p.num_accepted_tokens[n], 1, cols)
                                 : 1;
    const int64_t start_slot = index(n, accepted - 1);

    if (!slot_in_range(start_slot, p.num_state_slots, p.null_slot_is_padding)) {
      // Padding row: zero outputs, no state read or written.
      for (int64_t t = range.begin; t < range.end; ++t) {
        const int64_t o_base = m.o_offset(range.row, t, h);
        for (int32_t j = 0; j < m.V; ++j) store_from_double(m.o, m.dtype_o, o_base + j, 0.0);
      }
      return;
    }

    std::vector<double> S(size_t(format.block_elements()));
    format.load(format.block(p.state, start_slot, p.stride_state_slot, h), S.data());
    TokenScratch scratch(m);
    for (int64_t t = range.begin; t < range.end; ++t) {
      step(m, range.row, t, h, S.data(), scratch);
      const int64_t local = t - range.begin;
      if (cols > 1 && local < cols) {
        const int64_t slot = index(n, local);
        if (slot_in_range(slot, p.num_state_slots, p.null_slot_is_padding))
          format.store(S.data(), writes.add(n, h, slot));
      }
    }
    if (cols == 1 && range.length() > 0) format.store(S.data(), writes.add(n, h, start_slot));
  });

  writes.apply(p.state, p.stride_state_slot,
               [](int64_t count, auto&& fn) { parallel_for(count, fn); });
  return Status::Ok();
}

}  // namespace kdakit::cpu
