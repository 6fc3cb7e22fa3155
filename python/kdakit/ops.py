r"""kdakit's native entry points: ``prefill`` (chunked) and ``decode`` (token-serial over a state
pool), exposing every field of the C++ params structs (include/kdakit/kdakit.h) explicitly.

The recurrence (per sequence n and value head h, state S of K x V, tokens t in order)::

    S   <- diag(exp(gamma_t)) S                    decay, gamma_t <= 0 per key channel
    S   <- S + beta_t k_t (v_t - S^T k_t)^T         delta rule on the decayed state
    o_t  = S^T (scale * q_t)                        the output reads the updated state

Preprocessing, all in fp32, each behind a flag:

* ``use_qk_l2norm``: ``q, k <- x / sqrt(sum(x * x) + 1e-6)`` over the head dim, before ``scale``.
* ``use_beta_sigmoid``: ``beta <- sigmoid(beta)``; with ``allow_neg_eigval``: ``2 * sigmoid(beta)``.
* ``gate`` (gamma from g; A_log ``[HV]`` fp32, dt_bias ``[HV, K]`` or ``[HV * K]`` fp32, zeros if None):

  - ``"precomputed"``: ``gamma = g`` (the caller guarantees ``g <= 0``).
  - ``"softplus"`` (Kimi-Linear): ``gamma = -exp(A_log[h]) * softplus(g + dt_bias[h])``;
    softplus(x) = x for x > 20. ``A_log`` is required.
  - ``"lower_bound"`` (Kimi K3, FlashKDA): ``gamma = lower_bound * sigmoid(exp(A_log[h]) *
    (g + dt_bias[h]))``, or ``lower_bound * sigmoid(g + dt_bias[h])`` without ``A_log``;
    ``-5 <= lower_bound < 0``.

* GVA: ``HV`` value heads, ``H`` q/k heads, ``HV % H == 0``; value head h reads q/k head
  ``h // (HV // H)``.

Shapes and dtypes:

* q, k: ``[B, T, H, K]``, bfloat16, float16 or float32 (numpy has no bfloat16).
* v: ``[B, T, HV, V]``, the dtype of q; o (returned, or ``out``): ``[B, T, HV, V]``, as v.
* g: ``[B, T, HV, K]`` (``scalar_gate``: ``[B, T, HV]``); beta: ``[B, T, HV]``; bfloat16,
  float16 or float32.
* state: ``[N, HV, V, K]`` (``state_layout="v_first"``, the serving layout) or
  ``[N, HV, K, V]`` (``"k_first"``, FLA's default); float32 or bfloat16.
* cu_seqlens: ``[N + 1]``, int32 or int64; slot indices: int32 ``[N]`` (decode also
  ``[N, 1 + S]``); chunk_state_indices: int32 ``[number of chunk states]``.

Strides are free except that the last dim of q, k, v, g, o is contiguous and each state
``[HV, ...]`` is dense; q/k/v may be views into a fused projection buffer.

Where it runs: torch CUDA tensors run the sm_90a kernels on the current torch stream (or
``stream``); numpy arrays and torch CPU tensors run the CPU backend (prefill: fp32 chunked
algorithm by default, float64 reference with ``backend="reference"``; decode: float64
reference). An unsupported case raises NotImplementedError; nothing falls back silently.
Bad arguments raise ValueError (values, shapes) or TypeError (dtypes, devices, array types)
naming the argument. Tensors that require gradients are rejected: inference only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _arrays
from ._ext import ext
from .plan import PrefillPlan, batch_workspace_size

__all__ = ["PrefillOutput", "prefill", "prefill_workspace_size", "decode",
           "chunk_state_indices_at", "num_chunk_states"]

_GATES = ("precomputed", "softplus", "lower_bound")
_LAYOUTS = ("v_first", "k_first")


class PrefillOutput(NamedTuple):
    """What ``prefill`` returns: unpacks as ``o, final_state, chunk_states``."""

    o: Any
    final_state: Any
    chunk_states: Any


def _check_rank(name: str, x: Any, ranks: tuple[int, ...], dims: str) -> None:
    if x is not None and x.ndim not in ranks:
        raise ValueError(f"{name}: expected shape {dims}, got {tuple(x.shape)}")


def _gate_args(gate: str, A_log: Any, dt_bias: Any, lower_bound: float | None) -> float:
    """Checks the gate choice and returns the lower bound to pass to C++ (0 when unused)."""
    if gate not in _GATES:
        raise ValueError(f"gate: expected one of {', '.join(map(repr, _GATES))}, got {gate!r}")
    if gate == "lower_bound":
        if lower_bound is None:
            raise ValueError("lower_bound: required by gate='lower_bound' (a value in [-5, 0))")
        return float(lower_bound)
    if lower_bound is not None:
        raise ValueError(
            f"lower_bound: given ({lower_bound}) with gate={gate!r}; a lower bound is only "
            "read by gate='lower_bound'"
        )
    return 0.0


def _state_shape(N: int, HV: int, K: int, V: int, state_layout: str) -> tuple[int, ...]:
    if state_layout not in _LAYOUTS:
        raise ValueError(
            f"state_layout: expected 'v_first' or 'k_first', got {state_layout!r}"
        )
    return (N, HV, V, K) if state_layout == "v_first" else (N, HV, K, V)


def _num_seqs(q: Any, cu_seqlens: Any) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def num_chunk_states(B: int, T: int, interval: int, offsets: list[int] | None) -> int:
    """How many chunk states a prefill writes: ceil(L / interval) per sequence of length L
    (fixed batch: B sequences of T tokens; packed: lengths from the host ``offsets``)."""
    if offsets is None:
        return B * (-(-T // interval))
    return sum(-(-max(0, e - b) // interval) for b, e in zip(offsets[:-1], offsets[1:]))


def chunk_state_indices_at(seqlens, offsets, rows=None, interval: int = 64):
    """``chunk_state_indices`` for states at caller-chosen token offsets (host-side helper).

    ``seqlens``: the length of each sequence (ints). ``offsets[n]``: token offsets of sequence
    n, each a multiple of ``interval`` below its length; offset t asks for the state after its
    first t tokens (t = 0: its initial state; the state after all of them is its final state,
    ``final_state`` / ``final_state_indices``). ``rows[n]``: the row (pool slot) of
    ``chunk_states`` each offset goes to; default: 0, 1, 2, ... in order over all sequences.

    Returns an int32 numpy array with one entry per chunk state of the batch (``ceil(L /
    interval)`` per sequence, sequence after sequence): the row for the wanted entries, -1 for
    the others. Pass it with ``chunk_state_interval=interval`` (copied to the device for CUDA).
    """
    seqlens = [int(x) for x in seqlens]
    if len(offsets) != len(seqlens):
        raise ValueError(
            f"offsets: expected one list per sequence ({len(seqlens)}), got {len(offsets)}")
    if rows is not None and len(rows) != len(seqlens):
        raise ValueError(f"rows: expected one list per sequence ({len(seqlens)}), got {len(rows)}")
    if interval <= 0 or interval % 64:
        raise ValueError(f"interval: expected a positive multiple of 64, got {interval}")
    counts = [-(-max(0, L) // interval) for L in seqlens]
    out = np.full(sum(counts), -1, dtype=np.int32)
    first = 0
    next_row = 0
    for n, (L, count) in enumerate(zip(seqlens, counts)):
        wanted = [int(t) for t in offsets[n]]
        dest = [int(r) for r in rows[n]] if rows is not None else None
        if dest is not None and len(dest) != len(wanted):
            raise ValueError(
                f"rows[{n}]: expected one row per offset ({len(wanted)}), got {len(dest)}")
        for i, t in enumerate(wanted):
            if t % interval or not 0 <= t < L:
                raise ValueError(
                    f"offsets[{n}]: expected multiples of {interval} in [0, {L}) (the sequence's "
                    f"length; its final state covers {L}), got {t}")
            if out[first + t // interval] >= 0:
                raise ValueError(f"offsets[{n}]: offset {t} is given twice")
            out[first + t // interval] = dest[i] if dest is not None else next_row
            next_row += 1
        first += count
    return out


def _prefill_call(
    q, k, v, g, beta, *, gate, A_log, dt_bias, lower_bound, scale, use_qk_l2norm,
    use_beta_sigmoid, allow_neg_eigval, scalar_gate, cu_seqlens, cu_seqlens_cpu, initial_state,
    initial_state_indices, final_state, final_state_indices, output_final_state, state_layout,
    state_dtype, chunk_state_interval, chunk_states, chunk_state_indices, chunk_state_dtype, out,
    backend,
):
    """Normalises the arguments of prefill / prefill_workspace_size: returns the ArrayKind and
    the keyword arguments of the C++ entry point (outputs allocated)."""
    kind = _arrays.classify({
        "q": q, "k": k, "v": v, "g": g, "beta": beta, "A_log": A_log, "dt_bias": dt_bias,
        "cu_seqlens": cu_seqlens, "initial_state": initial_state,
        "initial_state_indices": initial_state_indices, "final_state": final_state,
        "final_state_indices": final_state_indices, "chunk_states": chunk_states,
        "chunk_state_indices": chunk_state_indices, "out": out,
    })
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_rank(name, x, (4,), "[B, T, heads, head_dim]")
    _check_rank("g", g, (3,) if scalar_gate else (4,), "[B, T, HV]" if scalar_gate else "[B, T, HV, K]")
    _check_rank("beta", beta, (3,), "[B, T, HV]")
    _check_rank("cu_seqlens", cu_seqlens, (1,), "[N + 1]")
    lb = _gate_args(gate, A_log, dt_bias, lower_bound)
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = _num_seqs(q, cu_seqlens)
    if scale is None:
        scale = K ** -0.5

    if out is None:
        out = _arrays.empty(kind, (B, T, HV, V), _arrays.dtype_name(v))
    if state_dtype is None:
        state_dtype = _arrays.dtype_name(initial_state) if initial_state is not None else "float32"
    if final_state is None and output_final_state:
        if final_state_indices is not None:
            raise ValueError("final_state_indices: given without final_state (the pool to write)")
        final_state = _arrays.empty(kind, _state_shape(N, HV, K, V, state_layout), state_dtype)
    if chunk_state_indices is not None and chunk_states is None:
        raise ValueError(
            "chunk_states: required with chunk_state_indices (the pool whose rows they name)")
    if chunk_state_interval and chunk_states is None:
        offsets = None
        if cu_seqlens is not None:
            offsets = _arrays.to_host_list(cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens)
        count = num_chunk_states(B, T, chunk_state_interval, offsets)
        shape = _state_shape(count, HV, K, V, state_layout)
        chunk_states = _arrays.empty(kind, shape, chunk_state_dtype or state_dtype)

    # The longest sequence, from host offsets only (a routing hint for the CUDA path, never a
    # device read): 0 when unknown.
    max_seqlen = 0
    if cu_seqlens is not None and cu_seqlens_cpu is not None:
        offsets = _arrays.to_host_list(cu_seqlens_cpu)
        max_seqlen = max((int(b) - int(a) for a, b in zip(offsets, offsets[1:])), default=0)
        max_seqlen = min(max(max_seqlen, 0), T)
    args = dict(
        A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu_seqlens, initial_state=initial_state,
        initial_state_indices=initial_state_indices, final_state=final_state,
        final_state_indices=final_state_indices, chunk_states=chunk_states,
        chunk_state_indices=chunk_state_indices, chunk_state_interval=int(chunk_state_interval),
        max_seqlen=max_seqlen, gate=gate, state_layout=state_layout,
        scale=float(scale), lower_bound=lb, use_qk_l2norm=bool(use_qk_l2norm),
        use_beta_sigmoid=bool(use_beta_sigmoid), allow_neg_eigval=bool(allow_neg_eigval),
        scalar_gate=bool(scalar_gate), backend=backend,
    )
    return kind, (q, k, v, g, beta, out), args


def prefill(
    q, k, v, g, beta, *,
    gate: str = "precomputed",
    A_log=None,
    dt_bias=None,
    lower_bound: float | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    scalar_gate: bool = False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    initial_state=None,
    initial_state_indices=None,
    final_state=None,
    final_state_indices=None,
    output_final_state: bool = False,
    state_layout: str = "v_first",
    state_dtype: str | None = None,
    chunk_state_interval: int = 0,
    chunk_states=None,
    chunk_state_indices=None,
    chunk_state_dtype: str | None = None,
    workspace=None,
    plan=None,
    out=None,
    backend: str = "auto",
    stream=None,
) -> PrefillOutput:
    r"""Chunked KDA forward over a fixed ``[B, T]`` or packed (``cu_seqlens``, ``B = 1``) batch.

    See the module docstring for the formula, shapes and dtypes. Arguments beyond those:

    * ``gate``: ``"precomputed"``, ``"softplus"`` or ``"lower_bound"`` (named, never guessed).
    * ``scale``: multiplies q after the L2 norm; default ``K ** -0.5``.
    * ``cu_seqlens``: ``[N + 1]`` offsets; sequence n is tokens ``[cu[n], cu[n+1])``; a
      repeated offset is an empty sequence (its state passes through). ``cu_seqlens_cpu``: the
      same offsets on the host, used to size ``chunk_states`` without a device read and to
      choose the CUDA kernel by the longest sequence as well as the average length.
    * ``initial_state``: dense ``[N, HV, ...]``, or a pool ``[num_slots, HV, ...]`` with
      ``initial_state_indices`` (int32 ``[N]``; a negative slot starts from zeros; SGLang's
      spelling). None: zeros. Slots may be any stride apart; each state ``[HV, ...]`` is dense.
    * ``final_state``: where the final states go (dense ``[N, HV, ...]``, or a pool with
      ``final_state_indices``; a negative slot is not written). Passing the same pool as the
      initial state updates it in place: with the same indices each sequence overwrites the
      slot it read; with other indices it reads slot ``initial_state_indices[n]`` and writes
      slot ``final_state_indices[n]`` (prefix caching: resume from a cached slot, keep it, write
      a new one). The caller guarantees that no sequence writes a slot another sequence reads
      or writes (sequences run concurrently; ``KDAKIT_DEBUG_CHECKS=1`` checks it on CUDA). With
      ``output_final_state=True`` and no ``final_state``, a dense one is allocated in
      ``state_dtype`` (default: the initial state's dtype, else float32).
    * ``chunk_state_interval`` C (a positive multiple of 64): also return the states before
      tokens 0, C, 2C, ... of every sequence (``ceil(L / C)`` entries each, sequence after
      sequence; FLA's ``h`` with C = 64) in ``chunk_states`` ``[count, HV, ...]`` (allocated in
      ``chunk_state_dtype``, default the state dtype, when None; for CUDA ``cu_seqlens`` without
      ``cu_seqlens_cpu`` that reads the offsets back, a synchronisation).
    * ``chunk_state_indices`` (int32 ``[count]``): write entry e to row
      ``chunk_state_indices[e]`` of ``chunk_states`` instead (a pool ``[num_rows, HV, ...]``,
      which may be the state pool itself; -1 skips the entry). States at chosen token offsets
      (multiples of 64): C = 64 and ``chunk_state_indices_at(...)``. The CUDA kernels do not
      write pool rows or a dtype other than the state's yet (NotImplementedError); the CPU
      backends do.
    * ``workspace``: CUDA scratch of ``prefill_workspace_size(...)`` bytes (any dtype, dense).
      Allocated per call when None; pass one to keep allocation off the run path. The call
      builds its plan (sequence ranges, chunk map) into it first.
    * ``plan``: a ``PrefillPlan`` from ``prefill_plan`` for this batch (same B, T, N and
      cu_seqlens values): its workspace is used and the plan step is skipped, so every layer of
      a forward step shares one plan (see kdakit.plan). Not together with ``workspace``.
    * ``out``: preallocated ``o``. ``backend``: ``"auto"``; on the CPU ``"chunked"`` (fp32, the
      GPU algorithm) or ``"reference"`` (float64 token by token). ``stream``: a
      ``torch.cuda.Stream`` or ``cudaStream_t`` int; default the current torch stream.

    Returns ``PrefillOutput(o, final_state, chunk_states)`` (None for what was not asked).
    """
    kind, arrays, args = _prefill_call(
        q, k, v, g, beta, gate=gate, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
        scale=scale, use_qk_l2norm=use_qk_l2norm, use_beta_sigmoid=use_beta_sigmoid,
        allow_neg_eigval=allow_neg_eigval, scalar_gate=scalar_gate, cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens_cpu, initial_state=initial_state,
        initial_state_indices=initial_state_indices, final_state=final_state,
        final_state_indices=final_state_indices, output_final_state=output_final_state,
        state_layout=state_layout, state_dtype=state_dtype,
        chunk_state_interval=chunk_state_interval, chunk_states=chunk_states,
        chunk_state_indices=chunk_state_indices, chunk_state_dtype=chunk_state_dtype, out=out,
        backend=backend,
    )
    plan_ready = False
    if plan is not None:
        if workspace is not None:
            raise ValueError("plan: carries its own workspace; pass plan or workspace, not both")
        if not isinstance(plan, PrefillPlan):
            raise TypeError(f"plan: expected a kdakit.PrefillPlan, got {type(plan).__name__}")
        B, T = q.shape[0], q.shape[1]
        plan.check_matches(B, T, _num_seqs(q, cu_seqlens), v.shape[2], cu_seqlens is not None)
        workspace = plan.workspace
        plan_ready = workspace is not None
        if kind.is_cuda and workspace is None:
            raise TypeError("plan: built for the CPU (no workspace), but the arrays are on CUDA")
    if workspace is not None:
        _arrays.classify({"q": q, "workspace": workspace})
    op_buffers = _op_state_buffers(args) if kind.library == "torch" and stream is None else None
    if op_buffers is not None:
        # NOTE: through the registered custom op, so that torch.compile traces the call and
        # sees which buffers it writes; it allocates a missing CUDA workspace itself.
        _torch_prefill(arrays, args, op_buffers, workspace, plan_ready)
    else:
        # NOTE: also torch tensors whose state buffers alias in a way the op's schema cannot
        # state (see _op_state_buffers): a direct call, eager only.
        handle = _arrays.stream_handle(kind, stream)
        with _arrays.device_guard(kind):
            if kind.is_cuda and workspace is None:
                nbytes = ext().prefill_workspace_size(*arrays, **args)
                workspace = _arrays.empty(kind, (max(int(nbytes), 1),), "uint8")
            ext().prefill(*arrays, **args, workspace=workspace, plan_ready=plan_ready,
                          stream=handle)
    return PrefillOutput(arrays[5], args["final_state"], args["chunk_states"])


def _op_state_buffers(args: dict) -> dict | None:
    """The state arguments of the kdakit::prefill custom op (torch_ops) for ``args``: a pool
    that is also ``final_state`` is passed once, as ``final_state``, with ``state_in_place``
    (it is the initial state too) and ``chunk_states_in_pool`` (it takes the chunk states too),
    so that no input of the op aliases a mutated one. None when the schema cannot say it: a
    pool read densely but written through indices (validation rejects it), or chunk states into
    rows of the initial-state pool when that pool is not also the final one."""
    init, fin, chunks = args["initial_state"], args["final_state"], args["chunk_states"]
    init_idx, fin_idx = args["initial_state_indices"], args["final_state_indices"]
    in_place = init is not None and init is fin
    if in_place and init_idx is None and fin_idx is not None:
        return None
    if init is not None and chunks is init and not in_place:
        return None
    return dict(
        initial_state=None if in_place else init,
        # NOTE: with the same indices the op reads through final_state_indices.
        initial_state_indices=None if in_place and init_idx is fin_idx else init_idx,
        chunk_states=None if chunks is not None and chunks is fin else chunks,
        state_in_place=in_place,
        chunk_states_in_pool=chunks is not None and chunks is fin,
    )


def _torch_prefill(arrays, args, buffers: dict, workspace, plan_ready: bool) -> None:
    """kdakit::prefill (torch_ops) on torch tensors, with the state arguments of
    _op_state_buffers."""
    from . import torch_ops

    torch_ops.prefill(
        *arrays, args["A_log"], args["dt_bias"], args["cu_seqlens"], buffers["initial_state"],
        buffers["initial_state_indices"], args["final_state"], args["final_state_indices"],
        buffers["chunk_states"], args["chunk_state_indices"], workspace,
        args["chunk_state_interval"], plan_ready, buffers["state_in_place"],
        buffers["chunk_states_in_pool"], args["gate"], args["state_layout"], args["scale"],
        args["lower_bound"], args["use_qk_l2norm"], args["use_beta_sigmoid"],
        args["allow_neg_eigval"], args["scalar_gate"], args["backend"], args["max_seqlen"],
    )


def prefill_workspace_size(q=None, k=None, v=None, g=None, beta=None, *,
                           num_tokens: int | None = None, num_v_heads: int | None = None,
                           num_seqs: int | None = None, batch: int | None = None,
                           **kwargs) -> int:
    """Bytes of CUDA workspace ``prefill`` (and ``prefill_plan``) needs, in one of two forms:

    * from a call's arguments: ``prefill_workspace_size(q, k, v, g, beta, **prefill_kwargs)``
      (same keywords as ``prefill``; outputs not given are sized but not kept); 0 on the CPU.
    * from sizes alone, as an engine allocates once for its largest batch:
      ``prefill_workspace_size(num_tokens=T, num_v_heads=HV, num_seqs=N)`` for N packed
      sequences of T tokens in total, or ``batch=B`` instead of ``num_seqs`` for a fixed
      ``[B, T]`` batch. The size never decreases as T, N, B or HV grow, so that buffer serves
      every smaller batch. 0 in a build without CUDA.
    """
    sizes = {"num_tokens": num_tokens, "num_v_heads": num_v_heads, "num_seqs": num_seqs,
             "batch": batch}
    if q is None:
        if any(x is not None for x in (k, v, g, beta)) or kwargs:
            raise TypeError("prefill_workspace_size: the sizes form takes only num_tokens, "
                            "num_v_heads, num_seqs and batch")
        if num_tokens is None or num_v_heads is None:
            raise TypeError("prefill_workspace_size: pass the call's tensors (q, k, v, g, beta, "
                            "...) or the sizes num_tokens= and num_v_heads= with num_seqs= "
                            "(packed) or batch= (fixed)")
        return batch_workspace_size(num_tokens, num_v_heads, num_seqs, batch)
    given = [name for name, x in sizes.items() if x is not None]
    if given:
        raise TypeError(f"prefill_workspace_size: {', '.join(given)} belong to the sizes form; "
                        "pass either tensors or sizes")
    if any(x is None for x in (k, v, g, beta)):
        raise TypeError("prefill_workspace_size: expected q, k, v, g and beta")
    kwargs.pop("workspace", None)
    kwargs.pop("plan", None)
    kwargs.pop("stream", None)
    defaults = dict(
        gate="precomputed", A_log=None, dt_bias=None, lower_bound=None, scale=None,
        use_qk_l2norm=False, use_beta_sigmoid=False, allow_neg_eigval=False, scalar_gate=False,
        cu_seqlens=None, cu_seqlens_cpu=None, initial_state=None, initial_state_indices=None,
        final_state=None, final_state_indices=None, output_final_state=False,
        state_layout="v_first", state_dtype=None, chunk_state_interval=0, chunk_states=None,
        chunk_state_indices=None, chunk_state_dtype=None, out=None, backend="auto",
    )
    unknown = set(kwargs) - set(defaults)
    if unknown:
        raise TypeError(f"prefill_workspace_size: unexpected arguments {sorted(unknown)}")
    defaults.update(kwargs)
    kind, arrays, args = _prefill_call(q, k, v, g, beta, **defaults)
    if not kind.is_cuda:
        return 0
    return int(ext().prefill_workspace_size(*arrays, **args))


def decode(
    q, k, v, g, beta, state, state_indices, *,
    gate: str = "precomputed",
    A_log=None,
    dt_bias=None,
    lower_bound: float | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    scalar_gate: bool = False,
    cu_seqlens=None,
    num_accepted_tokens=None,
    null_slot_is_padding: bool = False,
    state_layout: str = "v_first",
    out=None,
    backend: str = "auto",
    stream=None,
):
    r"""Token-serial KDA over a state pool, updated in place; returns ``o`` ``[B, T, HV, V]``.

    See the module docstring for the formula, shapes and dtypes. Arguments beyond those:

    * ``state``: the pool ``[num_slots, HV, V, K]`` (``"v_first"``) or ``[num_slots, HV, K, V]``,
      float32 or bfloat16, read and written in place.
    * ``state_indices``: int32 ``[N]``, or ``[N, 1 + S]`` for speculative decoding. Sequence n
      starts from slot ``state_indices[n, num_accepted_tokens[n] - 1]`` (column 0 without
      ``num_accepted_tokens``). A start slot < 0 (or 0 with ``null_slot_is_padding``) or past
      the pool makes the row padding: zero output, no state touched. With one column the final
      state goes back to the start slot; with ``1 + S`` columns the state after token t goes to
      slot ``state_indices[n, t]`` (negative: skipped).
    * ``cu_seqlens``: packed batch (``B = 1``); else N = B sequences of T tokens.
    * ``out``: preallocated ``o``. ``backend``: ``"auto"`` (CUDA kernels, or the float64 CPU
      reference) or ``"reference"`` on the CPU. ``stream``: as for ``prefill``.
    """
    kind = _arrays.classify({
        "q": q, "k": k, "v": v, "g": g, "beta": beta, "state": state,
        "state_indices": state_indices, "A_log": A_log, "dt_bias": dt_bias,
        "cu_seqlens": cu_seqlens, "num_accepted_tokens": num_accepted_tokens, "out": out,
    })
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_rank(name, x, (4,), "[B, T, heads, head_dim]")
    _check_rank("g", g, (3,) if scalar_gate else (4,), "[B, T, HV]" if scalar_gate else "[B, T, HV, K]")
    _check_rank("beta", beta, (3,), "[B, T, HV]")
    _check_rank("state", state, (4,), "[num_slots, HV, V, K] or [num_slots, HV, K, V]")
    _check_rank("state_indices", state_indices, (1, 2), "[N] or [N, 1 + S]")
    if state_layout not in _LAYOUTS:
        raise ValueError(f"state_layout: expected 'v_first' or 'k_first', got {state_layout!r}")
    lb = _gate_args(gate, A_log, dt_bias, lower_bound)
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if scale is None:
        scale = K ** -0.5
    if out is None:
        out = _arrays.empty(kind, (B, T, HV, V), _arrays.dtype_name(v))
    options = dict(
        gate=gate, state_layout=state_layout, scale=float(scale), lower_bound=lb,
        use_qk_l2norm=bool(use_qk_l2norm), use_beta_sigmoid=bool(use_beta_sigmoid),
        allow_neg_eigval=bool(allow_neg_eigval), scalar_gate=bool(scalar_gate),
        null_slot_is_padding=bool(null_slot_is_padding), backend=backend,
    )
    if kind.library == "torch" and stream is None:
        from . import torch_ops  # NOTE: the custom op, for torch.compile (see prefill)

        torch_ops.decode(q, k, v, g, beta, out, state, state_indices, A_log, dt_bias,
                         cu_seqlens, num_accepted_tokens, **options)
        return out
    handle = _arrays.stream_handle(kind, stream)
    with _arrays.device_guard(kind):
        ext().decode(
            q, k, v, g, beta, out, state, state_indices, A_log=A_log, dt_bias=dt_bias,
            cu_seqlens=cu_seqlens, num_accepted_tokens=num_accepted_tokens, **options,
            stream=handle,
        )
    return out
