// Times the prep kernel alone and the whole chunked prefill (sm90::run_prefill: plan + prep +
// recurrence) on random bf16 inputs. Not a test: a tool for device runs.
// Usage: prefill_prep_timing [repeats] [cases]
//   cases: comma-separated substrings of case names (default: every case). Each case draws its
//   inputs from its own generator, seeded by its index, so a subset gets the same inputs as a
//   full run (the inputs take most of the run time: ~5 s for an H96 case).
// Output: one line per case, "PREP_TIMING case=NAME prep_ms=X prefill_ms=Y pairs=P".
// The case "H1 fixed 8448" has 132 (chunk, head) pairs, one per SM of an H200: its prep time is
// about the latency of one CTA (plus the launch), the figure a fused prep + recurrence needs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/dtype.h"
#include "cuda/sm90/prefill/dispatch.h"
#include "cuda/sm90/prefill/prep/config.h"
#include "cuda/sm90/prefill/prep/launch.h"
#include "cuda/sm90/prefill/workspace.h"

namespace {

namespace pf = kdakit::sm90::prefill;

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

struct Case {
  std::string name;
  int HV;
  std::vector<int> lens;  // packed (cu_seqlens) when fixed_T == 0
  int64_t fixed_T;
  kdakit::GateMode gate;
  // exp(A_log) per head: 1 for every head, or spread over [1, 8) (steep heads send part of the
  // CTAs through the prep kernel's per-element path for wide-span channels).
  bool steep_heads = false;
  // The Python benchmark's distributions (kdakit.testing.generate): q, k, v, g, beta N(0, 1),
  // dt_bias N(0, 0.5) per channel, A_log = log U(1, 8) per head. Its per-channel dt_bias makes a
  // few channels of a steep head wide in most of their sub-blocks; the steep rows' uniform g and
  // constant dt_bias make most channels of the steepest heads wide. Counted on the CPU by
  // tools/prep_wide_pairs.py for H32 T = 8192 (three seeds): CTAs with a wide pair 44-57% against
  // 55%, median pairs per such CTA 13-21 against 91-93 (of 512); the plain softplus row has none.
  bool benchmark_inputs = false;
};

// Uniform in [0, 1) from a xorshift generator (fast enough for 10^8 elements).
float next_uniform(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return float(state >> 40) * (1.0f / 16777216.0f);
}

// Uniform bf16 in [lo, hi).
void fill_bf16(std::vector<uint16_t>& x, uint64_t& state, float lo, float hi) {
  for (auto& e : x) e = kdakit::cpu::bf16_from_float(lo + (hi - lo) * next_uniform(state));
}

// Standard normal from the same generator (Box-Muller over two uniforms; u1 in (0, 1]).
float next_normal(uint64_t& state) {
  const float u1 = 1.f - next_uniform(state), u2 = next_uniform(state);
  return std::sqrt(-2.f * std::log(u1)) * std::cos(6.2831853f * u2);
}
void fill_bf16_normal(std::vector<uint16_t>& x, uint64_t& state) {
  for (auto& e : x) e = kdakit::cpu::bf16_from_float(next_normal(state));
}

void* upload(const void* src, size_t bytes) {
  void* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, bytes));
  CHECK_CUDA(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

bool selected(const std::string& name, const char* spec) {
  if (spec == nullptr || *spec == '\0') return true;
  std::string list(spec);
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    const std::string key = list.substr(start, end - start);
    if (!key.empty() && name.find(key) != std::string::npos) return true;
    start = end + 1;
  }
  return false;
}

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
  const char* spec = argc > 2 ? argv[2] : nullptr;
  constexpr int D = pf::kHeadDim;
  auto rep = [](int len, int count) { return std::vector<int>(size_t(count), len); };
  const std::vector<Case> cases = {
      {"H96_fixed_8192", 96, {8192}, 8192, kdakit::GateMode::kLowerBound},
      {"H96_1024x8", 96, rep(1024, 8), 0, kdakit::GateMode::kLowerBound},
      {"H32_fixed_8192", 32, {8192}, 8192, kdakit::GateMode::kLowerBound},
      {"H32_1024x8", 32, rep(1024, 8), 0, kdakit::GateMode::kLowerBound},
      {"H32_fixed_8192_softplus", 32, {8192}, 8192, kdakit::GateMode::kSoftplus},
      {"H32_fixed_8192_softplus_steep", 32, {8192}, 8192, kdakit::GateMode::kSoftplus, true},
      {"H1_fixed_8448", 1, {8448}, 8448, kdakit::GateMode::kLowerBound},
      {"H32_fixed_8192_softplus_bench", 32, {8192}, 8192, kdakit::GateMode::kSoftplus, false, true},
      {"H32_1024x8_softplus_bench", 32, rep(1024, 8), 0, kdakit::GateMode::kSoftplus, false, true},
      {"H32_fixed_8192_bench", 32, {8192}, 8192, kdakit::GateMode::kLowerBound, false, true},
      // Few heads (issue 6): 2,048 (chunk, head) pairs each, ~7.8 waves of 264 CTAs, against
      // H96 fixed's ~47. One sequence of 32K tokens as a fixed batch and packed. In the packed
      // case prep_ms runs the plan kernel and the plan-reading prep. prefill_ms is the
      // dispatcher's call, which for one packed sequence reads cu_seqlens in prep
      // (PrepParams::single_cu), as the benchmark's row does.
      {"H4_fixed_32768", 4, {32768}, 32768, kdakit::GateMode::kLowerBound},
      {"H4_packed_32768", 4, {32768}, 0, kdakit::GateMode::kLowerBound},
      {"H16_fixed_8192", 16, {8192}, 8192, kdakit::GateMode::kLowerBound},
  };
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t t0, t1;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    if (!selected(c.name, spec)) continue;
    uint64_t gen = 0x9e3779b97f4a7c15ull * (ci + 1);
    const bool packed = c.fixed_T == 0;
    int64_t T = 0;
    for (int l : c.lens) T += l;
    const int64_t N = int64_t(c.lens.size());
    const size_t tok = size_t(T);
    std::vector<uint16_t> x(tok * c.HV * D), beta(tok * c.HV);
    auto fill = [&](std::vector<uint16_t>& y, float lo, float hi) {
      if (c.benchmark_inputs) {
        fill_bf16_normal(y, gen);
      } else {
        fill_bf16(y, gen, lo, hi);
      }
    };
    fill(x, -1.f, 1.f);
    void* q = upload(x.data(), x.size() * 2);
    fill(x, -1.f, 1.f);
    void* k = upload(x.data(), x.size() * 2);
    fill(x, -1.f, 1.f);
    void* v = upload(x.data(), x.size() * 2);
    fill(x, -4.f, 4.f);
    void* g = upload(x.data(), x.size() * 2);
    fill(beta, -4.f, 4.f);
    void* b = upload(beta.data(), beta.size() * 2);
    std::vector<float> alog(size_t(c.HV), 0.f), dt(size_t(c.HV) * D, 0.1f);
    if (c.steep_heads) {
      for (int h = 0; h < c.HV; ++h) alog[size_t(h)] = std::log(1.f + 7.f * (float(h) + 0.5f) / float(c.HV));
    }
    if (c.benchmark_inputs) {
      for (auto& a : alog) a = std::log(1.f + 7.f * next_uniform(gen));
      for (auto& d : dt) d = 0.5f * next_normal(gen);
    }
    void* dalog = upload(alog.data(), alog.size() * 4);
    void* ddt = upload(dt.data(), dt.size() * 4);
    std::vector<int32_t> cu(size_t(N + 1), 0);
    for (int64_t n = 0; n < N; ++n) cu[n + 1] = cu[n] + c.lens[n];
    void* dcu = upload(cu.data(), cu.size() * 4);
    void *o = nullptr, *state = nullptr;
    CHECK_CUDA(cudaMalloc(&o, tok * c.HV * D * 2));
    CHECK_CUDA(cudaMalloc(&state, size_t(N) * c.HV * D * D * 4));
    CHECK_CUDA(cudaMemset(state, 0, size_t(N) * c.HV * D * D * 4));

    kdakit::PrefillParams p{};
    p.batch = 1;
    p.seqlen = T;
    p.num_seqs = N;
    p.num_state_slots = N;
    p.num_qk_heads = c.HV;
    p.num_v_heads = c.HV;
    p.head_dim_k = p.head_dim_v = D;
    p.q = q;
    p.k = k;
    p.v = v;
    p.g = g;
    p.beta = b;
    p.A_log = static_cast<const float*>(dalog);
    p.dt_bias = static_cast<const float*>(ddt);
    p.cu_seqlens = packed ? dcu : nullptr;
    p.dtype_cu_seqlens = kdakit::DType::kInt32;
    p.o = o;
    p.initial_state = state;
    p.final_state = state;
    p.stride_initial_state_n = p.stride_final_state_n = int64_t(c.HV) * D * D;
    p.dtype_state = kdakit::DType::kFloat32;
    p.stride_q_h = p.stride_k_h = p.stride_v_h = p.stride_g_h = p.stride_o_h = D;
    p.stride_q_t = p.stride_k_t = p.stride_v_t = p.stride_g_t = p.stride_o_t = int64_t(c.HV) * D;
    p.stride_q_b = p.stride_k_b = p.stride_v_b = p.stride_g_b = p.stride_o_b = p.stride_q_t * T;
    p.stride_beta_h = 1;
    p.stride_beta_t = c.HV;
    p.stride_beta_b = int64_t(c.HV) * T;
    p.dtype_qkv = p.dtype_g = p.dtype_beta = kdakit::DType::kBFloat16;
    p.gate = c.gate;
    p.lower_bound = -5.f;
    p.scale = float(1.0 / std::sqrt(double(D)));
    p.use_qk_l2norm = p.use_beta_sigmoid = true;
    const size_t ws_bytes = kdakit::sm90::prefill_workspace_size(p);
    void* ws = nullptr;
    CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    p.workspace = ws;
    p.workspace_bytes = ws_bytes;
    pf::WorkspacePlan w = pf::make_workspace_plan(1, T, N, packed, c.HV);
    w.f16_block = kdakit::sm90::prefill_f16_block(p);  // the block type the whole call takes

    auto median_ms = [&](auto&& fn) -> double {
      for (int i = 0; i < 3; ++i) {
        const kdakit::Status s = fn();
        if (!s.ok()) {
          std::fprintf(stderr, "%s: %s\n", c.name.c_str(), s.message().c_str());
          std::exit(1);
        }
      }
      std::vector<float> ms;
      for (int i = 0; i < repeats; ++i) {
        CHECK_CUDA(cudaEventRecord(t0, stream));
        (void)fn();
        CHECK_CUDA(cudaEventRecord(t1, stream));
        CHECK_CUDA(cudaEventSynchronize(t1));
        float x = 0.f;
        CHECK_CUDA(cudaEventElapsedTime(&x, t0, t1));
        ms.push_back(x);
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    if (!pf::launch_prefill_plan(p, w, ws, stream).ok()) return 1;
    const double prep = median_ms([&] { return pf::launch_prefill_prep(p, w, ws, stream); });
    const double full = median_ms([&] { return kdakit::sm90::run_prefill(p, stream); });
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::printf("PREP_TIMING case=%s block=%s prep_ms=%.4f prefill_ms=%.4f pairs=%lld\n", c.name.c_str(),
                w.f16_block ? "f16" : "bf16", prep, full, (long long)(w.max_chunks * c.HV));
    std::fflush(stdout);
    for (void* ptr : {q, k, v, g, b, dalog, ddt, dcu, o, state, ws}) CHECK_CUDA(cudaFree(ptr));
  }
  return 0;
}
