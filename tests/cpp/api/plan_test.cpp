// The plan step's host side (docs/contract.md, "plan / workspace"): prefill_workspace_size and
// prefill_plan read only the batch fields and name the bad one; prefill with plan_ready needs
// its workspace; the host mirror of the plan kernel (what KDAKIT_DEBUG_CHECKS=1 compares a
// plan_ready workspace with) on hand-computed examples. Host buffers only: every call here
// returns before a launch, so it runs in CUDA builds without a GPU too.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "api/metadata_checks.h"
#include "cuda/sm90/prefill/dispatch.h"
#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

// Only the batch fields: what an engine knows before the layers run.
PrefillParams batch_fields(int64_t T, int64_t N, int32_t HV, const void* cu) {
  PrefillParams p;
  p.batch = cu != nullptr ? 1 : N;
  p.seqlen = T;
  p.num_seqs = N;
  p.num_v_heads = HV;
  p.cu_seqlens = cu;
  p.dtype_cu_seqlens = DType::kInt64;
  return p;
}

std::string describe(const Status& s) {
  return std::to_string(static_cast<int>(s.code())) + ": " + s.message();
}

void expect_status(const Status& s, StatusCode code, const std::string& needle) {
  EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(code)) << describe(s);
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message \"" << s.message() << "\" lacks \"" << needle << "\"";
}

// --- workspace size -----------------------------------------------------------------------

TEST(PlanWorkspaceSize, FromBatchFieldsAloneAndMonotone) {
  std::vector<int64_t> cu(65, 0);
  const size_t base = prefill_workspace_size(batch_fields(8192, 64, 32, cu.data()));
  if (!built_with_cuda()) {
    EXPECT_EQ(base, 0u) << "without CUDA no workspace is needed";
    return;
  }
  EXPECT_GT(base, 0u);
  // an engine sizes one buffer for its largest batch: no smaller batch may need more
  EXPECT_GE(base, prefill_workspace_size(batch_fields(4096, 64, 32, cu.data())));
  EXPECT_GE(base, prefill_workspace_size(batch_fields(8192, 16, 32, cu.data())));
  EXPECT_GE(base, prefill_workspace_size(batch_fields(8192, 64, 8, cu.data())));
  EXPECT_LT(base, prefill_workspace_size(batch_fields(8193, 64, 32, cu.data())));
  // fixed batch of 2 x 100 tokens: 2 chunks per row per value head
  EXPECT_GT(prefill_workspace_size(batch_fields(100, 2, 4, nullptr)), 0u);
}

// Segmented prefill (workspace.h): the full segments of every sequence of a batch get distinct
// slots inside the segment area, for any segment length and any lengths that fit T and N.
TEST(PlanWorkspaceSize, SegmentSlotsAreDistinctAndInsideTheArea) {
  namespace pf = sm90::prefill;
  std::mt19937_64 rng(std::random_device{}());
  for (int trial = 0; trial < 300; ++trial) {
    const bool packed = trial % 3 != 0;
    const int64_t N = 1 + int64_t(rng() % 12);
    const int64_t T = 1 + int64_t(rng() % 6000);
    const int32_t ls = 1 + int32_t(rng() % 20);
    // lengths: fixed batch, all T; packed, a random split of at most T tokens (empties too)
    std::vector<int64_t> lens(size_t(N), T);
    if (packed) {
      int64_t left = T;
      for (auto& l : lens) {
        l = rng() % 3 == 0 ? 0 : int64_t(rng() % uint64_t(left + 1));
        left -= l;
      }
    }
    const pf::WorkspacePlan w = pf::make_workspace_plan(packed ? 1 : N, T, N, packed, 4, ls);
    ASSERT_GT(w.num_segment_slots, 0);
    std::set<int64_t> used;
    int64_t c0 = 0;
    for (int64_t len : lens) {
      const int64_t nc = (len + pf::kChunk - 1) / pf::kChunk;
      const int64_t nseg = std::max<int64_t>(1, (nc + ls - 1) / ls);
      ASSERT_LE(nseg, w.max_segments) << "len " << len << " T " << T << " ls " << ls;
      for (int64_t s = 0; s + 1 < nseg; ++s) {  // full segments
        const int64_t slot = pf::segment_slot(c0, s, ls);
        EXPECT_GE(slot, 0);
        EXPECT_LT(slot, w.num_segment_slots) << "c0 " << c0 << " s " << s << " ls " << ls;
        EXPECT_TRUE(used.insert(slot).second) << "slot " << slot << " taken twice (ls " << ls << ")";
      }
      c0 += nc;
    }
    EXPECT_LE(c0, w.max_chunks);
    EXPECT_EQ(w.total_bytes, w.segments_offset + size_t(w.num_segment_slots) * 4 * pf::kSegmentBytes);
  }
}

#if KDAKIT_WITH_CUDA
// The plan-by-prep switch (dispatch.h; docs/contract.md, "Plan kernel"), host only: which calls
// the prep kernel writes the plan of (the default) and which the plan kernel. Nothing launches.
TEST(PlanSwitches, PlanByPrep) {
  PrefillParams p = batch_fields(8192, 1, 16, nullptr);  // H16, one fixed row of 8K tokens
  p.num_qk_heads = 16;
  p.head_dim_k = p.head_dim_v = 128;
  sm90::set_prefill_path(sm90::PrefillPath::kChunked);
  EXPECT_TRUE(sm90::prefill_plan_by_prep(p)) << "on by default for a fixed batch";
  sm90::set_prefill_plan_by_prep(0);
  EXPECT_FALSE(sm90::prefill_plan_by_prep(p)) << "the plan kernel on request";
  sm90::set_prefill_plan_by_prep(1);
  EXPECT_TRUE(sm90::prefill_plan_by_prep(p));
  PrefillParams empty_rows = p;
  empty_rows.seqlen = 0;
  EXPECT_FALSE(sm90::prefill_plan_by_prep(empty_rows)) << "T = 0: no prep CTA writes the plan";
  const int64_t cu[3] = {0, 4000, 8192};
  PrefillParams two = batch_fields(8192, 2, 16, cu);
  two.num_qk_heads = 16;
  two.head_dim_k = two.head_dim_v = 128;
  EXPECT_FALSE(sm90::prefill_plan_by_prep(two)) << "two packed sequences need the plan kernel";
  sm90::set_prefill_plan_by_prep(-1);
  sm90::set_prefill_path(sm90::PrefillPath::kAuto);
}

// The segment switch of the two-kernel path (dispatch.h; docs/contract.md, "Segments"): off by
// default, the cost model on request, forced lengths, and a workspace that grows by the segment
// area exactly when segments are taken. Host only: nothing launches.
TEST(PlanWorkspaceSize, SegmentSwitchAndItsWorkspace) {
  namespace pf = sm90::prefill;
  PrefillParams p = batch_fields(32768, 1, 4, nullptr);  // H4, one sequence of 32K tokens
  p.num_qk_heads = 4;
  p.head_dim_k = p.head_dim_v = 128;
  sm90::set_prefill_path(sm90::PrefillPath::kChunked);
  const pf::WorkspacePlan whole = pf::make_workspace_plan(1, 32768, 1, false, 4);

  sm90::set_prefill_segments(sm90::kSegmentsModel);
  const int32_t ls = sm90::prefill_segment_chunks(p);
  EXPECT_GT(ls, 0);  // at any SM count of the H100/H200 family (132 here without a GPU)
  const size_t with_segments = prefill_workspace_size(p);
  EXPECT_EQ(with_segments, pf::make_workspace_plan(1, 32768, 1, false, 4, ls).total_bytes);
  EXPECT_GT(with_segments, whole.total_bytes);
  // sized from the batch fields alone, the buffer covers the model's choice (Ls = 16, the most slots)
  PrefillParams sizes_only = batch_fields(32768, 1, 4, nullptr);
  EXPECT_GE(prefill_workspace_size(sizes_only), with_segments);
  sm90::set_prefill_segments(-1);  // no override: the default is the cost model's choice
  EXPECT_EQ(sm90::prefill_segment_chunks(p), ls);
  EXPECT_EQ(prefill_workspace_size(p), with_segments);
  EXPECT_GE(prefill_workspace_size(sizes_only), with_segments);

  sm90::set_prefill_segments(3, 32);
  EXPECT_EQ(sm90::prefill_segment_chunks(p), 3);
  EXPECT_EQ(prefill_workspace_size(p), pf::make_workspace_plan(1, 32768, 1, false, 4, 3).total_bytes);
  sm90::set_prefill_segments(0);
  EXPECT_EQ(sm90::prefill_segment_chunks(p), 0);
  EXPECT_EQ(prefill_workspace_size(p), whole.total_bytes);

  // many heads keep whole sequences under the model too (no regression at H = 96)
  sm90::set_prefill_segments(sm90::kSegmentsModel);
  PrefillParams h96 = batch_fields(8192, 1, 96, nullptr);
  h96.num_qk_heads = 96;
  h96.head_dim_k = h96.head_dim_v = 128;
  EXPECT_EQ(sm90::prefill_segment_chunks(h96), 0);

  sm90::set_prefill_segments(-1);
  sm90::set_prefill_path(sm90::PrefillPath::kAuto);
}

// The chunk blocks' element type (dispatch.h, prefill_f16_block; docs/contract.md, "Kernel
// paths"): fp16 for L2-normed q and k with |scale| in [1/16, 16] when the recurrence and summary
// kernels run 64 or 128 value rows, bf16 otherwise; the overrides. Host only.
TEST(PlanWorkspaceSize, ChunkBlockElementType) {
  PrefillParams p = batch_fields(32768, 1, 4, nullptr);
  p.num_qk_heads = 4;
  p.head_dim_k = p.head_dim_v = 128;
  p.use_qk_l2norm = true;
  p.scale = 0.08838835f;
  sm90::set_prefill_path(sm90::PrefillPath::kChunked);
  sm90::set_prefill_segments(sm90::kSegmentsModel);
  EXPECT_TRUE(sm90::prefill_f16_block(p));
  sm90::set_prefill_segments(0, 128);
  EXPECT_TRUE(sm90::prefill_f16_block(p));
  sm90::set_prefill_segments(0, 64);
  EXPECT_TRUE(sm90::prefill_f16_block(p));
  sm90::set_prefill_segments(0, 32);  // the mma.sync kernel reads bf16 blocks
  EXPECT_FALSE(sm90::prefill_f16_block(p));
  sm90::set_prefill_segments(4, 16);  // segments: 64- or 128-row summaries, 16-row recurrence
  EXPECT_FALSE(sm90::prefill_f16_block(p));
  sm90::set_prefill_segments(0, 128);
  p.use_qk_l2norm = false;  // unbounded q and k
  EXPECT_FALSE(sm90::prefill_f16_block(p));
  p.use_qk_l2norm = true;
  for (const float s : {1.f / 32.f, 32.f, -32.f}) {
    p.scale = s;
    EXPECT_FALSE(sm90::prefill_f16_block(p)) << "scale " << s;
  }
  for (const float s : {1.f / 16.f, 16.f, -1.f}) {
    p.scale = s;
    EXPECT_TRUE(sm90::prefill_f16_block(p)) << "scale " << s;
  }
  sm90::set_prefill_block(0);
  EXPECT_FALSE(sm90::prefill_f16_block(p));
  p.use_qk_l2norm = false;
  sm90::set_prefill_block(1);  // forced: wherever the kernels can
  EXPECT_TRUE(sm90::prefill_f16_block(p));
  sm90::set_prefill_segments(0, 32);
  EXPECT_FALSE(sm90::prefill_f16_block(p));
  sm90::set_prefill_block(-1);
  sm90::set_prefill_segments(-1);
  sm90::set_prefill_path(sm90::PrefillPath::kAuto);
}

// The longest-sequence hint (PrefillParams::max_seqlen): a packed batch averaging 32 tokens takes
// the 16-token-tile kernel (its workspace is the plan region alone) unless the caller says that
// one member is longer than the kernel's bound; then the two-kernel path and its chunk blocks.
// The bound is 1024 tokens with at least one (sequence, head) pair per SM (256 x 8 here), 512
// with fewer (the fused kernel's domain).
TEST(PlanWorkspaceSize, LongestSequenceHintRoutesALongMemberPastThePlanRegionKernels) {
  namespace pf = sm90::prefill;
  constexpr int64_t kT = 8192, kN = 256;
  std::vector<int64_t> cu(kN + 1, 0);
  PrefillParams p = batch_fields(kT, kN, 8, cu.data());  // a call's fields (head dims set)
  p.num_qk_heads = 8;
  p.head_dim_k = p.head_dim_v = 128;
  sm90::set_prefill_path(sm90::PrefillPath::kAuto);
  sm90::set_prefill_segments(0);
  const pf::WorkspacePlan plan = pf::make_workspace_plan(1, kT, kN, true, 8);
  EXPECT_EQ(prefill_workspace_size(p), plan.chunk_blocks_offset) << "no hint: the tile kernel";
  {
    // averaging over 64 tokens without the hint (128 here): routed on the device, so sized for
    // the two-kernel path; with the hint it is the host's choice again
    std::vector<int64_t> cu64(65, 0);
    PrefillParams mid = batch_fields(kT, 64, 8, cu64.data());
    mid.num_qk_heads = 8;
    mid.head_dim_k = mid.head_dim_v = 128;
    const pf::WorkspacePlan mid_plan = pf::make_workspace_plan(1, kT, 64, true, 8);
    EXPECT_EQ(prefill_workspace_size(mid), mid_plan.total_bytes) << "no hint, 128 tokens on average: routed";
    mid.max_seqlen = 1024;
    EXPECT_EQ(prefill_workspace_size(mid), mid_plan.chunk_blocks_offset) << "hint 1024: the tile kernel";
  }
  p.max_seqlen = 1024;
  EXPECT_EQ(prefill_workspace_size(p), plan.chunk_blocks_offset) << "1024 tokens: still the tile kernel";
  p.max_seqlen = 1025;
  EXPECT_EQ(prefill_workspace_size(p), plan.total_bytes) << "a longer member: the two-kernel path";
  p.max_seqlen = kT;
  EXPECT_EQ(prefill_workspace_size(p), plan.total_bytes);
  // fewer pairs than SMs (N = 16 averaging 64 tokens at H = 8): the fused kernel's bound of 512
  std::vector<int64_t> cu16(17, 0);
  PrefillParams few = batch_fields(1024, 16, 8, cu16.data());
  few.num_qk_heads = 8;
  few.head_dim_k = few.head_dim_v = 128;
  const pf::WorkspacePlan few_plan = pf::make_workspace_plan(1, 1024, 16, true, 8);
  few.max_seqlen = 512;
  EXPECT_EQ(prefill_workspace_size(few), few_plan.chunk_blocks_offset) << "512 tokens, 128 pairs: plan region";
  few.max_seqlen = 513;
  EXPECT_EQ(prefill_workspace_size(few), few_plan.total_bytes) << "513 tokens, 128 pairs: two-kernel path";
  // a fixed batch's rows all have the average length: the hint changes nothing there
  PrefillParams fixed = batch_fields(32, 8, 8, nullptr);
  fixed.num_qk_heads = 8;
  fixed.head_dim_k = fixed.head_dim_v = 128;
  const size_t fixed_size = prefill_workspace_size(fixed);
  fixed.max_seqlen = 32;
  EXPECT_EQ(prefill_workspace_size(fixed), fixed_size);
  sm90::set_prefill_segments(-1);
}

// KDAKIT_PREFILL_PATH=tile16 (set_prefill_path(kTile16)): the 16-token-tile kernel takes any
// batch it supports, a long fixed one included (its workspace: the plan region alone), and a call
// it does not support (q rows not 16-byte aligned) is kUnsupported naming the forced path and
// the reason, before anything is launched (no GPU needed). With the override removed the long
// batch is the two-kernel path's again.
TEST(PlanWorkspaceSize, ForcedTile16TakesAnySupportedBatchAndNamesWhatItDoesNot) {
  namespace pf = sm90::prefill;
  PrefillParams p = batch_fields(8192, 1, 8, nullptr);
  p.num_qk_heads = 8;
  p.head_dim_k = p.head_dim_v = 128;
  sm90::set_prefill_segments(0);
  const pf::WorkspacePlan plan = pf::make_workspace_plan(1, 8192, 1, false, 8);
  sm90::set_prefill_path(sm90::PrefillPath::kTile16);
  EXPECT_EQ(prefill_workspace_size(p), plan.chunk_blocks_offset) << "forced: the plan region";
  alignas(16) static uint8_t buffer[64];
  p.q = buffer + 2;  // not 16-byte aligned: neither plan-region kernel takes it
  p.k = p.v = buffer;
  const Status st = sm90::run_prefill(p, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.message();
  EXPECT_NE(st.message().find("KDAKIT_PREFILL_PATH=tile16"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.message();
  p.q = p.k = p.v = nullptr;
  sm90::set_prefill_path(sm90::PrefillPath::kAuto);
  EXPECT_EQ(prefill_workspace_size(p), plan.total_bytes) << "by default: the two-kernel path";
  sm90::set_prefill_segments(-1);
}

// A routed call (packed, no hint, averaging over 64 and at most 1024 tokens) is sized for the
// two-kernel path; with a smaller workspace it fails before anything is launched (no GPU needed),
// naming why it needs the chunk blocks. With the hint the tile kernel takes it and the plan region
// is enough.
TEST(PlanWorkspaceSize, RoutedCallWithASmallWorkspaceSaysWhyItNeedsTheBlocks) {
  for (const char* env : {"KDAKIT_PREFILL_PATH", "KDAKIT_TILE16_MAX_AVERAGE"})
    if (std::getenv(env) != nullptr) GTEST_SKIP() << env << " is set: the path is forced, nothing is routed";
  namespace pf = sm90::prefill;
  std::vector<int64_t> cu(65, 0);
  PrefillParams p = batch_fields(8192, 64, 8, cu.data());  // 128 tokens on average, 512 pairs
  p.num_qk_heads = 8;
  p.head_dim_k = p.head_dim_v = 128;
  alignas(16) static uint8_t buffer[64];
  p.q = p.k = p.v = buffer;
  sm90::set_prefill_path(sm90::PrefillPath::kAuto);
  sm90::set_prefill_segments(0);
  const pf::WorkspacePlan plan = pf::make_workspace_plan(1, 8192, 64, true, 8);
  ASSERT_EQ(prefill_workspace_size(p), plan.total_bytes);
  p.workspace = buffer;
  p.workspace_bytes = plan.chunk_blocks_offset;  // the plan region: what the tile kernel needs
  expect_status(sm90::run_prefill(p, nullptr), StatusCode::kInvalidArgument,
                "two-kernel path unless no sequence is past 1024 tokens, which only the device knows");
  p.max_seqlen = 1024;
  EXPECT_EQ(prefill_workspace_size(p), plan.chunk_blocks_offset) << "hinted: the tile kernel alone";
  sm90::set_prefill_segments(-1);
}

// One buffer sized from the largest batch's fields covers every call with at most those sizes,
// whatever segments the cost model picks for it: 8-chunk segments at up to 4 value heads
// (recurrence/launch.h, min_segment_chunks), one packed sequence modelled as a fixed batch.
TEST(PlanWorkspaceSize, BatchOnlySizeCoversTheModelsSegmentsOfEverySmallerCall) {
  sm90::set_prefill_path(sm90::PrefillPath::kAuto);
  sm90::set_prefill_segments(-1);  // the default: the cost model's choice
  int checked = 0, segmented = 0, eight = 0;
  for (const int32_t hv : {1, 2, 4, 5, 8, 16, 32}) {
    for (const int64_t t_max : {2048, 8192, 32768, 131072}) {
      for (const int64_t n_max : {1, 3, 9}) {
        for (const bool packed : {true, false}) {
          std::vector<int64_t> cu(size_t(n_max) + 1, 0);
          const size_t budget = prefill_workspace_size(batch_fields(t_max, n_max, hv, packed ? cu.data() : nullptr));
          for (const int64_t t : {t_max, t_max / 2 + 1, int64_t(1100), int64_t(1025)}) {
            for (int64_t n = 1; n <= n_max; n += 2) {
              if (t > t_max) continue;
              PrefillParams call = batch_fields(t, n, hv, packed ? cu.data() : nullptr);
              call.num_qk_heads = hv;
              call.head_dim_k = call.head_dim_v = 128;
              const int32_t ls = sm90::prefill_segment_chunks(call);
              segmented += ls > 0;
              eight += ls == 8;
              ++checked;
              EXPECT_GE(budget, prefill_workspace_size(call))
                  << "HV " << hv << (packed ? " packed" : " fixed") << ", sized for T " << t_max << " N " << n_max
                  << ", call T " << t << " N " << n << " (segments of " << ls << " chunks)";
            }
          }
        }
      }
    }
  }
  // the sweep reaches the cases it is for (checked to fail with the batch-only size at 16 chunks)
  EXPECT_GT(segmented, 0);
  EXPECT_GT(eight, 0) << "no call took 8-chunk segments";
  EXPECT_GT(checked, 300);
}
#endif

TEST(PlanWorkspaceSize, InvalidBatchFieldsSizeNothing) {
  std::vector<int64_t> cu(3, 0);
  PrefillParams p = batch_fields(10, 2, 4, cu.data());
  p.batch = 2;  // cu_seqlens needs B = 1
  EXPECT_EQ(prefill_workspace_size(p), 0u);
  p = batch_fields(10, 2, 0, cu.data());  // HV = 0
  EXPECT_EQ(prefill_workspace_size(p), 0u);
  p = batch_fields(-1, 2, 4, cu.data());
  EXPECT_EQ(prefill_workspace_size(p), 0u);
}

// --- prefill_plan validation --------------------------------------------------------------

struct PlanCase {
  std::string name;
  std::function<void(PrefillParams&, std::vector<unsigned char>&)> mutate;
  StatusCode code;
  std::string needle;
};

void PrintTo(const PlanCase& c, std::ostream* os) { *os << c.name; }

class PrefillPlanValidation : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PrefillPlanValidation, NamesTheArgument) {
  const PlanCase& c = GetParam();
  std::vector<int64_t> cu = {0, 4, 10};
  std::vector<unsigned char> memory(1 << 16);
  PrefillParams p = batch_fields(10, 2, 2, cu.data());
  p.workspace = memory.data();
  p.workspace_bytes = memory.size();
  c.mutate(p, memory);
  expect_status(prefill_plan(p, nullptr), c.code, c.needle);
}

const std::vector<PlanCase>& plan_cases() {
  static const std::vector<PlanCase> cases = {
      {"batch_not_1_with_cu_seqlens", [](PrefillParams& p, auto&) { p.batch = 2; },
       StatusCode::kInvalidArgument, "cu_seqlens: expected batch size 1"},
      {"num_seqs_not_batch_when_fixed",
       [](PrefillParams& p, auto&) { p.cu_seqlens = nullptr, p.batch = 3; },
       StatusCode::kInvalidArgument, "num_seqs: expected N = batch size (3)"},
      {"negative_seqlen", [](PrefillParams& p, auto&) { p.seqlen = -1; },
       StatusCode::kInvalidArgument, "seqlen: expected a token count T >= 0"},
      {"no_value_heads", [](PrefillParams& p, auto&) { p.num_v_heads = 0; },
       StatusCode::kInvalidArgument, "v: expected a number of value heads HV > 0, got 0"},
      {"cu_seqlens_float", [](PrefillParams& p, auto&) { p.dtype_cu_seqlens = DType::kFloat32; },
       StatusCode::kInvalidType, "cu_seqlens: expected dtype int32 or int64, got float32"},
      {"cu_seqlens_misaligned",
       [](PrefillParams& p, auto&) { p.cu_seqlens = static_cast<const char*>(p.cu_seqlens) + 4; },
       StatusCode::kInvalidArgument, "cu_seqlens: expected a pointer aligned to 8 bytes"},
  };
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefillPlanValidation, ::testing::ValuesIn(plan_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(PrefillPlan, WorkspaceMissingOrTooSmall) {
  std::vector<int64_t> cu = {0, 4, 10};
  std::vector<unsigned char> memory(1 << 16);
  PrefillParams p = batch_fields(10, 2, 2, cu.data());
  if (!built_with_cuda()) {
    p.workspace = memory.data(), p.workspace_bytes = memory.size();
    expect_status(prefill_plan(p, nullptr), StatusCode::kUnsupported, "built without CUDA");
    return;
  }
  expect_status(prefill_plan(p, nullptr), StatusCode::kInvalidArgument,
                "workspace: required (" + std::to_string(prefill_workspace_size(p)) + " bytes");
  p.workspace = memory.data();
  p.workspace_bytes = prefill_workspace_size(p) - 1;
  expect_status(prefill_plan(p, nullptr), StatusCode::kInvalidArgument,
                "workspace: expected at least " + std::to_string(prefill_workspace_size(p)));
}

TEST(PrefillPlan, NoSequencesIsANoOp) {
  if (!built_with_cuda()) GTEST_SKIP() << "without CUDA prefill_plan is kUnsupported";
  std::vector<int64_t> cu = {0};
  const PrefillParams p = batch_fields(0, 0, 2, cu.data());  // no workspace: nothing to write
  const Status s = prefill_plan(p, nullptr);
  EXPECT_TRUE(s.ok()) << describe(s);
}

// prefill with plan_ready checks the workspace before anything runs.
TEST(PrefillPlan, PrefillWithPlanReadyChecksTheWorkspace) {
  if (!built_with_cuda()) GTEST_SKIP() << "without CUDA prefill is kUnsupported";
  constexpr int64_t T = 10;
  constexpr int32_t H = 1, K = 128;
  std::vector<uint16_t> act(T * H * K * 5), out(T * H * K);
  std::vector<int64_t> cu = {0, 4, 10};
  std::vector<unsigned char> workspace(64);
  PrefillParams p = batch_fields(T, 2, H, cu.data());
  p.num_qk_heads = H, p.head_dim_k = p.head_dim_v = K;
  p.q = act.data(), p.k = act.data() + T * K, p.v = act.data() + 2 * T * K;
  p.g = act.data() + 3 * T * K, p.beta = act.data() + 4 * T * K, p.o = out.data();
  p.stride_q_t = p.stride_k_t = p.stride_v_t = p.stride_g_t = p.stride_o_t = H * K;
  p.stride_q_h = p.stride_k_h = p.stride_v_h = p.stride_g_h = p.stride_o_h = K;
  p.stride_beta_t = H, p.stride_beta_h = 1;
  p.scale = 0.088f;
  p.plan_ready = true;
  expect_status(prefill(p, nullptr), StatusCode::kInvalidArgument,
                "plan_ready: needs the workspace");
  p.workspace = workspace.data(), p.workspace_bytes = workspace.size();
  expect_status(prefill(p, nullptr), StatusCode::kInvalidArgument, "workspace: expected at least");
}

// --- the host mirror of the plan kernel ---------------------------------------------------

detail::PrefillPlanRegion plan_of(int64_t T, const std::vector<int64_t>& cu, int64_t max_chunks) {
  const PrefillParams p = batch_fields(T, int64_t(cu.size()) - 1, 1, cu.data());
  return detail::expected_prefill_plan(p, cu, 64, max_chunks);
}

TEST(PlanMirror, PackedWithEmptySequences) {
  // lengths 130, 0, 70 of T = 200: 3 + 0 + 2 chunks; max_chunks = ceil(200 / 64) + N = 7
  const auto r = plan_of(200, {0, 130, 130, 200}, 7);
  EXPECT_EQ(r.seq_start, (std::vector<int64_t>{0, 130, 130}));
  EXPECT_EQ(r.seq_len, (std::vector<int32_t>{130, 0, 70}));
  EXPECT_EQ(r.chunk_offsets, (std::vector<int32_t>{0, 3, 3, 5}));
  EXPECT_EQ(r.chunk_seq, (std::vector<int32_t>{0, 0, 0, 2, 2, -1, -1}));
  EXPECT_EQ(r.longest, (std::vector<int32_t>{130}));
  EXPECT_EQ(r.seq_order, (std::vector<int32_t>{0, 2, 1}));
}

TEST(PlanMirror, LaunchOrderIsLongestFirstWithTiesByIndex) {
  // lengths 100, 30, 170, 0, 64, 30, 170
  const auto r = plan_of(564, {0, 100, 130, 300, 300, 364, 394, 564}, 16);
  EXPECT_EQ(r.seq_len, (std::vector<int32_t>{100, 30, 170, 0, 64, 30, 170}));
  EXPECT_EQ(r.seq_order, (std::vector<int32_t>{2, 6, 0, 4, 1, 5, 3}));
}

TEST(PlanMirror, LaunchOrderPastFiveHundredTwelveSequencesIsTheIndexOrder) {
  // 513 sequences, the last one the longest: ranking stops at 512 (the plan kernel's one tile)
  std::vector<int64_t> cu(514);
  for (size_t i = 0; i < cu.size(); ++i) cu[i] = int64_t(i);
  cu.back() = 600;
  const auto r = plan_of(600, cu, 523);
  ASSERT_EQ(r.seq_order.size(), 513u);
  for (size_t i = 0; i < r.seq_order.size(); ++i) EXPECT_EQ(r.seq_order[i], int32_t(i));
  cu.pop_back();
  cu.back() = 600;  // 512 sequences: ranked, the last (89 tokens) first
  const auto s = plan_of(600, cu, 522);
  EXPECT_EQ(s.seq_order.front(), 511);
  EXPECT_EQ(s.seq_order[1], 0);
}

TEST(PlanMirror, BadOffsetsAreClampedAndMadeNonDecreasing) {
  // raw {-5, 3, 3, 70, 5} with T = 10 -> clamped {0, 3, 3, 10, 5} -> running max {0, 3, 3, 10, 10}
  const auto r = plan_of(10, {-5, 3, 3, 70, 5}, 5);
  EXPECT_EQ(r.seq_start, (std::vector<int64_t>{0, 3, 3, 10}));
  EXPECT_EQ(r.seq_len, (std::vector<int32_t>{3, 0, 7, 0}));
  EXPECT_EQ(r.chunk_offsets, (std::vector<int32_t>{0, 1, 1, 2, 2}));
  EXPECT_EQ(r.chunk_seq, (std::vector<int32_t>{0, 2, -1, -1, -1}));
  EXPECT_EQ(r.longest, (std::vector<int32_t>{7}));
}

TEST(PlanMirror, FixedBatch) {
  const PrefillParams p = batch_fields(130, 2, 1, nullptr);
  const auto r = detail::expected_prefill_plan(p, {}, 64, 6);
  EXPECT_EQ(r.seq_start, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(r.seq_len, (std::vector<int32_t>{130, 130}));
  EXPECT_EQ(r.chunk_offsets, (std::vector<int32_t>{0, 3, 6}));
  EXPECT_EQ(r.chunk_seq, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(r.longest, (std::vector<int32_t>{130}));
  EXPECT_EQ(r.seq_order, (std::vector<int32_t>{0, 1}));
}

TEST(PlanMirror, MismatchNamesTheFirstDifferentEntry) {
  const std::vector<int64_t> cu = {0, 130, 130, 200};
  const PrefillParams p = batch_fields(200, 3, 1, cu.data());
  detail::PrefillPlanRegion got = detail::expected_prefill_plan(p, cu, 64, 7);
  EXPECT_TRUE(detail::check_prefill_plan(p, cu, 64, got).ok());
  // the plan of other offsets with the same N: {0, 100, 130, 200}
  got = detail::expected_prefill_plan(p, {0, 100, 130, 200}, 64, 7);
  expect_status(detail::check_prefill_plan(p, cu, 64, got), StatusCode::kInvalidArgument,
                "plan_ready: the plan in workspace does not belong to this batch: seq_start[1] = "
                "100, expected 130");
  got = detail::expected_prefill_plan(p, cu, 64, 7);
  got.chunk_seq[5] = 1;
  expect_status(detail::check_prefill_plan(p, cu, 64, got), StatusCode::kInvalidArgument,
                "chunk_seq[5] = 1, expected -1");
  got = detail::expected_prefill_plan(p, cu, 64, 7);
  got.longest[0] = 200;
  expect_status(detail::check_prefill_plan(p, cu, 64, got), StatusCode::kInvalidArgument,
                "longest[0] = 200, expected 130");
  got = detail::expected_prefill_plan(p, cu, 64, 7);
  std::swap(got.seq_order[1], got.seq_order[2]);
  expect_status(detail::check_prefill_plan(p, cu, 64, got), StatusCode::kInvalidArgument,
                "seq_order[1] = 1, expected 2");
}

}  // namespace
}  // namespace kdakit
