r"""kdakit's operations as PyTorch custom ops (``torch.ops.kdakit.*``), for torch.compile and
anything else that traces torch programs. Imported only where torch is: ``import kdakit`` after
``import torch`` registers them, and so does ``import kdakit.torch_ops`` (which imports torch).
The core stays independent of torch: these ops call the same nanobind entry points as the rest
of the package, through DLPack.

The ops are the low-level entry points, with every output preallocated by the caller and
written in place, so each schema says exactly which arguments are mutated:

* ``kdakit::prefill(q, k, v, g, beta, o!, A_log?, dt_bias?, cu_seqlens?, initial_state?,
  initial_state_indices?, final_state!?, final_state_indices?, chunk_states!?,
  chunk_state_indices?, workspace!?, chunk_state_interval, plan_ready, state_in_place,
  chunk_states_in_pool, gate, state_layout, scale, lower_bound, use_qk_l2norm,
  use_beta_sigmoid, allow_neg_eigval, scalar_gate, backend) -> ()``.
  A state pool that the call both reads and writes is passed once, as ``final_state``, so that
  no input aliases a mutated one and no two mutated arguments alias each other:

  - ``state_in_place=True`` reads the initial states from ``final_state`` itself
    (``initial_state`` is then None): through ``initial_state_indices`` when given (read slot
    a, write slot b of one pool: prefix caching), else through ``final_state_indices`` (each
    sequence overwrites the slot it read).
  - ``chunk_states_in_pool=True`` writes the chunk states into rows of ``final_state`` itself,
    through ``chunk_state_indices`` (``chunk_states`` is then None).

  A None workspace on CUDA is allocated inside the op (the caching allocator; torch's graph
  pool under CUDA-graph capture).
* ``kdakit::prefill_plan(cu_seqlens?, workspace!, batch, seqlen, num_v_heads) -> ()``.
* ``kdakit::decode(q, k, v, g, beta, o!, state!, state_indices, A_log?, dt_bias?,
  cu_seqlens?, num_accepted_tokens?, gate, state_layout, scale, lower_bound, use_qk_l2norm,
  use_beta_sigmoid, allow_neg_eigval, scalar_gate, null_slot_is_padding, backend) -> ()``.

Their fake (meta) implementations do nothing: the outputs already exist with their final
shapes. CUDA ops launch on the current torch stream of the tensors' device.

The public functions (``kdakit.prefill``, ``decode``, ``chunk_kda``, ``fused_recurrent_kda``,
``prefill_plan``) call these ops for torch tensors unless an explicit ``stream`` is passed, so
``torch.compile(fullgraph=True)`` traces a model that calls them, and the in-place updates of
outputs, states and pools are visible to the compiler.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ._ext import ext

__all__ = ["prefill", "prefill_plan", "decode"]

Tensor = torch.Tensor


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def _device_guard(device: torch.device):
    """Makes a CUDA tensor's device current while kdakit launches (it launches on the current
    device); nothing on the CPU."""
    if device.type == "cuda" and device.index is not None:
        return torch.cuda.device(device.index)
    return contextlib.nullcontext()


@torch.library.custom_op("kdakit::prefill",
                         mutates_args=("o", "final_state", "chunk_states", "workspace"))
def prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, o: Tensor,
            A_log: Optional[Tensor], dt_bias: Optional[Tensor], cu_seqlens: Optional[Tensor],
            initial_state: Optional[Tensor], initial_state_indices: Optional[Tensor],
            final_state: Optional[Tensor], final_state_indices: Optional[Tensor],
            chunk_states: Optional[Tensor], chunk_state_indices: Optional[Tensor],
            workspace: Optional[Tensor], chunk_state_interval: int, plan_ready: bool,
            state_in_place: bool, chunk_states_in_pool: bool, gate: str, state_layout: str,
            scale: float, lower_bound: float, use_qk_l2norm: bool, use_beta_sigmoid: bool,
            allow_neg_eigval: bool, scalar_gate: bool, backend: str, max_seqlen: int = 0) -> None:
    """kdakit.prefill over preallocated outputs (see the module docstring). ``max_seqlen``: the
    longest sequence's length when known on the host (0: unknown), a routing hint."""
    if state_in_place:
        if initial_state is not None or final_state is None:
            raise ValueError("state_in_place: pass the state pool once, as final_state "
                             "(initial_state None); initial_state_indices, when given, are the "
                             "slots read, else final_state_indices")
        initial_state = final_state
        if initial_state_indices is None:
            initial_state_indices = final_state_indices
    if chunk_states_in_pool:
        if chunk_states is not None or final_state is None:
            raise ValueError("chunk_states_in_pool: pass the state pool once, as final_state "
                             "(chunk_states None), with chunk_state_indices naming its rows")
        chunk_states = final_state
    args = dict(
        A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu_seqlens, initial_state=initial_state,
        initial_state_indices=initial_state_indices, final_state=final_state,
        final_state_indices=final_state_indices, chunk_states=chunk_states,
        chunk_state_indices=chunk_state_indices, chunk_state_interval=chunk_state_interval,
        gate=gate, state_layout=state_layout, scale=scale, lower_bound=lower_bound,
        use_qk_l2norm=use_qk_l2norm, use_beta_sigmoid=use_beta_sigmoid,
        allow_neg_eigval=allow_neg_eigval, scalar_gate=scalar_gate, backend=backend,
        max_seqlen=max_seqlen,
    )
    arrays = (q, k, v, g, beta, o)
    with _device_guard(q.device):
        if q.device.type == "cuda" and workspace is None:
            nbytes = int(ext().prefill_workspace_size(*arrays, **args))
            workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=q.device)
        ext().prefill(*arrays, **args, workspace=workspace, plan_ready=plan_ready,
                      stream=_stream(q.device))


@prefill.register_fake
def _prefill_fake(q, k, v, g, beta, o, A_log, dt_bias, cu_seqlens, initial_state,
                  initial_state_indices, final_state, final_state_indices, chunk_states,
                  chunk_state_indices, workspace, chunk_state_interval, plan_ready,
                  state_in_place, chunk_states_in_pool, gate, state_layout, scale, lower_bound,
                  use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, scalar_gate,
                  backend, max_seqlen=0) -> None:
    return None


@torch.library.custom_op("kdakit::prefill_plan", mutates_args=("workspace",))
def prefill_plan(cu_seqlens: Optional[Tensor], workspace: Tensor, batch: int, seqlen: int,
                 num_v_heads: int) -> None:
    """kdakit.prefill_plan into a preallocated CUDA workspace (see kdakit.plan)."""
    with _device_guard(workspace.device):
        ext().prefill_plan(cu_seqlens, workspace, batch=batch, seqlen=seqlen,
                           num_v_heads=num_v_heads, stream=_stream(workspace.device))


@prefill_plan.register_fake
def _prefill_plan_fake(cu_seqlens, workspace, batch, seqlen, num_v_heads) -> None:
    return None


@torch.library.custom_op("kdakit::decode", mutates_args=("o", "state"))
def decode(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, o: Tensor, state: Tensor,
           state_indices: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor],
           cu_seqlens: Optional[Tensor], num_accepted_tokens: Optional[Tensor], gate: str,
           state_layout: str, scale: float, lower_bound: float, use_qk_l2norm: bool,
           use_beta_sigmoid: bool, allow_neg_eigval: bool, scalar_gate: bool,
           null_slot_is_padding: bool, backend: str) -> None:
    """kdakit.decode over a preallocated output and the state pool (see kdakit.ops)."""
    with _device_guard(q.device):
        ext().decode(
            q, k, v, g, beta, o, state, state_indices, A_log=A_log, dt_bias=dt_bias,
            cu_seqlens=cu_seqlens, num_accepted_tokens=num_accepted_tokens, gate=gate,
            state_layout=state_layout, scale=scale, lower_bound=lower_bound,
            use_qk_l2norm=use_qk_l2norm, use_beta_sigmoid=use_beta_sigmoid,
            allow_neg_eigval=allow_neg_eigval, scalar_gate=scalar_gate,
            null_slot_is_padding=null_slot_is_padding, backend=backend,
            stream=_stream(q.device),
        )


@decode.register_fake
def _decode_fake(q, k, v, g, beta, o, state, state_indices, A_log, dt_bias, cu_seqlens,
                 num_accepted_tokens, gate, state_layout, scale, lower_bound, use_qk_l2norm,
                 use_beta_sigmoid, allow_neg_eigval, scalar_gate, null_slot_is_padding,
                 backend) -> None:
    return None
