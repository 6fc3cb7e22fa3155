// The wgmma recurrence kernel (128 value rows per CTA) and its launcher (wgmma.cuh).
#include "cuda/sm90/prefill/recurrence/wgmma.cuh"
