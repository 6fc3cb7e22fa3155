// kda_prefill_recurrence_wgmma_sm90_kernel: the chunk-serial half of the two-kernel prefill on
// warpgroup MMAs (wgmma), for CTAs of 64 and 128 value rows, and the summary pass of segmented
// prefill (kSummary: the W and Kh products only, from zero or identity states). Same math, workspace, stages, TMA maps and
// grid as kda_prefill_recurrence_sm90_kernel (kernel.cuh), whose header has the equations; what
// differs is who multiplies:
//
// Warps: two warpgroups; warpgroup c owns value rows 64 c .. 64 c + 63 of S^T as the fp32 m64n128
//   wgmma accumulator (64 registers per thread; warp w of the group holds rows 16 w .. 16 w + 15
//   in the mma.sync C layout, so the state I/O helpers of kernel.cuh apply unchanged). Thread 0
//   issues the TMA loads, as in kernel.cuh.
// Per chunk and warpgroup (m64, k16 steps; A from registers, B from the 128B-swizzled stage):
//   U^T  = U0^T - S0^T W^T        8 x (hi + lo) m64n64 (U0 from the stage, S0 as bf16 hi + lo)
//   O^T  = S0^T Qt^T + U^T M^T    8 x (hi + lo) + 4 x (hi + lo) m64n64 (S0 hi + lo, U hi + lo)
//   S^T  = S0^T diag(decay) + U^T Kh   4 x 3 m64n128 (U hi x Kh, U lo x Kh, U hi x Kh lo)
// On an fp16 block (kF16) each product takes one fp16 pass, 8 + 8 + 4 m64n64 and 4 m64n128, with
// the state rows scaled by powers of two (rescale_rows below).
// The M product's group is committed before the state's; the output leaves from the accumulator
// registers (neighbouring value channels paired through a shuffle) while the state's group runs.
// NOTE: wgmma issues the chain's products asynchronously and at the full tensor rate of the
// SM; kernel.cuh's mma.sync spends about half of each ~3.9 us chunk on the MMA issue alone
// (docs/design/20261129-prefill.md). Measured (H200, prefill_prep_timing, the recurrence as
// prefill minus prep): H96 fixed 0.521 ms against the mma.sync kernel's 0.606 (~4.1 us per chunk
// against ~4.7), H32 1024 x 8 0.175 against 0.192; it is the 64- and 128-row kernel since.
#pragma once

#include "cuda/sm90/prefill/common/gmma.cuh"
#include "cuda/sm90/prefill/common/o_store.cuh"
#include "cuda/sm90/prefill/recurrence/kernel.cuh"

namespace kdakit::sm90::prefill::recurrence {

// Descriptors of the stage's Qt/W/Kh/Kh lo tile (two column halves of kQwkArrays x 64 rows):
// array a (0 Qt, 1 W, 2 Kh, 3 Kh lo) as a K-major B over the 128 key channels (k-step kk), and as
// an MN-major B over the 64 tokens (k-step ks, N = the 128 key channels in two 64-column halves).
template <int kHalfBytes>
__device__ __forceinline__ uint64_t qwk_desc_k(uint32_t qwk_base, int a, int kk) {
  return ptx::smem_desc(qwk_base + uint32_t(kk >> 2) * uint32_t(kHalfBytes) + uint32_t(a) * (kChunk * 128u) +
                            uint32_t(kk & 3) * 32u,
                        16, 1024);
}
template <int kHalfBytes>
__device__ __forceinline__ uint64_t qwk_desc_mn(uint32_t qwk_base, int a, int ks) {
  return ptx::smem_desc(qwk_base + uint32_t(a) * (kChunk * 128u) + uint32_t(ks) * 2048u, uint32_t(kHalfBytes), 1024);
}
// M [64 r][64 s] (K = s): K-major.
__device__ __forceinline__ uint64_t m_desc(uint32_t m_base, int ks) {
  return ptx::smem_desc(m_base + uint32_t(ks) * 32u, 16, 1024);
}

// kValueRows = 64 (one warpgroup) or 128 (two): value rows per CTA, as for kernel.cuh.
// kSummary: the summary pass of segmented prefill, as in kernel.cuh: CTA z < kSlices runs value
// slice z from a zero state (Psi), z >= kSlices key rows of Phi from the identity with U0 = 0;
// neither writes o, chunk states or the final state, and both skip Qt's and M's products.
// Segment 0 computes no Phi: its Psi CTAs start from the caller's initial state, so their end
// state is S_1, and its Phi CTAs copy S_0 into the workspace for the recurrence pass.
// At 64 value rows a fifth warp issues the stage refills (kProducerWarp; registers allow it:
// 160 threads x 255): a refill is then issued as soon as the stage is free and is off the
// warpgroup's chain. At 128 rows a ninth warp does not fit: with 288 threads ptxas caps the
// kernel at 168 registers (session 26: the fp16 kernel, 222 registers without it, spilled 44
// bytes; the bf16 one needs ~250).
template <int kValueRows>
constexpr bool kProducerWarp = kValueRows == 64;
template <int kValueRows>
constexpr int kCtaThreads = kValueRows * 2 + (kProducerWarp<kValueRows> ? 32 : 0);

// ---- fp16 operands (kF16: an fp16 chunk block, WorkspacePlan::f16_block) ----------------------
// The state registers hold S~ = 2^-E S, with one integer E per value row (rows never mix: the
// products of a row only involve that row of S0^T, U^T and O^T). Each chunk first moves every
// row's E so that its largest |S~| and |U0| 2^-E (over the quad's four threads, which hold the
// row's 128 key channels and 64 tokens) lie in [1, 2); then S0~, U~ = U0 2^-E - S0~ W, O~ and
// S~' = S0~ D + U~ Kh are all the same row's scaled values, and one fp16 pass of each operand
// (11 significant bits; bf16 keeps 8) replaces the bf16 hi + lo passes. Ranges: |W| < 1 and
// |Kh| <= 1 for L2-normed keys (the dispatcher's condition) bound |U~| by ~1 + 128 and |S~'| by
// ~2^13 before the next rescale, inside fp16's 65504. The output leaves as O~ 2^E and the state
// I/O applies 2^E. docs/design/20261204-prefill-fp16-recurrence.md has the rounding model.

// 2^n as a float, n in [-126, 127].
__device__ __forceinline__ float exp2i(int n) { return __uint_as_float(uint32_t(n + 127) << 23); }

// Rows of the thread's state fragment times f[0] (value row g) and f[1] (g + 8).
__device__ __forceinline__ void scale_state_rows(float (&s)[16][4], const float (&f)[2]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    s[j][0] *= f[0];
    s[j][1] *= f[0];
    s[j][2] *= f[1];
    s[j][3] *= f[1];
  }
}
// Rows of an m64n64 accumulator fragment (rows g at u[4 nt + e], g + 8 at u[4 nt + 2 + e]) times
// f[0] and f[1].
__device__ __forceinline__ void scale_acc_rows(float (&u)[32], const float (&f)[2]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    u[4 * nt] *= f[0];
    u[4 * nt + 1] *= f[0];
    u[4 * nt + 2] *= f[1];
    u[4 * nt + 3] *= f[1];
  }
}
// The state's true values 2^E S~ (undo: scale by 2^-E), for the state I/O.
__device__ __forceinline__ void state_to_true_scale(float (&s)[16][4], const int (&e)[2], bool inverse) {
  const float f[2] = {exp2i(inverse ? -e[0] : e[0]), exp2i(inverse ? -e[1] : e[1])};
  scale_state_rows(s, f);
}

// The chunk's rescale: new exponents e from the rows' largest |S~| and |U0| 2^-e, S~ by the change,
// U0 (u: the m64n64 accumulator layout, rows g at u[4 nt + e], g + 8 at u[4 nt + 2 + e]) into U0~.
__device__ __forceinline__ void rescale_rows(float (&s)[16][4], float (&u)[32], int (&e)[2]) {
  float ms[2] = {0.f, 0.f}, mu[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    ms[0] = fmaxf(ms[0], fmaxf(fabsf(s[j][0]), fabsf(s[j][1])));
    ms[1] = fmaxf(ms[1], fmaxf(fabsf(s[j][2]), fabsf(s[j][3])));
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    mu[0] = fmaxf(mu[0], fmaxf(fabsf(u[4 * nt]), fabsf(u[4 * nt + 1])));
    mu[1] = fmaxf(mu[1], fmaxf(fabsf(u[4 * nt + 2]), fabsf(u[4 * nt + 3])));
  }
  float fs[2], fu[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float m = fmaxf(ms[hr], mu[hr] * exp2i(-e[hr]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    // m in [2^d, 2^(d + 1)); a zero row keeps its exponent. E stays in [-100, 100], so that 2^E
    // and 2^-E are normal floats.
    int d = m > 0.f ? int(__float_as_uint(m) >> 23) - 127 : 0;
    d = max(-120, min(120, d));
    const int en = max(-100, min(100, e[hr] + d));
    fs[hr] = exp2i(e[hr] - en);
    fu[hr] = exp2i(-en);
    e[hr] = en;
  }
  scale_state_rows(s, fs);
  scale_acc_rows(u, fu);
}

template <int kValueRows, bool kSummary, bool kF16>
__global__ void __launch_bounds__(kCtaThreads<kValueRows>, 1)
    kda_prefill_recurrence_wgmma_sm90_kernel(const __grid_constant__ KernelParams p, const __grid_constant__ TmaParams tma) {
  using Cfg = Config<kValueRows>;
  using Smem = typename Cfg::SharedMemoryPlan;
  constexpr int kStages = Cfg::kStages;
  constexpr int kHalfBytes = int(Smem::kQwkArrays) * kChunk * 128;
  static_assert(kValueRows == 64 || kValueRows == 128, "wgmma m64: one or two warpgroups of 64 value rows");
  static_assert(Smem::kQwkArrays == 4, "the stage keeps Kh lo's slot (array 3; unused on an fp16 block)");
  static_assert(Smem::kU0Swizzled && Smem::kU0BoxCols == 32, "u0_offset addresses the swizzled U0 tile");
  static_assert(Cfg::kThreads == kValueRows * 2, "one warp per 16 value rows");

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (ptx::smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::kBarrierOffset);
  uint64_t* empty = full + kStages;
  if (!recurrence_side_runs(p.route)) {  // a routed call whose other side does the work
    kdakit::cuda::ptx::griddep_exit_after_previous();  // launched with PDL (launch, kernel.cuh)
    return;
  }
  // Launched with PDL: wait for the previous grid (at once otherwise). After the combine pass
  // (stages_before_wait) only the consumers wait, before the start states: the first stages' loads
  // go out first.
  const bool wait_late = !kSummary && p.stages_before_wait;
  if (!wait_late) kdakit::cuda::ptx::griddep_wait();

  // Grid order (fastest first): value slice z, segment, value head, sequence (as kernel.cuh).
  constexpr int kZ = kSummary ? 2 * Cfg::kSlices : Cfg::kSlices;
  const int64_t cta = blockIdx.x;
  const int z = int(cta % kZ);
  const int64_t rest = cta / kZ;
  const int seg = int(rest % p.max_segments);
  const int h = int((rest / p.max_segments) % p.num_v_heads);
  const int n = sequence_at(p, int(rest / p.max_segments / p.num_v_heads));
  const bool phi_run = kSummary && z >= Cfg::kSlices;
  const int v0 = (z % Cfg::kSlices) * kValueRows;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wg = warp / 4;

  const SegmentWork work = segment_work(p, n, seg);
  if (kSummary ? seg >= work.nseg - 1 : seg >= work.nseg) {
    if (wait_late) kdakit::cuda::ptx::griddep_wait();  // (the grid completes after the combine pass)
    return;
  }
  // NOTE: segment 0's Psi CTAs start from the caller's initial state (below), so their Psi is
  // S_1 itself and no Phi_0 is needed: the combine pass starts at segment 1, one step shorter.
  // Segment 0's Phi CTAs copy S_0 (their value slice) into slot(n, 0)'s Phi area instead, where
  // the recurrence pass's segment 0 reads it (the caller's buffer may be the final state's,
  // which the last segment's CTA overwrites in place): off the Psi CTAs' chain.
  if (phi_run && seg == 0) {
    if (threadIdx.x < Cfg::kThreads) {
      const int g = lane / 4, t = lane % 4;
      const int vrow = v0 + 64 * wg + 16 * (warp % 4) + g;
      float s0[16][4];
      common::load_initial_state(s0, p, n, h, vrow, t);
      store_state(s0, segment_at(p, segment_slot(work.chunk_begin, 0, work.ls), h) + SegmentLayout::kPhiHiOffset,
                  vrow, t, common::segment_state_view());
    }
    return;
  }
  const int chunk_begin = work.chunk_begin, j_begin = work.j_begin, num_chunks = work.num_chunks;
  volatile int* last_segment_flag = reinterpret_cast<volatile int*>(smem + Smem::kFlagsOffset);

  if (threadIdx.x == 0)
    init_pipeline<kStages>(full, empty, Cfg::kThreads, last_segment_flag, seg == work.nseg - 1);
  __syncthreads();

  // NOTE: summaries load neither Qt nor M (no output), nor, for Phi, U0 (zero).
  auto issue_chunk = [&](int j) {
    issue_chunk_at<Smem, kStages, !kSummary, !kF16>(smem, full, tma, p, chunk_begin + j_begin, h, v0, j, !phi_run);
  };
  constexpr bool kProducer = kProducerWarp<kValueRows>;
  const bool is_issuer = threadIdx.x == (kProducer ? Cfg::kThreads : 0);
  if (is_issuer)
    issue_first_chunks<Smem, kStages, !kSummary, !kF16>(smem, full, tma, p, chunk_begin + j_begin, h, v0, num_chunks,
                                                        !phi_run);
  if constexpr (kProducer) {
    if (threadIdx.x >= Cfg::kThreads) {  // the producer warp: refills only
      if (is_issuer) {
        for (int jr = 0; jr + kStages < num_chunks; ++jr) {
          ptx::mbarrier_wait(&empty[jr % kStages], (jr / kStages) & 1);
          issue_chunk(jr + kStages);
        }
      }
      return;
    }
  }

  const int g = lane / 4, t = lane % 4;
  const int vslice = 64 * wg + 16 * (warp % 4) + g;  // value row of c0/c1 within the CTA's slice
  const int vrow = v0 + vslice;                       // ... within the head (c2/c3: + 8)

  uint32_t u0_off[2][2];  // [value row + 8 hr][token 2t + par] in the U0 tile
  u0_fragment_offsets(u0_off, t, vslice);

  float state[64];
  float(&state4)[16][4] = reinterpret_cast<float(&)[16][4]>(state);
  int row_exp[2] = {0, 0};  // kF16: the state rows' exponents E (S~ = 2^-E S); 0 otherwise
  if constexpr (kSummary) {
    if (seg == 0) {
      // Segment 0's Psi runs from the caller's initial state S_0 (or zeros): its end state is S_1.
      common::load_initial_state(state4, p, n, h, vrow, t);
    } else {
      // Psi from zeros; Phi from the identity (row vrow of I in the fragment layout)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int k = 8 * j + 2 * t;
        state4[j][0] = phi_run && k == vrow ? 1.f : 0.f;
        state4[j][1] = phi_run && k + 1 == vrow ? 1.f : 0.f;
        state4[j][2] = phi_run && k == vrow + 8 ? 1.f : 0.f;
        state4[j][3] = phi_run && k + 1 == vrow + 8 ? 1.f : 0.f;
      }
    }
  } else {
    if (wait_late) kdakit::cuda::ptx::griddep_wait();  // the combine pass's start states
    load_start_state(state4, p, n, h, seg, work, vrow, t);
  }

  const int seq_len = p.seq_len[n];
  const int64_t seq_start = p.seq_start[n];
  __nv_bfloat16* o_seq = p.o + (p.packed ? 0 : int64_t(n) * p.stride_o_b) + seq_start * p.stride_o_t +
                         int64_t(h) * p.stride_o_h + v0 + 64 * wg + 16 * (warp % 4);

  const int chunks_per_state = p.chunk_states != nullptr ? p.chunk_state_interval / kChunk : 0;
  const bool write_chunk_states = !kSummary && chunks_per_state > 0;
  const int64_t chunk_state_base = write_chunk_states ? common::chunk_state_base_of(p, n, lane) : 0;

  // accU = U0^T of chunk j (value rows x tokens, the m64n64 accumulator layout), from its
  // landed stage. NOTE: chunk j + 1's stage is waited for while chunk j's state products run,
  // off the chain between the two chunks.
  float accU[32];
  auto load_u0 = [&](int j) {
    const uint8_t* u0 = smem + (j % kStages) * Smem::kStageBytes + Smem::kU0Offset;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const uint8_t* row = u0 + nt * (8 * 128);  // tokens 8 nt + 2t, + 1
        accU[4 * nt + 2 * hr] = phi_run ? 0.f : *reinterpret_cast<const float*>(row + u0_off[hr][0]);  // Phi: U0 not loaded
        accU[4 * nt + 2 * hr + 1] = phi_run ? 0.f : *reinterpret_cast<const float*>(row + u0_off[hr][1]);
      }
    }
  };
  if (num_chunks > 0) ptx::mbarrier_wait(&full[0], 0);

  for (int j = 0; j < num_chunks; ++j) {
    const int jg = j_begin + j;
    if (write_chunk_states) {
      if constexpr (kF16) {
        if (jg % chunks_per_state == 0) {
          state_to_true_scale(state4, row_exp, false);
          store_chunk_state(state4, p, chunk_state_base, jg, chunks_per_state, h, vrow, t);
          state_to_true_scale(state4, row_exp, true);
        }
      } else {
        store_chunk_state(state4, p, chunk_state_base, jg, chunks_per_state, h, vrow, t);
      }
    }

    const int s = j % kStages;  // landed: waited for before the loop or in the previous chunk
    const uint8_t* stage = smem + s * Smem::kStageBytes;
    const uint32_t qwk_base = ptx::smem_addr(stage + Smem::kQwkOffset);
    const uint32_t m_base = ptx::smem_addr(stage + Smem::kMOffset);
    const float* decay = reinterpret_cast<const float*>(stage + Smem::kDecayOffset);
    float accO[32];
    load_u0(j);

    if constexpr (kF16) {
      // ---- rescale, then S0~ as fp16 A fragments of all 128 key channels (k-step kk)
      rescale_rows(state4, accU, row_exp);
      uint32_t sa[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        sa[kk][0] = ptx::pack_f16x2(state4[2 * kk][0], state4[2 * kk][1]);
        sa[kk][1] = ptx::pack_f16x2(state4[2 * kk][2], state4[2 * kk][3]);
        sa[kk][2] = ptx::pack_f16x2(state4[2 * kk + 1][0], state4[2 * kk + 1][1]);
        sa[kk][3] = ptx::pack_f16x2(state4[2 * kk + 1][2], state4[2 * kk + 1][3]);
      }
      // ---- accU -= S0~ W^T (group 1), accO = S0~ Qt^T (group 2), one pass each (as below)
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        common::gmma_rs<common::OpNegRS64F16>(sa[kk], qwk_desc_k<kHalfBytes>(qwk_base, 1, kk), accU, true);
      ptx::wgmma_commit();
      if constexpr (!kSummary) {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
          common::gmma_rs<common::OpRS64F16>(sa[kk], qwk_desc_k<kHalfBytes>(qwk_base, 0, kk), accO, kk > 0);
        ptx::wgmma_commit();
        ptx::wgmma_wait<1>();
      } else {
        ptx::wgmma_wait<0>();
      }
      ptx::fence_operands(accU);
      // ---- U~^T as fp16 A fragments (k = tokens)
      uint32_t uh[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int i = 0; i < 4; ++i) uh[ks][i] = ptx::pack_f16x2(accU[8 * ks + 2 * i], accU[8 * ks + 2 * i + 1]);
      }
      if constexpr (!kSummary) {
        ptx::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) common::gmma_rs<common::OpRS64F16>(uh[ks], m_desc(m_base, ks), accO, true);
        ptx::wgmma_commit();
      }
      common::decay_state(state4, decay, t);
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        common::gmma_rs<common::OpStateF16>(uh[ks], qwk_desc_mn<kHalfBytes>(qwk_base, 2, ks), state, true);
      ptx::wgmma_commit();
    } else {
      // ---- S0 as bf16 hi + lo A fragments of all 128 key channels (k-step kk)
      uint32_t sa[8][4], sl[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        ptx::split_bf16(state4[2 * kk][0], state4[2 * kk][1], sa[kk][0], sl[kk][0]);
        ptx::split_bf16(state4[2 * kk][2], state4[2 * kk][3], sa[kk][1], sl[kk][1]);
        ptx::split_bf16(state4[2 * kk + 1][0], state4[2 * kk + 1][1], sa[kk][2], sl[kk][2]);
        ptx::split_bf16(state4[2 * kk + 1][2], state4[2 * kk + 1][3], sa[kk][3], sl[kk][3]);
      }
      // ---- accU -= S0^T W^T (group 1), then accO = S0^T Qt^T (group 2): U, which the rest of the
      // chunk waits for, leaves the tensor pipe first, and U's conversion below runs while the
      // output's products are still in it
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        common::gmma_rs<common::OpNegRS64>(sl[kk], qwk_desc_k<kHalfBytes>(qwk_base, 1, kk), accU, true);
        common::gmma_rs<common::OpNegRS64>(sa[kk], qwk_desc_k<kHalfBytes>(qwk_base, 1, kk), accU, true);
      }
      ptx::wgmma_commit();
      if constexpr (!kSummary) {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          common::gmma_rs<common::OpRS64>(sa[kk], qwk_desc_k<kHalfBytes>(qwk_base, 0, kk), accO, kk > 0);
          common::gmma_rs<common::OpRS64>(sl[kk], qwk_desc_k<kHalfBytes>(qwk_base, 0, kk), accO, true);
        }
        ptx::wgmma_commit();
      }
      if constexpr (!kSummary) {
        ptx::wgmma_wait<1>();
      } else {
        ptx::wgmma_wait<0>();
      }
      ptx::fence_operands(accU);

      // ---- U^T as bf16 hi + lo A fragments (k = tokens)
      uint32_t uh[4][4], ul[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        ptx::split_bf16(accU[8 * ks], accU[8 * ks + 1], uh[ks][0], ul[ks][0]);
        ptx::split_bf16(accU[8 * ks + 2], accU[8 * ks + 3], uh[ks][1], ul[ks][1]);
        ptx::split_bf16(accU[8 * ks + 4], accU[8 * ks + 5], uh[ks][2], ul[ks][2]);
        ptx::split_bf16(accU[8 * ks + 6], accU[8 * ks + 7], uh[ks][3], ul[ks][3]);
      }

      // ---- accO += U^T M^T (accumulates behind the group of S0^T Qt^T, same registers)
      if constexpr (!kSummary) {
        ptx::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          common::gmma_rs<common::OpRS64>(ul[ks], m_desc(m_base, ks), accO, true);
          common::gmma_rs<common::OpRS64>(uh[ks], m_desc(m_base, ks), accO, true);
        }
        ptx::wgmma_commit();
      }

      // ---- S^T = S0^T diag(decay) + U^T Kh (Kh as hi + lo)
      common::decay_state(state4, decay, t);
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        common::gmma_rs<common::OpState>(ul[ks], qwk_desc_mn<kHalfBytes>(qwk_base, 2, ks), state, true);
        common::gmma_rs<common::OpState>(uh[ks], qwk_desc_mn<kHalfBytes>(qwk_base, 3, ks), state, true);
        common::gmma_rs<common::OpState>(uh[ks], qwk_desc_mn<kHalfBytes>(qwk_base, 2, ks), state, true);
      }
      ptx::wgmma_commit();
    }

    // ---- O, while the state's group runs: value rows vrow, vrow + 8 of tokens 8 nt + 2t, +1
    // (wait<1>: every group but the state's, i.e. S0^T Qt^T and U^T M^T, has completed)
    if constexpr (!kSummary) {
      ptx::wgmma_wait<1>();
      ptx::fence_operands(accO);
      if constexpr (kF16) {  // O = 2^E O~
        const float f[2] = {exp2i(row_exp[0]), exp2i(row_exp[1])};
        scale_acc_rows(accO, f);
      }
      common::store_o_tile(accO, o_seq + int64_t(jg) * kChunk * p.stride_o_t, p.stride_o_t,
                           min(kChunk, seq_len - jg * kChunk), p.o_pairs, g, t);
    }
    if (j + 1 < num_chunks) ptx::mbarrier_wait(&full[(j + 1) % kStages], ((j + 1) / kStages) & 1);
    ptx::wgmma_wait<0>();
    ptx::fence_operands(state);

    // Every read of this stage is done (the wgmma reads completed at the wait above, the shared
    // loads' values are in registers): release it (one arrival per thread, init_pipeline).
    // NOTE: no proxy fence before the refill: the stage's generic-proxy reads are complete
    // before the arrival, and the empty barrier orders them before the TMA writes (as CUTLASS's
    // TMA pipelines do). fence.proxy.async compiled to MEMBAR.ALL.CTA, which made the issuing
    // thread wait for the output's global stores.
    // NOTE: the refill is issued here, as early as the stage is free, although it is on the
    // warpgroup's chain (warp 0 issues it before the next chunk's products): issued under the next
    // chunk's U products instead (session 24) the chain was shorter, 7-12% faster per chunk with
    // one or two CTAs on the GPU, but with every SM busy the later loads cost more (H64 fixed
    // +5%, H4 T = 32K +4.6%): at 96 CTAs the next chunk's U0 wait was 13% of the stall samples.
    ptx::mbarrier_arrive(&empty[s]);
    if (!kProducer && is_issuer && j + kStages < num_chunks) {
      ptx::mbarrier_wait(&empty[s], (j / kStages) & 1);
      issue_chunk(j + kStages);
    }
  }

  if constexpr (kF16) state_to_true_scale(state4, row_exp, false);
  if constexpr (kSummary) {
    // ---- Psi (fp32) or Phi (bf16 hi + lo, the combine pass's image) of this full segment
    uint8_t* area = segment_at(p, segment_slot(chunk_begin, seg, work.ls), h);
    if (!phi_run) {
      store_state(state4, area + SegmentLayout::kPsiOffset, vrow, t, common::segment_state_view());
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          uint32_t hi, lo;
          ptx::split_bf16(state4[j][2 * half], state4[j][2 * half + 1], hi, lo);
          const uint32_t off = phi_offset(vrow + 8 * half, 8 * j + 2 * t);
          *reinterpret_cast<uint32_t*>(area + SegmentLayout::kPhiHiOffset + off) = hi;
          *reinterpret_cast<uint32_t*>(area + SegmentLayout::kPhiLoOffset + off) = lo;
        }
      }
    }
    return;
  }
  // ---- final state, by the last segment (an empty sequence passes its initial state through)
  if (*last_segment_flag != 0) {
    void* fin = common::final_state_of(p, n, h);
    if (fin != nullptr) store_state(state4, fin, vrow, t, p);
  }
}

template <int kValueRows, bool kSummary, bool kF16>
Status launch_wgmma(const KernelParams& kp, const TmaParams& tma, int64_t num_ctas, cudaStream_t stream, bool pdl) {
  using Smem = typename Config<kValueRows>::SharedMemoryPlan;
  auto kernel = kda_prefill_recurrence_wgmma_sm90_kernel<kValueRows, kSummary, kF16>;
  static kdakit::cuda::PerDeviceOnce attr_once;  // per function and device (common/device_setup.cuh)
  cudaError_t err = kdakit::cuda::set_up_once_per_device(attr_once, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Smem::kAllocBytes));
  });
  if (err != cudaSuccess) return cuda_status(err, "cudaFuncSetAttribute(wgmma)", __LINE__);
  return kdakit::cuda::launch_pdl_kernel(kernel, "kda_prefill_recurrence_wgmma_sm90_kernel", dim3(unsigned(num_ctas)),
                                         kCtaThreads<kValueRows>, int(Smem::kAllocBytes), stream, pdl, kp, tma);
}

}  // namespace kdakit::sm90::prefill::recurrence
