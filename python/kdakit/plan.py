r"""The prefill plan: per-batch metadata built once per forward step and reused by every KDA
layer of that step (C++: ``kdakit::prefill_plan`` and ``PrefillParams::plan_ready``).

All layers of one forward pass share the packed batch (``cu_seqlens``), so the metadata the
prefill kernels need besides the tensors (each sequence's first token and length, the chunk
offsets, the chunk-to-sequence map) is the same for all of them. ``prefill_plan`` computes it
on the GPU from the device-resident ``cu_seqlens`` with one small kernel, without a host
synchronisation or an allocation (given a ``workspace``), into the plan region at the start of
the prefill workspace; ``prefill(..., plan=plan)`` (and ``chunk_kda(..., plan=plan)``) then
skips that kernel and uses the same workspace for its scratch::

    plan = kdakit.prefill_plan(cu_seqlens, num_tokens=T, num_v_heads=HV)   # once per step
    for layer in layers:                                                    # every KDA layer
        o, _ = kdakit.chunk_kda(q, k, v, g, beta, ..., cu_seqlens=cu_seqlens, plan=plan)

Without a plan, prefill builds the same metadata itself on every call (one extra small kernel
per layer). Both paths give bitwise identical results.

Rules:

* The plan holds what ``cu_seqlens`` contained when ``prefill_plan`` ran (stream order): after
  changing those values, run ``prefill_plan`` again (inside a captured CUDA graph that is just
  part of the step: capture ``prefill_plan`` together with the layers). The sizes a plan was
  built for (B, T, N, packed or not) are checked at every use; the values are not (that would
  need a device read); ``KDAKIT_DEBUG_CHECKS=1`` compares them, with a synchronisation.
* The layers of a step run one after another on one stream: they share the workspace.
* On the CPU backend a plan is a no-op (it holds no workspace), so the same engine code runs
  on CPU tensors.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _arrays
from ._ext import ext

__all__ = ["PrefillPlan", "prefill_plan", "batch_workspace_size"]


class PrefillPlan(NamedTuple):
    """A prefill workspace whose plan region holds the plan of one batch, and that batch's
    sizes. Pass it to ``prefill(..., plan=...)`` / ``chunk_kda(..., plan=...)``."""

    workspace: Any  # uint8 CUDA tensor of at least batch_workspace_size(...) bytes; None on CPU
    batch: int  # B (1 for a packed batch)
    seqlen: int  # T, tokens per batch row
    num_seqs: int  # N
    num_v_heads: int  # HV the workspace is sized for (a call may use as many or fewer)
    packed: bool  # built from cu_seqlens (else a fixed [B, T] batch)

    def check_matches(self, B: int, T: int, N: int, HV: int, packed: bool) -> None:
        """Raises ValueError naming ``plan`` unless a call of these sizes may use this plan."""
        if packed != self.packed:
            raise ValueError(
                f"plan: built for a {'packed' if self.packed else 'fixed'} batch, but the call "
                f"is {'packed (cu_seqlens given)' if packed else 'fixed (no cu_seqlens)'}"
            )
        if (B, T, N) != (self.batch, self.seqlen, self.num_seqs):
            raise ValueError(
                f"plan: built for B = {self.batch}, T = {self.seqlen}, N = {self.num_seqs}, but "
                f"the call has B = {B}, T = {T}, N = {N}; run prefill_plan for this batch"
            )
        if HV > self.num_v_heads:
            raise ValueError(
                f"plan: its workspace is sized for {self.num_v_heads} value heads, but the call "
                f"has HV = {HV}; pass num_v_heads={HV} (or more) to prefill_plan"
            )


def _is_int(value: Any) -> bool:
    """An int, or a torch.SymInt (a size traced by torch.compile with dynamic shapes)."""
    if isinstance(value, bool):
        return False
    torch = _arrays._torch()
    return isinstance(value, int) or (torch is not None and isinstance(value, torch.SymInt))


def _check_sizes(num_tokens: int, num_seqs: int, batch: int, num_v_heads: int, packed: bool):
    for name, value in (("num_tokens", num_tokens), ("num_v_heads", num_v_heads),
                        ("num_seqs", num_seqs), ("batch", batch)):
        if not _is_int(value):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens: expected a token count T >= 0, got {num_tokens}")
    if num_v_heads < 1:
        raise ValueError(f"num_v_heads: expected a number of value heads HV >= 1, got {num_v_heads}")
    if packed and num_seqs < 0:
        raise ValueError(f"num_seqs: expected a sequence count N >= 0, got {num_seqs}")
    if not packed and batch < 0:
        raise ValueError(f"batch: expected a batch size >= 0, got {batch}")


def batch_workspace_size(num_tokens: int, num_v_heads: int, num_seqs: int | None = None,
                         batch: int | None = None) -> int:
    """Bytes of CUDA prefill workspace (plan region included) for a batch of these sizes: N =
    ``num_seqs`` packed sequences of ``num_tokens`` tokens in total, or (``num_seqs`` None) a
    fixed batch of ``batch`` rows of ``num_tokens`` tokens each, with ``num_v_heads`` value
    heads. Non-decreasing in every size: a buffer sized for an engine's largest batch serves
    every smaller one. 0 in a build without CUDA."""
    packed = num_seqs is not None
    if packed and batch not in (None, 1):
        raise ValueError(f"batch: expected 1 (or None) with num_seqs (a packed batch), got {batch}")
    if not packed and batch is None:
        raise ValueError("batch: required without num_seqs (a fixed [batch, num_tokens] batch)")
    B = 1 if packed else batch
    N = num_seqs if packed else batch
    _check_sizes(num_tokens, N, B, num_v_heads, packed)
    return int(ext().prefill_batch_workspace_size(batch=B, seqlen=num_tokens, num_seqs=N,
                                                  num_v_heads=num_v_heads, packed=packed))


def prefill_plan(cu_seqlens=None, *, num_tokens: int, num_v_heads: int, batch: int | None = None,
                 workspace=None, device=None, stream=None) -> PrefillPlan:
    r"""Builds the plan of one batch for every prefill of a forward step.

    * ``cu_seqlens``: ``[N + 1]`` int32/int64 offsets of a packed batch (B = 1), on the device
      the layers run on; None for a fixed batch of ``batch`` rows.
    * ``num_tokens``: T, the token count of the packed row (dim 1 of q), or tokens per row.
    * ``num_v_heads``: HV of the layers (the workspace's chunk scratch scales with it).
    * ``workspace``: a dense CUDA tensor of at least ``batch_workspace_size(...)`` bytes (any
      dtype), reused step after step; allocated when None. Passing one keeps allocation off the
      step, as CUDA-graph capture needs (torch's graph pool also serves an allocation).
    * ``device``: where to allocate the workspace when neither cu_seqlens nor workspace says.
    * ``stream``: a ``torch.cuda.Stream`` or ``cudaStream_t`` int; default the current stream.

    Inside torch.compile (fullgraph) pass ``workspace``: sizing one is a call into the
    extension, which the compiler cannot trace.

    Returns a PrefillPlan. CPU ``cu_seqlens`` (or ``device="cpu"``) give a plan without a
    workspace that the CPU backend accepts and ignores.
    """
    kind = None
    if cu_seqlens is not None or workspace is not None:
        kind = _arrays.classify({"cu_seqlens": cu_seqlens, "workspace": workspace})
    packed = cu_seqlens is not None
    if packed:
        if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 1:
            raise ValueError(f"cu_seqlens: expected shape [N + 1], got {tuple(cu_seqlens.shape)}")
        if batch not in (None, 1):
            raise ValueError(f"batch: expected 1 (or None) with cu_seqlens, got {batch}")
        B, N = 1, int(cu_seqlens.shape[0]) - 1
    else:
        if batch is None:
            raise ValueError("batch: required without cu_seqlens (a fixed [batch, num_tokens] batch)")
        B = N = batch
    _check_sizes(num_tokens, N, B, num_v_heads, packed)
    torch = _arrays._torch()
    if kind is None:
        # NOTE: neither array says where the plan lives: `device` does (default: the CPU).
        dev = "cpu" if device is None else device
        if torch is None:
            if str(dev) != "cpu":
                raise ValueError(f"device: {dev} needs torch; import torch first")
            kind = _arrays.ArrayKind("numpy", "cpu", "device")
        else:
            kind = _arrays.ArrayKind("torch", torch.device(dev), "device")
    elif device is not None and kind.library == "torch":
        want = torch.device(device)
        if want.type != kind.device.type or want.index not in (None, kind.device.index):
            raise TypeError(f"device: {want} differs from the device of the arrays, {kind.device}")
    on_cpu = not kind.is_cuda
    if on_cpu:
        if workspace is not None:
            raise ValueError("workspace: the CPU backend needs no plan workspace; pass None")
        if stream is not None:
            raise ValueError("stream: only meaningful for CUDA tensors; the plan is for the CPU")
        return PrefillPlan(None, B, num_tokens, N, num_v_heads, packed)

    if workspace is None:
        nbytes = batch_workspace_size(num_tokens, num_v_heads, N if packed else None,
                                      None if packed else B)
        workspace = _arrays.empty(kind, (max(nbytes, 1),), "uint8")
    handle = _arrays.stream_handle(kind, stream)
    with _arrays.device_guard(kind):
        if stream is None:
            from . import torch_ops

            torch_ops.prefill_plan(cu_seqlens, workspace, B, num_tokens, num_v_heads)
        else:
            ext().prefill_plan(cu_seqlens, workspace, batch=B, seqlen=num_tokens,
                               num_v_heads=num_v_heads, stream=handle)
    return PrefillPlan(workspace, B, num_tokens, N, num_v_heads, packed)

