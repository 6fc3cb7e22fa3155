// Serving integration on the GPU (skipped without an sm_90 device): the plan step and CUDA-graph
// safety of kdakit::prefill / kdakit::decode, everything on non-default streams.
//
//   PlanKernel:   prefill_plan's region equals the host mirror (detail::expected_prefill_plan)
//                 for good and bad offsets, int32 and int64, fixed batches, N past one CTA tile.
//   PlanReuse:    one prefill_plan, then several layers with plan_ready = true, eagerly: each
//                 layer matches the float64 reference and is bitwise equal to the same layer
//                 run with the plan built on the fly.
//   PrefillGraph: one forward step (prefill_plan + L layers with plan_ready, or layers that plan
//                 on the fly; one case routed on the device, both sides in the graph)
//                 captured once with cudaStreamBeginCapture, then replayed after
//                 rewriting every input buffer: activations, gate parameters, states and pools,
//                 slot indices and the cu_seqlens values (same N, same T). Outputs are poisoned
//                 (NaN) before each replay, so an element the replay fails to write is reported.
//   DecodeGraph:  the same for decode: new tokens, pool contents, slot indices, padding rows,
//                 accepted counts and packed offsets before every replay.
// Every comparison is against kdakit::cpu::prefill_reference / decode_reference on the same
// host inputs. Bars as in the prefill and decode tests: prefill output 4e-3, fp32 state 2e-3,
// bf16 state 8e-3; decode output 8e-3 (bf16 rounding), fp32 pool 2e-5, bf16 pool 8e-3.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "api/metadata_checks.h"
#include "common/cases.h"
#include "common/host_tensor.h"
#include "common/prefill_checks.h"
#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::testing {
namespace {

bool have_sm90() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
}

#define SKIP_WITHOUT_SM90() \
  if (!have_sm90()) GTEST_SKIP() << "no sm_90 GPU"

// A non-blocking stream (never the legacy default stream), destroyed at scope exit.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Device buffers for the tensors of one call, filled in the order map_pointers visits them.
// The first fill allocates; a refill copies new host contents into the same addresses (what
// a graph replay needs), checking that every tensor kept its size.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(cudaStream_t stream) : stream_(stream) {}
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (auto& b : buffers_) cudaFree(b.ptr);
  }
  // Callback for map_pointers: allocate (first fill) or reuse the next buffer, then copy.
  void* operator()(HostTensor& x) {
    if (next_ == buffers_.size()) {
      void* d = nullptr;
      EXPECT_EQ(cudaMalloc(&d, x.nbytes()), cudaSuccess);
      buffers_.push_back({d, x.nbytes()});
    }
    Buffer& b = buffers_[next_++];
    EXPECT_EQ(b.bytes, x.nbytes()) << "a refill must keep every tensor's size";
    EXPECT_EQ(cudaMemcpyAsync(b.ptr, x.data(), x.nbytes(), cudaMemcpyHostToDevice, stream_),
              cudaSuccess);
    return b.ptr;
  }
  void rewind() { next_ = 0; }

 private:
  struct Buffer {
    void* ptr;
    size_t bytes;
  };
  cudaStream_t stream_;
  std::vector<Buffer> buffers_;
  size_t next_ = 0;
};

void download(HostTensor& x, const void* device, cudaStream_t stream) {
  ASSERT_EQ(cudaMemcpyAsync(x.data(), device, x.nbytes(), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
}

void* device_alloc(size_t bytes) {
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, bytes > 0 ? bytes : 1), cudaSuccess);
  return d;
}

// ------------------------------------------------------------------------------------------
// Prefill: one layer's tensors on the device
// ------------------------------------------------------------------------------------------

// A packed case with the same N and T as `c` but the sequence lengths `lens` (the tail takes
// up the difference, so the token count T stays the same).
PrefillCase with_lengths(PrefillCase c, std::vector<int64_t> lens) {
  const int64_t T = c.tokens_per_row();
  int64_t sum = 0;
  for (int64_t l : lens) sum += l;
  EXPECT_EQ(lens.size(), c.seq_lens.size()) << "N must stay the same";
  EXPECT_LE(sum, T);
  c.seq_lens = std::move(lens);
  c.tail = T - sum;
  return c;
}

struct PrefillLayer {
  PrefillTensors host;  // the inputs of the current step (and the reference's results)
  DeviceBuffers device;
  PrefillPointers ptr;
  PrefillParams params;
  explicit PrefillLayer(cudaStream_t s) : device(s) {}
};

// Fills `layer` with fresh inputs of case c, on the device at the same addresses as before
// (first call: new buffers), with cu_seqlens shared from `shared_cu` when given.
void fill_layer(PrefillLayer& layer, const PrefillCase& c, Rng& rng, const void* shared_cu) {
  layer.host = make_prefill_tensors(c, rng);
  layer.device.rewind();
  layer.ptr = map_pointers(layer.host, [&](HostTensor& x) { return layer.device(x); });
  if (shared_cu != nullptr) layer.ptr.cu_seqlens = shared_cu;
  layer.params = fill_prefill_params(c, layer.host, layer.ptr);
}

// The GPU results of a layer, read back into copies of its host tensors.
PrefillTensors read_back(const PrefillCase& c, PrefillLayer& layer, cudaStream_t stream) {
  PrefillTensors got = layer.host;
  download(got.o, layer.ptr.o, stream);
  if (c.in_place) {
    download(got.initial_state, layer.ptr.initial_state, stream);
  } else if (got.final_state.defined()) {
    download(got.final_state, layer.ptr.final_state, stream);
  }
  return got;
}

// Expects the GPU results `got` of case c to match the float64 reference run on `inputs`.
void expect_layer_matches(const PrefillCase& c, const PrefillTensors& inputs,
                          const PrefillTensors& got, const std::string& what) {
  SCOPED_TRACE(what);
  PrefillTensors ref = inputs;
  ASSERT_TRUE(run_reference_fp32_output(c, ref).ok());
  EXPECT_TRUE(rel_l2_below("o", got.o, ref.o, 4e-3));
  const double state_bar = c.dtype_state == DType::kBFloat16 ? 8e-3 : 2e-3;
  const HostTensor& got_final = final_state_of(c, got);
  if (got_final.defined()) {
    EXPECT_TRUE(rel_l2_below("final state", got_final, final_state_of(c, ref), state_bar));
    if (c.final_state == StateSource::kPool) {
      EXPECT_TRUE(
          untouched_slots_equal(final_state_of(c, inputs), got_final, final_state_of(c, ref)));
    }
  }
}

// ------------------------------------------------------------------------------------------
// Plan kernel against the host mirror
// ------------------------------------------------------------------------------------------

struct PlanKernelCase {
  std::string name;
  int64_t batch, seqlen;
  std::vector<int64_t> cu;  // empty: fixed batch of `batch` rows
  DType dtype_cu;
};

void PrintTo(const PlanKernelCase& c, std::ostream* os) { *os << c.name; }

std::vector<PlanKernelCase> plan_kernel_cases() {
  std::vector<PlanKernelCase> cases = {
      {"packed_empty_sequences", 1, 700, {0, 130, 130, 131, 600, 700}, DType::kInt64},
      {"packed_int32", 1, 300, {0, 64, 128, 129, 300}, DType::kInt32},
      {"bad_offsets_clamped", 1, 100, {-7, 30, 10, 250, 90, -3}, DType::kInt64},
      {"tail_past_last_offset", 1, 500, {0, 10, 20}, DType::kInt32},
      {"fixed_batch", 3, 130, {}, DType::kInt64},
      {"fixed_batch_empty_rows", 2, 0, {}, DType::kInt64},
  };
  // N beyond one CTA tile of the plan kernel (512 threads): the scans carry across tiles.
  PlanKernelCase many{"many_sequences_across_tiles", 1, 0, {0}, DType::kInt32};
  Rng rng(12345);
  for (int n = 0; n < 1500; ++n) many.cu.push_back(many.cu.back() + rng.integer(0, 40));
  many.seqlen = many.cu.back() + 17;
  cases.push_back(many);
  return cases;
}

class PlanKernel : public ::testing::TestWithParam<PlanKernelCase> {};

TEST_P(PlanKernel, MatchesHostMirror) {
  SKIP_WITHOUT_SM90();
  const PlanKernelCase& c = GetParam();
  Stream stream;
  const bool packed = !c.cu.empty();
  PrefillParams p;
  p.batch = c.batch;
  p.seqlen = c.seqlen;
  p.num_seqs = packed ? int64_t(c.cu.size()) - 1 : c.batch;
  p.num_v_heads = 2;
  p.dtype_cu_seqlens = c.dtype_cu;
  void* cu = nullptr;
  if (packed) {
    std::vector<int32_t> narrow(c.cu.begin(), c.cu.end());
    const bool wide = c.dtype_cu == DType::kInt64;
    const size_t bytes = c.cu.size() * (wide ? 8 : 4);
    cu = device_alloc(bytes);
    ASSERT_EQ(cudaMemcpy(cu, wide ? static_cast<const void*>(c.cu.data()) : narrow.data(), bytes,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  p.cu_seqlens = cu;
  p.workspace_bytes = prefill_workspace_size(p);
  ASSERT_GT(p.workspace_bytes, 0u);
  p.workspace = device_alloc(p.workspace_bytes);
  // poison the plan region: an entry the kernel does not write shows up as a mismatch
  ASSERT_EQ(cudaMemsetAsync(p.workspace, 0x5a, p.workspace_bytes, stream.s), cudaSuccess);
  const Status st = prefill_plan(p, stream.s);
  ASSERT_TRUE(st.ok()) << st.message();

  const sm90::prefill::WorkspacePlan w =
      sm90::prefill::make_workspace_plan(p.batch, p.seqlen, p.num_seqs, packed, p.num_v_heads);
  const auto* base = static_cast<const unsigned char*>(p.workspace);
  kdakit::detail::PrefillPlanRegion got;
  got.chunk_offsets.resize(size_t(p.num_seqs + 1));
  got.chunk_seq.resize(size_t(w.max_chunks));
  got.seq_start.resize(size_t(p.num_seqs));
  got.seq_len.resize(size_t(p.num_seqs));
  got.longest.resize(1);
  got.seq_order.resize(size_t(p.num_seqs));
  auto fetch = [&](auto& v, size_t offset) {
    if (v.empty()) return;  // e.g. chunk_seq of a batch without tokens
    ASSERT_EQ(cudaMemcpyAsync(v.data(), base + offset, v.size() * sizeof(v[0]),
                              cudaMemcpyDeviceToHost, stream.s),
              cudaSuccess);
  };
  fetch(got.chunk_offsets, w.chunk_offsets_offset);
  fetch(got.chunk_seq, w.chunk_seq_offset);
  fetch(got.seq_start, w.seq_start_offset);
  fetch(got.seq_len, w.seq_len_offset);
  fetch(got.longest, w.longest_offset);
  fetch(got.seq_order, w.seq_order_offset);
  ASSERT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess);
  const Status match = kdakit::detail::check_prefill_plan(p, c.cu, sm90::prefill::kChunk, got);
  EXPECT_TRUE(match.ok()) << match.message();
  cudaFree(p.workspace);
  if (cu != nullptr) cudaFree(cu);
}

INSTANTIATE_TEST_SUITE_P(Cases, PlanKernel, ::testing::ValuesIn(plan_kernel_cases()),
                         [](const auto& info) { return info.param.name; });

// ------------------------------------------------------------------------------------------
// Plan once, several layers (eager, non-default stream)
// ------------------------------------------------------------------------------------------

PrefillCase serving_case(std::string name) {
  PrefillCase c;
  c.name = std::move(name);
  c.seq_lens = {130, 0, 77, 300};
  c.tail = 5;
  c.H = 2;
  c.HV = 4;
  c.K = c.V = 128;
  c.dtype_g = c.dtype_beta = DType::kBFloat16;
  c.initial = c.final_state = StateSource::kPool;
  c.in_place = true;
  c.negative_indices = true;
  c.extra_slots = 3;
  return c;
}

TEST(PlanReuse, LayersShareOnePlanAndMatchPlanningOnTheFly) {
  SKIP_WITHOUT_SM90();
  Stream stream;
  Rng rng = make_rng();
  SCOPED_TRACE(rng.trace());
  const PrefillCase c = serving_case("plan_reuse");
  constexpr int kLayers = 3;
  std::deque<PrefillLayer> layers;  // not movable: they own device buffers
  for (int l = 0; l < kLayers; ++l) {
    layers.emplace_back(stream.s);
    fill_layer(layers[l], c, rng, l == 0 ? nullptr : layers[0].ptr.cu_seqlens);
  }
  const size_t ws_bytes = prefill_workspace_size(layers[0].params);  // batch fields only
  void* ws = device_alloc(ws_bytes);
  PrefillParams plan = layers[0].params;
  plan.workspace = ws, plan.workspace_bytes = ws_bytes;
  ASSERT_TRUE(prefill_plan(plan, stream.s).ok());
  std::vector<PrefillTensors> inputs, planned;
  for (auto& layer : layers) {
    inputs.push_back(layer.host);
    PrefillParams p = layer.params;
    p.workspace = ws, p.workspace_bytes = ws_bytes, p.plan_ready = true;
    const Status st = prefill(p, stream.s);
    ASSERT_TRUE(st.ok()) << st.message();
    planned.push_back(read_back(c, layer, stream.s));
  }
  for (int l = 0; l < kLayers; ++l) {
    expect_layer_matches(c, inputs[l], planned[l], "layer " + std::to_string(l));
    // the same layer, planned on the fly, from the same inputs
    layers[l].device.rewind();
    PrefillTensors again = inputs[l];
    map_pointers(again, [&](HostTensor& x) { return layers[l].device(x); });
    PrefillParams p = layers[l].params;
    p.workspace = ws, p.workspace_bytes = ws_bytes;
    ASSERT_TRUE(prefill(p, stream.s).ok());
    const PrefillTensors fly = read_back(c, layers[l], stream.s);
    EXPECT_TRUE(bitwise_equal("o, plan reused vs on the fly", planned[l].o, fly.o));
    EXPECT_TRUE(bitwise_equal("pool, plan reused vs on the fly", planned[l].initial_state,
                              fly.initial_state));
  }
  cudaFree(ws);
}

// ------------------------------------------------------------------------------------------
// Prefill captured in a CUDA graph, replayed with new contents
// ------------------------------------------------------------------------------------------

struct PrefillGraphCase {
  std::string name;
  PrefillCase base;
  std::vector<std::vector<int64_t>> lengths;  // per replay (packed): new cu_seqlens values
  int layers = 1;
  bool plan_step = true;  // capture prefill_plan + layers with plan_ready, else plan on the fly
  int replays = 3;
};

void PrintTo(const PrefillGraphCase& c, std::ostream* os) { *os << c.name; }

std::vector<PrefillGraphCase> prefill_graph_cases() {
  std::vector<PrefillGraphCase> cases;
  {
    PrefillGraphCase g{"pool_in_place_two_layers_plan_once", serving_case("g1")};
    g.lengths = {{300, 77, 0, 130}, {1, 400, 100, 6}, {0, 0, 512, 0}, {64, 64, 64, 64}};
    g.replays = 4;
    g.layers = 2;
    cases.push_back(g);
  }
  {
    PrefillGraphCase g{"dense_states_plan_on_the_fly", serving_case("g2")};
    g.base.initial = g.base.final_state = StateSource::kDense;
    g.base.in_place = false;
    g.base.negative_indices = false;
    g.base.dtype_cu = DType::kInt64;
    g.lengths = {{10, 200, 1, 300}, {511, 0, 0, 1}, {128, 128, 128, 128}};
    g.plan_step = false;
    cases.push_back(g);
  }
  {
    PrefillGraphCase g{"separate_pools_bf16_state_kfirst", serving_case("g3")};
    g.base.in_place = false;
    g.base.dtype_state = DType::kBFloat16;
    g.base.layout = StateLayout::kKFirst;
    g.base.gate = GateMode::kSoftplus;
    g.lengths = {{65, 65, 65, 65}, {0, 1, 2, 3}, {250, 250, 0, 0}};
    cases.push_back(g);
  }
  {
    PrefillGraphCase g{"fixed_batch_plan_once", serving_case("g4")};
    g.base.seq_lens.clear();
    g.base.tail = 0;
    g.base.batch = 2;
    g.base.seqlen = 150;
    g.base.initial = g.base.final_state = StateSource::kDense;
    g.base.in_place = false;
    g.base.negative_indices = false;
    g.layers = 2;
    cases.push_back(g);
  }
  {
    // ~10 tokens per sequence: the dispatcher takes the token-serial kernel, chosen from T and
    // N alone, so the choice is the same at capture and at every replay.
    PrefillGraphCase g{"short_sequences_token_serial", serving_case("g5")};
    g.base.seq_lens = {16, 3, 0, 20, 9, 16, 1};
    g.base.tail = 3;
    g.lengths = {{1, 1, 1, 1, 1, 1, 62}, {0, 0, 0, 0, 0, 0, 0}, {10, 10, 10, 10, 10, 10, 8}};
    g.layers = 2;
    cases.push_back(g);
  }
  {
    // A routed call (dispatch.cu, route_on_device): packed, no max_seqlen hint, averaging over 64
    // and at most 1024 tokens, N x HV >= 132 (the H100's and H200's SMs; on a larger card the
    // call is not routed and the case runs unrouted). The graph holds both sides, the tile
    // kernel and the two-kernel path, whose later grids start by programmatic dependent launch;
    // the replays alternate between a batch with a member past 1024 tokens (the two-kernel path
    // works) and one without (the tile kernel works). Two layers: the second layer's grids
    // must follow the first's.
    PrefillGraphCase g{"routed_both_sides_two_layers", serving_case("g6")};
    g.base.seq_lens = {700, 300, 0, 295};
    g.base.H = 17;
    g.base.HV = 34;
    g.lengths = {{1100, 100, 0, 95}, {325, 325, 325, 320}};
    g.layers = 2;
    g.replays = 2;
    cases.push_back(g);
  }
  return cases;
}

class PrefillGraph : public ::testing::TestWithParam<PrefillGraphCase> {};

TEST_P(PrefillGraph, ReplaysWithNewContents) {
  SKIP_WITHOUT_SM90();
  const PrefillGraphCase& g = GetParam();
  Stream stream;
  Rng rng = make_rng();
  SCOPED_TRACE(g.name + ", " + rng.trace());

  std::deque<PrefillLayer> layers;
  for (int l = 0; l < g.layers; ++l) {
    layers.emplace_back(stream.s);
    fill_layer(layers[l], g.base, rng, l == 0 ? nullptr : layers[0].ptr.cu_seqlens);
  }
  const size_t ws_bytes = prefill_workspace_size(layers[0].params);
  void* ws = device_alloc(ws_bytes);
  ASSERT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess);

  // --- capture one forward step
  ASSERT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  Status captured = Status::Ok();
  if (g.plan_step) {
    PrefillParams plan = layers[0].params;
    plan.workspace = ws, plan.workspace_bytes = ws_bytes;
    captured = prefill_plan(plan, stream.s);
  }
  for (auto& layer : layers) {
    if (!captured.ok()) break;
    PrefillParams p = layer.params;
    p.workspace = ws, p.workspace_bytes = ws_bytes, p.plan_ready = g.plan_step;
    captured = prefill(p, stream.s);
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream.s, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured.message();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  // --- replay after rewriting every input buffer
  for (int r = 0; r < g.replays; ++r) {
    PrefillCase c = g.base;
    if (c.packed() && !g.lengths.empty())
      c = with_lengths(c, g.lengths[size_t(r) % g.lengths.size()]);
    std::vector<PrefillTensors> inputs;
    for (int l = 0; l < g.layers; ++l) {
      const PrefillParams before = layers[l].params;
      fill_layer(layers[l], c, rng, l == 0 ? nullptr : layers[0].ptr.cu_seqlens);
      ASSERT_EQ(layers[l].params.o, before.o) << "a refill must keep the addresses";
      inputs.push_back(layers[l].host);
    }
    ASSERT_EQ(cudaGraphLaunch(exec, stream.s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess);
    for (int l = 0; l < g.layers; ++l) {
      const PrefillTensors got = read_back(c, layers[l], stream.s);
      expect_layer_matches(c, inputs[l], got,
                           "replay " + std::to_string(r) + ", layer " + std::to_string(l));
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(ws);
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefillGraph, ::testing::ValuesIn(prefill_graph_cases()),
                         [](const auto& info) { return info.param.name; });

// ------------------------------------------------------------------------------------------
// Decode captured in a CUDA graph, replayed with new contents
// ------------------------------------------------------------------------------------------

struct DecodeGraphCase {
  std::string name;
  DecodeCase base;
  std::vector<std::vector<int64_t>> lengths;  // per replay (packed): new cu_seqlens values
  int replays = 3;
};

void PrintTo(const DecodeGraphCase& c, std::ostream* os) { *os << c.name; }

DecodeCase decode_case() {
  DecodeCase c;
  c.batch = 8;
  c.seqlen = 1;
  c.H = c.HV = 4;
  c.K = c.V = 128;
  c.padding_rows = 2;
  return c;
}

std::vector<DecodeGraphCase> decode_graph_cases() {
  std::vector<DecodeGraphCase> cases;
  cases.push_back({"one_token_fp32_pool", decode_case()});
  {
    DecodeGraphCase g{"one_token_bf16_pool_null_slot", decode_case()};
    g.base.dtype_state = DType::kBFloat16;
    g.base.null_slot_is_padding = true;
    cases.push_back(g);
  }
  {
    DecodeGraphCase g{"speculative_accepted_counts", decode_case()};
    g.base.seqlen = 4;
    g.base.num_index_cols = 4;
    g.base.accepted = true;
    g.base.negative_write_slots = true;
    cases.push_back(g);
  }
  {
    DecodeGraphCase g{"packed_kfirst", decode_case()};
    g.base.seq_lens = {1, 0, 2, 1, 1};
    g.base.tail = 1;
    g.base.layout = StateLayout::kKFirst;
    g.lengths = {{2, 1, 0, 1, 1}, {0, 0, 0, 0, 5}, {1, 1, 1, 1, 1}};
    cases.push_back(g);
  }
  {
    DecodeGraphCase g{"head_dim_64_gva", decode_case()};
    g.base.K = g.base.V = 64;
    g.base.H = 2;
    cases.push_back(g);
  }
  return cases;
}

class DecodeGraph : public ::testing::TestWithParam<DecodeGraphCase> {};

TEST_P(DecodeGraph, ReplaysWithNewContents) {
  SKIP_WITHOUT_SM90();
  const DecodeGraphCase& g = GetParam();
  Stream stream;
  Rng rng = make_rng();
  SCOPED_TRACE(g.name + ", " + rng.trace());
  DeviceBuffers device(stream.s);
  DecodeTensors host = make_decode_tensors(g.base, rng);
  const DecodePointers ptr = map_pointers(host, [&](HostTensor& x) { return device(x); });
  const DecodeParams p = fill_decode_params(g.base, host, ptr);
  ASSERT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess);

  ASSERT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status captured = decode(p, stream.s);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream.s, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured.message();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (int r = 0; r < g.replays; ++r) {
    SCOPED_TRACE("replay " + std::to_string(r));
    DecodeCase c = g.base;
    if (c.packed() && !g.lengths.empty()) {
      const int64_t T = c.tokens_per_row();
      c.seq_lens = g.lengths[size_t(r) % g.lengths.size()];
      int64_t sum = 0;
      for (int64_t l : c.seq_lens) sum += l;
      c.tail = T - sum;
    }
    DecodeTensors inputs = make_decode_tensors(c, rng);  // new slots, pool, tokens; o poisoned
    device.rewind();
    const DecodePointers again = map_pointers(inputs, [&](HostTensor& x) { return device(x); });
    ASSERT_EQ(again.state, ptr.state);
    ASSERT_EQ(cudaGraphLaunch(exec, stream.s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess);
    DecodeTensors got = inputs;
    download(got.o, ptr.o, stream.s);
    download(got.state, ptr.state, stream.s);
    DecodeTensors ref = inputs;
    ASSERT_TRUE(run_decode_on_host(cpu::decode_reference, c, ref).ok());
    const double bar_state = c.dtype_state == DType::kFloat32 ? 2e-5 : 8e-3;
    expect_decode_matches(c, inputs, got, ref, 8e-3, bar_state);
    for (int64_t e = 0; e < ref.o.numel(); ++e) {
      if (ref.o.get(e) == 0.0) {
        ASSERT_EQ(got.o.get(e), 0.0) << "padding output not zero at " << got.o.index_string(e);
      }
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeGraph, ::testing::ValuesIn(decode_graph_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kdakit::testing
