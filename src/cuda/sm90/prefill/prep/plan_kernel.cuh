// Prefill plan kernel (sm_90a): fills the plan region of the workspace (workspace.h) once per
// batch; the prep and recurrence kernels read it.
//
// kda_prefill_plan_sm90_kernel, one CTA of kPlanThreads threads.
// From cu_seqlens [N + 1] (or the fixed [B, T] shape) it writes the plan region (workspace.h):
//   pos[m]          = max_{m' <= m} clamp(cu[m'], 0, T)        (clamped, non-decreasing)
//   seq_start[n]    = pos[n],  seq_len[n] = pos[n + 1] - pos[n]
//   chunk_offsets   = exclusive sum of ceil(seq_len / 64), [N] = total <= ceil(T / 64) + N
//   chunk_seq[c]    = the n with chunk_offsets[n] <= c < chunk_offsets[n + 1]; -1 past the total
//   longest         = max_n seq_len[n] (0 for N = 0): the device-side path choice of a routed call
//   seq_order[i]    = the sequence of rank i by (seq_len descending, n ascending) for N <=
//                     kOrderedSeqs, else i: the recurrence's launch order (workspace.h)
//   host_shape      = a shape-routed call's choice (workspace.h, Route): 1 when the host's
//                     recurrence shape beats whole sequences on 64-row CTAs by the cost model on
//                     these lengths (recurrence/launch.h, host_shape_wins), else 0; 1 for any
//                     other call (the host's choice stands)
//
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "cuda/sm90/prefill/prep/config.h"
#include "cuda/sm90/prefill/recurrence/launch.h"

namespace kdakit::sm90::prefill::prep {

// ------------------------------------------------------------------------------------------
// Plan kernel
// ------------------------------------------------------------------------------------------
struct PlanParams {
  const void* cu_seqlens;  // [N + 1], nullable (fixed batch)
  bool cu_int64;
  int64_t num_seqs;
  int64_t seqlen;
  int64_t max_chunks;
  int32_t* chunk_offsets;
  int32_t* chunk_seq;
  int64_t* seq_start;
  int32_t* seq_len;
  int32_t* longest;
  int32_t* seq_order;
  int32_t* host_shape;
  ShapeRoute shape_route;  // num_sms > 0: a shape-routed call (workspace.h, Route)
  int32_t num_v_heads;
};

// The plan's `host_shape` (thread 0, once the lengths are known).
__device__ __forceinline__ void write_shape_choice(const PlanParams& p, const KnownChains& k) {
  *p.host_shape = p.shape_route.num_sms <= 0 || host_shape_wins(k, p.shape_route, p.num_v_heads) ? 1 : 0;
}

struct MaxOp {
  __device__ __forceinline__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};

__global__ void __launch_bounds__(kPlanThreads) kda_prefill_plan_sm90_kernel(const __grid_constant__ PlanParams p) {
  using Scan = cub::BlockScan<long long, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ long long carry_pos;
  __shared__ long long carry_chunks;
  __shared__ int longest;
  // a shape-routed call's KnownChains (write_shape_choice)
  __shared__ unsigned long long full_segments, stacked64, stacked_host;
  __shared__ int lens[kPlanThreads];  // seq_len of a batch of at most kOrderedSeqs
  static_assert(kPlanThreads >= kOrderedSeqs, "the ranking holds every length in one tile");
  const int tid = threadIdx.x;
  const int64_t N = p.num_seqs, T = p.seqlen;

  if (p.cu_seqlens == nullptr) {
    const int64_t per_row = (T + kChunk - 1) / kChunk;
    for (int64_t n = tid; n <= N; n += kPlanThreads) {
      if (n < N) {
        p.seq_start[n] = 0;
        p.seq_len[n] = int32_t(T);
      }
      p.chunk_offsets[n] = int32_t(n * per_row);
    }
    for (int64_t c = tid; c < p.max_chunks; c += kPlanThreads) {
      p.chunk_seq[c] = (per_row > 0 && c < N * per_row) ? int32_t(c / per_row) : -1;
    }
    if (tid == 0) {
      *p.longest = N > 0 ? int32_t(T) : 0;
      *p.host_shape = 1;  // fixed batches are not shape-routed: the host's shape
    }
    for (int64_t n = tid; n < N; n += kPlanThreads) p.seq_order[n] = int32_t(n);
    return;
  }

  // Pass 1: clamped running maximum of the offsets; seq_start[n] = pos[n], pos[N] kept.
  if (tid == 0) carry_pos = 0;
  __syncthreads();
  for (int64_t base = 0; base <= N; base += kPlanThreads) {
    const int64_t m = base + tid;
    long long x = 0;
    if (m <= N) {
      const long long raw = p.cu_int64 ? static_cast<const int64_t*>(p.cu_seqlens)[m]
                                       : static_cast<const int32_t*>(p.cu_seqlens)[m];
      x = raw < 0 ? 0 : (raw > T ? T : raw);
    }
    long long pos;
    Scan(scan_storage).InclusiveScan(x, pos, MaxOp());
    const long long carry = carry_pos;
    pos = pos > carry ? pos : carry;
    if (m < N) p.seq_start[m] = pos;
    __syncthreads();
    if (tid == kPlanThreads - 1) carry_pos = pos;  // the tile's maximum
    __syncthreads();
  }
  const long long end_all = carry_pos;

  // Pass 2: lengths, chunk counts and their exclusive sum.
  if (tid == 0) carry_chunks = 0, longest = 0, full_segments = 0, stacked64 = 0, stacked_host = 0;
  __syncthreads();
  for (int64_t base = 0; base < N; base += kPlanThreads) {
    const int64_t n = base + tid;
    long long chunks = 0;
    if (n < N) {
      const long long start = p.seq_start[n];
      const long long end = n + 1 < N ? p.seq_start[n + 1] : end_all;
      p.seq_len[n] = int32_t(end - start);
      atomicMax(&longest, int(end - start));
      if (N <= kOrderedSeqs) lens[n] = int(end - start);
      chunks = (end - start + kChunk - 1) / kChunk;
      const int64_t ls = p.shape_route.segment_chunks;
      // NOTE: extra_segments tests the same condition; this one keeps the threads whose term is 0
      // (most, and all when segments are off) from queueing on the one shared-memory atomic.
      if (ls > 0 && chunks > ls)
        atomicAdd(&full_segments, (unsigned long long)extra_segments(chunks, ls));
    }
    long long offset, tile_total;
    Scan(scan_storage).ExclusiveSum(chunks, offset, tile_total);
    const long long carry = carry_chunks;
    if (n < N) p.chunk_offsets[n] = int32_t(carry + offset);
    __syncthreads();
    if (tid == 0) carry_chunks = carry + tile_total;
    __syncthreads();
  }
  const long long total = carry_chunks;
  if (tid == 0) p.chunk_offsets[N] = int32_t(total), *p.longest = longest;
  __syncthreads();
  const int64_t longest_chunks = (longest + kChunk - 1) / kChunk;
  const ShapeRoute& route = p.shape_route;
  const bool routed = route.num_sms > 0;

  // Launch order of the recurrence: rank of (length descending, index ascending), a permutation;
  // a shape-routed call's stacked chains (recurrence/launch.h, KnownChains) by the same ranks.
  if (N <= kOrderedSeqs) {
    if (tid < N) {
      const int mine = lens[tid];
      int rank = 0;
      for (int m = 0; m < int(N); ++m) {
        const int other = lens[m];
        rank += (other > mine || (other == mine && m < tid)) ? 1 : 0;
      }
      p.seq_order[rank] = tid;
      if (routed) {
        const int64_t chain = (mine + kChunk - 1) / kChunk;
        atomicMax(&stacked64, (unsigned long long)stacked_term(rank, chain, p.num_v_heads, 64, route.num_sms));
        atomicMax(&stacked_host,
                  (unsigned long long)stacked_term(rank, chain, p.num_v_heads, route.rows, route.num_sms));
      }
    }
  } else {
    for (int64_t n = tid; n < N; n += kPlanThreads) p.seq_order[n] = int32_t(n);
    if (tid == 0 && routed) {  // unranked: the longest chain's term alone
      stacked64 = stacked_term(0, longest_chunks, p.num_v_heads, 64, route.num_sms);
      stacked_host = stacked_term(0, longest_chunks, p.num_v_heads, route.rows, route.num_sms);
    }
  }
  __syncthreads();
  if (tid == 0) {
    write_shape_choice(p, KnownChains{longest_chunks, total, int64_t(full_segments), int64_t(stacked64),
                                      int64_t(stacked_host)});
  }

  // Pass 3: chunk -> sequence. The largest n with chunk_offsets[n] <= c skips empty sequences.
  for (int64_t c = tid; c < p.max_chunks; c += kPlanThreads) {
    int32_t seq = -1;
    if (c < total) {
      int64_t lo = 0, hi = N - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (p.chunk_offsets[mid] <= c) lo = mid; else hi = mid - 1;
      }
      seq = int32_t(lo);
    }
    p.chunk_seq[c] = seq;
  }
}

}  // namespace kdakit::sm90::prefill::prep
