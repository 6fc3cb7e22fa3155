// Launcher of the token-serial KDA kernel (kernel.cuh), one explicit instantiation per
// (state storage type, state layout, head dim) in instantiations/. Host-includable.
#pragma once

#include "cuda/sm90/decode/config.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::recurrent {

// StateT: float or __nv_bfloat16 (the pool / state storage type). kHeadDim: K = V.
template <class StateT, StateLayout kLayout, int kHeadDim>
Status launch_recurrent(const RecurrentKernelParams& p, cudaStream_t stream);

// Staged variant: V-first layout, decode mode with one index column only. kSingleToken: every
// sequence has at most one token (a dense batch with T = 1). kGroups: 32-row groups per CTA
// (2 only with kSingleToken). kPasses: slices of kGroups x 32 rows one CTA runs through its
// shared-memory slice (2 only with kSingleToken and kGroups = 2: the whole 128-row head, the next
// slice's rows copied as soon as a warp has stored the current ones). pdl: launch with the
// programmatic-dependent-launch attribute (src/cuda/common/pdl_launch.cuh).
// p.prefetch_before_wait (set only together with pdl) lets the kernel prefetch its slice before
// the wait.
template <class StateT, int kHeadDim, bool kSingleToken, int kGroups, int kPasses = 1>
Status launch_staged(const RecurrentKernelParams& p, cudaStream_t stream, bool pdl);

// Fast single-column V-first decode (config.h, FastDecodeParams), pdl: launch with the
// programmatic-dependent-launch attribute (src/cuda/common/pdl_launch.cuh).
// FastFlags::kPrefetchBeforeWait in p.flags (set only together with pdl) lets the direct kernel
// prefetch its rows before the wait.
// direct.cuh: kRowsPerWarp (8 or 4) value rows per warp, 4 warps per CTA; K = V = 64 or 128.
template <class StateT, int kHeadDim, int kRowsPerWarp>
Status launch_direct(const FastDecodeParams& p, cudaStream_t stream, bool pdl);

}  // namespace kdakit::sm90::recurrent
