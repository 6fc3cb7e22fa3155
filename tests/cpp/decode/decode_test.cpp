// sm_90a token-serial kernel (decode, speculative decoding, short prefill) against the float64
// reference (kdakit::cpu::decode_reference / prefill_reference).
//
// Every case draws fresh random inputs (seed printed on failure), poisons the outputs, runs
// the GPU path on a copy and the reference on the host tensors, and checks:
//   - outputs: relative L2 against the reference, NaN positions equal (tokens no sequence
//     owns stay poisoned), exact zeros on padding rows;
//   - state pool: slots the reference did not write are bit-identical to their input (and the
//     padding between slots is untouched), written slots match to the state dtype's bar.
// Every decode case runs once per kernel variant that fits it (KDAKIT_DECODE_VARIANT,
// KDAKIT_DECODE_PDL and KDAKIT_DECODE_PREFETCH, read by dispatch.cu on every call), and checks
// with sm90::decode_variant that the forced variant is the one that runs; a variant that does
// not fit a case is skipped, and DecodeVariants.EveryVariantFitsSomeCase checks that each one
// runs somewhere. Skips (GTEST_SKIP) without a CUDA device, so the suite passes on CPU-only
// machines.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "common/cases.h"
#include "common/host_tensor.h"
#include "cuda/sm90/decode/dispatch.h"
#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

using testing::DecodeCase;
using testing::DecodeTensors;
using testing::HostTensor;
using testing::PrefillCase;
using testing::PrefillTensors;
using testing::Rng;
using testing::StateSource;

// ------------------------------------------------------------------------------------------
// Device helpers
// ------------------------------------------------------------------------------------------

bool has_cuda_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!has_cuda_device()) GTEST_SKIP() << "no CUDA device"

// Device copies of host tensors, freed at scope exit.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : buffers_) cudaFree(p);
  }
  void* upload(const HostTensor& x) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, x.nbytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, x.data(), x.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    buffers_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> buffers_;
};

void download(HostTensor& x, const void* device) {
  ASSERT_EQ(cudaMemcpy(x.data(), device, x.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
}

void reupload(const HostTensor& x, void* device) {
  ASSERT_EQ(cudaMemcpy(device, x.data(), x.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
}

// ------------------------------------------------------------------------------------------
// Kernel variants
// ------------------------------------------------------------------------------------------

// "auto" is the dispatcher's own choice; otherwise a KDAKIT_DECODE_VARIANT name, "+pdl" for a
// launch with programmatic dependent launch (KDAKIT_DECODE_PDL=1, else 0; with it the direct and
// staged kernels may prefetch their rows before the grid wait: "+pf" forces that on, "+nopf" off,
// KDAKIT_DECODE_PREFETCH=1 / 0; "+pfn" / "+nopfn": staged64x2's L2 prefetch of its second pass,
// KDAKIT_DECODE_PREFETCH_NEXT=1 / 0).
const std::vector<std::string>& test_variants() {
  static const std::vector<std::string> variants = {
      "auto",          "registers",       "staged",       "staged64",          "direct32",
      "direct16",      "direct32+pdl",    "direct16+pdl", "direct32+pdl+nopf", "staged+pdl",
      "staged+pdl+pf", "staged64+pdl+pf", "staged64x2+pdl", "staged64x2+pdl+pfn"};
  return variants;
}

// Sets the variant's environment for its scope; unsets it afterwards.
class ScopedVariant {
 public:
  explicit ScopedVariant(const std::string& spec) {
    clear();
    if (spec == "auto") return;
    std::string rest = spec;
    if (strip_suffix(rest, "+nopf")) setenv("KDAKIT_DECODE_PREFETCH", "0", 1);
    if (strip_suffix(rest, "+nopfn")) setenv("KDAKIT_DECODE_PREFETCH_NEXT", "0", 1);
    if (strip_suffix(rest, "+pfn")) setenv("KDAKIT_DECODE_PREFETCH_NEXT", "1", 1);
    if (strip_suffix(rest, "+pf")) setenv("KDAKIT_DECODE_PREFETCH", "1", 1);
    pdl_ = strip_suffix(rest, "+pdl");
    name_ = rest;
    setenv("KDAKIT_DECODE_VARIANT", name_.c_str(), 1);
    setenv("KDAKIT_DECODE_PDL", pdl_ ? "1" : "0", 1);
  }
  ~ScopedVariant() { clear(); }
  ScopedVariant(const ScopedVariant&) = delete;
  ScopedVariant& operator=(const ScopedVariant&) = delete;

  bool is_auto() const { return name_.empty(); }
  // True when the dispatcher runs exactly this variant for p (always for "auto").
  bool fits(const DecodeParams& p) const {
    return is_auto() || sm90::decode_variant(p) == name_ + (pdl_ ? "+pdl" : "");
  }

 private:
  static bool strip_suffix(std::string& s, const std::string& suffix) {
    if (s.size() <= suffix.size() || s.compare(s.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
    s.resize(s.size() - suffix.size());
    return true;
  }
  static void clear() {
    unsetenv("KDAKIT_DECODE_VARIANT");
    unsetenv("KDAKIT_DECODE_PDL");
    unsetenv("KDAKIT_DECODE_PREFETCH");
    unsetenv("KDAKIT_DECODE_PREFETCH_NEXT");
  }
  std::string name_;
  bool pdl_ = false;
};

std::string variant_test_name(const std::string& spec) {
  std::string out;
  for (char ch : spec) out += (ch == '+' || ch == '@') ? '_' : ch;
  return out;
}

// ------------------------------------------------------------------------------------------
// Accuracy bars (CONTRACT.md section 6: recurrent-path accuracy on the decode path)
// ------------------------------------------------------------------------------------------

// Output: fp32 math against float64; the output dtype's rounding dominates.
double output_bar(DType dtype_qkv) { return dtype_qkv == DType::kFloat32 ? 2e-5 : 8e-3; }
// State: fp32 registers -> fp32 store is ~1e-6 off float64 after a few tokens; a bf16 pool
// rounds every stored element (2^-9 relative), so one rounding step apart is ~4e-3.
double state_bar(DType dtype_state) { return dtype_state == DType::kFloat32 ? 2e-5 : 8e-3; }

// A view of slot `slot` of a [slots, HV, a, b] state tensor (shares no storage: a copy).
HostTensor slot_copy(const HostTensor& state, int64_t slot) {
  const int64_t per_slot = state.shape[1] * state.shape[2] * state.shape[3];
  HostTensor out = HostTensor::contiguous(state.dtype, {state.shape[1], state.shape[2], state.shape[3]});
  for (int64_t e = 0; e < per_slot; ++e) out.set(e, state.get(slot * per_slot + e));
  return out;
}

bool slot_bytes_equal(const HostTensor& a, const HostTensor& b, int64_t slot) {
  const int64_t size = cpu::element_bytes(a.dtype);
  const int64_t begin = slot * a.stride(0) * size;
  const int64_t end = std::min<int64_t>(int64_t(a.nbytes()), (slot + 1) * a.stride(0) * size);
  return std::memcmp(static_cast<const char*>(a.data()) + begin, static_cast<const char*>(b.data()) + begin,
                     size_t(end - begin)) == 0;
}

// Pool check: slots the reference left as they were must be bit-identical on the GPU (the
// whole slot stride, padding included); the others match within the state bar.
void expect_pool_matches(const HostTensor& initial, const HostTensor& got, const HostTensor& ref,
                         DType dtype_state) {
  ASSERT_EQ(got.nbytes(), ref.nbytes());
  const int64_t slots = initial.shape[0];
  int64_t untouched = 0;
  for (int64_t s = 0; s < slots; ++s) {
    if (slot_bytes_equal(initial, ref, s)) {
      ++untouched;
      EXPECT_TRUE(slot_bytes_equal(initial, got, s)) << "slot " << s << " was not to be written";
    } else {
      EXPECT_TRUE(testing::rel_l2_below("state slot " + std::to_string(s), slot_copy(got, s), slot_copy(ref, s),
                                        state_bar(dtype_state)));
    }
  }
  EXPECT_GT(untouched, 0) << "every case keeps some slots untouched";
}

// Outputs: relative L2 plus exact zeros wherever the reference wrote exact zeros (padding).
void expect_output_matches(const HostTensor& got, const HostTensor& ref, DType dtype_qkv) {
  EXPECT_TRUE(testing::rel_l2_below("output", got, ref, output_bar(dtype_qkv)));
  for (int64_t e = 0; e < ref.numel(); ++e) {
    if (ref.get(e) == 0.0) {
      ASSERT_EQ(got.get(e), 0.0) << "padding output not zero at " << got.index_string(e);
    }
  }
}

// ------------------------------------------------------------------------------------------
// Decode cases
// ------------------------------------------------------------------------------------------

DecodeCase base_case(std::string name) {
  DecodeCase c;
  c.name = std::move(name);
  c.batch = 6;
  c.seqlen = 1;
  c.H = 4;
  c.HV = 4;
  c.K = 128;
  c.V = 128;
  return c;
}

// Grids of many waves: batch x 3 heads, single token, the first padding_rows rows padding.
DecodeCase waves_case(std::string name, int64_t batch, int64_t padding_rows, DType pool) {
  DecodeCase c = base_case(std::move(name));
  c.batch = batch;
  c.H = c.HV = 3;
  c.padding_rows = padding_rows;
  c.dtype_state = pool;
  return c;
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> cases;
  auto add = [&](DecodeCase c) { cases.push_back(std::move(c)); };
  // --- regular
  add(base_case("fp32_pool_lower_bound"));
  {
    DecodeCase c = base_case("bf16_pool");
    c.dtype_state = DType::kBFloat16;
    add(c);
  }
  {
    DecodeCase c = base_case("kfirst_fp32");
    c.layout = StateLayout::kKFirst;
    add(c);
  }
  {
    DecodeCase c = base_case("kfirst_bf16");
    c.layout = StateLayout::kKFirst;
    c.dtype_state = DType::kBFloat16;
    add(c);
  }
  {
    DecodeCase c = base_case("softplus_gate");
    c.gate = GateMode::kSoftplus;
    add(c);
  }
  {
    DecodeCase c = base_case("precomputed_gate_no_norm");
    c.gate = GateMode::kPrecomputed;
    c.l2norm = false;
    add(c);
  }
  {
    DecodeCase c = base_case("lower_bound_no_A_log_no_dt_bias");
    c.has_A_log = false;
    c.has_dt_bias = false;
    c.lower_bound = -2.5f;
    add(c);
  }
  {
    DecodeCase c = base_case("gdn_scalar_gate_softplus");
    c.gate = GateMode::kSoftplus;
    c.scalar_gate = true;
    add(c);
  }
  {
    DecodeCase c = base_case("raw_beta");
    c.beta_sigmoid = false;
    add(c);
  }
  {
    DecodeCase c = base_case("neg_eigval_bf16_g_beta");
    c.neg_eigval = true;
    c.dtype_g = DType::kBFloat16;
    c.dtype_beta = DType::kBFloat16;
    add(c);
  }
  {
    DecodeCase c = base_case("fp32_activations");
    c.dtype_qkv = DType::kFloat32;
    add(c);
  }
  {
    DecodeCase c = base_case("fp16_activations_kfirst");
    c.dtype_qkv = DType::kFloat16;
    c.layout = StateLayout::kKFirst;
    add(c);
  }
  {
    DecodeCase c = base_case("head_dim_64");
    c.K = 64;
    c.V = 64;
    add(c);
  }
  {
    DecodeCase c = base_case("head_dim_64_kfirst_bf16");
    c.K = 64;
    c.V = 64;
    c.layout = StateLayout::kKFirst;
    c.dtype_state = DType::kBFloat16;
    add(c);
  }
  // --- irregular
  {
    DecodeCase c = base_case("odd_heads");
    c.H = 3;
    c.HV = 3;
    c.batch = 5;
    add(c);
  }
  {
    DecodeCase c = base_case("gva_h1_hv3");
    c.H = 1;
    c.HV = 3;
    add(c);
  }
  {
    DecodeCase c = base_case("gva_h2_hv6_kfirst");
    c.H = 2;
    c.HV = 6;
    c.layout = StateLayout::kKFirst;
    add(c);
  }
  {
    DecodeCase c = base_case("padded_views_and_slots");
    c.pad = 4;
    add(c);
  }
  {
    DecodeCase c = base_case("padding_rows");
    c.batch = 9;
    c.padding_rows = 4;
    add(c);
  }
  {
    DecodeCase c = base_case("null_slot_is_padding");
    c.batch = 9;
    c.padding_rows = 4;
    c.null_slot_is_padding = true;
    add(c);
  }
  {
    DecodeCase c = base_case("packed_int64_cu");
    c.seq_lens = {1, 0, 1, 2, 1};
    c.dtype_cu = DType::kInt64;
    c.tail = 2;
    add(c);
  }
  // Kernel choice (dispatch.cu): V-first one-column decode goes to the staged kernel (dense
  // T = 1: single-token variant, 32- or 64-row slices; packed with T <= N: token-loop variant)
  // when the pool is 16-byte aligned, to the register kernel otherwise. These cases pin each route.
  {
    DecodeCase c = base_case("staged_packed_token_loop");
    c.seq_lens = {1, 0, 2, 1, 1, 0, 1};  // 6 tokens for 7 sequences, one of them 2 tokens long
    add(c);
  }
  {
    DecodeCase c = base_case("staged_packed_token_loop_bf16");
    c.seq_lens = {2, 0, 1, 0, 3, 1};
    c.dtype_state = DType::kBFloat16;
    add(c);
  }
  // Dense T = 1 at K = 128 with more than 1024 32-row slices takes the staged kernel with
  // 64-row slices (dispatch.cu: 300 x 4 x 4 = 4800), with padding rows mixed in; the cases above
  // (6 x 4 x 4 = 96) take 32-row slices.
  {
    DecodeCase c = base_case("many_items_fp32");
    c.batch = 300;
    c.padding_rows = 40;
    add(c);
  }
  {
    DecodeCase c = base_case("many_items_bf16_null_slot");
    c.batch = 300;
    c.padding_rows = 40;
    c.null_slot_is_padding = true;
    c.dtype_state = DType::kBFloat16;
    add(c);
  }
  {
    DecodeCase c = base_case("registers_bf16_slots_8_byte_aligned");
    c.dtype_state = DType::kBFloat16;
    c.pad = 4;  // slot stride HV*V*K + 4 bf16 elements: 8-byte, not 16-byte aligned
    add(c);
  }
  {
    DecodeCase c = base_case("multi_token_in_place");
    c.seqlen = 5;
    add(c);
  }
  {
    DecodeCase c = base_case("many_tokens_groups_kfirst");
    c.seqlen = 37;  // three token groups of 16, the last partial
    c.batch = 3;
    c.layout = StateLayout::kKFirst;
    add(c);
  }
  {
    DecodeCase c = base_case("many_tokens_groups");
    c.seqlen = 37;
    c.batch = 3;
    c.dtype_state = DType::kBFloat16;
    add(c);
  }
  // --- speculative decoding (S = 3: 1 + 3 index columns, 4 tokens)
  {
    DecodeCase c = base_case("spec_s3_accepted");
    c.seqlen = 4;
    c.num_index_cols = 4;
    c.accepted = true;
    add(c);
  }
  {
    DecodeCase c = base_case("spec_s3_accepted_bf16_kfirst");
    c.seqlen = 4;
    c.num_index_cols = 4;
    c.accepted = true;
    c.dtype_state = DType::kBFloat16;
    c.layout = StateLayout::kKFirst;
    add(c);
  }
  {
    DecodeCase c = base_case("spec_s3_skipped_writes_padding");
    c.batch = 8;
    c.seqlen = 4;
    c.num_index_cols = 4;
    c.accepted = true;
    c.negative_write_slots = true;
    c.padding_rows = 2;
    add(c);
  }
  {
    DecodeCase c = base_case("spec_packed_short_sequences");
    c.seq_lens = {4, 2, 0, 3, 1};
    c.num_index_cols = 4;
    c.accepted = true;
    add(c);
  }
  {
    DecodeCase c = base_case("spec_more_tokens_than_columns");
    c.seqlen = 6;
    c.num_index_cols = 3;
    c.accepted = true;
    add(c);
  }
  // --- grids of several waves (2400 32-row slices: 4.5 waves of the direct kernel, 1.5 of the
  // 64-row staged one), with padding rows
  for (const DType pool : {DType::kFloat32, DType::kBFloat16}) {
    add(waves_case(pool == DType::kFloat32 ? "many_waves_padding" : "many_waves_bf16_padding", 200, 37, pool));
  }
  // --- fast kernel (direct.cuh): GVA with a ratio that is not a power of two
  // (fast_qk_head), K = 64, bf16 pools with padding, packed single-token batches (the serving
  // layout of vLLM), fp16 activations with raw beta and the precomputed gate
  {
    DecodeCase c = base_case("gva_h2_hv10_bf16_padding");
    c.H = 2;
    c.HV = 10;
    c.batch = 11;
    c.padding_rows = 3;
    c.dtype_state = DType::kBFloat16;
    add(c);
  }
  {
    DecodeCase c = base_case("head_dim_64_bf16_gva_padding");
    c.K = 64;
    c.V = 64;
    c.H = 1;
    c.HV = 3;
    c.batch = 9;
    c.padding_rows = 2;
    c.dtype_state = DType::kBFloat16;
    add(c);
  }
  {
    DecodeCase c = base_case("packed_single_tokens_null_slot");
    c.seq_lens = std::vector<int64_t>(40, 1);
    c.padding_rows = 6;
    c.null_slot_is_padding = true;
    add(c);
  }
  {
    DecodeCase c = base_case("fp16_precomputed_raw_beta_bf16_pool");
    c.dtype_qkv = DType::kFloat16;
    c.gate = GateMode::kPrecomputed;
    c.beta_sigmoid = false;
    c.dtype_state = DType::kBFloat16;
    c.batch = 13;
    add(c);
  }
  {
    DecodeCase c = base_case("many_items_gdn_softplus_int64_packed");
    c.seq_lens = std::vector<int64_t>(150, 1);
    c.seq_lens[7] = 0;
    c.seq_lens[90] = 3;
    c.dtype_cu = DType::kInt64;
    c.gate = GateMode::kSoftplus;
    c.scalar_gate = true;
    c.padding_rows = 20;
    add(c);
  }
  return cases;
}

// More than one wave of staged64x2 (1200 heads; a wave is 6 x 132 fp32 / 8 x 132 bf16 CTAs on the
// H200; every grid of decode_cases is under one) and, with an fp32 pool, of the direct kernel (4800
// 32-row CTAs, 5 x 132 per wave). Run under the variants that serve such grids only (wave_variants):
// the pools are 39 / 20 MB, each run a second of host work.
std::vector<DecodeCase> wave_cases() {
  std::vector<DecodeCase> cases;
  for (const DType pool : {DType::kFloat32, DType::kBFloat16}) {
    cases.push_back(waves_case(pool == DType::kFloat32 ? "x2_waves_padding" : "x2_waves_bf16_padding", 400, 41, pool));
  }
  return cases;
}
const std::vector<std::string>& wave_variants() {
  static const std::vector<std::string> variants = {"auto", "staged64x2+pdl", "staged64x2+pdl+pfn", "direct32+pdl"};
  return variants;
}

using VariantCase = std::tuple<DecodeCase, std::string>;

class DecodeKernel : public ::testing::TestWithParam<VariantCase> {};

TEST_P(DecodeKernel, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto& [c, variant] = GetParam();
  ScopedVariant scoped(variant);
  Rng rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  DecodeTensors t = testing::make_decode_tensors(c, rng);
  const HostTensor initial_state = t.state;

  DeviceArena arena;
  const testing::DecodePointers dev = testing::map_pointers(t, [&](HostTensor& x) { return arena.upload(x); });
  const DecodeParams p = testing::fill_decode_params(c, t, dev);
  if (!scoped.fits(p)) GTEST_SKIP() << variant << " does not serve this case (dispatcher: " << sm90::decode_variant(p) << ")";
  const Status status = decode(p, nullptr);
  ASSERT_TRUE(status.ok()) << status.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got_o = t.o, got_state = t.state;
  download(got_o, dev.o);
  download(got_state, dev.state);

  const Status ref = cpu::decode_reference(testing::fill_decode_params(c, t, testing::host_pointers(t)));
  ASSERT_TRUE(ref.ok()) << ref.message();
  expect_output_matches(got_o, t.o, c.dtype_qkv);
  expect_pool_matches(initial_state, got_state, t.state, c.dtype_state);
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeKernel,
                         ::testing::Combine(::testing::ValuesIn(decode_cases()), ::testing::ValuesIn(test_variants())),
                         [](const ::testing::TestParamInfo<VariantCase>& info) {
                           return std::get<0>(info.param).name + "__" + variant_test_name(std::get<1>(info.param));
                         });
INSTANTIATE_TEST_SUITE_P(Waves, DecodeKernel,
                         ::testing::Combine(::testing::ValuesIn(wave_cases()), ::testing::ValuesIn(wave_variants())),
                         [](const ::testing::TestParamInfo<VariantCase>& info) {
                           return std::get<0>(info.param).name + "__" + variant_test_name(std::get<1>(info.param));
                         });

// Every forced variant serves at least one case above (decided on the host: reads no memory).
TEST(DecodeVariants, EveryVariantFitsSomeCase) {
  SKIP_WITHOUT_GPU();
  std::vector<DecodeTensors> tensors;
  const std::vector<DecodeCase> cases = decode_cases();
  Rng rng = testing::make_rng();
  for (const DecodeCase& c : cases) tensors.push_back(testing::make_decode_tensors(c, rng));
  for (const std::string& variant : test_variants()) {
    if (variant == "auto") continue;
    ScopedVariant scoped(variant);
    int fits = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      fits += scoped.fits(testing::fill_decode_params(cases[i], tensors[i], testing::host_pointers(tensors[i])));
    }
    EXPECT_GT(fits, 0) << variant << " serves no case";
  }
  // And the names the dispatcher accepts are the ones tested.
  for (const std::string& name : sm90::decode_variant_names()) {
    bool tested = false;
    for (const std::string& variant : test_variants()) tested |= variant.rfind(name, 0) == 0;
    EXPECT_TRUE(tested) << name << " is not in test_variants()";
  }
}

// Three decode steps chained on the same pool (fresh activations each step), as an engine
// runs consecutive tokens: the pool after the third step and its outputs match.
class DecodeKernelChain : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeKernelChain, ThreeStepsOnOnePool) {
  SKIP_WITHOUT_GPU();
  ScopedVariant scoped(GetParam());
  for (DType dtype_state : {DType::kFloat32, DType::kBFloat16}) {
    DecodeCase c = base_case("chain");
    c.batch = 7;
    c.padding_rows = 2;
    c.dtype_state = dtype_state;
    Rng rng = testing::make_rng();
    SCOPED_TRACE(rng.trace());
    DecodeTensors t = testing::make_decode_tensors(c, rng);
    const HostTensor initial_state = t.state;

    DeviceArena arena;
    const testing::DecodePointers dev = testing::map_pointers(t, [&](HostTensor& x) { return arena.upload(x); });
    const DecodeParams p = testing::fill_decode_params(c, t, dev);
    if (!scoped.fits(p)) GTEST_SKIP() << GetParam() << " does not serve this case";
    HostTensor got_o = t.o;
    for (int step = 0; step < 3; ++step) {
      testing::detail::make_activations(c, t, rng);  // fresh q, k, v, g, beta; o poisoned
      for (const auto& [host, device] : {std::pair<const HostTensor*, const void*>{&t.q, dev.q},
                                         {&t.k, dev.k},
                                         {&t.v, dev.v},
                                         {&t.g, dev.g},
                                         {&t.beta, dev.beta},
                                         {&t.o, dev.o}}) {
        reupload(*host, const_cast<void*>(device));
      }
      if (t.A_log.defined()) reupload(t.A_log, const_cast<void*>(dev.A_log));
      if (t.dt_bias.defined()) reupload(t.dt_bias, const_cast<void*>(dev.dt_bias));
      const Status status = decode(p, nullptr);
      ASSERT_TRUE(status.ok()) << status.message();
      const Status ref = cpu::decode_reference(testing::fill_decode_params(c, t, testing::host_pointers(t)));
      ASSERT_TRUE(ref.ok()) << ref.message();
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    HostTensor got_state = t.state;
    download(got_o, dev.o);
    download(got_state, dev.state);
    expect_output_matches(got_o, t.o, c.dtype_qkv);
    expect_pool_matches(initial_state, got_state, t.state, c.dtype_state);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, DecodeKernelChain, ::testing::ValuesIn(test_variants()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return variant_test_name(info.param);
                         });

// Launches back to back without any host sync, captured in a CUDA graph: four steps on the
// same slots with the same inputs. With "+pdl" the capture holds programmatic edges between
// the decode kernels, and every step must still see the state the previous one wrote.
class DecodeKernelGraph : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeKernelGraph, FourStepsCaptured) {
  SKIP_WITHOUT_GPU();
  ScopedVariant scoped(GetParam());
  DecodeCase c = base_case("graph");
  c.batch = 37;
  c.H = 2;
  c.HV = 6;
  c.padding_rows = 5;
  Rng rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  DecodeTensors t = testing::make_decode_tensors(c, rng);
  const HostTensor initial_state = t.state;
  DeviceArena arena;
  const testing::DecodePointers dev = testing::map_pointers(t, [&](HostTensor& x) { return arena.upload(x); });
  const DecodeParams p = testing::fill_decode_params(c, t, dev);
  if (!scoped.fits(p)) GTEST_SKIP() << GetParam() << " does not serve this case";

  // One eager call on a scratch pool first, so that one-time kernel attributes are set outside
  // the capture.
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, t.state.nbytes()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(scratch, dev.state, t.state.nbytes(), cudaMemcpyDeviceToDevice), cudaSuccess);
  DecodeParams warm = p;
  warm.state = scratch;
  ASSERT_TRUE(decode(warm, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaFree(scratch), cudaSuccess);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (int step = 0; step < 4; ++step) {
    const Status status = decode(p, stream);
    EXPECT_TRUE(status.ok()) << status.message();
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);

  for (int step = 0; step < 4; ++step) {
    const Status ref = cpu::decode_reference(testing::fill_decode_params(c, t, testing::host_pointers(t)));
    ASSERT_TRUE(ref.ok()) << ref.message();
  }
  HostTensor got_o = t.o, got_state = t.state;
  download(got_o, dev.o);
  download(got_state, dev.state);
  expect_output_matches(got_o, t.o, c.dtype_qkv);
  expect_pool_matches(initial_state, got_state, t.state, c.dtype_state);
}

INSTANTIATE_TEST_SUITE_P(Variants, DecodeKernelGraph, ::testing::ValuesIn(test_variants()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return variant_test_name(info.param);
                         });

// Same inputs, same bits: no atomics, no order-dependent sums.
TEST(DecodeKernelDeterminism, RepeatedRunsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  DecodeCase c = base_case("determinism");
  c.batch = 16;
  c.seqlen = 4;
  c.num_index_cols = 4;
  c.accepted = true;
  Rng rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  DecodeTensors t = testing::make_decode_tensors(c, rng);
  DeviceArena arena;
  const testing::DecodePointers dev = testing::map_pointers(t, [&](HostTensor& x) { return arena.upload(x); });
  const DecodeParams p = testing::fill_decode_params(c, t, dev);
  HostTensor first_o = t.o, first_state = t.state;
  for (int run = 0; run < 20; ++run) {
    reupload(t.state, dev.state);
    ASSERT_TRUE(decode(p, nullptr).ok());
    HostTensor o = t.o, state = t.state;
    download(o, dev.o);
    download(state, dev.state);
    if (run == 0) {
      first_o = o;
      first_state = state;
    } else {
      ASSERT_TRUE(testing::storage_equal("output, run " + std::to_string(run), o, first_o));
      ASSERT_TRUE(testing::storage_equal("state, run " + std::to_string(run), state, first_state));
    }
  }
}

// The same for every kernel variant on a single-column batch (the spec case above runs the
// register kernel): no order-dependent sums in the fast kernels either.
class DecodeKernelVariantDeterminism : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeKernelVariantDeterminism, RepeatedRunsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  ScopedVariant scoped(GetParam());
  DecodeCase c = base_case("variant_determinism");
  c.batch = 64;
  c.padding_rows = 5;
  c.dtype_state = DType::kBFloat16;
  Rng rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  DecodeTensors t = testing::make_decode_tensors(c, rng);
  DeviceArena arena;
  const testing::DecodePointers dev = testing::map_pointers(t, [&](HostTensor& x) { return arena.upload(x); });
  const DecodeParams p = testing::fill_decode_params(c, t, dev);
  if (!scoped.fits(p)) GTEST_SKIP() << GetParam() << " does not serve this case";
  HostTensor first_o = t.o, first_state = t.state;
  for (int run = 0; run < 10; ++run) {
    reupload(t.state, dev.state);
    ASSERT_TRUE(decode(p, nullptr).ok());
    HostTensor o = t.o, state = t.state;
    download(o, dev.o);
    download(state, dev.state);
    if (run == 0) {
      first_o = o;
      first_state = state;
    } else {
      ASSERT_TRUE(testing::storage_equal("output, run " + std::to_string(run), o, first_o));
      ASSERT_TRUE(testing::storage_equal("state, run " + std::to_string(run), state, first_state));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, DecodeKernelVariantDeterminism, ::testing::ValuesIn(test_variants()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return variant_test_name(info.param);
                         });

// Shapes and layouts the kernel does not build are an error naming the supported ones.
TEST(DecodeKernelUnsupported, HeadDimAndMisalignedSlotStride) {
  SKIP_WITHOUT_GPU();
  DecodeCase c = base_case("unsupported");
  c.K = 96;
  c.V = 96;
  Rng rng = testing::make_rng();
  DecodeTensors t = testing::make_decode_tensors(c, rng);
  DecodeParams p = testing::fill_decode_params(c, t, testing::host_pointers(t));
  Status s = sm90::run_decode(p, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("K = V = 128 or K = V = 64"), std::string::npos) << s.message();

  DecodeCase odd = base_case("odd_slot_stride");
  odd.pad = 1;  // slot stride HV*V*K + 1 fp32 elements: breaks 16-byte state accesses
  DecodeTensors u = testing::make_decode_tensors(odd, rng);
  DecodeParams q = testing::fill_decode_params(odd, u, testing::host_pointers(u));
  s = sm90::run_decode(q, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("aligned"), std::string::npos) << s.message();
}

// ------------------------------------------------------------------------------------------
// Short prefill through run_recurrent_prefill (PrefillParams)
// ------------------------------------------------------------------------------------------

PrefillCase prefill_case(std::string name) {
  PrefillCase c;
  c.name = std::move(name);
  c.batch = 3;
  c.seqlen = 21;
  c.H = 2;
  c.HV = 4;
  c.K = 128;
  c.V = 128;
  return c;
}

std::vector<PrefillCase> prefill_cases() {
  std::vector<PrefillCase> cases;
  cases.push_back(prefill_case("dense_states"));
  {
    PrefillCase c = prefill_case("no_initial_state");
    c.initial = StateSource::kNone;
    cases.push_back(c);
  }
  {
    PrefillCase c = prefill_case("pool_in_place_negative_indices_packed");
    c.seq_lens = {17, 0, 64, 3, 30};
    c.tail = 5;
    c.initial = StateSource::kPool;
    c.final_state = StateSource::kPool;
    c.in_place = true;
    c.negative_indices = true;
    c.extra_slots = 3;
    cases.push_back(c);
  }
  {
    PrefillCase c = prefill_case("pool_separate_bf16_kfirst_softplus");
    c.seq_lens = {9, 40, 1};
    c.initial = StateSource::kPool;
    c.final_state = StateSource::kPool;
    c.extra_slots = 2;
    c.dtype_state = DType::kBFloat16;
    c.layout = StateLayout::kKFirst;
    c.gate = GateMode::kSoftplus;
    cases.push_back(c);
  }
  {
    PrefillCase c = prefill_case("chunk_states_packed");
    c.seq_lens = {70, 0, 130, 64};
    c.chunk_state_interval = 64;
    cases.push_back(c);
  }
  {
    PrefillCase c = prefill_case("head_dim_64_gdn_padded");
    c.K = 64;
    c.V = 64;
    c.scalar_gate = true;
    c.gate = GateMode::kSoftplus;
    c.pad = 4;
    cases.push_back(c);
  }
  return cases;
}

class RecurrentPrefillKernel : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(RecurrentPrefillKernel, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const PrefillCase& c = GetParam();
  Rng rng = testing::make_rng();
  SCOPED_TRACE(rng.trace());
  PrefillTensors t = testing::make_prefill_tensors(c, rng);
  const HostTensor initial_final = c.in_place ? t.initial_state : t.final_state;

  DeviceArena arena;
  const testing::PrefillPointers dev = testing::map_pointers(t, [&](HostTensor& x) { return arena.upload(x); });
  const PrefillParams p = testing::fill_prefill_params(c, t, dev);
  ASSERT_TRUE(validate(p).ok()) << validate(p).message();
  const Status status = sm90::run_recurrent_prefill(p, nullptr);
  ASSERT_TRUE(status.ok()) << status.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got_o = t.o;
  download(got_o, dev.o);
  HostTensor& final_host = c.in_place ? t.initial_state : t.final_state;
  HostTensor got_final = final_host;
  if (final_host.defined()) download(got_final, c.in_place ? dev.initial_state : dev.final_state);
  HostTensor got_chunks = t.chunk_states;
  if (t.chunk_states.defined()) download(got_chunks, dev.chunk_states);

  const Status ref = cpu::prefill_reference(testing::fill_prefill_params(c, t, testing::host_pointers(t)));
  ASSERT_TRUE(ref.ok()) << ref.message();

  EXPECT_TRUE(testing::rel_l2_below("output", got_o, t.o, output_bar(c.dtype_qkv)));
  if (final_host.defined()) {
    if (c.final_state == StateSource::kPool) {
      expect_pool_matches(initial_final, got_final, final_host, c.dtype_state);
    } else {
      // Dense final states start poisoned: every one must be written.
      EXPECT_TRUE(testing::rel_l2_below("final state", got_final, final_host, state_bar(c.dtype_state)));
    }
  }
  if (t.chunk_states.defined()) {
    EXPECT_TRUE(testing::rel_l2_below("chunk states", got_chunks, t.chunk_states, state_bar(c.dtype_state)));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, RecurrentPrefillKernel, ::testing::ValuesIn(prefill_cases()),
                         [](const ::testing::TestParamInfo<PrefillCase>& info) { return info.param.name; });

}  // namespace
}  // namespace kdakit
