// fp32 chunked KDA prefill: the algorithm of the GPU prefill (docs/design, PREFILL-NOTES.md),
// written as plain loops so that a kernel's intermediates can be checked against it.
//
// A sequence is cut into chunks of kChunk = 64 tokens (the last one may be shorter: C' rows).
// Per chunk, rows r, s in [0, C'), key channel i, value channel j, all in fp32:
//   b2_r[i]  = (gamma_1[i] + ... + gamma_r[i]) * log2(e)          gate cumsum in base 2
//   Kt_r     = exp2(b2_r) k_r,   Qt_r = scale exp2(b2_r) q_r,   Kh_r = exp2(b2_C' - b2_r) k_r
//   L[r, s]  = sum_i k_r[i] k_s[i] exp2(b2_r[i] - b2_s[i])            s < r
//   M[r, s]  = sum_i scale q_r[i] k_s[i] exp2(b2_r[i] - b2_s[i])      s <= r
//   T        = (I + diag(beta) L)^-1          unit lower triangular, by forward substitution
//   W        = T diag(beta) Kt   [C', K],     U0 = T diag(beta) V   [C', V]
// and with S0 (K x V) the state entering the chunk:
//   U = U0 - W S0,   O = Qt S0 + M U,   S_next = diag(exp2(b2_C')) S0 + Kh^T U
// Every exponent is a difference b2_r - b2_s with s <= r (or b2_r itself), so every factor is
// <= 1 whatever the gate: no overflow, underflow to zero is harmless. exp2(b2_r - b2_s) is
// formed per element, not as a product of two factors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/dtype.h"
#include "cpu/layout.h"
#include "cpu/prefill_driver.h"
#include "cpu/preprocess.h"
#include "kdakit/kdakit.h"

namespace kdakit::cpu {
namespace {

// Tokens per chunk of the GPU prefill: one 64-row wgmma tile.
constexpr int32_t kChunk = 64;
constexpr float kLog2e = 1.4426950408889634f;

// Per-chunk scratch, row-major [rows][cols].
struct ChunkScratch {
  int32_t K, V;
  std::vector<float> q, k, v, gamma, b2, beta;     // inputs, [C][K] / [C][V] / [C]
  std::vector<float> Kt, Qt, Kh, L, M, T, W, U;    // [C][K], [C][C], [C][V]
  std::vector<float> S, S_next;                    // [K][V]
  ChunkScratch(int32_t K_, int32_t V_)
      : K(K_), V(V_),
        q(size_t(kChunk) * K), k(size_t(kChunk) * K), v(size_t(kChunk) * V), gamma(size_t(kChunk) * K),
        b2(size_t(kChunk) * K), beta(kChunk),
        Kt(size_t(kChunk) * K), Qt(size_t(kChunk) * K), Kh(size_t(kChunk) * K),
        L(size_t(kChunk) * kChunk), M(size_t(kChunk) * kChunk), T(size_t(kChunk) * kChunk),
        W(size_t(kChunk) * K), U(size_t(kChunk) * V), S(size_t(K) * V), S_next(size_t(K) * V) {}
};

// Runs chunk [t0, t0 + C') of row b for value head h on x.S; writes the outputs.
void run_chunk(const KdaProblem& m, int64_t b, int64_t t0, int32_t C, int32_t h, ChunkScratch& x) {
  const int32_t K = m.K, V = m.V;
  const float scale = m.scale;

  // --- load and preprocess (fp32), gate cumsum in base 2
  std::vector<float> running(static_cast<size_t>(K), 0.f);
  for (int32_t r = 0; r < C; ++r) {
    TokenInputs<float> in{&x.q[size_t(r) * K], &x.k[size_t(r) * K], &x.v[size_t(r) * V], &x.gamma[size_t(r) * K], 0.f};
    load_token(m, b, t0 + r, h, in);
    x.beta[size_t(r)] = in.beta;
    for (int32_t i = 0; i < K; ++i) {
      running[size_t(i)] += in.gamma[i];
      x.b2[size_t(r) * K + i] = running[size_t(i)] * kLog2e;
    }
  }
  const float* b2_last = &x.b2[size_t(C - 1) * K];

  // --- gated q, k
  for (int32_t r = 0; r < C; ++r) {
    for (int32_t i = 0; i < K; ++i) {
      const size_t ri = size_t(r) * K + i;
      const float decay = std::exp2(x.b2[ri]);
      x.Kt[ri] = decay * x.k[ri];
      x.Qt[ri] = scale * decay * x.q[ri];
      x.Kh[ri] = std::exp2(b2_last[i] - x.b2[ri]) * x.k[ri];
    }
  }

  // --- L (strictly lower) and M (lower, diagonal included)
  for (int32_t r = 0; r < C; ++r) {
    for (int32_t s = 0; s <= r; ++s) {
      float l = 0.f, mm = 0.f;
      for (int32_t i = 0; i < K; ++i) {
        const float e = std::exp2(x.b2[size_t(r) * K + i] - x.b2[size_t(s) * K + i]);
        const float ks = x.k[size_t(s) * K + i] * e;
        l += x.k[size_t(r) * K + i] * ks;
        mm += scale * x.q[size_t(r) * K + i] * ks;
      }
      x.L[size_t(r) * kChunk + s] = s < r ? l : 0.f;
      x.M[size_t(r) * kChunk + s] = mm;
    }
  }

  // --- T = (I + diag(beta) L)^-1 by forward substitution, row by row:
  //     T[r, s] = -sum_{m = s}^{r - 1} beta_r L[r, m] T[m, s]   (s < r),   T[r, r] = 1
  for (int32_t r = 0; r < C; ++r) {
    for (int32_t s = 0; s < r; ++s) {
      float acc = 0.f;
      for (int32_t mi = s; mi < r; ++mi) acc += x.L[size_t(r) * kChunk + mi] * x.T[size_t(mi) * kChunk + s];
      x.T[size_t(r) * kChunk + s] = -x.beta[size_t(r)] * acc;
    }
    x.T[size_t(r) * kChunk + r] = 1.f;
  }

  // --- W = T diag(beta) Kt, U = T diag(beta) V - W S0
  for (int32_t r = 0; r < C; ++r) {
    float* w = &x.W[size_t(r) * K];
    float* u = &x.U[size_t(r) * V];
    for (int32_t i = 0; i < K; ++i) w[i] = 0.f;
    for (int32_t j = 0; j < V; ++j) u[j] = 0.f;
    for (int32_t s = 0; s <= r; ++s) {
      const float tb = x.T[size_t(r) * kChunk + s] * x.beta[size_t(s)];
      for (int32_t i = 0; i < K; ++i) w[i] += tb * x.Kt[size_t(s) * K + i];
      for (int32_t j = 0; j < V; ++j) u[j] += tb * x.v[size_t(s) * V + j];
    }
  }
  std::vector<float> ws(static_cast<size_t>(V));
  for (int32_t r = 0; r < C; ++r) {
    const float* w = &x.W[size_t(r) * K];
    for (int32_t j = 0; j < V; ++j) ws[size_t(j)] = 0.f;
    for (int32_t i = 0; i < K; ++i) {
      for (int32_t j = 0; j < V; ++j) ws[size_t(j)] += w[i] * x.S[size_t(i) * V + j];
    }
    for (int32_t j = 0; j < V; ++j) x.U[size_t(r) * V + j] -= ws[size_t(j)];
  }

  // --- O = Qt S0 + M U
  std::vector<float> o(static_cast<size_t>(V));
  for (int32_t r = 0; r < C; ++r) {
    for (int32_t j = 0; j < V; ++j) o[size_t(j)] = 0.f;
    for (int32_t i = 0; i < K; ++i) {
      const float qt = x.Qt[size_t(r) * K + i];
      for (int32_t j = 0; j < V; ++j) o[size_t(j)] += qt * x.S[size_t(i) * V + j];
    }
    for (int32_t s = 0; s <= r; ++s) {
      const float ms = x.M[size_t(r) * kChunk + s];
      for (int32_t j = 0; j < V; ++j) o[size_t(j)] += ms * x.U[size_t(s) * V + j];
    }
    const int64_t o_base = m.o_offset(b, t0 + r, h);
    for (int32_t j = 0; j < V; ++j) store_from_double(m.o, m.dtype_o, o_base + j, double(o[size_t(j)]));
  }

  // --- S_next = diag(exp2(b2_C')) S0 + Kh^T U
  for (int32_t i = 0; i < K; ++i) {
    const float decay = std::exp2(b2_last[i]);
    for (int32_t j = 0; j < V; ++j) x.S_next[size_t(i) * V + j] = decay * x.S[size_t(i) * V + j];
    for (int32_t r = 0; r < C; ++r) {
      const float kh = x.Kh[size_t(r) * K + i];
      for (int32_t j = 0; j < V; ++j) x.S_next[size_t(i) * V + j] += kh * x.U[size_t(r) * V + j];
    }
  }
  x.S.swap(x.S_next);
}

}  // namespace

Status prefill_chunked(const PrefillParams& p) {
  const int64_t interval = p.chunk_state_interval;
  return run_prefill(p, [interval](const KdaProblem& m, SeqRange range, int32_t h, double* S,
                                   const ChunkStateSink& sink) {
    ChunkScratch x(m.K, m.V);
    const int64_t KV = int64_t(m.K) * m.V;
    for (int64_t e = 0; e < KV; ++e) x.S[size_t(e)] = float(S[e]);  // exact: fp32/bf16 storage
    std::vector<double> snapshot;
    for (int64_t t0 = range.begin; t0 < range.end; t0 += kChunk) {
      const int64_t local = t0 - range.begin;
      if (sink.enabled() && local % interval == 0) {
        snapshot.assign(x.S.begin(), x.S.end());
        sink(local / interval, snapshot.data());
      }
      const int32_t C = int32_t(std::min<int64_t>(kChunk, range.end - t0));
      run_chunk(m, range.row, t0, C, h, x);
    }
    for (int64_t e = 0; e < KV; ++e) S[e] = double(x.S[size_t(e)]);
  });
}

}  // namespace kdakit::cpu
