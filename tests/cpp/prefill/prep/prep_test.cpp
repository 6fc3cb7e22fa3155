// Plan and prep kernels (src/cuda/sm90/prefill/prep) against a float64 CPU computation of the
// same workspace (src/cuda/sm90/prefill/workspace.h): the plan region exactly, and every array
// of every chunk block as a relative L2 error over all blocks, with the zero padding of partial
// chunks checked bit for bit and the blocks past the chunk total left untouched.
//
// Each case draws fresh random inputs (seed printed on failure; KDAKIT_TEST_SEED replays).
// Without a CUDA device the tests skip.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "cpu/dtype.h"
#include "cpu/layout.h"
#include "cpu/preprocess.h"
#include "cuda/sm90/prefill/prep/config.h"
#include "cuda/sm90/prefill/prep/launch.h"
#include "cuda/sm90/prefill/workspace.h"

namespace kdakit::testing {
namespace {

namespace pf = kdakit::sm90::prefill;
using Layout = pf::ChunkBlockLayout;
constexpr int kC = pf::kChunk;
constexpr int kD = pf::kHeadDim;
constexpr unsigned char kPoison = 0xff;  // NaN in every float dtype, -1 in the int arrays

bool has_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// ------------------------------------------------------------------------------------------
// Device copies of a case
// ------------------------------------------------------------------------------------------
struct DeviceCase {
  std::vector<void*> buffers;
  ~DeviceCase() {
    for (void* b : buffers) cudaFree(b);
  }
  void* upload(const HostTensor& t) {
    void* d = nullptr;
    if (cudaMalloc(&d, std::max<size_t>(t.nbytes(), 16)) != cudaSuccess) return nullptr;
    buffers.push_back(d);
    cudaMemcpy(d, t.data(), t.nbytes(), cudaMemcpyHostToDevice);
    return d;
  }
};

// ------------------------------------------------------------------------------------------
// Float64 reference of the plan region and the chunk blocks
// ------------------------------------------------------------------------------------------
struct RefPlan {
  std::vector<int32_t> chunk_offsets, chunk_seq, seq_len, seq_order;
  std::vector<int64_t> seq_start;
  int64_t total = 0;
};

// The plan's rule: offsets clamped into [0, T], then a running maximum.
RefPlan reference_plan(const PrefillParams& p, const pf::WorkspacePlan& w) {
  RefPlan r;
  const int64_t N = p.num_seqs, T = p.seqlen;
  std::vector<int64_t> pos(size_t(N + 1), 0);
  int64_t running = 0;
  for (int64_t m = 0; m <= N; ++m) {
    if (p.cu_seqlens == nullptr) {
      pos[size_t(m)] = 0;
      continue;
    }
    const int64_t x = std::clamp<int64_t>(cpu::load_index(p.cu_seqlens, p.dtype_cu_seqlens, m), 0, T);
    running = std::max(running, x);
    pos[size_t(m)] = running;
  }
  r.chunk_offsets.assign(size_t(N + 1), 0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t start = p.cu_seqlens ? pos[size_t(n)] : 0;
    const int64_t len = p.cu_seqlens ? pos[size_t(n + 1)] - pos[size_t(n)] : T;
    r.seq_start.push_back(start);
    r.seq_len.push_back(int32_t(len));
    r.chunk_offsets[size_t(n + 1)] = r.chunk_offsets[size_t(n)] + int32_t((len + kC - 1) / kC);
  }
  r.total = r.chunk_offsets[size_t(N)];
  r.chunk_seq.assign(size_t(w.max_chunks), -1);
  for (int64_t n = 0; n < N; ++n) {
    for (int32_t c = r.chunk_offsets[size_t(n)]; c < r.chunk_offsets[size_t(n + 1)]; ++c) r.chunk_seq[size_t(c)] = int32_t(n);
  }
  // launch order: longest first, ties by index, for at most 512 sequences
  for (int64_t n = 0; n < N; ++n) r.seq_order.push_back(int32_t(n));
  if (N <= 512) {
    std::stable_sort(r.seq_order.begin(), r.seq_order.end(),
                     [&](int32_t a, int32_t b) { return r.seq_len[size_t(a)] > r.seq_len[size_t(b)]; });
  }
  return r;
}

// One chunk block in float64, rows past the chunk length zero.
struct RefBlock {
  std::vector<double> qt, w, kh, m, u0, decay;
  RefBlock() : qt(kC * kD, 0.0), w(kC * kD, 0.0), kh(kC * kD, 0.0), m(kC * kC, 0.0), u0(kC * kD, 0.0), decay(kD, 0.0) {}
};

RefBlock reference_block(const cpu::KdaProblem& prob, int64_t row, int64_t tok0, int len, int32_t h, double scale) {
  RefBlock out;
  std::vector<double> q(kC * kD, 0.0), k(kC * kD, 0.0), v(kC * kD, 0.0), b2(kC * kD, 0.0), beta(kC, 0.0);
  std::vector<double> gamma(kD);
  std::vector<double> acc(kD, 0.0);
  for (int r = 0; r < len; ++r) {
    cpu::TokenInputs<double> tok{&q[size_t(r) * kD], &k[size_t(r) * kD], &v[size_t(r) * kD], gamma.data(), 0.0};
    cpu::load_token(prob, row, tok0 + r, h, tok);
    beta[size_t(r)] = tok.beta;
    for (int i = 0; i < kD; ++i) {
      acc[size_t(i)] += gamma[size_t(i)] / std::log(2.0);
      b2[size_t(r) * kD + i] = acc[size_t(i)];
    }
  }
  const double* last = &b2[size_t(std::max(len - 1, 0)) * kD];
  for (int i = 0; i < kD; ++i) out.decay[size_t(i)] = len > 0 ? std::exp2(last[i]) : 1.0;
  std::vector<double> kt(kC * kD, 0.0);
  for (int r = 0; r < len; ++r) {
    for (int i = 0; i < kD; ++i) {
      const size_t e = size_t(r) * kD + i;
      out.qt[e] = scale * std::exp2(b2[e]) * q[e];
      out.kh[e] = std::exp2(last[i] - b2[e]) * k[e];
      kt[e] = std::exp2(b2[e]) * k[e];
    }
  }
  // L (strictly lower) and M (lower with diagonal).
  std::vector<double> L(kC * kC, 0.0);
  for (int r = 0; r < len; ++r) {
    for (int s = 0; s <= r; ++s) {
      double l = 0.0, mm = 0.0;
      for (int i = 0; i < kD; ++i) {
        const double f = std::exp2(b2[size_t(r) * kD + i] - b2[size_t(s) * kD + i]) * k[size_t(s) * kD + i];
        l += k[size_t(r) * kD + i] * f;
        mm += q[size_t(r) * kD + i] * f;
      }
      if (s < r) L[size_t(r) * kC + s] = l;
      out.m[size_t(r) * kC + s] = scale * mm;
    }
  }
  // T = (I + diag(beta) L)^-1 by forward substitution, column by column.
  std::vector<double> T(kC * kC, 0.0);
  for (int j = 0; j < kC; ++j) {
    for (int r = j; r < kC; ++r) {
      double x = r == j ? 1.0 : 0.0;
      for (int s = j; s < r; ++s) x -= beta[size_t(r)] * L[size_t(r) * kC + s] * T[size_t(s) * kC + j];
      T[size_t(r) * kC + j] = x;
    }
  }
  for (int r = 0; r < len; ++r) {
    for (int i = 0; i < kD; ++i) {
      double wsum = 0.0, usum = 0.0;
      for (int s = 0; s <= r; ++s) {
        const double ts = T[size_t(r) * kC + s] * beta[size_t(s)];
        wsum += ts * kt[size_t(s) * kD + i];
        usum += ts * v[size_t(s) * kD + i];
      }
      out.w[size_t(r) * kD + i] = wsum;
      out.u0[size_t(r) * kD + i] = usum;
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------
// Comparison accumulators
// ------------------------------------------------------------------------------------------
struct ArrayError {
  ArrayError(const char* n, double b) : name(n), bar(b) {}
  const char* name;
  double bar;
  double diff2 = 0.0, ref2 = 0.0, worst = -1.0, worst_got = 0.0, worst_ref = 0.0;
  std::string worst_where;
  int64_t nonfinite = 0;      // NaN/inf in the kernel's output where the reference is finite
  int64_t padding_bad = 0;    // padding entries that are not exactly +0
  void add(double got, double ref, bool padding, const std::string& where) {
    if (padding) {
      if (!(got == 0.0 && !std::signbit(got))) ++padding_bad;
      return;
    }
    if (!std::isfinite(got)) {
      ++nonfinite;
      return;
    }
    diff2 += (got - ref) * (got - ref);
    ref2 += ref * ref;
    if (std::fabs(got - ref) > worst) {
      worst = std::fabs(got - ref);
      worst_got = got;
      worst_ref = ref;
      worst_where = where;
    }
  }
  double rel() const { return ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2); }
  std::string str() const {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%-5s rel_l2 %.3e (bar %.1e), worst |diff| %.3e at %s (got %.6g, ref %.6g)", name,
                  rel(), bar, worst, worst_where.c_str(), worst_got, worst_ref);
    return buf;
  }
};

double bf16_at(const unsigned char* base, size_t off_bytes) {
  uint16_t bits;
  std::memcpy(&bits, base + off_bytes, 2);
  return cpu::bf16_to_float(bits);
}
double f16_at(const unsigned char* base, size_t off_bytes) {
  uint16_t bits;
  std::memcpy(&bits, base + off_bytes, 2);
  return cpu::fp16_to_float(bits);
}
// An element of the block arrays Qt, W, Kh, M: bf16, or fp16 on an fp16 block (f16_block).
double block_at(const unsigned char* base, size_t off_bytes, bool f16) {
  return f16 ? f16_at(base, off_bytes) : bf16_at(base, off_bytes);
}
double f32_at(const unsigned char* base, size_t off_bytes) {
  float f;
  std::memcpy(&f, base + off_bytes, 4);
  return f;
}

// ------------------------------------------------------------------------------------------
// One run: plan + prep on the device, everything compared with the reference.
// ------------------------------------------------------------------------------------------
struct PrepRun {
  pf::WorkspacePlan w{};
  std::vector<unsigned char> workspace;  // device workspace after the run
};

// Runs plan + prep for params `p` (device pointers) into a poisoned workspace; f16: fp16 blocks.
void run_device(const PrefillParams& p, PrepRun& run, bool f16 = false) {
  run.w = pf::make_workspace_plan(p.batch, p.seqlen, p.num_seqs, p.cu_seqlens != nullptr, p.num_v_heads);
  run.w.f16_block = f16;
  void* ws = nullptr;
  CUDA_OK(cudaMalloc(&ws, run.w.total_bytes));
  CUDA_OK(cudaMemset(ws, kPoison, run.w.total_bytes));
  const Status plan = pf::launch_prefill_plan(p, run.w, ws, nullptr);
  ASSERT_TRUE(plan.ok()) << plan.message();
  const Status prep = pf::launch_prefill_prep(p, run.w, ws, nullptr);
  ASSERT_TRUE(prep.ok()) << prep.message();
  CUDA_OK(cudaDeviceSynchronize());
  run.workspace.resize(run.w.total_bytes);
  CUDA_OK(cudaMemcpy(run.workspace.data(), ws, run.w.total_bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(ws));
}

struct PrepErrors {
  ArrayError qt{"Qt", 6e-3}, w{"W", 1e-2}, kh{"Kh", 6e-3}, m{"M", 1e-2}, u0{"U0", 6e-3}, decay{"decay", 1e-5};
  // Kh hi + lo against the float64 Kh: the fp32 gate sums and exponentials, not bf16, set it.
  ArrayError kh2{"Kh+lo", 1e-4};
  // fp16 blocks: Qt and Kh hold 11 significant bits (bf16: 8), so their bars are 6x tighter; W
  // and M keep theirs (their error is prep's products').
  explicit PrepErrors(bool f16) {
    if (f16) qt.bar = kh.bar = 1e-3;
  }
};

// Runs case `c` on tensors `t` with the current prep variant and compares the whole workspace
// with the reference; f16: fp16 blocks (Qt, W, Kh, M in fp16, Kh lo left unwritten).
void check_tensors_once(const PrefillCase& c, PrefillTensors& t, bool check_twice, bool f16) {
  SCOPED_TRACE(c.name + (f16 ? ", fp16 block" : ", bf16 block"));
  DeviceCase dev;
  PrefillPointers dptr = map_pointers(t, [&](HostTensor& x) { return dev.upload(x); });
  const PrefillParams p = fill_prefill_params(c, t, dptr);
  PrepRun run;
  run_device(p, run, f16);
  if (::testing::Test::HasFatalFailure()) return;

  // Plan region, exactly.
  const PrefillParams hp = fill_prefill_params(c, t, host_pointers(t));
  const RefPlan rp = reference_plan(hp, run.w);
  const unsigned char* ws = run.workspace.data();
  const int64_t N = p.num_seqs;
  for (int64_t n = 0; n <= N; ++n) {
    int32_t got;
    std::memcpy(&got, ws + run.w.chunk_offsets_offset + 4 * n, 4);
    ASSERT_EQ(got, rp.chunk_offsets[size_t(n)]) << "chunk_offsets[" << n << "]";
  }
  for (int64_t n = 0; n < N; ++n) {
    int64_t start;
    int32_t len;
    std::memcpy(&start, ws + run.w.seq_start_offset + 8 * n, 8);
    std::memcpy(&len, ws + run.w.seq_len_offset + 4 * n, 4);
    ASSERT_EQ(start, rp.seq_start[size_t(n)]) << "seq_start[" << n << "]";
    ASSERT_EQ(len, rp.seq_len[size_t(n)]) << "seq_len[" << n << "]";
    int32_t order;
    std::memcpy(&order, ws + run.w.seq_order_offset + 4 * n, 4);
    ASSERT_EQ(order, rp.seq_order[size_t(n)]) << "seq_order[" << n << "]";
  }
  for (int64_t ch = 0; ch < run.w.max_chunks; ++ch) {
    int32_t got;
    std::memcpy(&got, ws + run.w.chunk_seq_offset + 4 * ch, 4);
    ASSERT_EQ(got, rp.chunk_seq[size_t(ch)]) << "chunk_seq[" << ch << "]";
  }

  // Chunk blocks.
  const cpu::KdaProblem prob = cpu::make_problem(hp);
  PrepErrors err(f16);
  const int HV = c.HV;
  int64_t kh_lo_written = 0;
  for (int64_t ch = 0; ch < rp.total; ++ch) {
    const int32_t n = rp.chunk_seq[size_t(ch)];
    const int j = int(ch - rp.chunk_offsets[size_t(n)]);
    const int len = std::min<int>(kC, rp.seq_len[size_t(n)] - j * kC);
    const int64_t tok0 = rp.seq_start[size_t(n)] + int64_t(j) * kC;
    const int64_t row = c.packed() ? 0 : n;
    for (int h = 0; h < HV; ++h) {
      const RefBlock ref = reference_block(prob, row, tok0, len, h, p.scale);
      const unsigned char* blk = ws + run.w.chunk_blocks_offset + (size_t(ch) * HV + h) * pf::kChunkBlockBytes;
      const std::string at = "chunk " + std::to_string(ch) + " head " + std::to_string(h);
      for (int r = 0; r < kC; ++r) {
        const bool pad_row = r >= len;
        for (int i = 0; i < kD; ++i) {
          const size_t e = size_t(r) * kD + i;
          const std::string where = at + " [" + std::to_string(r) + ", " + std::to_string(i) + "]";
          err.qt.add(block_at(blk, Layout::kQtOffset + 2 * e, f16), ref.qt[e], pad_row, where);
          err.w.add(block_at(blk, Layout::kWOffset + 2 * e, f16), ref.w[e], pad_row, where);
          err.kh.add(block_at(blk, Layout::kKhOffset + 2 * e, f16), ref.kh[e], pad_row, where);
          if (!f16) {
            err.kh2.add(bf16_at(blk, Layout::kKhOffset + 2 * e) + bf16_at(blk, Layout::kKhLoOffset + 2 * e), ref.kh[e],
                        pad_row, where);
          } else {
            kh_lo_written += blk[Layout::kKhLoOffset + 2 * e] != kPoison || blk[Layout::kKhLoOffset + 2 * e + 1] != kPoison;
          }
          err.u0.add(f32_at(blk, Layout::kU0Offset + 4 * e), ref.u0[e], pad_row, where);
        }
        for (int s = 0; s < kC; ++s) {
          const size_t e = size_t(r) * kC + s;
          err.m.add(block_at(blk, Layout::kMOffset + 2 * e, f16), ref.m[e], pad_row || s >= len,
                    at + " [" + std::to_string(r) + ", " + std::to_string(s) + "]");
        }
      }
      for (int i = 0; i < kD; ++i) {
        err.decay.add(f32_at(blk, Layout::kDecayOffset + 4 * size_t(i)), ref.decay[size_t(i)], false,
                      at + " [" + std::to_string(i) + "]");
      }
    }
  }
  // Blocks past the total: untouched.
  const size_t written_end = run.w.chunk_blocks_offset + size_t(rp.total) * HV * pf::kChunkBlockBytes;
  for (size_t b = written_end; b < run.w.total_bytes; ++b) {
    ASSERT_EQ(ws[b], kPoison) << "byte " << b - written_end << " past the chunk total was written";
  }
  EXPECT_EQ(kh_lo_written, 0) << "an fp16 block's Kh lo was written";
  for (const ArrayError* a : {&err.qt, &err.w, &err.kh, &err.kh2, &err.m, &err.u0, &err.decay}) {
    if (f16 && a == &err.kh2) continue;
    std::printf("    [%s] %s\n", c.name.c_str(), a->str().c_str());
    EXPECT_EQ(a->nonfinite, 0) << a->name << ": non-finite outputs";
    EXPECT_EQ(a->padding_bad, 0) << a->name << ": padding entries that are not +0";
    EXPECT_LE(a->rel(), a->bar) << a->str();
  }

  if (check_twice) {  // identical results run to run
    PrepRun again;
    run_device(p, again, f16);
    ASSERT_EQ(again.workspace.size(), run.workspace.size());
    EXPECT_EQ(std::memcmp(again.workspace.data(), run.workspace.data(), run.workspace.size()), 0)
        << "two runs differ";
  }
}

// Both block element types (the dispatcher takes fp16 for L2-normed inputs on 64- and 128-row
// recurrence CTAs, bf16 otherwise).
void check_tensors(const PrefillCase& c, PrefillTensors& t, bool check_twice = false) {
  for (const bool f16 : {false, true}) {
    check_tensors_once(c, t, check_twice, f16);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

void check_case(const PrefillCase& c, Rng& rng, bool check_twice = false) {
  SCOPED_TRACE(rng.trace());
  PrefillTensors t = make_prefill_tensors(c, rng);
  check_tensors(c, t, check_twice);
}

PrefillCase base_case(const std::string& name) {
  PrefillCase c;
  c.name = name;
  c.H = 2;
  c.HV = 2;
  c.K = kD;
  c.V = kD;
  c.initial = StateSource::kNone;
  c.final_state = StateSource::kNone;
  c.dtype_g = DType::kBFloat16;
  c.dtype_beta = DType::kBFloat16;
  return c;
}

// One sequence with a precomputed fp32 gate, which the wide-span tests below write by hand.
PrefillCase precomputed_gate_case(const std::string& name, int64_t seqlen) {
  PrefillCase c = base_case(name);
  c.batch = 1;
  c.seqlen = seqlen;
  c.gate = GateMode::kPrecomputed;
  c.dtype_g = DType::kFloat32;
  return c;
}

class PrefillPrep : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_device()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(PrefillPrep, FixedLowerBoundOddLength) {
  Rng rng = make_rng();
  PrefillCase c = base_case("fixed_lower_bound_T200");
  c.batch = 2;
  c.seqlen = 200;
  check_case(c, rng, /*check_twice=*/true);
}

TEST_F(PrefillPrep, PackedSoftplusGvaEmptyAndTail) {
  Rng rng = make_rng();
  PrefillCase c = base_case("packed_softplus_gva");
  c.seq_lens = {70, 0, 1, 129, 0, 64, 5};
  c.tail = 37;
  c.gate = GateMode::kSoftplus;
  c.H = 1;
  c.HV = 3;
  c.dtype_g = DType::kFloat32;
  c.dtype_beta = DType::kFloat32;
  c.dtype_cu = DType::kInt64;
  check_case(c, rng);
}

TEST_F(PrefillPrep, PrecomputedPaddedViewsNoNormNoSigmoid) {
  Rng rng = make_rng();
  PrefillCase c = base_case("precomputed_padded");
  c.batch = 3;
  c.seqlen = 77;
  c.gate = GateMode::kPrecomputed;
  c.l2norm = false;
  c.beta_sigmoid = false;
  c.pad = 8;
  c.dtype_g = DType::kFloat32;
  check_case(c, rng);
}

TEST_F(PrefillPrep, ScalarGateLowerBoundNoALogNoBias) {
  Rng rng = make_rng();
  PrefillCase c = base_case("gdn_lower_bound");
  c.seq_lens = {100, 33, 64};
  c.scalar_gate = true;
  c.has_A_log = false;
  c.has_dt_bias = false;
  c.lower_bound = -2.5f;
  check_case(c, rng);
}

TEST_F(PrefillPrep, ScalarGateSoftplusNegEigval) {
  Rng rng = make_rng();
  PrefillCase c = base_case("gdn_softplus_neg_eigval");
  c.batch = 1;
  c.seqlen = 150;
  c.scalar_gate = true;
  c.gate = GateMode::kSoftplus;
  c.neg_eigval = true;
  c.H = 2;
  c.HV = 4;
  check_case(c, rng);
}

TEST_F(PrefillPrep, ManyShortSequences) {
  Rng rng = make_rng();
  PrefillCase c = base_case("short_sequences");
  for (int i = 0; i < 40; ++i) c.seq_lens.push_back(rng.integer(0, 20));
  c.tail = 3;
  c.dtype_cu = DType::kInt32;
  check_case(c, rng);
}

// Gates that decay by far more than 133 nats within 16 tokens on some channels: the diagonal
// tiles take the per-element path there. Without it the midpoint factors would overflow.
TEST_F(PrefillPrep, WideSpanPrecomputedGate) {
  Rng rng = make_rng();
  PrefillCase c = precomputed_gate_case("wide_span_precomputed", 130);
  SCOPED_TRACE(rng.trace());
  PrefillTensors t = make_prefill_tensors(c, rng);
  // Most channels mild, about 15% very steep (10-60 nats per token), 15% moderately steep.
  std::vector<double> rate(size_t(c.HV) * kD);
  for (double& x : rate) {
    const double u = rng.uniform(0.0, 1.0);
    x = u < 0.15 ? rng.uniform(10.0, 60.0) : (u < 0.3 ? rng.uniform(3.0, 9.0) : rng.uniform(0.0, 0.5));
  }
  for (int64_t tt = 0; tt < c.seqlen; ++tt) {
    for (int h = 0; h < c.HV; ++h) {
      for (int i = 0; i < kD; ++i) t.g.set_at({0, tt, h, i}, -rate[size_t(h) * kD + i] * rng.uniform(0.5, 1.5));
    }
  }
  check_tensors(c, t);
}

// Spans of 180 to 230 (base 2) per 16-row sub-block on half the channels (the others mild, so
// that the chunk decay, which underflows fp32 on the steep ones, keeps a measurable norm): with
// the in-kernel L2 norm, spans up to 216 take the midpoint factors (up to 2^108) and wider ones
// the per-element path; without it the bound is 192 (config.h, max_diag_span). Against float64.
TEST_F(PrefillPrep, SpansAroundTheDiagonalBound) {
  for (const bool l2norm : {true, false}) {
    SCOPED_TRACE(l2norm ? "q/k L2 norm in kernel" : "no L2 norm");
    Rng rng = make_rng();
    PrefillCase c = precomputed_gate_case(l2norm ? "spans_180_230_l2norm" : "spans_180_230_raw", 150);
    c.l2norm = l2norm;
    SCOPED_TRACE(rng.trace());
    PrefillTensors t = make_prefill_tensors(c, rng);
    std::vector<double> rate(size_t(c.HV) * kD);  // nats per token: span = 16 rate log2(e)
    for (double& x : rate) {
      x = rng.uniform(0.0, 1.0) < 0.5 ? rng.uniform(180.0, 230.0) / (16.0 * 1.4426950408889634) : rng.uniform(0.0, 0.5);
    }
    for (int64_t tt = 0; tt < c.seqlen; ++tt) {
      for (int h = 0; h < c.HV; ++h) {
        for (int i = 0; i < kD; ++i) t.g.set_at({0, tt, h, i}, -rate[size_t(h) * kD + i]);
      }
    }
    check_tensors(c, t);
    if (HasFatalFailure()) return;
  }
}

// Wide-span (sub-block, channel) pairs placed by hand: channels in all four 32-channel mask words
// (the channel-major scratch is indexed by channel), some wide in every sub-block and some only
// in the first two or three (per-sub-block lists of different lengths), and a partial last
// chunk. Steep channels decay by 20-40 nats per token, the others by at most 0.5. Full chunks of
// head h hold 4 x 1 = 4, 4 x 6 + 2 = 26, 4 x 6 + 3 = 27 and 4 x 4 = 16 pairs.
TEST_F(PrefillPrep, WideSpanPairsPlacedByHand) {
  Rng rng = make_rng();
  // two full chunks and one of 22 rows (sub-blocks 0 and part of 1)
  PrefillCase c = precomputed_gate_case("wide_pairs_by_hand", 150);
  c.HV = 4;
  c.H = 4;
  SCOPED_TRACE(rng.trace());
  PrefillTensors t = make_prefill_tensors(c, rng);
  // per head: channels steep in every sub-block, and one more steep in its first `extra` sub-blocks
  const std::vector<std::vector<int>> steep = {{77}, {0, 31, 32, 64, 100, 127}, {3, 40, 41, 90, 96, 126}, {5, 37, 70, 101}};
  const int extra_channel[4] = {-1, 50, 12, 1};
  const int extra_subblocks[4] = {0, 2, 3, 0};
  for (int64_t tt = 0; tt < c.seqlen; ++tt) {
    const int sub = int(tt % 64) / 16;
    for (int h = 0; h < c.HV; ++h) {
      for (int i = 0; i < kD; ++i) {
        bool is_steep = std::find(steep[size_t(h)].begin(), steep[size_t(h)].end(), i) != steep[size_t(h)].end();
        is_steep = is_steep || (i == extra_channel[h] && sub < extra_subblocks[h]);
        t.g.set_at({0, tt, h, i}, is_steep ? -rng.uniform(20.0, 40.0) : -rng.uniform(0.0, 0.5));
      }
    }
  }
  check_tensors(c, t);
}

// Wide spans made of one steep 8-row half or two moderate ones, per (sub-block, channel) at
// random: a wide channel whose first half spans at most the bound keeps that half's columns in
// the product (against the half's midpoint) and sums the second-half quadrant per element; one
// steep within its first half sums the whole diagonal tile per element (kernel.cuh, phase 3).
// Patterns (base-2 spans of the two halves): mild; first half steep (300-400, the whole tile per
// element); second half steep (mild first half); both 95-120 (wide at both bounds, front list);
// first half just under or over the bound (+-12) with a mild second half. Both bounds (with and
// without the L2 norm), a partial last chunk. Against float64.
TEST_F(PrefillPrep, WideSpansFromEightRowHalves) {
  for (const bool l2norm : {true, false}) {
    SCOPED_TRACE(l2norm ? "q/k L2 norm in kernel" : "no L2 norm");
    Rng rng = make_rng();
    PrefillCase c = precomputed_gate_case(l2norm ? "half_spans_l2norm" : "half_spans_raw", 180);
    c.l2norm = l2norm;
    c.HV = 3;
    c.H = 3;
    SCOPED_TRACE(rng.trace());
    PrefillTensors t = make_prefill_tensors(c, rng);
    const double bound = l2norm ? 216.0 : 192.0;
    const double per_token = 1.0 / (8.0 * 1.4426950408889634);  // nats per token of a base-2 half span of 1
    const int64_t blocks = (c.seqlen + 15) / 16;
    std::vector<double> span(size_t(blocks) * size_t(c.HV) * kD * 2);  // [block][h][channel][half]
    for (size_t b = 0; b < span.size() / 2; ++b) {
      const double u = rng.uniform(0.0, 1.0);
      double s0 = rng.uniform(0.0, 4.0), s1 = rng.uniform(0.0, 4.0);
      if (u < 0.1) s0 = rng.uniform(300.0, 400.0);
      else if (u < 0.2) s1 = rng.uniform(300.0, 400.0);
      else if (u < 0.3) s0 = rng.uniform(95.0, 120.0), s1 = rng.uniform(95.0, 120.0);
      else if (u < 0.35) s0 = bound - rng.uniform(1.0, 12.0);
      else if (u < 0.4) s0 = bound + rng.uniform(1.0, 12.0);
      span[2 * b] = s0;
      span[2 * b + 1] = s1;
    }
    for (int64_t tt = 0; tt < c.seqlen; ++tt) {
      const size_t blk = size_t(tt / 16), half = size_t((tt % 16) / 8);
      for (int h = 0; h < c.HV; ++h) {
        for (int i = 0; i < kD; ++i) {
          const double s = span[2 * ((blk * size_t(c.HV) + size_t(h)) * kD + size_t(i)) + half];
          t.g.set_at({0, tt, h, i}, -s * per_token * rng.uniform(0.9, 1.1));
        }
      }
    }
    check_tensors(c, t);
    if (HasFatalFailure()) return;
  }
}

// Softplus with steep heads (exp(A_log) up to 40): the realistic route to wide spans.
TEST_F(PrefillPrep, SteepSoftplusHeads) {
  Rng rng = make_rng();
  PrefillCase c = base_case("steep_softplus");
  c.seq_lens = {97, 64, 31};
  c.gate = GateMode::kSoftplus;
  c.HV = 4;
  c.H = 4;
  SCOPED_TRACE(rng.trace());
  PrefillTensors t = make_prefill_tensors(c, rng);
  for (int h = 0; h < c.HV; ++h) t.A_log.set(h, h < 2 ? rng.uniform(2.5, 3.7) : rng.uniform(-1.0, 0.5));
  check_tensors(c, t);
}

// cu_seqlens that break the contract (decreasing, past T, negative): the plan clamps them into
// a running maximum over [0, T]; every chunk it produces is computed from in-range tokens.
TEST_F(PrefillPrep, BadCuSeqlensAreClamped) {
  Rng rng = make_rng();
  PrefillCase c = base_case("bad_cu_seqlens");
  c.seq_lens = {50, 90, 10, 40};
  c.tail = 10;
  PrefillTensors t = make_prefill_tensors(c, rng);
  const int64_t T = c.tokens_per_row();
  const double bad[5] = {-7.0, 120.0, 60.0, double(T + 500), 30.0};
  for (int m = 0; m < 5; ++m) t.cu_seqlens.set(m, bad[m]);
  DeviceCase dev;
  PrefillPointers dptr = map_pointers(t, [&](HostTensor& x) { return dev.upload(x); });
  const PrefillParams p = fill_prefill_params(c, t, dptr);
  PrepRun run;
  run_device(p, run);
  if (HasFatalFailure()) return;
  const PrefillParams hp = fill_prefill_params(c, t, host_pointers(t));
  const RefPlan rp = reference_plan(hp, run.w);
  EXPECT_EQ(rp.seq_start, (std::vector<int64_t>{0, 120, 120, T}));
  EXPECT_EQ(rp.seq_len, (std::vector<int32_t>{120, 0, int32_t(T - 120), 0}));
  for (int64_t n = 0; n <= p.num_seqs; ++n) {
    int32_t got;
    std::memcpy(&got, run.workspace.data() + run.w.chunk_offsets_offset + 4 * n, 4);
    EXPECT_EQ(got, rp.chunk_offsets[size_t(n)]) << "chunk_offsets[" << n << "]";
  }
  for (int64_t n = 0; n < p.num_seqs; ++n) {
    int64_t start;
    std::memcpy(&start, run.workspace.data() + run.w.seq_start_offset + 8 * n, 8);
    EXPECT_EQ(start, rp.seq_start[size_t(n)]);
  }
}

TEST_F(PrefillPrep, UnsupportedShapesAndLayoutsAreRejected) {
  Rng rng = make_rng();
  PrefillCase c = base_case("unsupported");
  c.batch = 1;
  c.seqlen = 64;
  PrefillTensors t = make_prefill_tensors(c, rng);
  DeviceCase dev;
  PrefillPointers dptr = map_pointers(t, [&](HostTensor& x) { return dev.upload(x); });
  const PrefillParams good = fill_prefill_params(c, t, dptr);
  const pf::WorkspacePlan w = pf::make_workspace_plan(1, 64, 1, false, c.HV);
  void* ws = nullptr;
  CUDA_OK(cudaMalloc(&ws, w.total_bytes));
  struct Mutation {
    const char* what;
    void (*apply)(PrefillParams&);
  };
  const Mutation mutations[] = {
      {"K = 64", [](PrefillParams& p) { p.head_dim_k = p.head_dim_v = 64; }},
      {"fp16 q/k/v", [](PrefillParams& p) { p.dtype_qkv = DType::kFloat16; }},
      {"fp16 g", [](PrefillParams& p) { p.dtype_g = DType::kFloat16; }},
      {"odd token stride", [](PrefillParams& p) { p.stride_q_t += 1; }},
      {"misaligned v", [](PrefillParams& p) { p.v = static_cast<const char*>(p.v) + 2; }},
      // the kernel derives a fixed batch's rows from T as int32 (nothing is read: rejected first)
      {"2^31 tokens per row", [](PrefillParams& p) { p.seqlen = int64_t(INT32_MAX) + 1; }},
  };
  for (const Mutation& m : mutations) {
    PrefillParams p = good;
    m.apply(p);
    const Status s = pf::launch_prefill_prep(p, w, ws, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << m.what << ": " << s.message();
    std::printf("    [unsupported] %s -> %s\n", m.what, s.message().c_str());
  }
  CUDA_OK(cudaFree(ws));
}

// ------------------------------------------------------------------------------------------
// Timing of the prep kernel alone (disabled by default: --gtest_also_run_disabled_tests).
// ------------------------------------------------------------------------------------------
// Uniform bf16 values in [lo, hi) from a xorshift generator (fast enough for 10^8 elements).
void fill_bf16(std::vector<uint16_t>& x, uint64_t& state, float lo, float hi) {
  for (auto& e : x) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const float u = float(state >> 40) * (1.0f / 16777216.0f);
    e = cpu::bf16_from_float(lo + (hi - lo) * u);
  }
}

void time_prep(int32_t H, int64_t T, GateMode gate) {
  const int64_t D = kD;
  uint64_t gen = 0x9e3779b97f4a7c15ull;
  std::vector<uint16_t> qk(size_t(T * H * D)), g(size_t(T * H * D)), beta(size_t(T * H));
  void *dq, *dk, *dv, *dg, *dbeta, *dalog, *ddt;
  auto up = [&](void** d, const void* src, size_t bytes) {
    ASSERT_EQ(cudaMalloc(d, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(*d, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  };
  fill_bf16(qk, gen, -1.f, 1.f);
  up(&dq, qk.data(), qk.size() * 2);
  fill_bf16(qk, gen, -1.f, 1.f);
  up(&dk, qk.data(), qk.size() * 2);
  fill_bf16(qk, gen, -1.f, 1.f);
  up(&dv, qk.data(), qk.size() * 2);
  fill_bf16(g, gen, -4.f, 4.f);
  up(&dg, g.data(), g.size() * 2);
  fill_bf16(beta, gen, -4.f, 4.f);
  up(&dbeta, beta.data(), beta.size() * 2);
  std::vector<float> alog(size_t(H), 0.f), dt(size_t(H * D), 0.1f);
  up(&dalog, alog.data(), alog.size() * 4);
  up(&ddt, dt.data(), dt.size() * 4);
  const PrefillParams p{
      .batch = 1, .seqlen = T, .num_seqs = 1, .num_qk_heads = H, .num_v_heads = H, .head_dim_k = kD, .head_dim_v = kD,
      .q = dq, .k = dk, .v = dv, .g = dg, .beta = dbeta, .A_log = static_cast<const float*>(dalog),
      .dt_bias = static_cast<const float*>(ddt),
      .stride_q_b = T * H * D, .stride_q_t = H * D, .stride_q_h = D,
      .stride_k_b = T * H * D, .stride_k_t = H * D, .stride_k_h = D,
      .stride_v_b = T * H * D, .stride_v_t = H * D, .stride_v_h = D,
      .stride_g_b = T * H * D, .stride_g_t = H * D, .stride_g_h = D,
      .stride_beta_b = T * H, .stride_beta_t = H, .stride_beta_h = 1,
      .dtype_qkv = DType::kBFloat16, .dtype_g = DType::kBFloat16, .dtype_beta = DType::kBFloat16,
      .gate = gate, .scale = float(1.0 / std::sqrt(double(kD))), .lower_bound = -5.f,
      .use_qk_l2norm = true, .use_beta_sigmoid = true,
  };
  const pf::WorkspacePlan w = pf::make_workspace_plan(1, T, 1, false, H);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, w.total_bytes), cudaSuccess);
  ASSERT_TRUE(pf::launch_prefill_plan(p, w, ws, nullptr).ok());
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pf::launch_prefill_prep(p, w, ws, nullptr).ok());
  std::vector<float> ms;
  for (int i = 0; i < 30; ++i) {
    cudaEventRecord(start);
    ASSERT_TRUE(pf::launch_prefill_prep(p, w, ws, nullptr).ok());
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float x = 0.f;
    cudaEventElapsedTime(&x, start, stop);
    ms.push_back(x);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const int64_t chunks = (T + kC - 1) / kC;
  const double bytes = double(T) * H * D * 2 * 4 + double(T) * H * 2 + double(chunks) * H * pf::kChunkBlockBytes;
  std::printf("PREP_TIMING H=%d T=%lld gate=%s: median %.4f ms (min %.4f), %.2f GB moved, %.2f TB/s\n", H,
              (long long)T, to_string(gate), med, ms.front(), bytes / 1e9, bytes / (med * 1e-3) / 1e12);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (void* d : {dq, dk, dv, dg, dbeta, dalog, ddt, ws}) cudaFree(d);
}

TEST_F(PrefillPrep, DISABLED_Timing) {
  time_prep(96, 8192, GateMode::kLowerBound);
  time_prep(32, 8192, GateMode::kLowerBound);
  time_prep(32, 8192, GateMode::kSoftplus);
}

// One shape only, for profiling runs (ncu --launch-skip).
TEST_F(PrefillPrep, DISABLED_TimingH96) { time_prep(96, 8192, GateMode::kLowerBound); }

}  // namespace
}  // namespace kdakit::testing
