"""kdakit: Kimi Delta Attention (KDA) kernels for NVIDIA Hopper (sm_90a), with a CPU backend.

Public functions:

* ``chunk_kda``, ``fused_recurrent_kda``: drop-ins for ``fla.ops.kda`` (same arguments,
  defaults and return values; see kdakit.fla_compat).
* ``prefill``, ``decode``, ``prefill_workspace_size``: the native entry points, every option
  explicit (gate by name, state layout, state pools, chunk states, workspace; see kdakit.ops);
  ``chunk_state_indices_at`` builds the chunk-state map for states at chosen token offsets.
* ``built_with_cuda()``: whether the extension carries the CUDA kernels.

torch CUDA tensors run the GPU kernels on the current stream; numpy arrays and torch CPU
tensors run the CPU backend. ``kdakit.testing`` holds the helpers the tests and benchmarks
share; ``python -m kdakit bench`` runs the benchmarks.
"""

from ._ext import built_with_cuda
from .fla_compat import chunk_kda, fused_recurrent_kda
from .ops import (PrefillOutput, chunk_state_indices_at, decode, prefill,
                  prefill_workspace_size)

__version__ = "0.1.0"

__all__ = [
    "chunk_kda",
    "fused_recurrent_kda",
    "prefill",
    "decode",
    "prefill_workspace_size",
    "chunk_state_indices_at",
    "PrefillOutput",
    "built_with_cuda",
    "__version__",
]
