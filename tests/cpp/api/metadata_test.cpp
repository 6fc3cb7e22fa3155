// Metadata checks (the rules KDAKIT_DEBUG_CHECKS=1 applies to cu_seqlens, slot indices and
// num_accepted_tokens after copying them to the host): a valid baseline passes and each named
// mutation of the host metadata names its first bad element. The params must pass validate()
// in every case, so each failure comes from the metadata alone.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/metadata_checks.h"
#include "kdakit/kdakit.h"

namespace kdakit {
namespace {

constexpr int32_t kH = 1, kHV = 2, kK = 4, kV = 4;
constexpr int64_t kStateElems = int64_t{kHV} * kK * kV;

// Backing memory for the params' pointers; validation and the metadata checks read none of it.
struct Buffers {
  std::vector<float> act = std::vector<float>(4096);
  std::vector<float> out = std::vector<float>(4096);
  std::vector<float> pool = std::vector<float>(16 * kStateElems);
  std::vector<float> chunks = std::vector<float>(16 * kStateElems);
  std::vector<int64_t> cu = std::vector<int64_t>(16);
  std::vector<int32_t> idx = std::vector<int32_t>(64);
  std::vector<int32_t> idx2 = std::vector<int32_t>(64);
  std::vector<int32_t> idx3 = std::vector<int32_t>(64);
  std::vector<int32_t> acc = std::vector<int32_t>(16);
};

template <typename P>
void fill_common(P& p, Buffers& b) {
  const int64_t T = p.seqlen;
  p.num_qk_heads = kH, p.num_v_heads = kHV, p.head_dim_k = kK, p.head_dim_v = kV;
  p.dtype_qkv = p.dtype_g = p.dtype_beta = DType::kFloat32;
  p.q = b.act.data(), p.k = b.act.data(), p.v = b.act.data(), p.g = b.act.data();
  p.beta = b.act.data(), p.o = b.out.data();
  p.stride_q_h = p.stride_k_h = p.stride_v_h = p.stride_o_h = p.stride_g_h = kK;
  p.stride_q_t = p.stride_k_t = kH * kK;
  p.stride_v_t = p.stride_o_t = p.stride_g_t = kHV * kK;
  p.stride_q_b = p.stride_k_b = T * kH * kK;
  p.stride_v_b = p.stride_o_b = p.stride_g_b = T * kHV * kK;
  p.stride_beta_h = 1, p.stride_beta_t = kHV, p.stride_beta_b = T * kHV;
  p.scale = 0.5f;
}

// Packed prefill of three sequences (lengths 4, 0, 5 of T = 10) over an in-place pool of 6
// slots, with chunk states every 64 tokens (one per non-empty sequence).
struct PrefillCase {
  PrefillParams p;
  detail::PrefillMetadata m;
};

PrefillCase valid_prefill(Buffers& b) {
  PrefillCase c;
  PrefillParams& p = c.p;
  p.batch = 1, p.seqlen = 10, p.num_seqs = 3, p.num_state_slots = 6, p.num_chunk_states = 2;
  fill_common(p, b);
  p.cu_seqlens = b.cu.data(), p.dtype_cu_seqlens = DType::kInt64;
  p.initial_state = p.final_state = b.pool.data();
  p.initial_state_indices = p.final_state_indices = b.idx.data();
  p.stride_initial_state_n = p.stride_final_state_n = kStateElems;
  p.chunk_states = b.chunks.data(), p.chunk_state_interval = 64;
  p.stride_chunk_states_n = kStateElems;
  c.m.cu_seqlens = {0, 4, 4, 9};
  c.m.initial_state_indices = {2, -1, 5};
  c.m.final_state_indices = {2, -1, 5};
  return c;
}

// The baseline's pool read through initial_state_indices and written through a second index
// array (the prefix-caching pattern).
void write_elsewhere(PrefillCase& c, Buffers& b, std::vector<int32_t> final_slots) {
  c.p.final_state_indices = b.idx2.data();
  c.m.final_state_indices = std::move(final_slots);
}

// The baseline's two chunk-state entries (one per non-empty sequence) written through
// chunk_state_indices into rows of the state pool itself.
void chunks_into_the_pool(PrefillCase& c, Buffers& b, std::vector<int32_t> rows) {
  c.p.chunk_states = b.pool.data(), c.p.chunk_state_indices = b.idx3.data();
  c.p.num_chunk_state_slots = 6;
  c.m.chunk_state_indices = std::move(rows);
}

// Dense speculative decode: 3 rows of T = 3 tokens, index rows [1 + S = 3] padded to 4,
// pool of 10 slots; row 2 is padding.
struct DecodeCase {
  DecodeParams p;
  detail::DecodeMetadata m;
};

DecodeCase valid_decode(Buffers& b) {
  DecodeCase c;
  DecodeParams& p = c.p;
  p.batch = 3, p.seqlen = 3, p.num_seqs = 3, p.num_state_slots = 10, p.num_index_cols = 3;
  fill_common(p, b);
  p.state_indices = b.idx.data(), p.num_accepted_tokens = b.acc.data();
  p.state = b.pool.data(), p.stride_state_slot = kStateElems, p.stride_state_indices_n = 4;
  c.m.state_indices = {1, 2, 3, 99, 4, 5, 6, 99, -1, -1, -1};
  c.m.num_accepted_tokens = {1, 3, 2};
  return c;
}

template <typename C>
struct Case {
  std::string name;
  std::function<void(C&, Buffers&)> mutate;
  bool ok;
  std::string needle;  // a piece of the message: the argument and the bad element
};

template <typename C>
void PrintTo(const Case<C>& c, std::ostream* os) {
  *os << c.name;
}

template <typename C>
void expect_case(const Case<C>& c, C (*make)(Buffers&)) {
  Buffers b;
  C x = make(b);
  c.mutate(x, b);
  ASSERT_TRUE(validate(x.p).ok()) << c.name << ": " << validate(x.p).message();
  const Status s = detail::check_metadata(x.p, x.m);
  if (c.ok) {
    EXPECT_TRUE(s.ok()) << c.name << ": " << s.message();
    return;
  }
  EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(StatusCode::kInvalidArgument))
      << c.name << ": " << s.message();
  EXPECT_NE(s.message().find(c.needle), std::string::npos)
      << c.name << ": message \"" << s.message() << "\" lacks \"" << c.needle << "\"";
}

using PC = Case<PrefillCase>;
using DC = Case<DecodeCase>;

const std::vector<PC>& prefill_cases() {
  static const std::vector<PC> cases = {
      {"baseline", [](PrefillCase&, Buffers&) {}, true, ""},
      {"tokens_past_last_offset",
       [](PrefillCase& c, Buffers&) {
         c.m.cu_seqlens = {0, 1, 1, 3};
       },
       true, ""},
      {"all_sequences_empty",
       [](PrefillCase& c, Buffers&) {
         c.m.cu_seqlens = {0, 0, 0, 0};
       },
       true, ""},
      {"fixed_batch_has_no_offsets",
       [](PrefillCase& c, Buffers&) {
         c.p.cu_seqlens = nullptr, c.p.batch = 3, c.p.num_chunk_states = 3;
         c.p.stride_q_b = 10 * kH * kK, c.p.stride_k_b = 10 * kH * kK;
         c.p.stride_v_b = c.p.stride_o_b = c.p.stride_g_b = 10 * kHV * kK;
         c.p.stride_beta_b = 10 * kHV;
         c.m.cu_seqlens.clear();
       },
       true, ""},
      {"separate_read_and_write_pools",
       [](PrefillCase& c, Buffers& b) {
         c.p.final_state = b.chunks.data(), c.p.final_state_indices = b.idx2.data();
         c.p.chunk_states = nullptr, c.p.chunk_state_interval = 0;
         c.m.initial_state_indices = {1, 1, 1};  // many readers of one slot are fine
         c.m.final_state_indices = {1, 2, 3};
       },
       true, ""},
      {"shared_pool_written_elsewhere",
       [](PrefillCase& c, Buffers& b) {
         write_elsewhere(c, b, {0, 1, 3});
       },
       true, ""},
      {"shared_pool_slot_read_and_written_by_one_sequence",
       [](PrefillCase& c, Buffers& b) {
         write_elsewhere(c, b, {2, 1, 4});
       },
       true, ""},
      {"shared_pool_slot_read_by_another_sequence",
       [](PrefillCase& c, Buffers& b) {
         write_elsewhere(c, b, {5, 1, 3});
       },
       false,
       "initial_state_indices: slot 5 is read by sequence 2 and written by sequence 0 "
       "(final_state_indices) of the same pool"},
      {"chunk_rows_into_the_state_pool",
       [](PrefillCase& c, Buffers& b) {
         chunks_into_the_pool(c, b, {0, 1});
       },
       true, ""},
      {"chunk_rows_skipped",
       [](PrefillCase& c, Buffers& b) {
         chunks_into_the_pool(c, b, {-1, -1});
       },
       true, ""},
      {"chunk_row_is_the_own_initial_slot",
       [](PrefillCase& c, Buffers& b) {
         chunks_into_the_pool(c, b, {2, 5});
       },
       true, ""},
      {"chunk_rows_in_their_own_pool",
       [](PrefillCase& c, Buffers& b) {
         chunks_into_the_pool(c, b, {2, 5});
         c.p.chunk_states = b.chunks.data();
       },
       true, ""},
      {"chunk_row_is_another_sequences_initial_slot",
       [](PrefillCase& c, Buffers& b) {
         write_elsewhere(c, b, {0, 1, 3});
         chunks_into_the_pool(c, b, {5, 4});
       },
       false,
       "initial_state_indices: slot 5 is read by sequence 2 and written by sequence 0 "
       "(chunk_state_indices)"},
      {"chunk_row_is_another_sequences_final_slot",
       [](PrefillCase& c, Buffers& b) {
         chunks_into_the_pool(c, b, {0, 2});
       },
       false, "chunk_state_indices: slot 2 is written by sequences 0 and 2 (final_state_indices)"},
      {"chunk_row_written_twice",
       [](PrefillCase& c, Buffers& b) {
         chunks_into_the_pool(c, b, {3, 3});
       },
       false, "chunk_state_indices: slot 3 is written by sequences 0 and 2"},
      {"chunk_row_out_of_range",
       [](PrefillCase& c, Buffers& b) {
         chunks_into_the_pool(c, b, {0, 6});
       },
       false, "chunk_state_indices[1] = 6"},
      {"too_few_chunk_state_indices",
       [](PrefillCase& c, Buffers& b) {
         chunks_into_the_pool(c, b, {0, 1});
         c.m.cu_seqlens = {0, 70, 70, 75};
         c.p.seqlen = 80;
       },
       false, "chunk_state_indices: expected room for the 3 chunk states"},
      {"first_offset_not_zero",
       [](PrefillCase& c, Buffers&) {
         c.m.cu_seqlens = {1, 4, 4, 9};
       },
       false, "cu_seqlens[0] = 0, got 1"},
      {"decreasing_offsets",
       [](PrefillCase& c, Buffers&) {
         c.m.cu_seqlens = {0, 4, 3, 9};
       },
       false, "cu_seqlens[2] = 3 < cu_seqlens[1] = 4"},
      {"last_offset_past_tokens",
       [](PrefillCase& c, Buffers&) {
         c.m.cu_seqlens = {0, 4, 4, 11};
       },
       false, "cu_seqlens: expected cu_seqlens[3] <= T = 10"},
      {"initial_slot_out_of_range",
       [](PrefillCase& c, Buffers&) {
         c.m.initial_state_indices = {2, 6, 5};
         c.m.final_state_indices = {2, -1, 5};
       },
       false, "initial_state_indices[1] = 6"},
      {"final_slot_out_of_range",
       [](PrefillCase& c, Buffers& b) {
         c.p.final_state_indices = b.idx2.data();
         c.p.final_state = b.chunks.data(), c.p.chunk_states = nullptr,
         c.p.chunk_state_interval = 0;
         c.m.final_state_indices = {0, 7, 1};
       },
       false, "final_state_indices[1] = 7"},
      {"final_slot_written_twice",
       [](PrefillCase& c, Buffers&) {
         c.m.initial_state_indices = c.m.final_state_indices = {2, -1, 2};
       },
       false, "slot 2 is written by sequences 0 and 2"},
      {"too_few_chunk_states",
       [](PrefillCase& c, Buffers&) {
         c.m.cu_seqlens = {0, 70, 70, 75};
         c.p.seqlen = 80;
       },
       false, "chunk_states: expected room for the 3 chunk states"},
  };
  return cases;
}

class PrefillMetadataChecks : public ::testing::TestWithParam<PC> {};
TEST_P(PrefillMetadataChecks, Rule) { expect_case(GetParam(), &valid_prefill); }
INSTANTIATE_TEST_SUITE_P(Cases, PrefillMetadataChecks, ::testing::ValuesIn(prefill_cases()),
                         [](const auto& info) { return info.param.name; });

const std::vector<DC>& decode_cases() {
  static const std::vector<DC> cases = {
      {"baseline", [](DecodeCase&, Buffers&) {}, true, ""},
      {"null_slot_rows_are_padding",
       [](DecodeCase& c, Buffers&) {
         c.p.null_slot_is_padding = true;
         c.m.state_indices = {1, 2, 3, 99, 0, 0, 0, 99, 0, 0, 0};
       },
       true, ""},
      {"packed_empty_sequence_writes_nothing",
       [](DecodeCase& c, Buffers& b) {
         c.p.batch = 1, c.p.seqlen = 6, c.p.cu_seqlens = b.cu.data();
         c.p.stride_q_b = c.p.stride_k_b = 6 * kH * kK;
         c.p.stride_v_b = c.p.stride_o_b = c.p.stride_g_b = 6 * kHV * kK;
         c.p.stride_beta_b = 6 * kHV;
         c.m.cu_seqlens = {0, 3, 3, 6};
         c.m.state_indices = {1, 2, 3, 99, 4, 5, 6, 99, 7, 8, 9};
       },
       true, ""},
      {"accepted_zero",
       [](DecodeCase& c, Buffers&) {
         c.m.num_accepted_tokens = {0, 3, 2};
       },
       false, "num_accepted_tokens[0] = 0"},
      {"accepted_past_columns",
       [](DecodeCase& c, Buffers&) {
         c.m.num_accepted_tokens = {1, 4, 2};
       },
       false, "num_accepted_tokens: expected a value in [1, 3]"},
      {"slot_out_of_range", [](DecodeCase& c, Buffers&) { c.m.state_indices[6] = 10; }, false,
       "state_indices[1, 2] = 10"},
      {"slot_written_by_two_rows", [](DecodeCase& c, Buffers&) { c.m.state_indices[5] = 2; }, false,
       "slot 2 is written by sequences 0 and 1"},
      {"zero_slot_shared_without_null_slot_flag",
       [](DecodeCase& c, Buffers&) { c.m.state_indices = {1, 2, 3, 99, 0, 0, 0, 99, 0, 0, 0}; },
       false, "slot 0 is written by sequences 1 and 2"},
      {"start_slot_written_by_another_row",
       [](DecodeCase& c, Buffers&) {
         c.p.seqlen = 1;  // one token: row n writes only state_indices[n, 0]
         c.p.stride_q_b = c.p.stride_k_b = kH * kK;
         c.p.stride_v_b = c.p.stride_o_b = c.p.stride_g_b = kHV * kK;
         c.p.stride_beta_b = kHV;
         c.m.state_indices = {1, 8, 8, 99, 7, 1, 9, 99, -1, -1, -1};
         c.m.num_accepted_tokens = {1, 2, 1};
       },
       false, "slot 1 is the start state of sequence 1 and written by sequence 0"},
      {"bad_offsets",
       [](DecodeCase& c, Buffers& b) {
         c.p.batch = 1, c.p.seqlen = 9, c.p.cu_seqlens = b.cu.data();
         c.m.cu_seqlens = {0, 3, 2, 6};
       },
       false, "cu_seqlens[2] = 2"},
  };
  return cases;
}

class DecodeMetadataChecks : public ::testing::TestWithParam<DC> {};
TEST_P(DecodeMetadataChecks, Rule) { expect_case(GetParam(), &valid_decode); }
INSTANTIATE_TEST_SUITE_P(Cases, DecodeMetadataChecks, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kdakit
