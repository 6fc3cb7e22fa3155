// A C++ engine's forward step with kdakit's C API (include/kdakit/kdakit.h): the engine's own
// stream and workspace, one prefill plan shared by every KDA layer, prefill for the sequences
// that arrive and decode for the running ones over a state pool, the whole step captured once
// in a CUDA graph and replayed step after step with new buffer contents.
//
// Built by CMake with the CUDA kernels (examples/CMakeLists.txt) and run by CTest; without a
// GPU it exits with 77 (CTest: skipped). At the end it checks layer 0's last prefill against
// kdakit::cpu::prefill_reference and prints the relative L2 error.
//
// Sizes: 4 layers of HV = H = 8 heads, K = V = 128; 3 new sequences of 100, 37 and 250
// tokens packed into one row (T = 387), 4 running sequences decoding one token each; each
// layer has a pool of 16 fp32 state slots [16, HV, V, K] that both phases update in place.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kdakit/kdakit.h"

namespace {

constexpr int kLayers = 4, kHeads = 8, kDim = 128, kSlots = 16, kDecodeSeqs = 4;
constexpr int64_t kStateElems = int64_t{kHeads} * kDim * kDim;
const std::vector<int32_t> kLengths = {100, 37, 250};

#define CUDA_OK(expr)                                                    \
  do {                                                                   \
    const cudaError_t err_ = (expr);                                     \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                            \
      return 1;                                                          \
    }                                                                    \
  } while (0)

#define KDAKIT_OK(expr)                                                                          \
  do {                                                                                           \
    const kdakit::Status st_ = (expr);                                                           \
    if (!st_.ok()) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, st_.message().c_str()); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

// bf16 from float, round to nearest even (inputs here are finite).
uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

// One device buffer with its host copy (what the engine would have produced on the GPU).
template <typename T>
struct Buffer {
  std::vector<T> host;
  T* device = nullptr;
  explicit Buffer(size_t n) : host(n) { cudaMalloc(&device, n * sizeof(T)); }
  ~Buffer() { cudaFree(device); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  cudaError_t upload(cudaStream_t s) {
    return cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, s);
  }
  cudaError_t download(cudaStream_t s) {
    return cudaMemcpyAsync(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost, s);
  }
};

// The activations of one phase of one layer: q, k, v, g (raw gate input), beta (logits), o.
struct Activations {
  int64_t rows, tokens;
  Buffer<uint16_t> q, k, v, g, beta, o;
  Activations(int64_t rows_, int64_t tokens_)
      : rows(rows_),
        tokens(tokens_),
        q(size_t(rows_ * tokens_ * kHeads * kDim)),
        k(q.host.size()),
        v(q.host.size()),
        g(q.host.size()),
        beta(size_t(rows_ * tokens_ * kHeads)),
        o(q.host.size()) {}
  void randomize(std::mt19937& rng) {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto* b : {&q, &k, &v, &g, &beta})
      for (auto& x : b->host) x = to_bf16(normal(rng));
  }
  cudaError_t upload(cudaStream_t s) {
    for (auto* b : {&q, &k, &v, &g, &beta})
      if (const cudaError_t e = b->upload(s); e != cudaSuccess) return e;
    return cudaSuccess;
  }
};

// The strides, pointers and options both phases share (contiguous [rows, tokens, H, 128]).
template <typename P>
void fill_common(P& p, Activations& a, const float* A_log, const float* dt_bias) {
  const int64_t row = int64_t{kHeads} * kDim;
  p.num_qk_heads = p.num_v_heads = kHeads;
  p.head_dim_k = p.head_dim_v = kDim;
  p.q = a.q.device, p.k = a.k.device, p.v = a.v.device, p.g = a.g.device;
  p.beta = a.beta.device, p.o = a.o.device;
  p.A_log = A_log, p.dt_bias = dt_bias;
  p.stride_q_b = p.stride_k_b = p.stride_v_b = p.stride_g_b = p.stride_o_b = a.tokens * row;
  p.stride_q_t = p.stride_k_t = p.stride_v_t = p.stride_g_t = p.stride_o_t = row;
  p.stride_q_h = p.stride_k_h = p.stride_v_h = p.stride_g_h = p.stride_o_h = kDim;
  p.stride_beta_b = a.tokens * kHeads, p.stride_beta_t = kHeads, p.stride_beta_h = 1;
  p.dtype_qkv = p.dtype_g = p.dtype_beta = kdakit::DType::kBFloat16;
  p.gate = kdakit::GateMode::kLowerBound;  // Kimi K3 / FlashKDA gate
  p.lower_bound = -5.f;
  p.scale = 1.f / std::sqrt(float(kDim));
  p.use_qk_l2norm = p.use_beta_sigmoid = true;
}

struct Layer {
  Activations prefill{1, 387}, decode{kDecodeSeqs, 1};
  Buffer<float> A_log{kHeads}, dt_bias{size_t(kHeads) * kDim};
  Buffer<float> pool{size_t(kSlots) * kStateElems};
};

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("serving_step: no CUDA device, nothing to run\n");
    return 77;
  }
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937 rng(2024);

  // --- per-step metadata the engine owns: cu_seqlens of the prefill batch, decode slots
  const int64_t N = int64_t(kLengths.size()), T = 387;
  Buffer<int32_t> cu{size_t(N) + 1}, prefill_slots{size_t(N)}, decode_slots{kDecodeSeqs};
  std::vector<Layer> layers(kLayers);
  for (Layer& l : layers) {
    for (auto& x : l.A_log.host)
      x = std::log(1.f + 7.f * std::uniform_real_distribution<float>()(rng));
    for (auto& x : l.dt_bias.host) x = 0.5f * std::normal_distribution<float>()(rng);
    for (auto& x : l.pool.host) x = 0.1f * std::normal_distribution<float>()(rng);
    CUDA_OK(l.A_log.upload(stream));
    CUDA_OK(l.dt_bias.upload(stream));
    CUDA_OK(l.pool.upload(stream));
  }

  // --- the batch fields size the workspace; one buffer for all layers (they run in order)
  kdakit::PrefillParams batch{.batch = 1,
                              .seqlen = T,
                              .num_seqs = N,
                              .num_v_heads = kHeads,
                              .cu_seqlens = cu.device,
                              .dtype_cu_seqlens = kdakit::DType::kInt32};
  const size_t workspace_bytes = kdakit::prefill_workspace_size(batch);
  void* workspace = nullptr;
  CUDA_OK(cudaMalloc(&workspace, workspace_bytes));
  batch.workspace = workspace;
  batch.workspace_bytes = workspace_bytes;
  std::printf("serving_step: workspace %.1f MB for T = %lld, N = %lld, HV = %d\n",
              double(workspace_bytes) / 1e6, (long long)T, (long long)N, kHeads);

  // --- capture one step: plan once, then every layer's prefill (plan_ready) and decode
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  kdakit::Status captured = kdakit::prefill_plan(batch, stream);
  for (Layer& l : layers) {
    if (!captured.ok()) break;
    kdakit::PrefillParams p = batch;  // batch fields, workspace
    fill_common(p, l.prefill, l.A_log.device, l.dt_bias.device);
    p.num_state_slots = kSlots;
    p.initial_state = p.final_state = l.pool.device;  // in place, through the slot indices
    p.initial_state_indices = p.final_state_indices = prefill_slots.device;
    p.stride_initial_state_n = p.stride_final_state_n = kStateElems;
    p.plan_ready = true;
    captured = kdakit::prefill(p, stream);
    if (!captured.ok()) break;
    kdakit::DecodeParams d{
        .batch = kDecodeSeqs, .seqlen = 1, .num_seqs = kDecodeSeqs, .num_state_slots = kSlots};
    fill_common(d, l.decode, l.A_log.device, l.dt_bias.device);
    d.state = l.pool.device;
    d.state_indices = decode_slots.device;
    d.stride_state_slot = kStateElems;
    d.stride_state_indices_n = 1;
    captured = kdakit::decode(d, stream);
  }
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  KDAKIT_OK(captured);
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  // --- three steps: new inputs, new offsets (same N), new slots; replay
  std::vector<float> pool_before;
  for (int step = 0; step < 3; ++step) {
    std::vector<int32_t> lengths = kLengths;
    std::shuffle(lengths.begin(), lengths.end(), rng);
    cu.host[0] = 0;
    for (int64_t n = 0; n < N; ++n)
      cu.host[size_t(n) + 1] = cu.host[size_t(n)] + lengths[size_t(n)];
    std::vector<int32_t> slots(kSlots);
    for (int s = 0; s < kSlots; ++s) slots[size_t(s)] = s;
    std::shuffle(slots.begin(), slots.end(), rng);
    std::copy(slots.begin(), slots.begin() + N, prefill_slots.host.begin());
    std::copy(slots.begin() + N, slots.begin() + N + kDecodeSeqs, decode_slots.host.begin());
    CUDA_OK(cu.upload(stream));
    CUDA_OK(prefill_slots.upload(stream));
    CUDA_OK(decode_slots.upload(stream));
    for (Layer& l : layers) {
      l.prefill.randomize(rng);
      l.decode.randomize(rng);
      CUDA_OK(l.prefill.upload(stream));
      CUDA_OK(l.decode.upload(stream));
    }
    CUDA_OK(layers[0].pool.download(stream));  // for the check after the last step
    CUDA_OK(cudaStreamSynchronize(stream));
    pool_before = layers[0].pool.host;
    CUDA_OK(cudaGraphLaunch(exec, stream));
  }
  CUDA_OK(layers[0].prefill.o.download(stream));
  CUDA_OK(cudaStreamSynchronize(stream));

  // --- check layer 0's last prefill output on the CPU (float64 reference, host pointers)
  Layer& l0 = layers[0];
  std::vector<float> ref_pool = pool_before;
  std::vector<uint16_t> ref_o(l0.prefill.o.host.size(), 0);
  kdakit::PrefillParams h = batch;
  h.workspace = nullptr, h.workspace_bytes = 0;
  h.cu_seqlens = cu.host.data();
  fill_common(h, l0.prefill, l0.A_log.host.data(), l0.dt_bias.host.data());
  h.q = l0.prefill.q.host.data(), h.k = l0.prefill.k.host.data(), h.v = l0.prefill.v.host.data();
  h.g = l0.prefill.g.host.data(), h.beta = l0.prefill.beta.host.data(), h.o = ref_o.data();
  h.num_state_slots = kSlots;
  h.initial_state = h.final_state = ref_pool.data();
  h.initial_state_indices = h.final_state_indices = prefill_slots.host.data();
  h.stride_initial_state_n = h.stride_final_state_n = kStateElems;
  KDAKIT_OK(kdakit::cpu::prefill_reference(h));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref_o.size(); ++i) {
    const double a = from_bf16(l0.prefill.o.host[i]), b = from_bf16(ref_o[i]);
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  const double rel = std::sqrt(diff / norm);
  std::printf(
      "serving_step: %d layers x 3 graph replays; layer 0 prefill output vs float64 "
      "reference: rel L2 %.2e (bar 4e-3)\n",
      kLayers, rel);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(workspace);
  cudaStreamDestroy(stream);
  return rel <= 4e-3 ? 0 : 1;
}
