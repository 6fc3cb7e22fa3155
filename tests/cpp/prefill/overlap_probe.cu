// prefill_overlap_probe: a scheduling probe for the device runs (not a test, no kdakit kernels).
//
// The question behind it (docs/design/20261201-prefill-segments.md, session 28): could a few
// long-lived "chain" CTAs (one per SM, each waiting on per-item ready flags, as a recurrence
// reading chunk blocks as prep finishes them would) run *during* a large grid of short
// "producer" CTAs (two per SM, ~18 us each, as the prep kernel's), and how must the two be
// launched for the chain's CTAs to be resident early rather than after the producer grid has
// drained? Spinning CTAs that held every SM would starve the producer: the chain grid here is
// small, and every wait gives up after a timeout, so the probe cannot hang.
//
// Launch schemes, each eager and captured into a CUDA graph:
//   streams   the chain on a second stream forked and joined with events, enqueued before the
//             producer (the producer on the caller's stream)
//   priority  the same with the second stream at the device's greatest priority (and, for the
//             graph, instantiated with cudaGraphInstantiateFlagUseNodePriority)
//   prio-after the priority scheme with the producer enqueued first and the chain second: the
//             order a serialised launch (CUDA_LAUNCH_BLOCKING=1, a tool) runs without deadlock;
//             the question is whether the chain's CTAs still become resident early
//   pdl       one stream: the chain first, triggering griddepcontrol.launch_dependents at its
//             start, the producer launched with programmatic stream serialization, then a tail
//             kernel that records how many chain CTAs had finished when it started (does work
//             after the producer wait for the chain too?)
// Printed per scheme: when the last chain CTA started relative to the first producer CTA (us),
// the whole span against the producer grid alone, waits that timed out, and the tail's count.
//
// Usage: prefill_overlap_probe [chain_ctas (32)] [producer_ctas (20480)] [producer_us (18)]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/common/ptx_sm90.cuh"

namespace {

#define CHECK(x)                                                                                    \
  do {                                                                                              \
    const cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

constexpr int kProducerThreads = 256;
constexpr int kProducerSmem = 107 * 1024;  // two per SM, as the prep kernel
constexpr int kChainThreads = 160;
constexpr int kChainSmem = 200 * 1024;    // one per SM, as the 64-row recurrence
constexpr int kItemsPerChain = 64;
constexpr unsigned long long kTimeoutNs = 200ull * 1000 * 1000;

struct Times {
  unsigned long long producer_first_start, producer_last_end;
  unsigned long long chain_first_start, chain_last_start, chain_last_end;
  int timeouts;
  int chain_done;  // chain CTAs finished
  int tail_saw_done;
};

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// the library's flag accessors (src/cuda/common/ptx_sm90.cuh), as the overlapped call uses them
using kdakit::cuda::ptx::load_acquire_gpu;
using kdakit::cuda::ptx::store_release_gpu;

__global__ void __launch_bounds__(kProducerThreads) producer(int* flags, int epoch, unsigned long long spin_ns,
                                                             Times* t) {
  extern __shared__ unsigned char smem[];
  const unsigned long long t0 = now_ns();
  if (threadIdx.x == 0) {
    atomicMin(&t->producer_first_start, t0);
    smem[0] = 1;
  }
  while (now_ns() - t0 < spin_ns) {
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    store_release_gpu(flags + blockIdx.x, epoch);
    atomicMax(&t->producer_last_end, now_ns());
  }
}

__global__ void __launch_bounds__(kChainThreads) chain(const int* flags, int producer_ctas, int epoch, bool pdl,
                                                       Times* t) {
  extern __shared__ unsigned char smem[];
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x != 0) return;
  const unsigned long long t0 = now_ns();
  smem[0] = 1;
  atomicMin(&t->chain_first_start, t0);
  atomicMax(&t->chain_last_start, t0);
  // item j: the last producer CTA of the j-th of kItemsPerChain equal groups
  const int group = producer_ctas / kItemsPerChain;
  for (int j = 0; j < kItemsPerChain; ++j) {
    const int* f = flags + (j + 1) * group - 1;
    while (load_acquire_gpu(f) != epoch) {
      if (now_ns() - t0 > kTimeoutNs) {
        atomicAdd(&t->timeouts, 1);
        j = kItemsPerChain;
        break;
      }
      __nanosleep(256);
    }
  }
  atomicMax(&t->chain_last_end, now_ns());
  __threadfence();
  atomicAdd(&t->chain_done, 1);
}

__global__ void reset_times(Times* t) {
  if (threadIdx.x == 0) {
    *t = Times{};
    t->producer_first_start = ~0ull;
    t->chain_first_start = ~0ull;
  }
}

__global__ void tail(Times* t) {
  if (threadIdx.x == 0) t->tail_saw_done = *reinterpret_cast<volatile int*>(&t->chain_done);
}

struct Probe {
  int chain_ctas, producer_ctas;
  unsigned long long spin_ns;
  int* flags = nullptr;
  Times* times = nullptr;
  cudaStream_t main_stream = nullptr, side = nullptr, side_hi = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  int epoch = 0;

  int greatest_priority = 0;

  void reset() {
    reset_times<<<1, 32, 0, main_stream>>>(times);
    CHECK(cudaGetLastError());
  }
  // A launch with at most one attribute (none when attr is null).
  template <class... Args>
  static void launch(void (*kernel)(Args...), int ctas, int threads, int smem, cudaStream_t s,
                     const cudaLaunchAttribute* attr, Args... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(ctas));
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = size_t(smem);
    cfg.stream = s;
    cfg.attrs = const_cast<cudaLaunchAttribute*>(attr);
    cfg.numAttrs = attr != nullptr ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
  }
  void launch_producer(cudaStream_t s, bool programmatic) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    launch(producer, producer_ctas, kProducerThreads, kProducerSmem, s, programmatic ? &attr : nullptr, flags, epoch,
           spin_ns, times);
  }
  void launch_chain(cudaStream_t s, bool pdl, bool high_priority) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributePriority;
    attr.val.priority = greatest_priority;
    launch(chain, chain_ctas, kChainThreads, kChainSmem, s, high_priority ? &attr : nullptr,
           static_cast<const int*>(flags), producer_ctas, epoch, pdl, times);
  }
  // Enqueues one run of `scheme` on main_stream (0 producer alone, 1 streams, 2 priority, 3 pdl,
  // 4 priority with the producer enqueued first).
  void enqueue(int scheme) {
    ++epoch;
    reset();
    if (scheme == 0) {
      launch_producer(main_stream, false);
    } else if (scheme == 1 || scheme == 2) {
      cudaStream_t s = scheme == 2 ? side_hi : side;
      CHECK(cudaEventRecord(fork, main_stream));
      CHECK(cudaStreamWaitEvent(s, fork, 0));
      launch_chain(s, false, scheme == 2);
      launch_producer(main_stream, false);
      CHECK(cudaEventRecord(join, s));
      CHECK(cudaStreamWaitEvent(main_stream, join, 0));
    } else if (scheme == 4) {
      CHECK(cudaEventRecord(fork, main_stream));
      CHECK(cudaStreamWaitEvent(side_hi, fork, 0));
      launch_producer(main_stream, false);
      launch_chain(side_hi, false, true);
      CHECK(cudaEventRecord(join, side_hi));
      CHECK(cudaStreamWaitEvent(main_stream, join, 0));
    } else {
      launch_chain(main_stream, true, false);
      launch_producer(main_stream, true);
    }
    tail<<<1, 32, 0, main_stream>>>(times);
    CHECK(cudaGetLastError());
  }
  void report(const char* name, int scheme, const Times& t, double producer_alone_us) {
    unsigned long long start = t.producer_first_start, end = t.producer_last_end;
    if (scheme != 0) {
      if (t.chain_first_start < start) start = t.chain_first_start;
      if (t.chain_last_end > end) end = t.chain_last_end;
    }
    const double span = double(end - start) / 1e3;
    if (scheme == 0) {
      std::printf("OVERLAP_PROBE %-22s producer %8.1f us\n", name, span);
      return;
    }
    const double late = (double(t.chain_last_start) - double(t.producer_first_start)) / 1e3;
    std::printf("OVERLAP_PROBE %-22s last chain CTA started %+9.1f us after the first producer CTA; span %8.1f us "
                "(producer alone %.1f); timeouts %d; chain CTAs done when the tail started %d of %d\n",
                name, late, span, producer_alone_us, t.timeouts, t.tail_saw_done, chain_ctas);
  }
};

}  // namespace

int main(int argc, char** argv) {
  Probe p;
  p.chain_ctas = argc > 1 ? std::atoi(argv[1]) : 32;
  p.producer_ctas = argc > 2 ? std::atoi(argv[2]) : 20480;
  p.spin_ns = (argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 18ull) * 1000ull;
  int dev = 0, sms = 0, lo = 0, hi = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (p.chain_ctas < 1 || p.chain_ctas > sms / 2 || p.producer_ctas < kItemsPerChain) {
    std::fprintf(stderr, "chain CTAs must be 1..%d (half the SMs), producer CTAs at least %d\n", sms / 2,
                 kItemsPerChain);
    return 2;
  }
  CHECK(cudaFuncSetAttribute(producer, cudaFuncAttributeMaxDynamicSharedMemorySize, kProducerSmem));
  CHECK(cudaFuncSetAttribute(chain, cudaFuncAttributeMaxDynamicSharedMemorySize, kChainSmem));
  CHECK(cudaMalloc(&p.flags, sizeof(int) * size_t(p.producer_ctas)));
  CHECK(cudaMemset(p.flags, 0, sizeof(int) * size_t(p.producer_ctas)));
  CHECK(cudaMalloc(&p.times, sizeof(Times)));
  CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  p.greatest_priority = hi;
  CHECK(cudaStreamCreateWithFlags(&p.main_stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&p.side, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithPriority(&p.side_hi, cudaStreamNonBlocking, hi));
  CHECK(cudaEventCreateWithFlags(&p.fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&p.join, cudaEventDisableTiming));
  std::printf("OVERLAP_PROBE %d SMs, %d chain CTAs (%d B smem), %d producer CTAs (%d B smem, %.0f us each)\n", sms,
              p.chain_ctas, kChainSmem, p.producer_ctas, kProducerSmem, double(p.spin_ns) / 1e3);

  const char* names[] = {"producer alone", "streams", "priority", "pdl", "prio-after"};
  double alone_us = 0;
  for (int graph = 0; graph < 2; ++graph) {
    for (int scheme = 0; scheme < 5; ++scheme) {
      for (int rep = 0; rep < 2; ++rep) {
        if (graph == 0) {
          p.enqueue(scheme);
        } else {
          // the epoch is baked into the captured launches: capture per run
          cudaGraph_t g;
          cudaGraphExec_t ge;
          CHECK(cudaStreamBeginCapture(p.main_stream, cudaStreamCaptureModeThreadLocal));
          p.enqueue(scheme);
          CHECK(cudaStreamEndCapture(p.main_stream, &g));
          CHECK(cudaGraphInstantiateWithFlags(&ge, g, scheme == 2 || scheme == 4 ? cudaGraphInstantiateFlagUseNodePriority : 0));
          CHECK(cudaGraphLaunch(ge, p.main_stream));
          CHECK(cudaStreamSynchronize(p.main_stream));
          CHECK(cudaGraphExecDestroy(ge));
          CHECK(cudaGraphDestroy(g));
        }
        CHECK(cudaStreamSynchronize(p.main_stream));
        Times t{};
        CHECK(cudaMemcpy(&t, p.times, sizeof(Times), cudaMemcpyDeviceToHost));
        if (scheme == 0) {
          alone_us = double(t.producer_last_end - t.producer_first_start) / 1e3;
        }
        char label[64];
        std::snprintf(label, sizeof(label), "%s%s r%d", names[scheme], graph ? " (graph)" : "", rep);
        p.report(label, scheme, t, alone_us);
      }
    }
  }
  return 0;
}
