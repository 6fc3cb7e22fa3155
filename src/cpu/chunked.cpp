// fp32 chunked KDA prefill: the algorithm of the GPU prefill (docs/design, PREFILL-NOTES.md),
// written as loops, the matrix products through one register-blocked helper. prepare_chunk /
// apply_chunk (chunked.h) are its two halves, exposed so that a kernel's per-chunk intermediates
// can be checked against them.
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
// formed per element, not as a product of two factors; in L and M by exp2_nonpositive below (a
// polynomial the compiler vectorises; scalar std::exp2 there was most of the backend's time).
#include "cpu/chunked.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "cpu/dtype.h"
#include "cpu/layout.h"
#include "cpu/prefill_driver.h"
#include "cpu/preprocess.h"
#include "kdakit/kdakit.h"

namespace kdakit::cpu {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// 2^x for x <= 0 in fp32, within 2.5e-7 relative of std::exp2 for x >= -126 and 0 below (where
// std::exp2 is subnormal, which FlushSubnormals would flush anyway). x = n + f with n = round(x),
// |f| <= 1/2: 2^f is its Taylor series in f ln 2 to degree 6 (remainder below 1.3e-7), and 2^n is
// built in the exponent field. No branch, no libm call: a loop of these vectorises.
inline float exp2_nonpositive(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding and subtracting it rounds to integer
  const float lo = x < -126.f ? -126.f : x;
  const float xc = lo > 127.f ? 127.f : lo;  // the contract has x <= 0; this keeps n in range
  const float n = (xc + kRound) - kRound;
  const float f = xc - n;
  constexpr float c1 = 0.6931471805599453f, c2 = 0.2402265069591007f, c3 = 0.0555041086648216f,
                  c4 = 0.0096181291076285f, c5 = 0.0013333558146428f, c6 = 0.0001540353039338f;
  const float p = 1.f + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * (c5 + f * c6)))));
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  const float e = p * scale;  // computed unconditionally so that the select below is no branch
  return x < -126.f ? 0.f : e;
}

// Flushes fp32 subnormal results and inputs to zero on this thread while it lives (x86 MXCSR
// FTZ and DAZ); prefill_chunked holds one around each chunk's prepare and apply. With fast-decaying
// gates the gated rows pass 2^-126 after a few dozen tokens, and x86 arithmetic on subnormals takes
// a slow path of ~100 cycles (the demo case, H4 T = 777, ran 3.7x slower without this). What is
// flushed is below 2^-126, far under the accuracy bar.
class FlushSubnormals {
 public:
#if defined(__SSE2__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;
  unsigned saved_;
#endif
};

typedef float v4 __attribute__((vector_size(16)));  // GCC/Clang vector type (SSE on x86-64)

// xz = sum_i x[i] z[i] and yz = sum_i y[i] z[i], in four interleaved partial sums (the order of
// the terms differs from a serial loop's; a serial chain of adds was the L/M loop's bound).
void dot2(const float* x, const float* y, const float* z, int32_t n, float& xz, float& yz) {
  v4 sx = {0.f, 0.f, 0.f, 0.f}, sy = sx;
  const int32_t n4 = n - n % 4;
  for (int32_t i = 0; i < n4; i += 4) {
    v4 xv, yv, zv;
    std::memcpy(&xv, x + i, sizeof(v4));
    std::memcpy(&yv, y + i, sizeof(v4));
    std::memcpy(&zv, z + i, sizeof(v4));
    sx += xv * zv;
    sy += yv * zv;
  }
  float a = (sx[0] + sx[1]) + (sx[2] + sx[3]), b = (sy[0] + sy[1]) + (sy[2] + sy[3]);
  for (int32_t i = n4; i < n; ++i) {
    a += x[i] * z[i];
    b += y[i] * z[i];
  }
  xz = a;
  yz = b;
}

// c[r][j] += sum_k a(r, k) b[k][j] for r < R, j < N, k < D, with a(r, k) = a[r * ars + k * aks]
// (strides, so that a transposed operand needs no copy). Blocks of 4 rows x 8 columns keep their
// sums in registers (GCC/Clang vector types) across k; each sum still adds its terms in order
// k = 0, 1, ..., as the plain triple loop does. lower: a is zero above its diagonal (a(r, k) = 0
// for k > r), and those terms are skipped (a block's rows run to its last row's diagonal).
void matmul_acc(int32_t R, int32_t N, int32_t D, const float* a, size_t ars, size_t aks,
                const float* b, size_t ldb, float* c, size_t ldc, bool lower = false) {
  constexpr int32_t kR = 4, kN = 8;
  const int32_t R4 = R - R % kR, N8 = N - N % kN;
  for (int32_t r = 0; r < R4; r += kR) {
    const int32_t k_end = lower ? std::min(D, r + kR) : D;
    for (int32_t j = 0; j < N8; j += kN) {
      v4 acc[kR][2];
      for (int32_t rr = 0; rr < kR; ++rr) {
        std::memcpy(&acc[rr][0], c + size_t(r + rr) * ldc + j, sizeof(v4));
        std::memcpy(&acc[rr][1], c + size_t(r + rr) * ldc + j + 4, sizeof(v4));
      }
      for (int32_t k = 0; k < k_end; ++k) {
        v4 b0, b1;
        std::memcpy(&b0, b + size_t(k) * ldb + j, sizeof(v4));
        std::memcpy(&b1, b + size_t(k) * ldb + j + 4, sizeof(v4));
        for (int32_t rr = 0; rr < kR; ++rr) {
          const float av = a[size_t(r + rr) * ars + size_t(k) * aks];
          acc[rr][0] += av * b0;
          acc[rr][1] += av * b1;
        }
      }
      for (int32_t rr = 0; rr < kR; ++rr) {
        std::memcpy(c + size_t(r + rr) * ldc + j, &acc[rr][0], sizeof(v4));
        std::memcpy(c + size_t(r + rr) * ldc + j + 4, &acc[rr][1], sizeof(v4));
      }
    }
  }
  // the rows and columns outside the blocks
  for (int32_t r = 0; r < R; ++r) {
    const int32_t k_end = lower ? std::min(D, r + 1) : D;
    for (int32_t j = (r < R4 ? N8 : 0); j < N; ++j) {
      float sum = c[size_t(r) * ldc + j];
      for (int32_t k = 0; k < k_end; ++k)
        sum += a[size_t(r) * ars + size_t(k) * aks] * b[size_t(k) * ldb + j];
      c[size_t(r) * ldc + j] = sum;
    }
  }
}

}  // namespace

ChunkPrep::ChunkPrep(int32_t K_, int32_t V_)
    : K(K_),
      V(V_),
      qn(size_t(kChunk) * K),
      kn(size_t(kChunk) * K),
      v(size_t(kChunk) * V),
      beta(kChunk),
      b2(size_t(kChunk) * K),
      Qt(size_t(kChunk) * K),
      Kt(size_t(kChunk) * K),
      Kh(size_t(kChunk) * K),
      L(size_t(kChunk) * kChunk),
      M(size_t(kChunk) * kChunk),
      T(size_t(kChunk) * kChunk),
      W(size_t(kChunk) * K),
      U0(size_t(kChunk) * V),
      decay(size_t(K)),
      gamma(size_t(K)),
      running(size_t(K)),
      ks(size_t(K)),
      tb(size_t(kChunk) * kChunk),
      U(size_t(kChunk) * V) {}

void prepare_chunk(const KdaProblem& m, int64_t row, int64_t t0, int32_t rows, int32_t h,
                   ChunkPrep& x) {
  const int32_t K = m.K, V = m.V, C = rows;
  const float scale = m.scale;
  for (std::vector<float>* a :
       {&x.qn, &x.kn, &x.v, &x.beta, &x.b2, &x.Qt, &x.Kt, &x.Kh, &x.L, &x.M, &x.T, &x.W, &x.U0}) {
    std::fill(a->begin(), a->end(), 0.f);
  }
  x.rows = rows;

  // --- load and preprocess (fp32), gate cumsum in base 2
  std::vector<float>& gamma = x.gamma;
  std::vector<float>& running = x.running;
  std::fill(running.begin(), running.end(), 0.f);
  for (int32_t r = 0; r < C; ++r) {
    TokenInputs<float> in{&x.qn[size_t(r) * K], &x.kn[size_t(r) * K], &x.v[size_t(r) * V],
                          gamma.data(), 0.f};
    load_token(m, row, t0 + r, h, in);
    x.beta[size_t(r)] = in.beta;
    for (int32_t i = 0; i < K; ++i) {
      running[size_t(i)] += gamma[size_t(i)];
      x.b2[size_t(r) * K + i] = running[size_t(i)] * kLog2e;
    }
  }
  const float* b2_last = &x.b2[size_t(C - 1) * K];
  for (int32_t i = 0; i < K; ++i) x.decay[size_t(i)] = std::exp2(b2_last[i]);

  // --- gated q, k
  for (int32_t r = 0; r < C; ++r) {
    for (int32_t i = 0; i < K; ++i) {
      const size_t ri = size_t(r) * K + i;
      const float factor = std::exp2(x.b2[ri]);
      x.Kt[ri] = factor * x.kn[ri];
      x.Qt[ri] = scale * factor * x.qn[ri];
      x.Kh[ri] = std::exp2(b2_last[i] - x.b2[ri]) * x.kn[ri];
    }
  }

  // --- L (strictly lower) and M (lower, diagonal included); exp2(b2_r - b2_s) <= 1 per element.
  //     The gated k_s row goes through a buffer so that its loop (no reduction) vectorises.
  std::vector<float>& ks = x.ks;
  for (int32_t r = 0; r < C; ++r) {
    const float* b2_r = &x.b2[size_t(r) * K];
    for (int32_t s = 0; s <= r; ++s) {
      const float* b2_s = &x.b2[size_t(s) * K];
      const float* k_s = &x.kn[size_t(s) * K];
      for (int32_t i = 0; i < K; ++i) ks[size_t(i)] = k_s[i] * exp2_nonpositive(b2_r[i] - b2_s[i]);
      float l = 0.f, mm = 0.f;
      dot2(&x.kn[size_t(r) * K], &x.qn[size_t(r) * K], ks.data(), K, l, mm);
      x.L[size_t(r) * kChunk + s] = s < r ? l : 0.f;
      x.M[size_t(r) * kChunk + s] = scale * mm;
    }
  }

  // --- T = (I + diag(beta) L)^-1 by forward substitution, row by row:
  //     T[r, s] = -beta_r sum_{m = s}^{r - 1} L[r, m] T[m, s]   (s < r),   T[r, r] = 1
  for (int32_t r = 0; r < C; ++r) {
    for (int32_t s = 0; s < r; ++s) {
      float acc = 0.f;
      for (int32_t mi = s; mi < r; ++mi)
        acc += x.L[size_t(r) * kChunk + mi] * x.T[size_t(mi) * kChunk + s];
      x.T[size_t(r) * kChunk + s] = -x.beta[size_t(r)] * acc;
    }
    x.T[size_t(r) * kChunk + r] = 1.f;
  }

  // --- W = T diag(beta) Kt, U0 = T diag(beta) V (T diag(beta) is zero above its diagonal)
  std::vector<float>& tb = x.tb;  // [C][C] here: row stride C
  for (int32_t r = 0; r < C; ++r) {
    for (int32_t s = 0; s < C; ++s)
      tb[size_t(r) * C + s] = x.T[size_t(r) * kChunk + s] * x.beta[size_t(s)];
  }
  matmul_acc(C, K, C, tb.data(), C, 1, x.Kt.data(), K, x.W.data(), K, /*lower=*/true);
  matmul_acc(C, V, C, tb.data(), C, 1, x.v.data(), V, x.U0.data(), V, /*lower=*/true);
}

void apply_chunk(ChunkPrep& x, float* S, float* O) {
  const int32_t K = x.K, V = x.V, C = x.rows;

  // --- U = U0 - W S0 (the first C rows of the scratch)
  std::vector<float>& U = x.U;
  const size_t u_size = size_t(C) * V;
  std::fill(U.begin(), U.begin() + ptrdiff_t(u_size), 0.f);
  matmul_acc(C, V, K, x.W.data(), K, 1, S, V, U.data(), V);  // W S0
  for (size_t e = 0; e < u_size; ++e) U[e] = x.U0[e] - U[e];

  // --- O = Qt S0 + M U (M is zero above its diagonal)
  std::fill(O, O + ptrdiff_t(C) * V, 0.f);
  matmul_acc(C, V, K, x.Qt.data(), K, 1, S, V, O, V);
  matmul_acc(C, V, C, x.M.data(), kChunk, 1, U.data(), V, O, V, /*lower=*/true);

  // --- S <- diag(decay) S0 + Kh^T U (row i of S depends only on row i of S0)
  for (int32_t i = 0; i < K; ++i) {
    for (int32_t j = 0; j < V; ++j) S[size_t(i) * V + j] *= x.decay[size_t(i)];
  }
  matmul_acc(K, V, C, x.Kh.data(), 1, K, U.data(), V, S, V);
}

Status prefill_chunk_prep(const PrefillParams& p, int64_t seq, int64_t chunk, int32_t h,
                          ChunkPrep& prep) {
  const Status status = validate(p);
  if (!status.ok()) return status;
  if (seq < 0 || seq >= p.num_seqs || h < 0 || h >= p.num_v_heads) {
    return Status(StatusCode::kInvalidArgument,
                  "prefill_chunk_prep: sequence or value head out of range");
  }
  if (prep.K != p.head_dim_k || prep.V != p.head_dim_v) {
    return Status(StatusCode::kInvalidArgument,
                  "prefill_chunk_prep: ChunkPrep built for other head dims");
  }
  const SeqRange range = sequence_range(p.cu_seqlens, p.dtype_cu_seqlens, seq, p.seqlen);
  const int64_t t0 = range.begin + chunk * kChunk;
  if (chunk < 0 || t0 >= range.end) {
    return Status(StatusCode::kInvalidArgument,
                  "prefill_chunk_prep: the sequence has no such chunk");
  }
  prepare_chunk(make_problem(p), range.row, t0, int32_t(std::min<int64_t>(kChunk, range.end - t0)),
                h, prep);
  return Status::Ok();
}

Status prefill_chunked(const PrefillParams& p) {
  const int64_t interval = p.chunk_state_interval;
  return run_prefill(p, [interval](const KdaProblem& m, SeqRange range, int32_t h, double* S,
                                   const ChunkStateSink& sink) {
    const int64_t KV = int64_t(m.K) * m.V;
    std::vector<float> state(static_cast<size_t>(KV));
    for (int64_t e = 0; e < KV; ++e) state[size_t(e)] = float(S[e]);  // exact: fp32/bf16 storage
    ChunkPrep prep(m.K, m.V);
    std::vector<float> O(size_t(kChunk) * m.V);
    std::vector<double> snapshot;
    for (int64_t t0 = range.begin; t0 < range.end; t0 += kChunk) {
      const int64_t local = t0 - range.begin;
      if (sink.enabled() && local % interval == 0) {
        snapshot.assign(state.begin(), state.end());
        sink(local / interval, snapshot.data());
      }
      const int32_t rows = int32_t(std::min<int64_t>(kChunk, range.end - t0));
      {
        // The chunk's arithmetic only: the state's conversions in and out stay exact.
        const FlushSubnormals flush;
        prepare_chunk(m, range.row, t0, rows, h, prep);
        apply_chunk(prep, state.data(), O.data());
      }
      for (int32_t r = 0; r < rows; ++r) {
        const int64_t o_base = m.o_offset(range.row, t0 + r, h);
        for (int32_t j = 0; j < m.V; ++j)
          store_from_double(m.o, m.dtype_o, o_base + j, double(O[size_t(r) * m.V + j]));
      }
    }
    for (int64_t e = 0; e < KV; ++e) S[e] = double(state[size_t(e)]);
  });
}

}  // namespace kdakit::cpu
