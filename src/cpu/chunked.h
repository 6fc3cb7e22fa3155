// The two halves of the fp32 chunked prefill (chunked.cpp), exposed so that GPU tests can
// check a kernel's per-chunk intermediates, not only its final outputs.
//
// prepare_chunk: everything that depends only on the chunk's own tokens (the GPU prep kernel).
// apply_chunk:   the chunk-serial step from the state entering the chunk (the recurrence kernel).
// Arrays are row-major with kChunk rows (row r = token r of the chunk); rows r >= C' (and the
// columns s >= C' of L, M, T) are zero, as in the GPU workspace blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/preprocess.h"
#include "kdakit/kdakit.h"

namespace kdakit::cpu {

// Tokens per chunk of the GPU prefill: one 64-row wgmma tile.
inline constexpr int32_t kChunk = 64;

struct ChunkPrep {
  int32_t rows = 0;  // C' <= kChunk, the chunk's tokens
  int32_t K = 0, V = 0;
  std::vector<float> qn, kn;  // [kChunk][K] q, k after the optional L2 norm (q not scaled)
  std::vector<float> v;       // [kChunk][V]
  std::vector<float> beta;    // [kChunk] after the optional sigmoid
  std::vector<float> b2;      // [kChunk][K] log2(e) * (gamma_0 + ... + gamma_r)
  std::vector<float> Qt;      // [kChunk][K] scale * exp2(b2_r) * qn_r
  std::vector<float> Kt;      // [kChunk][K] exp2(b2_r) * kn_r
  std::vector<float> Kh;      // [kChunk][K] exp2(b2_{C'-1} - b2_r) * kn_r
  std::vector<float> L;       // [kChunk][kChunk] strictly lower
  std::vector<float> M;       // [kChunk][kChunk] lower, diagonal included
  std::vector<float> T;       // [kChunk][kChunk] (I + diag(beta) L)^-1, unit lower
  std::vector<float> W;       // [kChunk][K] T diag(beta) Kt
  std::vector<float> U0;      // [kChunk][V] T diag(beta) V
  std::vector<float> decay;   // [K] exp2(b2_{C'-1})
  // Scratch of prepare_chunk and apply_chunk, sized once here so that a chunk allocates nothing.
  std::vector<float> gamma, running, ks;  // [K]
  std::vector<float> tb;                  // [kChunk][kChunk] T diag(beta)
  std::vector<float> U;                   // [kChunk][V] U0 - W S0

  ChunkPrep(int32_t K_, int32_t V_);
};

// Fills `prep` for the chunk of `rows` tokens starting at token t0 of batch row `row`, value
// head h (rows >= 1).
void prepare_chunk(const KdaProblem& m, int64_t row, int64_t t0, int32_t rows, int32_t h,
                   ChunkPrep& prep);

// U = U0 - W S0, O = Qt S0 + M U, S <- diag(decay) S0 + Kh^T U. S is [K][V] (S[i * V + j]),
// updated in place; O is [prep.rows][V]. Writes prep's scratch (U), nothing else of it.
void apply_chunk(ChunkPrep& prep, float* S, float* O);

// The intermediates of chunk `chunk` (0-based, 64 tokens each) of sequence `seq`, value head
// h, for host-resident params (cu_seqlens is read). Validates p; kInvalidArgument when the
// sequence has no such chunk.
Status prefill_chunk_prep(const PrefillParams& p, int64_t seq, int64_t chunk, int32_t h,
                          ChunkPrep& prep);

}  // namespace kdakit::cpu
