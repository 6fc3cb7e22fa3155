// Per-token preprocessing of the KDA contract (CONTRACT.md section 1), templated on the
// arithmetic type: double for the reference, float for the chunked mirror of the GPU path.
//
//   q, k     <- x / sqrt(sum(x * x) + 1e-6)                      (use_qk_l2norm)
//   beta     <- sigmoid(beta), or 2 * sigmoid(beta)               (use_beta_sigmoid,
//   allow_neg_eigval) gamma    =  g                                                 (kPrecomputed)
//            =  -exp(A_log[h]) * softplus(g + dt_bias[h])         (kSoftplus)
//            =  lb * sigmoid(exp(A_log[h]) * (g + dt_bias[h]))    (kLowerBound; A_log null: no
//            factor)
// GVA: value head h reads q/k head h / (HV / H).
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/layout.h"
#include "kdakit/kdakit.h"

namespace kdakit::cpu {

// Everything a (sequence, value head) computation reads, taken from PrefillParams or
// DecodeParams (same field names).
struct KdaProblem {
  ActivationView q, k, v, g, beta;
  void* o = nullptr;
  DType dtype_o = DType::kFloat32;
  int64_t stride_o_b = 0, stride_o_t = 0, stride_o_h = 0;
  const float* A_log = nullptr;
  const float* dt_bias = nullptr;
  int32_t H = 0, HV = 0, K = 0, V = 0;
  GateMode gate = GateMode::kPrecomputed;
  bool scalar_gate = false;
  float lower_bound = 0.f;
  float scale = 0.f;
  bool l2norm = false, beta_sigmoid = false, neg_eigval = false;

  int32_t qk_head(int32_t h) const { return h / (HV / H); }
  int64_t o_offset(int64_t b, int64_t t, int64_t h) const {
    return b * stride_o_b + t * stride_o_t + h * stride_o_h;
  }
};

template <class Params>
KdaProblem make_problem(const Params& p) {
  KdaProblem m;
  m.q = ActivationView{p.q, p.dtype_qkv, p.stride_q_b, p.stride_q_t, p.stride_q_h};
  m.k = ActivationView{p.k, p.dtype_qkv, p.stride_k_b, p.stride_k_t, p.stride_k_h};
  m.v = ActivationView{p.v, p.dtype_qkv, p.stride_v_b, p.stride_v_t, p.stride_v_h};
  m.g = ActivationView{p.g, p.dtype_g, p.stride_g_b, p.stride_g_t, p.stride_g_h};
  m.beta = ActivationView{p.beta, p.dtype_beta, p.stride_beta_b, p.stride_beta_t, p.stride_beta_h};
  m.o = p.o;
  m.dtype_o = p.dtype_qkv;
  m.stride_o_b = p.stride_o_b;
  m.stride_o_t = p.stride_o_t;
  m.stride_o_h = p.stride_o_h;
  m.A_log = p.A_log;
  m.dt_bias = p.dt_bias;
  m.H = p.num_qk_heads;
  m.HV = p.num_v_heads;
  m.K = p.head_dim_k;
  m.V = p.head_dim_v;
  m.gate = p.gate;
  m.scalar_gate = p.scalar_gate;
  m.lower_bound = p.lower_bound;
  m.scale = p.scale;
  m.l2norm = p.use_qk_l2norm;
  m.beta_sigmoid = p.use_beta_sigmoid;
  m.neg_eigval = p.allow_neg_eigval;
  return m;
}

template <class Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}

template <class Real>
Real softplus(Real x) {
  return x > Real(20) ? x : std::log1p(std::exp(x));
}

// One token of one value head, preprocessed: q and k normalised (not scaled), gamma per key
// channel (natural log, <= 0), beta after the sigmoid.
template <class Real>
struct TokenInputs {
  Real* q;      // [K]
  Real* k;      // [K]
  Real* v;      // [V]
  Real* gamma;  // [K]
  Real beta;
};

template <class Real>
void l2_normalize(Real* x, int32_t n) {
  Real sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const Real inv = Real(1) / std::sqrt(sum + Real(1e-6));
  for (int32_t i = 0; i < n; ++i) x[i] *= inv;
}

// Reads and preprocesses token t of batch row b for value head h into `out` (arrays sized by
// the caller: K, K, V, K).
template <class Real>
void load_token(const KdaProblem& m, int64_t b, int64_t t, int32_t h, TokenInputs<Real>& out) {
  const int32_t hk = m.qk_head(h);
  for (int32_t i = 0; i < m.K; ++i) {
    out.q[i] = Real(m.q.load(b, t, hk, i));
    out.k[i] = Real(m.k.load(b, t, hk, i));
  }
  for (int32_t j = 0; j < m.V; ++j) out.v[j] = Real(m.v.load(b, t, h, j));
  if (m.l2norm) {
    l2_normalize(out.q, m.K);
    l2_normalize(out.k, m.K);
  }

  const Real beta_raw = Real(m.beta.load(b, t, h, 0));
  out.beta = m.beta_sigmoid ? (m.neg_eigval ? Real(2) : Real(1)) * sigmoid(beta_raw) : beta_raw;

  const Real a = m.A_log != nullptr ? std::exp(Real(m.A_log[h])) : Real(1);
  for (int32_t i = 0; i < m.K; ++i) {
    const Real g = Real(m.g.load(b, t, h, m.scalar_gate ? 0 : i));
    if (m.gate == GateMode::kPrecomputed) {
      out.gamma[i] = g;
      continue;
    }
    const Real bias = m.dt_bias == nullptr ? Real(0)
                      : m.scalar_gate      ? Real(m.dt_bias[h])
                                           : Real(m.dt_bias[int64_t(h) * m.K + i]);
    if (m.gate == GateMode::kSoftplus) {
      out.gamma[i] = -a * softplus(g + bias);
    } else {
      out.gamma[i] = Real(m.lower_bound) * sigmoid(a * (g + bias));
    }
  }
}

}  // namespace kdakit::cpu
