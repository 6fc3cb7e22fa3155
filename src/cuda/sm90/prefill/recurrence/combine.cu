// kda_prefill_combine_sm90_kernel: the combine pass of segmented prefill (workspace.h, segments).
//
// Per (sequence n, value head h) with nseg >= 3 segments, serially over the full segments s >= 1:
//   S_{s+1}^T = S_s^T Phi_s + Psi_s        (S^T: V x K fp32, Phi_s: K x K, Psi_s: V x K)
// from S_1^T = Psi_0, which the summary pass ran from the caller's initial state (it also put S_0's
// copy in slot(n, 0)'s Phi area, and wrote no Phi_0). S_{s+1} overwrites Psi_s in its slot: the
// recurrence pass then reads every segment's start state from the workspace, never the caller's
// buffer. With two segments there is nothing to combine.
//
// One CTA of 8 warps per (n, h); warp w owns value rows 16 w .. 16 w + 15 of S^T as the
// m16n8 accumulator tiles of the recurrence kernel (state_io.cuh). S_s^T enters the product as
// bf16 hi + lo A fragments and Phi_s as bf16 hi + lo B fragments (ldmatrix.trans of the
// swizzled image the summary pass wrote), three passes (hi hi, lo hi, hi lo): ~2^-16 relative
// per term, so the chain adds no error beside the recurrence's own. Phi_{s+1} lands by a bulk
// copy while segment s is multiplied.
//
// kda_prefill_combine_split_sm90_kernel (the default; KDAKIT_PREFILL_COMBINE=whole, read once by
// the dispatcher, or set_prefill_combine(1) runs the one above): the same products, spread over a
// group of kRowBlocks CTAs per (n, h). Rows of S^T are independent (S_{s+1}^T[v] =
// S_s^T[v] Phi_s + Psi_s[v]), so CTA r owns value rows 16 r .. 16 r + 15, and its warp w owns
// key tiles 2 w, 2 w + 1 of them: 48 mma per warp and segment instead of 384, the chain's step
// shortened about eightfold in MMAs. The price is one
// exchange per segment: warp w's two tiles, split into bf16 hi + lo, are exactly the A fragment
// of k-step w, so each warp writes its fragment to shared memory and, after a CTA barrier, reads
// all eight. Every CTA streams the whole Phi_s (64 KB per segment). Each pass (hi hi, lo hi,
// hi lo) accumulates on its own and the three are added at the end, so the mma chain of a step
// is 8 deep, not 24: the two kernels agree to fp32 rounding, not bit for bit. The CTAs of one
// (n, h) share nothing but Phi's global copies, so they are launched without a cluster (one kept
// S_0's copy from overwriting Phi_0 before all eight had read it, until the summary pass took
// segment 0 over, session 36).
//
// Both kernels let the next grid of the stream launch at their start (griddepcontrol.launch_dependents):
// the recurrence pass after them is launched with PDL and loads its first stages (chunk blocks
// prep wrote two grids back) while this pass runs, waiting (griddepcontrol.wait) only before the
// start states this pass writes (recurrence/wgmma.cuh).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/common/device_setup.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sm90/prefill/common/ptx.cuh"
#include "cuda/sm90/prefill/common/state_io.cuh"
#include "cuda/sm90/prefill/recurrence/launch.h"
#include "cuda/sm90/prefill/workspace.h"

namespace kdakit::sm90::prefill::combine {
namespace {

constexpr int kWarps = kHeadDim / 16;
constexpr int kThreads = kWarps * 32;
constexpr uint32_t kPhiBytes = kHeadDim * kHeadDim * 2;  // one of hi, lo
constexpr size_t kBufferBytes = 2 * size_t(kPhiBytes);
constexpr size_t kBarrierOffset = 2 * kBufferBytes;
constexpr size_t kAllocBytes = kBarrierOffset + 2 * 8 + 128;  // the base is rounded up to 128

// The state fields (only the initial state's are read) in the common base.
struct CombineParams : common::StateParams {
  const int32_t* chunk_offsets;
  int64_t max_chunks;
  int32_t num_v_heads;
  uint8_t* segments;
  int64_t num_segment_slots;
  int32_t segment_chunks;
};

__device__ __forceinline__ uint32_t phi_addr(uint32_t base, int row, int chunk16) {
  return base + uint32_t(chunk16 >> 3) * (kHeadDim * 128u) + uint32_t(row) * 128u +
         uint32_t(((chunk16 & 7) ^ (row & 7)) << 4);
}

// The chain of (sequence n, value head h), shared by both kernels: its first global chunk, its
// segment length and its segment count (below 3: nothing to combine). The
// plan's offsets are device data, clamped so that no load leaves the workspace.
struct Chain {
  int c0, ls, nseg;
  int64_t slot0;  // segment_slot(c0, 0, ls); segment s's is slot0 + s (s ls is a multiple of ls)
};
__device__ __forceinline__ Chain chain_of(const CombineParams& p, int n) {
  Chain c;
  c.c0 = p.chunk_offsets[n];
  int nc = p.chunk_offsets[n + 1] - c.c0;
  c.c0 = max(0, min(c.c0, int(p.max_chunks)));
  nc = max(0, min(nc, int(p.max_chunks) - c.c0));
  c.ls = p.segment_chunks;
  c.nseg = max(1, (nc + c.ls - 1) / c.ls);
  c.slot0 = segment_slot(c.c0, 0, c.ls);
  return c;
}
// Segment s's area (Psi, Phi hi, Phi lo) for value head h.
__device__ __forceinline__ uint8_t* segment_area(const CombineParams& p, const Chain& c, int h, int s) {
  const int64_t slot = c.slot0 + s;  // no division per step (the chain's head, session 27)
  return p.segments + (size_t(slot) * p.num_v_heads + h) * kSegmentBytes;
}
// Phi_s (hi, lo) from `area` into buffer b of shared memory, completing on full[b].
__device__ __forceinline__ void issue_phi(uint8_t* smem, uint64_t* full, const uint8_t* area, int b) {
  uint8_t* buf = smem + b * kBufferBytes;
  ptx::mbarrier_arrive_expect_tx(&full[b], 2 * kPhiBytes);
  ptx::bulk_load(buf, area + SegmentLayout::kPhiHiOffset, kPhiBytes, &full[b]);
  ptx::bulk_load(buf + kPhiBytes, area + SegmentLayout::kPhiLoOffset, kPhiBytes, &full[b]);
}

__global__ void __launch_bounds__(kThreads, 1) kda_prefill_combine_sm90_kernel(const __grid_constant__ CombineParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((128u - (ptx::smem_addr(smem_raw) & 127u)) & 127u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarrierOffset);

  const int HV = p.num_v_heads;
  const int h = int(blockIdx.x % unsigned(HV));
  const int n = int(blockIdx.x / unsigned(HV));
  kdakit::cuda::ptx::griddep_launch_dependents();  // the recurrence pass (file header)
  if (!recurrence_side_runs(p.route)) return;  // a routed call whose other side does the work
  const Chain chain = chain_of(p, n);
  if (chain.nseg < 3) return;
  const int full_segments = chain.nseg - 1;
  auto area = [&](int s) { return segment_area(p, chain, h, s); };
  auto issue = [&](int s) { issue_phi(smem, full, area(s), (s - 1) & 1); };  // step s - 1's buffer
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(&full[0], 1);
    ptx::mbarrier_init(&full[1], 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    issue(1);
    if (full_segments > 2) issue(2);
  }

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;
  const int quad = lane % 4;
  const int vrow = warp * 16 + group;
  const int ldt_row = (lane % 8) + 8 * ((lane / 8) % 2);
  const int ldt_chunk = lane / 16;

  float state[16][4];  // S_1, the summary pass's Psi_0
  common::load_state(state, area(0) + SegmentLayout::kPsiOffset, vrow, quad, common::segment_state_view());

  for (int s = 1; s < full_segments; ++s) {
    const int step = s - 1, b = step & 1;
    uint8_t* seg = area(s);
    float acc[16][4];
    ptx::mbarrier_wait(&full[b], (step >> 1) & 1);
    // NOTE: Psi_s is loaded after the wait: loaded before it, ptxas scheduled this kernel at 255
    // registers and spilled (nvcc 13.0). This kernel is the opt-in one (KDAKIT_PREFILL_COMBINE=whole).
    common::load_state(acc, seg + SegmentLayout::kPsiOffset, vrow, quad, common::segment_state_view());

    const uint32_t hi_base = ptx::smem_addr(smem + b * kBufferBytes);
    const uint32_t lo_base = hi_base + kPhiBytes;
    #pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      uint32_t a_hi[4], a_lo[4];
      ptx::split_bf16(state[2 * ks][0], state[2 * ks][1], a_hi[0], a_lo[0]);
      ptx::split_bf16(state[2 * ks][2], state[2 * ks][3], a_hi[1], a_lo[1]);
      ptx::split_bf16(state[2 * ks + 1][0], state[2 * ks + 1][1], a_hi[2], a_lo[2]);
      ptx::split_bf16(state[2 * ks + 1][2], state[2 * ks + 1][3], a_hi[3], a_lo[3]);
      #pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t bh[4], bl[4];
        ptx::ldmatrix_x4_trans(bh, phi_addr(hi_base, 16 * ks + ldt_row, 2 * np + ldt_chunk));
        ptx::ldmatrix_x4_trans(bl, phi_addr(lo_base, 16 * ks + ldt_row, 2 * np + ldt_chunk));
        ptx::mma_bf16_16816(acc[2 * np], a_lo, bh[0], bh[1]);
        ptx::mma_bf16_16816(acc[2 * np + 1], a_lo, bh[2], bh[3]);
        ptx::mma_bf16_16816(acc[2 * np], a_hi, bl[0], bl[1]);
        ptx::mma_bf16_16816(acc[2 * np + 1], a_hi, bl[2], bl[3]);
        ptx::mma_bf16_16816(acc[2 * np], a_hi, bh[0], bh[1]);
        ptx::mma_bf16_16816(acc[2 * np + 1], a_hi, bh[2], bh[3]);
      }
    }
    // every warp has read buffer b: refill it with Phi_{s+2}
    __syncthreads();
    if (threadIdx.x == 0 && s + 2 < full_segments) {
      ptx::fence_proxy_async_shared();
      issue(s + 2);
    }
    // S_{s+1}: the start state of segment s + 1, over Psi_s
    common::store_state(acc, seg + SegmentLayout::kPsiOffset, vrow, quad, common::segment_state_view());
    #pragma unroll
    for (int j = 0; j < 16; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) state[j][e] = acc[j][e];
    }
  }
}

constexpr int kRowBlocks = kHeadDim / 16;          // CTAs per (n, h)
constexpr int kSplitTiles = 2;                       // key tiles (of 8) per warp
// NOTE: the split kernel keeps three Phi buffers, Phi_{s+3} loading during steps s + 1 and s + 2 (with
// two, a load had one step to land): 22.3 -> 20.7 us at H4 T = 32K (H200, session 27). What bounds
// the step (~1.4 us there) is mostly shared-memory traffic, ~200 KB a step and CTA
// (docs/design/20261201-prefill-segments.md, session 27).
constexpr int kSplitBuffers = 3;
constexpr size_t kSplitBarrierOffset = kSplitBuffers * kBufferBytes;
constexpr size_t kExchangeOffset = kSplitBarrierOffset + kSplitBuffers * 8 + 104;  // 16-byte aligned
constexpr size_t kExchangeBytes = size_t(kWarps) * 2 * 32 * 16;  // [k-step][hi, lo][lane] 4 x u32
constexpr size_t kSplitAllocBytes = kExchangeOffset + kExchangeBytes + 128;
static_assert(kWarps * kSplitTiles * 8 == kHeadDim, "the warps' tiles cover the key channels");
static_assert(kExchangeOffset % 16 == 0, "the exchange buffer is read as 16-byte vectors");
static_assert(kSplitAllocBytes <= 227 * 1024, "the split kernel's shared memory fits an SM");

__global__ void __launch_bounds__(kThreads, 1)
    kda_prefill_combine_split_sm90_kernel(const __grid_constant__ CombineParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((128u - (ptx::smem_addr(smem_raw) & 127u)) & 127u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kSplitBarrierOffset);
  uint32_t* exchange = reinterpret_cast<uint32_t*>(smem + kExchangeOffset);

  const int HV = p.num_v_heads;
  const int rb = int(blockIdx.x % unsigned(kRowBlocks));  // an (n, h)'s CTAs are consecutive
  const int pair = int(blockIdx.x / unsigned(kRowBlocks));
  const int h = pair % HV;
  const int n = pair / HV;
  kdakit::cuda::ptx::griddep_launch_dependents();  // the recurrence pass (file header)
  if (!recurrence_side_runs(p.route)) return;  // a routed call whose other side does the work
  const Chain chain = chain_of(p, n);
  if (chain.nseg < 3) return;
  const int full_segments = chain.nseg - 1;
  auto area = [&](int s) { return segment_area(p, chain, h, s); };
  auto issue = [&](int s) { issue_phi(smem, full, area(s), (s - 1) % kSplitBuffers); };  // step s - 1's buffer
  if (threadIdx.x == 0) {
    for (int b = 0; b < kSplitBuffers; ++b) ptx::mbarrier_init(&full[b], 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int s = 1; s <= kSplitBuffers && s < full_segments; ++s) issue(s);
  }

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;
  const int quad = lane % 4;
  const int vrow = rb * 16 + group;
  const int tile0 = warp * kSplitTiles;
  const int ldt_row = (lane % 8) + 8 * ((lane / 8) % 2);
  const int ldt_chunk = lane / 16;

  float state[kSplitTiles][4];  // S_1, the summary pass's Psi_0
  common::load_state(state, area(0) + SegmentLayout::kPsiOffset, vrow, quad, common::segment_state_view(), tile0);

  // NOTE: Psi_s is loaded two steps ahead (during step s - 2): one step ahead, its L2/DRAM round
  // trip still showed at the head of each step (Nsight Compute, H4 T = 32K, session 27). Step s
  // writes S_{s+1} over this thread's elements of Psi_s only, after reading them.
  float psi[kSplitTiles][4], psi_next[kSplitTiles][4];
  common::load_state(psi, area(1) + SegmentLayout::kPsiOffset, vrow, quad, common::segment_state_view(), tile0);
  if (full_segments > 2) {
    common::load_state(psi_next, area(2) + SegmentLayout::kPsiOffset, vrow, quad, common::segment_state_view(),
                       tile0);
  }
  // This thread's A fragment slots: [k-step][hi, lo][lane] 16 bytes each, so that writes and reads
  // are whole 512-byte warp rows of 128-bit accesses.
  uint4* exchange4 = reinterpret_cast<uint4*>(exchange);
  for (int s = 1, b = 0, phase = 0; s < full_segments; ++s) {
    uint8_t* seg = area(s);
    // Three accumulators per tile, one per pass (hi hi from Psi_s; lo hi and hi lo from zero):
    // chains of 8 dependent mma instead of one of 24.
    float acc[kSplitTiles][4], acc_lh[kSplitTiles][4], acc_hl[kSplitTiles][4];
    #pragma unroll
    for (int j = 0; j < kSplitTiles; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[j][e] = psi[j][e];
        psi[j][e] = psi_next[j][e];
        acc_lh[j][e] = 0.f;
        acc_hl[j][e] = 0.f;
      }
    }
    if (s + 2 < full_segments) {
      common::load_state(psi_next, area(s + 2) + SegmentLayout::kPsiOffset, vrow, quad,
                         common::segment_state_view(), tile0);
    }

    // This warp's tiles are the A fragment of k-step `warp`: publish it (hi, lo), then read all.
    {
      uint4 hi, lo;
      ptx::split_bf16(state[0][0], state[0][1], hi.x, lo.x);
      ptx::split_bf16(state[0][2], state[0][3], hi.y, lo.y);
      ptx::split_bf16(state[1][0], state[1][1], hi.z, lo.z);
      ptx::split_bf16(state[1][2], state[1][3], hi.w, lo.w);
      exchange4[(warp * 2) * 32 + lane] = hi;
      exchange4[(warp * 2 + 1) * 32 + lane] = lo;
    }
    ptx::mbarrier_wait(&full[b], phase);
    __syncthreads();  // the exchange buffer holds every warp's fragment

    const uint32_t hi_base = ptx::smem_addr(smem + b * kBufferBytes);
    const uint32_t lo_base = hi_base + kPhiBytes;
    #pragma unroll
    for (int ks = 0; ks < kWarps; ++ks) {
      const uint4 fh = exchange4[(ks * 2) * 32 + lane];
      const uint4 fl = exchange4[(ks * 2 + 1) * 32 + lane];
      const uint32_t a_hi[4] = {fh.x, fh.y, fh.z, fh.w};
      const uint32_t a_lo[4] = {fl.x, fl.y, fl.z, fl.w};
      uint32_t bh[4], bl[4];
      ptx::ldmatrix_x4_trans(bh, phi_addr(hi_base, 16 * ks + ldt_row, 2 * warp + ldt_chunk));
      ptx::ldmatrix_x4_trans(bl, phi_addr(lo_base, 16 * ks + ldt_row, 2 * warp + ldt_chunk));
      ptx::mma_bf16_16816(acc_lh[0], a_lo, bh[0], bh[1]);
      ptx::mma_bf16_16816(acc_lh[1], a_lo, bh[2], bh[3]);
      ptx::mma_bf16_16816(acc_hl[0], a_hi, bl[0], bl[1]);
      ptx::mma_bf16_16816(acc_hl[1], a_hi, bl[2], bl[3]);
      ptx::mma_bf16_16816(acc[0], a_hi, bh[0], bh[1]);
      ptx::mma_bf16_16816(acc[1], a_hi, bh[2], bh[3]);
    }
    #pragma unroll
    for (int j = 0; j < kSplitTiles; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] += acc_lh[j][e] + acc_hl[j][e];
    }
    // every warp has read buffer b and the exchange buffer: refill b with Phi_{s+3}
    __syncthreads();
    if (threadIdx.x == 0 && s + kSplitBuffers < full_segments) {
      ptx::fence_proxy_async_shared();
      issue(s + kSplitBuffers);
    }
    // S_{s+1}: the start state of segment s + 1, over this CTA's part of Psi_s
    common::store_state(acc, seg + SegmentLayout::kPsiOffset, vrow, quad, common::segment_state_view(), tile0);
    #pragma unroll
    for (int j = 0; j < kSplitTiles; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) state[j][e] = acc[j][e];
    }
    if (++b == kSplitBuffers) b = 0, phase ^= 1;
  }
}

}  // namespace
}  // namespace kdakit::sm90::prefill::combine

namespace kdakit::sm90::prefill {

Status launch_prefill_combine(const PrefillParams& p, const WorkspacePlan& plan, void* workspace,
                              cudaStream_t stream, CombineKernel kernel) {
  using namespace combine;
  if (plan.segment_chunks <= 0) return Status(StatusCode::kInternal, "combine: the plan has no segments");
  const bool whole = kernel == CombineKernel::kWhole;
  if (p.num_seqs == 0) return Status::Ok();
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  CombineParams cp{};
  static_cast<common::StateParams&>(cp) = common::state_params(p);
  cp.route = route_of(plan, workspace);
  cp.chunk_offsets = reinterpret_cast<const int32_t*>(ws + plan.chunk_offsets_offset);
  cp.max_chunks = plan.max_chunks;
  cp.num_v_heads = p.num_v_heads;
  cp.segments = ws + plan.segments_offset;
  cp.num_segment_slots = plan.num_segment_slots;
  cp.segment_chunks = plan.segment_chunks;

  const int64_t pairs = p.num_seqs * p.num_v_heads;
  if (pairs * (whole ? 1 : kRowBlocks) > int64_t(INT32_MAX)) {
    return Status(StatusCode::kUnsupported, "combine: N * HV * CTAs per head must stay below 2^31");
  }
  cudaError_t err = cudaSuccess;
  if (whole) {
    static kdakit::cuda::PerDeviceOnce attr_once;  // per function and device (common/device_setup.cuh)
    err = kdakit::cuda::set_up_once_per_device(attr_once, [] {
      return cudaFuncSetAttribute(kda_prefill_combine_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(kAllocBytes));
    });
    if (err == cudaSuccess) {
      kda_prefill_combine_sm90_kernel<<<unsigned(pairs), kThreads, kAllocBytes, stream>>>(cp);
      err = cudaGetLastError();
    }
  } else {
    static kdakit::cuda::PerDeviceOnce split_attr_once;
    err = kdakit::cuda::set_up_once_per_device(split_attr_once, [] {
      return cudaFuncSetAttribute(kda_prefill_combine_split_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(kSplitAllocBytes));
    });
    if (err == cudaSuccess) {
      // NOTE: no cluster: with the cluster of session 10 put back, H16 T = 8K measured -0.2%
      // against -1.6% without it (H100, session 36; the other rows within 0.3%).
      kda_prefill_combine_split_sm90_kernel<<<unsigned(pairs * kRowBlocks), kThreads, kSplitAllocBytes, stream>>>(cp);
      err = cudaGetLastError();
    }
  }
  if (err != cudaSuccess) {
    return Status(StatusCode::kCudaError, std::string(whole ? "kda_prefill_combine_sm90_kernel: "
                                                            : "kda_prefill_combine_split_sm90_kernel: ") +
                                              cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace kdakit::sm90::prefill
