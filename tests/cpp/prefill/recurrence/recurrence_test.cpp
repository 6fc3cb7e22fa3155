// The recurrence kernel alone (src/cuda/sm90/prefill/recurrence/), fed a workspace computed on
// the CPU in float64 from the chunked equations of workspace.h and rounded to its storage dtypes.
// Checks, on random inputs drawn fresh per run:
//   - output and final state against a float64 token-by-token recurrence (CONTRACT.md section 6),
//   - the same through a float64 mirror over the rounded workspace (the kernel takes S0 and U as
//     bf16 hi + lo, ~exact), so the design's error is known without a GPU: CPU-only test,
//   - partial chunks, empty sequences (bit-exact pass-through), tokens past cu[N] untouched,
//     strided o, V-first/K-first, fp32/bf16 state, pool indices (negative = zeros / skip),
//     exact in-place update, chunk states, every value-rows variant, bitwise repeatability.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kdakit/kdakit.h"
#if KDAKIT_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/sm90/prefill/recurrence/launch.h"
#endif
#include "cuda/sm90/prefill/workspace.h"

namespace {

using kdakit::sm90::prefill::ChunkBlockLayout;
using kdakit::sm90::prefill::kChunk;
using kdakit::sm90::prefill::kChunkBlockBytes;
using kdakit::sm90::prefill::kHeadDim;
constexpr int D = kHeadDim;

uint16_t to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float from_bf16_bits(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
double round_bf16(double x) { return from_bf16_bits(to_bf16_bits(float(x))); }

double rel_l2(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ------------------------------------------------------------------------------------------
// Problem: per (token, value head) inputs after preprocessing (L2-normed q/k, beta in (0,1),
// gamma <= 0 natural-log decay per key channel); q/k/v bf16-representable.
// ------------------------------------------------------------------------------------------
struct Problem {
  bool packed = false;
  int64_t batch = 1, seqlen = 0;     // B, T
  std::vector<int64_t> cu;           // packed: cu_seqlens (cu[N] may be < T)
  std::vector<int> lens;             // tokens of each sequence
  std::vector<int64_t> starts;       // first token within its row
  int HV = 1;
  double scale = 1.0 / std::sqrt(double(D));
  // [row, t, h, D]
  std::vector<double> q, k, v, gamma;
  std::vector<double> beta;          // [row, t, h]
  std::vector<double> s0;            // [N, h, K, V] initial state (K x V), zeros where absent
  std::vector<bool> has_init;        // [N]

  int64_t N() const { return int64_t(lens.size()); }
  int64_t row(int64_t n) const { return packed ? 0 : n; }
  size_t tok(int64_t n, int64_t t, int h) const {  // (row, token, head) flat index
    return (size_t(row(n)) * seqlen + size_t(starts[n] + t)) * HV + h;
  }
};

Problem make_problem(std::mt19937_64& rng, bool packed, std::vector<int> lens, int64_t T, int HV) {
  Problem pr;
  pr.packed = packed;
  pr.HV = HV;
  pr.lens = lens;
  if (packed) {
    pr.batch = 1;
    pr.cu.push_back(0);
    for (int l : lens) pr.cu.push_back(pr.cu.back() + l);
    pr.seqlen = std::max<int64_t>(T, pr.cu.back());
    for (size_t n = 0; n < lens.size(); ++n) pr.starts.push_back(pr.cu[n]);
  } else {
    pr.batch = int64_t(lens.size());
    pr.seqlen = T;
    for (size_t n = 0; n < lens.size(); ++n) pr.starts.push_back(0);
  }
  std::normal_distribution<double> normal(0.0, 1.0);
  const size_t ntok = size_t(pr.batch * pr.seqlen * HV);
  pr.q.resize(ntok * D);
  pr.k.resize(ntok * D);
  pr.v.resize(ntok * D);
  pr.gamma.resize(ntok * D);
  pr.beta.resize(ntok);
  for (size_t i = 0; i < ntok; ++i) {
    for (double* x : {&pr.q[i * D], &pr.k[i * D]}) {
      double ss = 0;
      for (int c = 0; c < D; ++c) {
        x[c] = normal(rng);
        ss += x[c] * x[c];
      }
      for (int c = 0; c < D; ++c) x[c] = round_bf16(x[c] / std::sqrt(ss + 1e-6));
    }
    for (int c = 0; c < D; ++c) {
      pr.v[i * D + c] = round_bf16(normal(rng));
      // lower-bound gate shape (lb = -5) biased towards long memory: most channels decay slowly
      const double x = -3.0 + 1.5 * normal(rng);
      pr.gamma[i * D + c] = -5.0 / (1.0 + std::exp(-x));
    }
    pr.beta[i] = 1.0 / (1.0 + std::exp(-normal(rng)));
  }
  pr.s0.assign(size_t(pr.N()) * HV * D * D, 0.0);
  pr.has_init.assign(size_t(pr.N()), false);
  return pr;
}

void random_initial_state(std::mt19937_64& rng, Problem& pr, double p_present) {
  std::normal_distribution<double> normal(0.0, 0.5);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t n = 0; n < pr.N(); ++n) {
    pr.has_init[n] = u(rng) < p_present;
    if (!pr.has_init[n]) continue;
    for (size_t i = 0; i < size_t(pr.HV) * D * D; ++i)
      pr.s0[size_t(n) * pr.HV * D * D + i] = round_bf16(normal(rng));  // representable in bf16 and fp32
  }
}

// float64 token-by-token recurrence (CONTRACT.md section 1). o: [row, t, h, V]; s: [N, h, K, V].
void token_reference(const Problem& pr, std::vector<double>& o, std::vector<double>& s_final) {
  o.assign(size_t(pr.batch * pr.seqlen * pr.HV) * D, 0.0);
  s_final = pr.s0;
  for (int64_t n = 0; n < pr.N(); ++n)
    for (int h = 0; h < pr.HV; ++h) {
      double* S = &s_final[(size_t(n) * pr.HV + h) * D * D];
      std::vector<double> pred(D);
      for (int t = 0; t < pr.lens[n]; ++t) {
        const size_t i = pr.tok(n, t, h);
        const double *q = &pr.q[i * D], *k = &pr.k[i * D], *v = &pr.v[i * D], *g = &pr.gamma[i * D];
        for (int a = 0; a < D; ++a) {
          const double e = std::exp(g[a]);
          for (int b = 0; b < D; ++b) S[a * D + b] *= e;
        }
        std::fill(pred.begin(), pred.end(), 0.0);
        for (int a = 0; a < D; ++a)
          for (int b = 0; b < D; ++b) pred[b] += S[a * D + b] * k[a];
        for (int a = 0; a < D; ++a)
          for (int b = 0; b < D; ++b) S[a * D + b] += pr.beta[i] * k[a] * (v[b] - pred[b]);
        double* out = &o[i * D];
        for (int a = 0; a < D; ++a)
          for (int b = 0; b < D; ++b) out[b] += S[a * D + b] * pr.scale * q[a];
      }
    }
}

// ------------------------------------------------------------------------------------------
// Workspace on the CPU, per workspace.h (float64 math, then rounded to the block dtypes).
// ------------------------------------------------------------------------------------------
struct CpuWorkspace {
  kdakit::sm90::prefill::WorkspacePlan plan;
  std::vector<unsigned char> bytes;
  std::vector<int32_t> chunk_offsets;
};

CpuWorkspace build_workspace(const Problem& pr) {
  CpuWorkspace ws;
  ws.plan = kdakit::sm90::prefill::make_workspace_plan(pr.batch, pr.seqlen, pr.N(), pr.packed, pr.HV);
  ws.bytes.assign(ws.plan.total_bytes, 0);
  ws.chunk_offsets.push_back(0);
  for (int64_t n = 0; n < pr.N(); ++n) ws.chunk_offsets.push_back(ws.chunk_offsets.back() + (pr.lens[n] + kChunk - 1) / kChunk);
  EXPECT_LE(ws.chunk_offsets.back(), ws.plan.max_chunks);
  auto* offs = reinterpret_cast<int32_t*>(&ws.bytes[ws.plan.chunk_offsets_offset]);
  auto* cseq = reinterpret_cast<int32_t*>(&ws.bytes[ws.plan.chunk_seq_offset]);
  auto* sstart = reinterpret_cast<int64_t*>(&ws.bytes[ws.plan.seq_start_offset]);
  auto* slen = reinterpret_cast<int32_t*>(&ws.bytes[ws.plan.seq_len_offset]);
  auto* order = reinterpret_cast<int32_t*>(&ws.bytes[ws.plan.seq_order_offset]);
  // the launch order: reversed, so that a kernel reading it wrongly skips or repeats a sequence
  // (the outputs are poisoned before each run); the plan kernel writes longest first
  for (int64_t n = 0; n < pr.N(); ++n) order[n] = int32_t(pr.N() - 1 - n);
  for (int64_t c = 0; c < ws.plan.max_chunks; ++c) cseq[c] = -1;
  for (int64_t n = 0; n <= pr.N(); ++n) offs[n] = ws.chunk_offsets[n];
  for (int64_t n = 0; n < pr.N(); ++n) {
    sstart[n] = pr.starts[n];
    slen[n] = pr.lens[n];
    for (int c = ws.chunk_offsets[n]; c < ws.chunk_offsets[n + 1]; ++c) cseq[c] = int32_t(n);
  }

  std::vector<double> b(kChunk * D), L(kChunk * kChunk), X(kChunk * 2 * D);
  for (int64_t n = 0; n < pr.N(); ++n)
    for (int h = 0; h < pr.HV; ++h)
      for (int c = ws.chunk_offsets[n]; c < ws.chunk_offsets[n + 1]; ++c) {
        const int t0 = (c - ws.chunk_offsets[n]) * kChunk;
        const int len = std::min(kChunk, pr.lens[n] - t0);
        unsigned char* blk = &ws.bytes[ws.plan.chunk_blocks_offset + (size_t(c) * pr.HV + h) * kChunkBlockBytes];
        auto* Qt = reinterpret_cast<uint16_t*>(blk + ChunkBlockLayout::kQtOffset);
        auto* W = reinterpret_cast<uint16_t*>(blk + ChunkBlockLayout::kWOffset);
        auto* Kh = reinterpret_cast<uint16_t*>(blk + ChunkBlockLayout::kKhOffset);
        auto* KhLo = reinterpret_cast<uint16_t*>(blk + ChunkBlockLayout::kKhLoOffset);
        auto* M = reinterpret_cast<uint16_t*>(blk + ChunkBlockLayout::kMOffset);
        auto* U0 = reinterpret_cast<float*>(blk + ChunkBlockLayout::kU0Offset);
        auto* decay = reinterpret_cast<float*>(blk + ChunkBlockLayout::kDecayOffset);
        auto at = [&](int r) { return pr.tok(n, t0 + r, h); };
        for (int r = 0; r < len; ++r)
          for (int i = 0; i < D; ++i) b[r * D + i] = (r ? b[(r - 1) * D + i] : 0.0) + pr.gamma[at(r) * D + i];
        const double* blast = &b[(len - 1) * D];
        for (int r = 0; r < len; ++r) {
          const double *q = &pr.q[at(r) * D], *k = &pr.k[at(r) * D];
          for (int i = 0; i < D; ++i) {
            Qt[r * D + i] = to_bf16_bits(float(pr.scale * std::exp(b[r * D + i]) * q[i]));
            const float kh = float(std::exp(blast[i] - b[r * D + i]) * k[i]);
            Kh[r * D + i] = to_bf16_bits(kh);
            KhLo[r * D + i] = to_bf16_bits(kh - from_bf16_bits(Kh[r * D + i]));
          }
          for (int s = 0; s <= r; ++s) {
            const double* ks = &pr.k[at(s) * D];
            double l = 0, m = 0;
            for (int i = 0; i < D; ++i) {
              const double e = std::exp(b[r * D + i] - b[s * D + i]);
              l += k[i] * ks[i] * e;
              m += pr.scale * q[i] * ks[i] * e;
            }
            L[r * kChunk + s] = l;
            M[r * kChunk + s] = to_bf16_bits(float(m));
          }
        }
        // (I + diag(beta) L) X = diag(beta) [Kt | V], forward substitution
        for (int r = 0; r < len; ++r) {
          const double beta = pr.beta[at(r)];
          const double* k = &pr.k[at(r) * D];
          const double* v = &pr.v[at(r) * D];
          for (int i = 0; i < D; ++i) {
            X[r * 2 * D + i] = beta * std::exp(b[r * D + i]) * k[i];
            X[r * 2 * D + D + i] = beta * v[i];
          }
          for (int s = 0; s < r; ++s) {
            const double f = beta * L[r * kChunk + s];
            for (int i = 0; i < 2 * D; ++i) X[r * 2 * D + i] -= f * X[s * 2 * D + i];
          }
          for (int i = 0; i < D; ++i) {
            W[r * D + i] = to_bf16_bits(float(X[r * 2 * D + i]));
            U0[r * D + i] = float(X[r * 2 * D + D + i]);
          }
        }
        for (int i = 0; i < D; ++i) decay[i] = float(std::exp(blast[i]));
      }
  return ws;
}

// float64 mirror of the kernel over the rounded workspace. The kernel takes S0 and U as bf16
// hi + lo in every product (16 mantissa bits), i.e. unrounded here; Kh enters as hi + lo, as the
// workspace stores it.
void chunk_mirror(const Problem& pr, const CpuWorkspace& ws, std::vector<double>& o, std::vector<double>& s_final) {
  o.assign(size_t(pr.batch * pr.seqlen * pr.HV) * D, 0.0);
  s_final = pr.s0;
  std::vector<double> U(kChunk * D);
  for (int64_t n = 0; n < pr.N(); ++n)
    for (int h = 0; h < pr.HV; ++h) {
      double* S = &s_final[(size_t(n) * pr.HV + h) * D * D];
      for (int c = ws.chunk_offsets[n]; c < ws.chunk_offsets[n + 1]; ++c) {
        const int t0 = (c - ws.chunk_offsets[n]) * kChunk;
        const unsigned char* blk = &ws.bytes[ws.plan.chunk_blocks_offset + (size_t(c) * pr.HV + h) * kChunkBlockBytes];
        auto bf = [&](size_t off, int i) { return double(from_bf16_bits(reinterpret_cast<const uint16_t*>(blk + off)[i])); };
        const float* U0 = reinterpret_cast<const float*>(blk + ChunkBlockLayout::kU0Offset);
        const float* decay = reinterpret_cast<const float*>(blk + ChunkBlockLayout::kDecayOffset);
        for (int r = 0; r < kChunk; ++r)
          for (int vv = 0; vv < D; ++vv) {
            double acc = 0;
            for (int i = 0; i < D; ++i) acc += bf(ChunkBlockLayout::kWOffset, r * D + i) * S[i * D + vv];
            U[r * D + vv] = double(U0[r * D + vv]) - acc;
          }
        const int len = std::min(kChunk, pr.lens[n] - t0);
        for (int r = 0; r < len; ++r)
          for (int vv = 0; vv < D; ++vv) {
            double acc = 0;
            for (int i = 0; i < D; ++i) acc += bf(ChunkBlockLayout::kQtOffset, r * D + i) * S[i * D + vv];
            for (int s = 0; s <= r; ++s) acc += bf(ChunkBlockLayout::kMOffset, r * kChunk + s) * U[s * D + vv];
            o[pr.tok(n, t0 + r, h) * D + vv] = acc;
          }
        for (int i = 0; i < D; ++i)
          for (int vv = 0; vv < D; ++vv) {
            double acc = double(decay[i]) * S[i * D + vv];
            for (int r = 0; r < kChunk; ++r)
              acc += (bf(ChunkBlockLayout::kKhOffset, r * D + i) + bf(ChunkBlockLayout::kKhLoOffset, r * D + i)) *
                     U[r * D + vv];
            S[i * D + vv] = acc;
          }
      }
    }
}

std::vector<double> gather_valid(const Problem& pr, const std::vector<double>& o) {
  std::vector<double> out;
  for (int64_t n = 0; n < pr.N(); ++n)
    for (int t = 0; t < pr.lens[n]; ++t)
      for (int h = 0; h < pr.HV; ++h)
        for (int c = 0; c < D; ++c) out.push_back(o[pr.tok(n, t, h) * D + c]);
  return out;
}

std::mt19937_64 fresh_rng(uint64_t* seed_out) {
  std::random_device dev;
  const uint64_t seed = (uint64_t(dev()) << 32) ^ dev();
  *seed_out = seed;
  return std::mt19937_64(seed);
}

// The design's error budget, without a GPU: bf16 workspace + bf16 S0/U operands vs float64.
TEST(PrefillRecurrenceCpu, DesignErrorWithinBar) {
  uint64_t seed;
  auto rng = fresh_rng(&seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Problem pr = make_problem(rng, true, {256, 0, 300, 65, 1}, 700, 2);
  random_initial_state(rng, pr, 1.0);
  const CpuWorkspace ws = build_workspace(pr);
  std::vector<double> o_ref, s_ref, o_m, s_m;
  token_reference(pr, o_ref, s_ref);
  chunk_mirror(pr, ws, o_m, s_m);
  const double eo = rel_l2(gather_valid(pr, o_m), gather_valid(pr, o_ref));
  const double es = rel_l2(s_m, s_ref);
  std::printf("design error: output %.3e (bar 4e-3), fp32 final state %.3e (bar 2e-3)\n", eo, es);
  EXPECT_LE(eo, 4e-3);
  EXPECT_LE(es, 2e-3);
}

#if KDAKIT_WITH_CUDA
// ------------------------------------------------------------------------------------------
// GPU runs
// ------------------------------------------------------------------------------------------
bool have_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  return prop.major == 9;
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (bytes) EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct StateSpec {
  bool bf16 = false;
  bool k_first = false;
  bool pool = false;       // initial/final through slot indices
  bool in_place = false;   // same buffer for initial and final
  bool with_initial = true;
  bool with_final = true;
};

// Host image of a state buffer [slots, HV, state] in the storage dtype/layout.
struct StateImage {
  std::vector<unsigned char> bytes;
  size_t elem = 4;
  bool bf16 = false, k_first = false;
  int HV = 1;
  void init(int64_t slots, int hv, bool b16, bool kf) {
    elem = b16 ? 2 : 4;
    bf16 = b16;
    k_first = kf;
    HV = hv;
    bytes.assign(size_t(slots) * hv * D * D * elem, 0);
  }
  size_t index(int64_t slot, int h, int kk, int vv) const {
    const size_t base = (size_t(slot) * HV + h) * D * D;
    return base + (k_first ? size_t(kk) * D + vv : size_t(vv) * D + kk);
  }
  double get(int64_t slot, int h, int kk, int vv) const {
    const size_t i = index(slot, h, kk, vv);
    if (bf16) return from_bf16_bits(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
    return reinterpret_cast<const float*>(bytes.data())[i];
  }
  void set(int64_t slot, int h, int kk, int vv, double x) {
    const size_t i = index(slot, h, kk, vv);
    if (bf16)
      reinterpret_cast<uint16_t*>(bytes.data())[i] = to_bf16_bits(float(x));
    else
      reinterpret_cast<float*>(bytes.data())[i] = float(x);
  }
  void fill_random(std::mt19937_64& rng) {
    std::normal_distribution<double> normal(0.0, 0.5);
    for (size_t i = 0; i < bytes.size() / elem; ++i) {
      if (bf16)
        reinterpret_cast<uint16_t*>(bytes.data())[i] = to_bf16_bits(float(normal(rng)));
      else
        reinterpret_cast<float*>(bytes.data())[i] = float(round_bf16(normal(rng)));
    }
  }
};

struct GpuResult {
  std::vector<uint16_t> o;             // bf16 bits, [B, T, HV, o_pitch]
  std::vector<unsigned char> final_state;
  std::vector<unsigned char> chunk_states;
};

constexpr uint16_t kPoison = 0x7fc1;  // a NaN pattern the kernel never writes

template <int kRows>
kdakit::Status launch_rows(const kdakit::PrefillParams& p, const kdakit::sm90::prefill::WorkspacePlan& plan,
                           const void* ws) {
  return kdakit::sm90::prefill::launch_prefill_recurrence<kRows>(p, plan, ws, nullptr);
}

kdakit::Status launch_any(int rows, const kdakit::PrefillParams& p, const kdakit::sm90::prefill::WorkspacePlan& plan,
                          const void* ws) {
  switch (rows) {
    case 16: return launch_rows<16>(p, plan, ws);
    case 32: return launch_rows<32>(p, plan, ws);
    case 64: return launch_rows<64>(p, plan, ws);
    default: return launch_rows<128>(p, plan, ws);
  }
}

struct RunConfig {
  int rows = 128;
  int o_pad = 0;                 // extra elements after each head's V (strided o)
  int chunk_state_interval = 0;  // 0 = none
  int64_t num_chunk_states = 0;
};

// Runs the kernel once. init/final images describe the state buffers (pool or dense);
// indices: per sequence slots (pool mode).
void run_gpu(const Problem& pr, const CpuWorkspace& ws, const StateSpec& ss, const RunConfig& rc,
             const StateImage& init_img, const std::vector<int32_t>& init_idx, const std::vector<int32_t>& final_idx,
             int64_t num_slots, GpuResult& res) {
  const int64_t o_pitch = D + rc.o_pad;
  const size_t o_elems = size_t(pr.batch * pr.seqlen * pr.HV) * o_pitch;
  DeviceBuffer d_ws(ws.bytes.size()), d_o(o_elems * 2), d_init(init_img.bytes.size()),
      d_final(ss.in_place ? 0 : init_img.bytes.size()), d_iidx(init_idx.size() * 4), d_fidx(final_idx.size() * 4),
      d_cu(8), d_cs(size_t(rc.num_chunk_states) * pr.HV * D * D * init_img.elem);
  CUDA_OK(cudaMemcpy(d_ws.ptr, ws.bytes.data(), ws.bytes.size(), cudaMemcpyHostToDevice));
  std::vector<uint16_t> poison(o_elems, kPoison);
  CUDA_OK(cudaMemcpy(d_o.ptr, poison.data(), o_elems * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_init.ptr, init_img.bytes.data(), init_img.bytes.size(), cudaMemcpyHostToDevice));
  if (!ss.in_place) CUDA_OK(cudaMemset(d_final.ptr, 0xff, init_img.bytes.size()));
  if (!init_idx.empty()) CUDA_OK(cudaMemcpy(d_iidx.ptr, init_idx.data(), init_idx.size() * 4, cudaMemcpyHostToDevice));
  if (!final_idx.empty())
    CUDA_OK(cudaMemcpy(d_fidx.ptr, final_idx.data(), final_idx.size() * 4, cudaMemcpyHostToDevice));
  if (d_cs.ptr) CUDA_OK(cudaMemset(d_cs.ptr, 0xff, size_t(rc.num_chunk_states) * pr.HV * D * D * init_img.elem));

  kdakit::PrefillParams p{};
  p.batch = pr.batch;
  p.seqlen = pr.seqlen;
  p.num_seqs = pr.N();
  p.num_state_slots = num_slots;
  p.num_chunk_states = rc.num_chunk_states;
  p.num_qk_heads = pr.HV;
  p.num_v_heads = pr.HV;
  p.head_dim_k = D;
  p.head_dim_v = D;
  p.cu_seqlens = pr.packed ? d_cu.ptr : nullptr;
  p.o = d_o.ptr;
  p.initial_state = ss.with_initial ? d_init.ptr : nullptr;
  p.initial_state_indices = ss.pool && ss.with_initial ? static_cast<const int32_t*>(d_iidx.ptr) : nullptr;
  p.final_state = ss.with_final ? (ss.in_place ? d_init.ptr : d_final.ptr) : nullptr;
  p.final_state_indices = ss.pool && ss.with_final ? static_cast<const int32_t*>(d_fidx.ptr) : nullptr;
  p.chunk_states = d_cs.ptr;
  p.stride_o_h = o_pitch;
  p.stride_o_t = o_pitch * pr.HV;
  p.stride_o_b = p.stride_o_t * pr.seqlen;
  p.stride_initial_state_n = int64_t(pr.HV) * D * D;
  p.stride_final_state_n = int64_t(pr.HV) * D * D;
  p.dtype_state = ss.bf16 ? kdakit::DType::kBFloat16 : kdakit::DType::kFloat32;
  p.state_layout = ss.k_first ? kdakit::StateLayout::kKFirst : kdakit::StateLayout::kVFirst;
  p.scale = float(pr.scale);
  p.chunk_state_interval = rc.chunk_state_interval;

  const kdakit::Status st = launch_any(rc.rows, p, ws.plan, d_ws.ptr);
  ASSERT_TRUE(st.ok()) << st.message();
  CUDA_OK(cudaDeviceSynchronize());
  res.o.resize(o_elems);
  CUDA_OK(cudaMemcpy(res.o.data(), d_o.ptr, o_elems * 2, cudaMemcpyDeviceToHost));
  res.final_state.resize(init_img.bytes.size());
  CUDA_OK(cudaMemcpy(res.final_state.data(), ss.in_place ? d_init.ptr : d_final.ptr, init_img.bytes.size(),
                     cudaMemcpyDeviceToHost));
  res.chunk_states.resize(size_t(rc.num_chunk_states) * pr.HV * D * D * init_img.elem);
  if (d_cs.ptr)
    CUDA_OK(cudaMemcpy(res.chunk_states.data(), d_cs.ptr, res.chunk_states.size(), cudaMemcpyDeviceToHost));
}

struct Case {
  std::string name;
  bool packed;
  std::vector<int> lens;
  int64_t T;  // fixed: tokens per row; packed: row length (>= sum of lens)
  int HV;
  StateSpec ss;
  RunConfig rc;
};

void check_case(const Case& cs) {
  if (!have_gpu()) GTEST_SKIP() << "no sm_90 GPU";
  uint64_t seed;
  auto rng = fresh_rng(&seed);
  SCOPED_TRACE(cs.name + ", seed " + std::to_string(seed));
  Problem pr = make_problem(rng, cs.packed, cs.lens, cs.T, cs.HV);
  const int64_t N = pr.N();

  // State buffers: dense [N, ...] or a pool of 2N + 1 slots with shuffled, partly negative indices.
  const int64_t slots = cs.ss.pool ? 2 * N + 1 : N;
  StateImage init_img;
  init_img.init(slots, pr.HV, cs.ss.bf16, cs.ss.k_first);
  init_img.fill_random(rng);
  std::vector<int32_t> iidx, fidx;
  std::vector<int64_t> init_slot(N, -1), final_slot(N, -1);
  if (cs.ss.pool) {
    std::vector<int32_t> perm(slots);
    for (int64_t i = 0; i < slots; ++i) perm[i] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t n = 0; n < N; ++n) {
      const int32_t slot = perm[n];
      // every third sequence starts from zeros (negative index); in place, the same slot is written
      iidx.push_back(n % 3 == 1 ? -1 : slot);
      fidx.push_back(cs.ss.in_place ? slot : (n % 4 == 2 ? -1 : perm[N + n]));
    }
    for (int64_t n = 0; n < N; ++n) {
      init_slot[n] = iidx[n];
      final_slot[n] = fidx[n];
    }
  } else {
    for (int64_t n = 0; n < N; ++n) init_slot[n] = final_slot[n] = n;
  }
  for (int64_t n = 0; n < N; ++n) {
    pr.has_init[n] = cs.ss.with_initial && init_slot[n] >= 0;
    for (int h = 0; h < pr.HV; ++h)
      for (int kk = 0; kk < D; ++kk)
        for (int vv = 0; vv < D; ++vv)
          pr.s0[((size_t(n) * pr.HV + h) * D + kk) * D + vv] = pr.has_init[n] ? init_img.get(init_slot[n], h, kk, vv) : 0.0;
  }

  const CpuWorkspace ws = build_workspace(pr);
  std::vector<double> o_ref, s_ref, o_mir, s_mir;
  token_reference(pr, o_ref, s_ref);
  chunk_mirror(pr, ws, o_mir, s_mir);

  GpuResult res;
  run_gpu(pr, ws, cs.ss, cs.rc, init_img, iidx, fidx, slots, res);
  if (::testing::Test::HasFatalFailure()) return;

  // ---- output: valid tokens vs reference; everything else untouched (poison intact)
  const int64_t o_pitch = D + cs.rc.o_pad;
  std::vector<double> o_gpu(o_ref.size(), 0.0);
  std::vector<bool> written(size_t(pr.batch * pr.seqlen * pr.HV), false);
  for (int64_t n = 0; n < N; ++n)
    for (int t = 0; t < pr.lens[n]; ++t)
      for (int h = 0; h < pr.HV; ++h) written[pr.tok(n, t, h)] = true;
  size_t poison_broken = 0, nan_in_valid = 0;
  for (size_t i = 0; i < written.size(); ++i)
    for (int64_t c = 0; c < o_pitch; ++c) {
      const uint16_t bits = res.o[i * o_pitch + c];
      if (written[i] && c < D) {
        o_gpu[i * D + c] = from_bf16_bits(bits);
        if (std::isnan(o_gpu[i * D + c])) ++nan_in_valid;
      } else if (bits != kPoison) {
        ++poison_broken;
      }
    }
  EXPECT_EQ(nan_in_valid, 0u);
  EXPECT_EQ(poison_broken, 0u) << "elements outside the sequences' tokens were written";
  const double eo = rel_l2(gather_valid(pr, o_gpu), gather_valid(pr, o_ref));
  const double eo_mir = rel_l2(gather_valid(pr, o_gpu), gather_valid(pr, o_mir));
  std::printf("[%s] output rel-L2 %.3e vs float64 (bar 4e-3), %.3e vs chunk mirror\n", cs.name.c_str(), eo, eo_mir);
  if (!gather_valid(pr, o_ref).empty()) {
    EXPECT_LE(eo, 4e-3);
    EXPECT_LE(eo_mir, 2e-3);
  }

  // ---- final state
  StateImage got;
  got.init(slots, pr.HV, cs.ss.bf16, cs.ss.k_first);
  got.bytes = res.final_state;
  if (cs.ss.with_final) {
    std::vector<double> s_gpu, s_exp;
    for (int64_t n = 0; n < N; ++n) {
      if (final_slot[n] < 0) continue;
      const bool empty = pr.lens[n] == 0;
      for (int h = 0; h < pr.HV; ++h)
        for (int kk = 0; kk < D; ++kk)
          for (int vv = 0; vv < D; ++vv) {
            const double g = got.get(final_slot[n], h, kk, vv);
            const double r = s_ref[((size_t(n) * pr.HV + h) * D + kk) * D + vv];
            if (empty) {
              // pass-through, bit for bit (zeros without an initial state)
              ASSERT_EQ(g, pr.has_init[n] ? init_img.get(init_slot[n], h, kk, vv) : 0.0)
                  << "empty sequence " << n << " state changed at h " << h << " k " << kk << " v " << vv;
            } else {
              s_gpu.push_back(g);
              s_exp.push_back(r);
            }
          }
    }
    if (!s_gpu.empty()) {
      const double es = rel_l2(s_gpu, s_exp);
      std::printf("[%s] final state rel-L2 %.3e vs float64 (bar %s)\n", cs.name.c_str(), es,
                  cs.ss.bf16 ? "8e-3 bf16 storage" : "2e-3");
      EXPECT_LE(es, cs.ss.bf16 ? 8e-3 : 2e-3);
    }
    // slots nobody writes keep their bytes (the untouched parts of the pool)
    if (cs.ss.pool) {
      std::vector<bool> target(slots, false);
      for (int64_t n = 0; n < N; ++n)
        if (final_slot[n] >= 0) target[final_slot[n]] = true;
      const size_t slot_bytes = size_t(pr.HV) * D * D * got.elem;
      for (int64_t sl = 0; sl < slots; ++sl) {
        if (target[sl]) continue;
        const unsigned char* a = res.final_state.data() + sl * slot_bytes;
        if (cs.ss.in_place) {
          EXPECT_EQ(std::memcmp(a, init_img.bytes.data() + sl * slot_bytes, slot_bytes), 0) << "slot " << sl;
        } else {
          for (size_t b = 0; b < slot_bytes; ++b) ASSERT_EQ(a[b], 0xff) << "slot " << sl << " written";
        }
      }
    }
  }

  // ---- chunk states: entry e of sequence n = state before token C * j
  if (cs.rc.chunk_state_interval > 0) {
    const int C = cs.rc.chunk_state_interval;
    StateImage csi;
    csi.init(cs.rc.num_chunk_states, pr.HV, cs.ss.bf16, cs.ss.k_first);
    csi.bytes = res.chunk_states;
    int64_t e = 0;
    std::vector<double> got_v, exp_v;
    for (int64_t n = 0; n < N; ++n) {
      for (int j = 0; j * C < pr.lens[n]; ++j, ++e) {
        if (e >= cs.rc.num_chunk_states) continue;
        Problem prefix = pr;
        prefix.lens.assign(size_t(N), 0);
        prefix.lens[n] = j * C;
        std::vector<double> o_tmp, s_tmp;
        token_reference(prefix, o_tmp, s_tmp);
        for (int h = 0; h < pr.HV; ++h)
          for (int kk = 0; kk < D; ++kk)
            for (int vv = 0; vv < D; ++vv) {
              got_v.push_back(csi.get(e, h, kk, vv));
              exp_v.push_back(s_tmp[((size_t(n) * pr.HV + h) * D + kk) * D + vv]);
            }
      }
    }
    ASSERT_FALSE(got_v.empty());
    const double ec = rel_l2(got_v, exp_v);
    std::printf("[%s] chunk states rel-L2 %.3e (%lld entries)\n", cs.name.c_str(), ec, (long long)e);
    EXPECT_LE(ec, cs.ss.bf16 ? 8e-3 : 2e-3);
    // entries past the written ones stay untouched
    const size_t entry_bytes = size_t(pr.HV) * D * D * csi.elem;
    for (int64_t x = e; x < cs.rc.num_chunk_states; ++x)
      for (size_t b = 0; b < entry_bytes; ++b) ASSERT_EQ(res.chunk_states[x * entry_bytes + b], 0xff);
  }

  // ---- bitwise repeatability
  GpuResult again;
  run_gpu(pr, ws, cs.ss, cs.rc, init_img, iidx, fidx, slots, again);
  EXPECT_TRUE(again.o == res.o) << "output differs between two runs";
  EXPECT_TRUE(again.final_state == res.final_state) << "final state differs between two runs";
  EXPECT_TRUE(again.chunk_states == res.chunk_states) << "chunk states differ between two runs";
}

class PrefillRecurrenceGpu : public ::testing::TestWithParam<Case> {};

TEST_P(PrefillRecurrenceGpu, MatchesFloat64Reference) { check_case(GetParam()); }

std::vector<Case> cases() {
  std::vector<Case> v;
  // regular: fixed batch, every value-rows variant
  for (int rows : {16, 32, 64, 128})
    v.push_back({"fixed_rows" + std::to_string(rows), false, {256, 256}, 256, 3, {}, {.rows = rows}});
  // irregular: partial chunks, empty sequences, cu[N] < T, strided o
  v.push_back({"packed_mixed", true, {130, 0, 1, 64, 257, 0, 63}, 700, 2, {}, {.rows = 64, .o_pad = 8}});
  v.push_back({"packed_o_unaligned", true, {70, 5}, 100, 2, {}, {.rows = 32, .o_pad = 3}});
  v.push_back({"fixed_partial", false, {77, 77}, 77, 2, {}, {.rows = 128}});
  // state variants
  v.push_back({"bf16_vfirst", true, {100, 0, 200}, 300, 2, {.bf16 = true}, {.rows = 128}});
  v.push_back({"fp32_kfirst", true, {100, 0, 200}, 300, 2, {.k_first = true}, {.rows = 16}});
  v.push_back({"bf16_kfirst", true, {100, 0, 200}, 300, 2, {.bf16 = true, .k_first = true}, {.rows = 64}});
  v.push_back({"pool", true, {90, 0, 140, 3, 64, 0}, 400, 2, {.pool = true}, {.rows = 32}});
  v.push_back({"pool_in_place", true, {90, 0, 140, 3, 64, 0}, 400, 2, {.pool = true, .in_place = true}, {.rows = 128}});
  v.push_back({"dense_in_place_bf16", false, {150, 150, 150}, 150, 2, {.bf16 = true, .in_place = true}, {.rows = 64}});
  v.push_back({"no_initial", true, {100, 0, 30}, 200, 2, {.with_initial = false}, {.rows = 128}});
  v.push_back({"no_final", true, {100, 30}, 200, 2, {.with_final = false}, {.rows = 128}});
  // chunk states (C = 64 and C = 128), capacity cut short on one
  v.push_back({"chunk_states_64", true, {130, 0, 64, 65}, 300, 2, {}, {.rows = 64, .chunk_state_interval = 64, .num_chunk_states = 7}});
  v.push_back({"chunk_states_128_capped", true, {300, 129}, 500, 2, {.bf16 = true}, {.rows = 128, .chunk_state_interval = 128, .num_chunk_states = 4}});
  // long: many chunks, so errors that grow with the chain show
  v.push_back({"long_2048", false, {2048}, 2048, 1, {}, {.rows = 128}});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefillRecurrenceGpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });
#endif  // KDAKIT_WITH_CUDA

}  // namespace
