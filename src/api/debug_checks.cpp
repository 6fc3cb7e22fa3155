// Debug-mode checks of device-resident metadata (see debug_checks.h). Everything here runs
// only when KDAKIT_DEBUG_CHECKS=1: it allocates host vectors and synchronises `stream`, which
// the normal run path never does.
#include "api/debug_checks.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "api/check.h"

namespace kdakit {
namespace {

// Copies `count` elements of `elem_bytes` bytes from device memory at `src` to the host.
Status copy_to_host(const char* name, const void* src, size_t count, size_t elem_bytes,
                    cudaStream_t stream, std::vector<unsigned char>& dst) {
  dst.resize(count * elem_bytes);
  if (count == 0) return Status::Ok();
  cudaError_t err =
      cudaMemcpyAsync(dst.data(), src, dst.size(), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  KDAKIT_CHECK(err == cudaSuccess, kCudaError, "KDAKIT_DEBUG_CHECKS: reading ", name,
               " to the host failed: ", cudaGetErrorString(err));
  return Status::Ok();
}

Status refuse_under_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  KDAKIT_CHECK(err == cudaSuccess, kCudaError,
               "KDAKIT_DEBUG_CHECKS: cudaStreamIsCapturing failed: ", cudaGetErrorString(err));
  KDAKIT_CHECK(capture == cudaStreamCaptureStatusNone, kUnsupported,
               "KDAKIT_DEBUG_CHECKS=1 reads metadata with a stream synchronisation, which CUDA "
               "graph capture forbids; unset it to capture");
  return Status::Ok();
}

// cu_seqlens as int64 offsets [N + 1]: cu[0] = 0, non-decreasing, cu[N] <= T.
Status read_cu_seqlens(const void* cu, DType dtype, int64_t num_seqs, int64_t seqlen,
                       cudaStream_t stream, std::vector<int64_t>& out) {
  const size_t count = static_cast<size_t>(num_seqs + 1);
  const size_t elem = dtype == DType::kInt32 ? 4 : 8;
  std::vector<unsigned char> raw;
  KDAKIT_RETURN_IF_ERROR(copy_to_host("cu_seqlens", cu, count, elem, stream, raw));
  out.resize(count);
  for (size_t i = 0; i < count; ++i) {
    if (elem == 4) {
      int32_t x;
      std::memcpy(&x, raw.data() + i * 4, 4);
      out[i] = x;
    } else {
      std::memcpy(&out[i], raw.data() + i * 8, 8);
    }
  }
  KDAKIT_CHECK(out[0] == 0, kInvalidArgument, "cu_seqlens: expected cu_seqlens[0] = 0, got ",
               out[0]);
  for (size_t i = 1; i < count; ++i) {
    KDAKIT_CHECK(out[i] >= out[i - 1], kInvalidArgument,
                 "cu_seqlens: expected non-decreasing offsets, got cu_seqlens[", i, "] = ",
                 out[i], " < cu_seqlens[", i - 1, "] = ", out[i - 1]);
  }
  KDAKIT_CHECK(out[count - 1] <= seqlen, kInvalidArgument, "cu_seqlens: expected cu_seqlens[",
               count - 1, "] <= T = ", seqlen, " tokens, got ", out[count - 1]);
  return Status::Ok();
}

Status read_int32(const char* name, const int32_t* src, size_t count, cudaStream_t stream,
                  std::vector<int32_t>& out) {
  std::vector<unsigned char> raw;
  KDAKIT_RETURN_IF_ERROR(copy_to_host(name, src, count, 4, stream, raw));
  out.resize(count);
  if (count > 0) std::memcpy(out.data(), raw.data(), count * 4);
  return Status::Ok();
}

// Tokens of sequence n: from cu_seqlens when packed, else T.
int64_t seq_len(const std::vector<int64_t>& cu, int64_t seqlen, int64_t n) {
  return cu.empty() ? seqlen : cu[n + 1] - cu[n];
}

// Records that `slot` is written by sequence n; two sequences writing one slot race.
Status claim_write(const char* name, int32_t slot, int64_t n,
                   std::unordered_map<int32_t, int64_t>& writer) {
  const auto [it, inserted] = writer.emplace(slot, n);
  KDAKIT_CHECK(inserted || it->second == n, kInvalidArgument, name, ": slot ", slot,
               " is written by sequences ", it->second, " and ", n,
               "; expected each written slot to belong to one sequence");
  return Status::Ok();
}

}  // namespace

bool debug_checks_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("KDAKIT_DEBUG_CHECKS");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return enabled;
}

Status debug_check(const PrefillParams& p, cudaStream_t stream) {
  KDAKIT_RETURN_IF_ERROR(refuse_under_capture(stream));
  const int64_t N = p.num_seqs;
  std::vector<int64_t> cu;
  if (p.cu_seqlens != nullptr) {
    KDAKIT_RETURN_IF_ERROR(
        read_cu_seqlens(p.cu_seqlens, p.dtype_cu_seqlens, N, p.seqlen, stream, cu));
  }
  std::vector<int32_t> init_idx, final_idx;
  if (p.initial_state_indices != nullptr) {
    KDAKIT_RETURN_IF_ERROR(read_int32("initial_state_indices", p.initial_state_indices,
                                      static_cast<size_t>(N), stream, init_idx));
  }
  if (p.final_state_indices != nullptr) {
    KDAKIT_RETURN_IF_ERROR(read_int32("final_state_indices", p.final_state_indices,
                                      static_cast<size_t>(N), stream, final_idx));
  }
  for (size_t n = 0; n < init_idx.size(); ++n) {
    KDAKIT_CHECK(init_idx[n] < p.num_state_slots, kInvalidArgument,
                 "initial_state_indices: expected a slot < num_state_slots = ",
                 p.num_state_slots, " (or < 0 for a zero initial state), got ",
                 "initial_state_indices[", n, "] = ", init_idx[n]);
  }
  std::unordered_map<int32_t, int64_t> writer;
  for (size_t n = 0; n < final_idx.size(); ++n) {
    KDAKIT_CHECK(final_idx[n] < p.num_state_slots, kInvalidArgument,
                 "final_state_indices: expected a slot < num_state_slots = ", p.num_state_slots,
                 " (or < 0 to skip the write), got final_state_indices[", n, "] = ",
                 final_idx[n]);
    if (final_idx[n] >= 0) {
      KDAKIT_RETURN_IF_ERROR(
          claim_write("final_state_indices", final_idx[n], static_cast<int64_t>(n), writer));
    }
  }
  // In a shared pool, a slot one sequence writes must not be another sequence's start.
  if (p.initial_state == p.final_state && !init_idx.empty() && !final_idx.empty()) {
    for (size_t n = 0; n < init_idx.size(); ++n) {
      const auto it = writer.find(init_idx[n]);
      KDAKIT_CHECK(init_idx[n] < 0 || it == writer.end() || it->second == int64_t(n),
                   kInvalidArgument, "initial_state_indices: slot ", init_idx[n],
                   " is read by sequence ", n, " and written by sequence ",
                   it == writer.end() ? -1 : it->second, " of the same pool");
    }
  }
  if (p.chunk_states != nullptr && !cu.empty()) {
    int64_t needed = 0;
    for (int64_t n = 0; n < N; ++n) {
      needed += (seq_len(cu, p.seqlen, n) + p.chunk_state_interval - 1) / p.chunk_state_interval;
    }
    KDAKIT_CHECK(needed <= p.num_chunk_states, kInvalidArgument,
                 "chunk_states: expected room for the ", needed,
                 " chunk states these cu_seqlens produce, got num_chunk_states = ",
                 p.num_chunk_states);
  }
  return Status::Ok();
}

Status debug_check(const DecodeParams& p, cudaStream_t stream) {
  KDAKIT_RETURN_IF_ERROR(refuse_under_capture(stream));
  const int64_t N = p.num_seqs;
  const int64_t cols = p.num_index_cols;
  std::vector<int64_t> cu;
  if (p.cu_seqlens != nullptr) {
    KDAKIT_RETURN_IF_ERROR(
        read_cu_seqlens(p.cu_seqlens, p.dtype_cu_seqlens, N, p.seqlen, stream, cu));
  }
  std::vector<int32_t> idx, acc;
  const size_t idx_count = N == 0 ? 0 : static_cast<size_t>((N - 1) * p.stride_state_indices_n + cols);
  KDAKIT_RETURN_IF_ERROR(read_int32("state_indices", p.state_indices, idx_count, stream, idx));
  if (p.num_accepted_tokens != nullptr) {
    KDAKIT_RETURN_IF_ERROR(read_int32("num_accepted_tokens", p.num_accepted_tokens,
                                      static_cast<size_t>(N), stream, acc));
  }
  std::unordered_map<int32_t, int64_t> writer;
  for (int64_t n = 0; n < N; ++n) {
    int64_t start_col = 0;
    if (!acc.empty()) {
      KDAKIT_CHECK(acc[n] >= 1 && acc[n] <= cols, kInvalidArgument,
                   "num_accepted_tokens: expected a value in [1, ", cols,
                   "] (the columns of state_indices), got num_accepted_tokens[", n, "] = ",
                   acc[n]);
      start_col = acc[n] - 1;
    }
    const int32_t* row = idx.data() + n * p.stride_state_indices_n;
    for (int64_t t = 0; t < cols; ++t) {
      KDAKIT_CHECK(row[t] < p.num_state_slots, kInvalidArgument,
                   "state_indices: expected a slot < num_state_slots = ", p.num_state_slots,
                   " (or < 0 for padding), got state_indices[", n, ", ", t, "] = ", row[t]);
    }
    const auto is_padding = [&](int32_t s) { return s < 0 || (s == 0 && p.null_slot_is_padding); };
    if (is_padding(row[start_col])) continue;
    if (cols == 1) {
      KDAKIT_RETURN_IF_ERROR(claim_write("state_indices", row[0], n, writer));
      continue;
    }
    const int64_t written = std::min<int64_t>(seq_len(cu, p.seqlen, n), cols);
    for (int64_t t = 0; t < written; ++t) {
      if (!is_padding(row[t])) KDAKIT_RETURN_IF_ERROR(claim_write("state_indices", row[t], n, writer));
    }
  }
  return Status::Ok();
}

}  // namespace kdakit
