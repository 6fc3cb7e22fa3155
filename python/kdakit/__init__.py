"""kdakit: Kimi Delta Attention (KDA) kernels for NVIDIA Hopper (sm_90a), with a CPU backend.

Public functions:

* ``chunk_kda``, ``fused_recurrent_kda``: drop-ins for ``fla.ops.kda`` (same arguments,
  defaults and return values; see kdakit.fla_compat).
* ``prefill``, ``decode``, ``prefill_workspace_size``: the native entry points, every option
  explicit (gate by name, state layout, state pools, chunk states, workspace; see kdakit.ops);
  ``chunk_state_indices_at`` builds the chunk-state map for states at chosen token offsets.
* ``prefill_plan`` -> ``PrefillPlan``: the per-batch plan, built once per forward step and
  passed to every layer's prefill / chunk_kda as ``plan=`` (see kdakit.plan).
* ``built_with_cuda()``: whether the extension carries the CUDA kernels.

With torch, kdakit's ops are also registered as PyTorch custom ops (``torch.ops.kdakit.*``,
kdakit.torch_ops) and the functions above call them for torch tensors, so that
``torch.compile(fullgraph=True)`` traces models that use kdakit. That happens on ``import
kdakit`` when torch is already imported, else on ``import kdakit.torch_ops`` or at the first
call with torch tensors.

torch CUDA tensors run the GPU kernels on their device's current stream; numpy arrays and torch CPU
tensors run the CPU backend. ``kdakit.testing`` holds the helpers the tests and benchmarks
share; ``python -m kdakit bench`` runs the benchmarks.
"""

import sys as _sys

from ._ext import built_with_cuda
from .fla_compat import chunk_kda, fused_recurrent_kda
from .ops import (PrefillOutput, chunk_state_indices_at, decode, prefill,
                  prefill_workspace_size)
from .plan import PrefillPlan, prefill_plan

if "torch" in _sys.modules:
    # NOTE: torch is already loaded, so registering the custom ops costs nothing; numpy-only
    # users never import torch through kdakit.
    from . import torch_ops as _torch_ops  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "chunk_kda",
    "fused_recurrent_kda",
    "prefill",
    "decode",
    "prefill_workspace_size",
    "chunk_state_indices_at",
    "prefill_plan",
    "PrefillPlan",
    "PrefillOutput",
    "built_with_cuda",
    "__version__",
]
