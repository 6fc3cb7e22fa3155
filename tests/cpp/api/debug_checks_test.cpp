// Debug mode on the GPU (CUDA builds only; skipped without a device): with
// KDAKIT_DEBUG_CHECKS=1, set before the first kdakit call of this process, prefill and decode
// copy cu_seqlens / slot indices / num_accepted_tokens to the host and reject bad values
// before launching; under CUDA graph capture they refuse to run. The rules themselves are
// covered by metadata_test.cpp; this checks the device copies (both cu_seqlens widths, strided
// index rows, the plan region of a plan_ready workspace) and the wiring into the entry points.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

class DebugModeEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { setenv("KDAKIT_DEBUG_CHECKS", "1", 1); }
};

[[maybe_unused]] const ::testing::Environment* const kDebugEnv =
    ::testing::AddGlobalTestEnvironment(new DebugModeEnvironment);

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Device allocations freed at scope exit; zero-filled so valid calls compute on defined data.
class DeviceArena {
 public:
  ~DeviceArena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  void* zeros(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, bytes), cudaSuccess);
    ptrs_.push_back(p);
    return p;
  }
  template <typename T>
  T* copy(const std::vector<T>& host) {
    auto* p = static_cast<T*>(zeros(host.size() * sizeof(T)));
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

// The shape the CUDA kernels are built for: K = V = 128, bf16 activations, fp32 state.
constexpr int32_t kHeads = 2, kDim = 128;
constexpr int64_t kStateElems = int64_t{kHeads} * kDim * kDim;

template <typename P>
void fill_activations(P& p, DeviceArena& a) {
  const int64_t tokens = p.batch * p.seqlen;
  p.num_qk_heads = p.num_v_heads = kHeads;
  p.head_dim_k = p.head_dim_v = kDim;
  p.q = a.zeros(tokens * kHeads * kDim * 2);
  p.k = a.zeros(tokens * kHeads * kDim * 2);
  p.v = a.zeros(tokens * kHeads * kDim * 2);
  p.g = a.zeros(tokens * kHeads * kDim * 2);
  p.beta = a.zeros(tokens * kHeads * 2);
  p.o = a.zeros(tokens * kHeads * kDim * 2);
  const int64_t row = kHeads * kDim;
  p.stride_q_h = p.stride_k_h = p.stride_v_h = p.stride_g_h = p.stride_o_h = kDim;
  p.stride_q_t = p.stride_k_t = p.stride_v_t = p.stride_g_t = p.stride_o_t = row;
  p.stride_q_b = p.stride_k_b = p.stride_v_b = p.stride_g_b = p.stride_o_b = p.seqlen * row;
  p.stride_beta_h = 1, p.stride_beta_t = kHeads, p.stride_beta_b = p.seqlen * kHeads;
  p.scale = 0.088f;
}

// Packed prefill of 2 sequences over T = 10 tokens, in-place pool of 4 slots.
PrefillParams packed_prefill(DeviceArena& a, const std::vector<int64_t>& cu,
                             const std::vector<int32_t>& slots) {
  PrefillParams p;
  p.batch = 1, p.seqlen = 10, p.num_seqs = static_cast<int64_t>(cu.size()) - 1;
  p.num_state_slots = 4;
  fill_activations(p, a);
  p.cu_seqlens = a.copy(cu), p.dtype_cu_seqlens = DType::kInt64;
  p.initial_state = p.final_state = a.zeros(4 * kStateElems * 4);
  p.initial_state_indices = p.final_state_indices = a.copy(slots);
  p.stride_initial_state_n = p.stride_final_state_n = kStateElems;
  p.workspace_bytes = prefill_workspace_size(p);
  p.workspace = p.workspace_bytes ? a.zeros(p.workspace_bytes) : nullptr;
  return p;
}

// Dense speculative decode: 2 rows of 2 tokens, index rows of 2 columns padded to 3.
DecodeParams spec_decode(DeviceArena& a, const std::vector<int32_t>& idx,
                         const std::vector<int32_t>& accepted) {
  DecodeParams p;
  p.batch = 2, p.seqlen = 2, p.num_seqs = 2, p.num_state_slots = 6, p.num_index_cols = 2;
  fill_activations(p, a);
  p.state = a.zeros(6 * kStateElems * 4), p.stride_state_slot = kStateElems;
  p.state_indices = a.copy(idx), p.stride_state_indices_n = 3;
  p.num_accepted_tokens = a.copy(accepted);
  return p;
}

void expect_rejected(const Status& s, const std::string& needle) {
  EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(StatusCode::kInvalidArgument))
      << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message \"" << s.message() << "\" lacks \"" << needle << "\"";
}

// A valid call passes the debug checks; whatever the kernels answer, it is not a rejection of
// the metadata.
void expect_not_rejected(const Status& s) {
  EXPECT_NE(static_cast<int>(s.code()), static_cast<int>(StatusCode::kInvalidArgument))
      << s.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(DebugChecks, PrefillValidMetadataPasses) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  expect_not_rejected(prefill(packed_prefill(a, {0, 4, 10}, {3, -1}), nullptr));
}

TEST(DebugChecks, PrefillDecreasingOffsets) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  expect_rejected(prefill(packed_prefill(a, {0, 6, 5}, {0, 1}), nullptr),
                  "cu_seqlens[2] = 5 < cu_seqlens[1] = 6");
}

TEST(DebugChecks, PrefillInt32OffsetsPastTokens) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  PrefillParams p = packed_prefill(a, {0, 4, 10}, {0, 1});
  p.cu_seqlens = a.copy(std::vector<int32_t>{0, 4, 11});
  p.dtype_cu_seqlens = DType::kInt32;
  expect_rejected(prefill(p, nullptr), "cu_seqlens[2] <= T = 10 tokens, got 11");
}

TEST(DebugChecks, PrefillSlotOutOfRange) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  expect_rejected(prefill(packed_prefill(a, {0, 4, 10}, {0, 4}), nullptr),
                  "initial_state_indices[1] = 4");
}

// The prefix-caching pattern: one pool read through initial_state_indices and written
// through other final_state_indices; valid unless a sequence writes a slot another one reads.
TEST(DebugChecks, PrefillSharedPoolWrittenElsewhere) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  PrefillParams p = packed_prefill(a, {0, 4, 10}, {3, -1});
  p.final_state_indices = a.copy(std::vector<int32_t>{0, 1});
  expect_not_rejected(prefill(p, nullptr));
  p.initial_state_indices = a.copy(std::vector<int32_t>{3, 0});
  expect_rejected(prefill(p, nullptr),
                  "initial_state_indices: slot 0 is read by sequence 1 and written by sequence 0");
}

// Chunk states into rows of the state pool: their indices are copied and checked too (the
// kernels may then answer kUnsupported, which is no rejection of the metadata).
TEST(DebugChecks, PrefillChunkStateRows) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  PrefillParams p = packed_prefill(a, {0, 4, 10}, {3, -1});
  p.chunk_states = const_cast<void*>(p.initial_state), p.chunk_state_interval = 64;
  p.stride_chunk_states_n = kStateElems, p.num_chunk_state_slots = 4, p.num_chunk_states = 2;
  p.chunk_state_indices = a.copy(std::vector<int32_t>{1, 2});
  expect_not_rejected(prefill(p, nullptr));
  p.chunk_state_indices = a.copy(std::vector<int32_t>{1, 4});
  expect_rejected(prefill(p, nullptr), "chunk_state_indices[1] = 4");
  p.chunk_state_indices = a.copy(std::vector<int32_t>{2, 3});
  expect_rejected(prefill(p, nullptr),
                  "chunk_state_indices: slot 3 is written by sequences 0 and 1");
}

// prefill_plan checks the batch fields only: the pool and chunk-row arguments of the same
// params (whose index arrays it does not copy) are checked by the prefills that use the plan.
TEST(DebugChecks, PrefillPlanWithChunkStateRows) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  PrefillParams p = packed_prefill(a, {0, 4, 10}, {3, -1});
  p.chunk_states = const_cast<void*>(p.initial_state), p.chunk_state_interval = 64;
  p.stride_chunk_states_n = kStateElems, p.num_chunk_state_slots = 4, p.num_chunk_states = 2;
  p.chunk_state_indices = a.copy(std::vector<int32_t>{1, 2});
  const Status plan = prefill_plan(p, nullptr);
  EXPECT_TRUE(plan.ok()) << plan.message();
  p.plan_ready = true;
  expect_not_rejected(prefill(p, nullptr));
  p.chunk_state_indices = a.copy(std::vector<int32_t>{2, 3});
  expect_rejected(prefill(p, nullptr),
                  "chunk_state_indices: slot 3 is written by sequences 0 and 1");
}

TEST(DebugChecks, PlanReadyWithAStalePlanIsRejected) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  PrefillParams p = packed_prefill(a, {0, 4, 10}, {3, -1});
  ASSERT_TRUE(prefill_plan(p, nullptr).ok());
  p.plan_ready = true;
  expect_not_rejected(prefill(p, nullptr));
  // same N and T, other offsets: the plan in the workspace belongs to the old ones
  p.cu_seqlens = a.copy(std::vector<int64_t>{0, 6, 10});
  expect_rejected(prefill(p, nullptr),
                  "plan_ready: the plan in workspace does not belong to this batch: "
                  "seq_start[1] = 4, expected 6");
}

TEST(DebugChecks, PrefillPlanDecreasingOffsets) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  expect_rejected(prefill_plan(packed_prefill(a, {0, 6, 5}, {0, 1}), nullptr),
                  "cu_seqlens[2] = 5 < cu_seqlens[1] = 6");
}

TEST(DebugChecks, DecodeValidMetadataPasses) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  expect_not_rejected(decode(spec_decode(a, {1, 2, 99, 3, 4, 99}, {1, 2}), nullptr));
}

TEST(DebugChecks, DecodeAcceptedOutOfRange) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  expect_rejected(decode(spec_decode(a, {1, 2, 99, 3, 4, 99}, {1, 3}), nullptr),
                  "num_accepted_tokens[1] = 3");
}

TEST(DebugChecks, DecodeStridedSlotOutOfRange) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  expect_rejected(decode(spec_decode(a, {1, 2, 99, 3, 6, 99}, {1, 1}), nullptr),
                  "state_indices[1, 1] = 6");
}

TEST(DebugChecks, RefusesGraphCapture) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceArena a;
  const DecodeParams p = spec_decode(a, {1, 2, 99, 3, 4, 99}, {1, 2});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status s = decode(p, stream);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(StatusCode::kUnsupported)) << s.message();
  EXPECT_NE(s.message().find("graph capture"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kdakit
