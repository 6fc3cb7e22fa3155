// The wgmma recurrence kernel (64 and 128 value rows per CTA) and its launchers (wgmma.cuh).
#include "cuda/sm90/prefill/recurrence/wgmma.cuh"
