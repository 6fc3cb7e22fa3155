// Times, on the TARGETS.md prefill shapes (not a test: a tool for the device runs):
//   - the recurrence kernel alone for each value-rows variant (the workspace holds a valid plan
//     region and zero chunk blocks; the MMA work does not depend on the values),
//   - the whole chunked prefill (sm90::run_prefill: plan + prep + recurrence) and the
//     token-serial path (sm90::run_recurrent_prefill) on zero bf16 inputs with the lower-bound
//     gate, q/k L2 norm and beta sigmoid, fp32 V-first state in place,
// so that the dispatcher's choices (value rows, chunked vs token-serial) rest on measurements.
// Usage: prefill_recurrence_timing [repeats]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90/decode/dispatch.h"
#include "cuda/sm90/prefill/dispatch.h"
#include "cuda/sm90/prefill/recurrence/launch.h"
#include "cuda/sm90/prefill/workspace.h"

namespace {

using namespace kdakit::sm90::prefill;

struct Shape {
  std::string name;
  int HV;
  std::vector<int> lens;  // packed when more than one
  int64_t fixed_T;        // > 0: fixed batch [1, T]
};

template <int kRows>
kdakit::Status launch(const kdakit::PrefillParams& p, const WorkspacePlan& plan, const void* ws, cudaStream_t s) {
  return launch_prefill_recurrence<kRows>(p, plan, ws, s);
}

kdakit::Status launch_rows(int rows, const kdakit::PrefillParams& p, const WorkspacePlan& plan, const void* ws,
                           cudaStream_t s) {
  switch (rows) {
    case 16: return launch<16>(p, plan, ws, s);
    case 32: return launch<32>(p, plan, ws, s);
    case 64: return launch<64>(p, plan, ws, s);
    default: return launch<128>(p, plan, ws, s);
  }
}

#define CHECK_CUDA(x)                                                              \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
  int num_sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  auto rep = [](int len, int count) { return std::vector<int>(size_t(count), len); };
  std::vector<Shape> shapes = {
      {"H96 fixed 8192", 96, {8192}, 8192},
      {"H96 mixed", 96, {1300, 547, 2048, 963, 271, 3063}, 0},
      {"H96 1024x8", 96, rep(1024, 8), 0},
      {"H96 512x16", 96, rep(512, 16), 0},
      {"H96 256x32", 96, rep(256, 32), 0},
      {"H96 64x128", 96, rep(64, 128), 0},
      {"H96 32x256", 96, rep(32, 256), 0},
      {"H96 16x512", 96, rep(16, 512), 0},
      {"H64 fixed 8192", 64, {8192}, 8192},
      {"H32 fixed 8192", 32, {8192}, 8192},
      {"H32 1024x8", 32, rep(1024, 8), 0},
      {"H4 fixed 32768", 4, {32768}, 32768},
      {"H8 fixed 32768", 8, {32768}, 32768},
      {"H16 fixed 32768", 16, {32768}, 32768},
  };
  {
    std::vector<int> l = {4096};
    for (int i = 0; i < 8; ++i) l.push_back(512);
    shapes.insert(shapes.begin() + 8, Shape{"H96 4096+8x512", 96, l, 0});
  }

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t t0, t1;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));
  std::printf("ms per call, median-free mean of %d; recurrence alone per value-rows variant, then the whole\n"
              "chunked prefill and the token-serial path on the same shape\n", repeats);
  std::printf("%-18s %6s %9s %9s %9s %9s %7s %10s %10s\n", "case", "pairs", "rows16", "rows32", "rows64", "rows128",
              "chosen", "prefill", "recurrent");
  for (const Shape& sh : shapes) {
    const bool packed = sh.fixed_T == 0;
    int64_t T = 0;
    for (int l : sh.lens) T += l;
    const int64_t N = int64_t(sh.lens.size());
    const WorkspacePlan plan = make_workspace_plan(packed ? 1 : N, packed ? T : sh.fixed_T, N, packed, sh.HV);
    std::vector<unsigned char> host(plan.chunk_blocks_offset, 0);
    auto* offs = reinterpret_cast<int32_t*>(&host[plan.chunk_offsets_offset]);
    auto* sstart = reinterpret_cast<int64_t*>(&host[plan.seq_start_offset]);
    auto* slen = reinterpret_cast<int32_t*>(&host[plan.seq_len_offset]);
    auto* order = reinterpret_cast<int32_t*>(&host[plan.seq_order_offset]);
    offs[0] = 0;
    int64_t start = 0;
    for (int64_t n = 0; n < N; ++n) {
      offs[n + 1] = offs[n] + (sh.lens[n] + kChunk - 1) / kChunk;
      sstart[n] = packed ? start : 0;
      slen[n] = sh.lens[n];
      order[n] = int32_t(n);
      start += sh.lens[n];
    }
    void* ws = nullptr;
    CHECK_CUDA(cudaMalloc(&ws, plan.total_bytes));
    CHECK_CUDA(cudaMemset(ws, 0, plan.total_bytes));
    CHECK_CUDA(cudaMemcpy(ws, host.data(), host.size(), cudaMemcpyHostToDevice));
    void *o = nullptr, *state = nullptr;
    CHECK_CUDA(cudaMalloc(&o, size_t(T) * sh.HV * kHeadDim * 2));
    CHECK_CUDA(cudaMalloc(&state, size_t(N) * sh.HV * kHeadDim * kHeadDim * 4));
    CHECK_CUDA(cudaMemset(state, 0, size_t(N) * sh.HV * kHeadDim * kHeadDim * 4));

    kdakit::PrefillParams p{};
    p.batch = packed ? 1 : N;
    p.seqlen = packed ? T : sh.fixed_T;
    p.num_seqs = N;
    p.num_state_slots = N;
    p.num_qk_heads = sh.HV;
    p.num_v_heads = sh.HV;
    p.head_dim_k = p.head_dim_v = kHeadDim;
    p.cu_seqlens = packed ? ws : nullptr;  // only its presence is read by this kernel
    p.o = o;
    p.stride_o_h = kHeadDim;
    p.stride_o_t = int64_t(sh.HV) * kHeadDim;
    p.stride_o_b = p.stride_o_t * p.seqlen;
    p.initial_state = state;
    p.final_state = state;
    p.stride_initial_state_n = p.stride_final_state_n = int64_t(sh.HV) * kHeadDim * kHeadDim;
    p.dtype_state = kdakit::DType::kFloat32;

    std::printf("%-18s %6lld", sh.name.c_str(), (long long)(N * sh.HV));
    auto time_ms = [&](auto&& fn) -> float {
      for (int w = 0; w < 2; ++w) {
        const kdakit::Status st = fn();
        if (!st.ok()) {
          std::printf(" [%s]", st.message().c_str());
          return -1.f;
        }
      }
      CHECK_CUDA(cudaEventRecord(t0, stream));
      for (int r = 0; r < repeats; ++r) (void)fn();
      CHECK_CUDA(cudaEventRecord(t1, stream));
      CHECK_CUDA(cudaEventSynchronize(t1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
      return ms / repeats;
    };
    for (int rows : {16, 32, 64, 128})
      std::printf(" %9.3f", time_ms([&] { return launch_rows(rows, p, plan, ws, stream); }));
    std::printf(" %7d", whole_sequences(p.batch, p.seqlen, N, p.cu_seqlens != nullptr, sh.HV, num_sms).rows);

    // ---- whole prefill and token-serial path on zero bf16 inputs
    const size_t tok = size_t(p.batch) * size_t(p.seqlen);
    void *q = nullptr, *v = nullptr, *g = nullptr, *beta = nullptr, *cu = nullptr, *dt = nullptr;
    CHECK_CUDA(cudaMalloc(&q, tok * sh.HV * kHeadDim * 2));
    CHECK_CUDA(cudaMalloc(&v, tok * sh.HV * kHeadDim * 2));
    CHECK_CUDA(cudaMalloc(&g, tok * sh.HV * kHeadDim * 2));
    CHECK_CUDA(cudaMalloc(&beta, tok * sh.HV * 2));
    CHECK_CUDA(cudaMalloc(&cu, size_t(N + 1) * 8));
    CHECK_CUDA(cudaMalloc(&dt, size_t(sh.HV) * kHeadDim * 4));
    CHECK_CUDA(cudaMemset(q, 0, tok * sh.HV * kHeadDim * 2));
    CHECK_CUDA(cudaMemset(v, 0, tok * sh.HV * kHeadDim * 2));
    CHECK_CUDA(cudaMemset(g, 0, tok * sh.HV * kHeadDim * 2));
    CHECK_CUDA(cudaMemset(beta, 0, tok * sh.HV * 2));
    CHECK_CUDA(cudaMemset(dt, 0, size_t(sh.HV) * kHeadDim * 4));
    std::vector<int64_t> cu_host(size_t(N + 1), 0);
    for (int64_t n = 0; n < N; ++n) cu_host[n + 1] = cu_host[n] + sh.lens[n];
    CHECK_CUDA(cudaMemcpy(cu, cu_host.data(), cu_host.size() * 8, cudaMemcpyHostToDevice));
    kdakit::PrefillParams full = p;
    full.q = q;
    full.k = q;
    full.v = v;
    full.g = g;
    full.beta = beta;
    full.dt_bias = static_cast<const float*>(dt);
    full.cu_seqlens = packed ? cu : nullptr;
    full.dtype_cu_seqlens = kdakit::DType::kInt64;
    full.stride_q_h = full.stride_k_h = full.stride_v_h = full.stride_g_h = kHeadDim;
    full.stride_q_t = full.stride_k_t = full.stride_v_t = full.stride_g_t = int64_t(sh.HV) * kHeadDim;
    full.stride_q_b = full.stride_k_b = full.stride_v_b = full.stride_g_b = full.stride_q_t * p.seqlen;
    full.stride_beta_h = 1;
    full.stride_beta_t = sh.HV;
    full.stride_beta_b = int64_t(sh.HV) * p.seqlen;
    full.dtype_g = full.dtype_beta = kdakit::DType::kBFloat16;
    full.gate = kdakit::GateMode::kLowerBound;
    full.lower_bound = -5.f;
    full.scale = 0.08838834764831845f;
    full.use_qk_l2norm = full.use_beta_sigmoid = true;
    full.workspace = ws;
    full.workspace_bytes = plan.total_bytes;
    std::printf(" %10.3f", time_ms([&] { return kdakit::sm90::run_prefill(full, stream); }));
    // NOTE: the token-serial path is a candidate for short sequences only; on long ones it takes
    // tens of ms per call.
    int longest = 0;
    for (int l : sh.lens) longest = std::max(longest, l);
    if (longest <= 1024)
      std::printf(" %10.3f\n", time_ms([&] { return kdakit::sm90::run_recurrent_prefill(full, stream); }));
    else
      std::printf(" %10s\n", "-");
    std::fflush(stdout);
    for (void* ptr : {q, v, g, beta, cu, dt}) CHECK_CUDA(cudaFree(ptr));
    CHECK_CUDA(cudaFree(ws));
    CHECK_CUDA(cudaFree(o));
    CHECK_CUDA(cudaFree(state));
  }
  return 0;
}
