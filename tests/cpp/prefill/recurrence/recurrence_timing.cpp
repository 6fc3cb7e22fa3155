// Times the recurrence kernel alone on the TARGETS.md prefill shapes (not a test: a tool the
// device runs use to pick value rows per CTA and to track the kernel's share of prefill time).
// The workspace holds a valid plan region and small random chunk blocks (the MMA work does not
// depend on the values). Usage: prefill_recurrence_timing [repeats]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

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
  std::printf("%-18s %6s %10s %10s %10s %10s  %s\n", "case", "CTAs", "rows16", "rows32", "rows64", "rows128",
              "chosen");
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
    offs[0] = 0;
    int64_t start = 0;
    for (int64_t n = 0; n < N; ++n) {
      offs[n + 1] = offs[n] + (sh.lens[n] + kChunk - 1) / kChunk;
      sstart[n] = packed ? start : 0;
      slen[n] = sh.lens[n];
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
    for (int rows : {16, 32, 64, 128}) {
      for (int w = 0; w < 2; ++w) {
        const kdakit::Status st = launch_rows(rows, p, plan, ws, stream);
        if (!st.ok()) {
          std::printf("\nlaunch failed: %s\n", st.message().c_str());
          return 1;
        }
      }
      CHECK_CUDA(cudaEventRecord(t0, stream));
      for (int r = 0; r < repeats; ++r) (void)launch_rows(rows, p, plan, ws, stream);
      CHECK_CUDA(cudaEventRecord(t1, stream));
      CHECK_CUDA(cudaEventSynchronize(t1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
      std::printf(" %10.3f", ms / repeats);
    }
    std::printf("  rows%d\n", recurrence_value_rows(N, sh.HV, num_sms));
    std::fflush(stdout);
    CHECK_CUDA(cudaFree(ws));
    CHECK_CUDA(cudaFree(o));
    CHECK_CUDA(cudaFree(state));
  }
  return 0;
}
