r"""FLA-compatible entry points: ``chunk_kda`` and ``fused_recurrent_kda`` take FLA's argument
names, order, defaults and return values (flash-linear-attention ``fla.ops.kda``), so that
``from kdakit import chunk_kda`` can replace ``from fla.ops.kda import chunk_kda``.

They translate FLA's flags into kdakit's explicit options and call ``kdakit.prefill`` /
``kdakit.decode`` (kdakit/ops.py, which documents the math, shapes and dtypes):

* gate: ``use_gate_in_kernel=False`` -> precomputed (``gamma = g``; A_log, dt_bias and
  lower_bound are not read, as in FLA); ``use_gate_in_kernel=True`` with ``lower_bound`` set ->
  lower-bound gate ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (A_log optional);
  ``use_gate_in_kernel=True`` without ``lower_bound`` -> softplus gate
  ``-exp(A_log) * softplus(g + dt_bias)`` (A_log required).
* state layout: FLA's default K-first ``[N, HV, K, V]`` (``state_v_first=False``) is kept;
  ``state_v_first=True`` selects V-first ``[N, HV, V, K]``, the serving layout kdakit's kernels
  are fastest with.
* serving extras of ``chunk_kda`` spelled as SGLang's: ``initial_state_indices`` (the initial
  state is a pool, updated in place) and ``output_intermediate_states`` (= FLA's
  ``return_intermediate_states``).

Inference only: tensors that require gradients are rejected ("training is not supported yet").
"""

from __future__ import annotations

import warnings
from typing import Any

from . import _arrays
from .ops import decode, prefill

__all__ = ["chunk_kda", "fused_recurrent_kda"]

# FLA's chunk sizes; kdakit computes in 64-token chunks either way (the result is the same
# recurrence), chunk_size only sets the spacing of the intermediate states h.
_FLA_CHUNK_SIZES = (32, 64)


def _state_v_first(state_v_first: bool, kwargs: dict) -> bool:
    """Resolves the deprecated alias ``transpose_state_layout`` of ``state_v_first``."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError(
                "state_v_first: cannot be passed together with its deprecated alias "
                "transpose_state_layout"
            )
        warnings.warn(
            "transpose_state_layout is deprecated; use state_v_first (same meaning)",
            DeprecationWarning,
            stacklevel=3,
        )
        return bool(kwargs.pop("transpose_state_layout"))
    return bool(state_v_first)


def _reject_unknown(fn: str, kwargs: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise TypeError(
            f"{fn}() got unexpected keyword arguments {unknown}; accepted extra keywords: "
            f"{', '.join(known)}"
        )


def _gate(use_gate_in_kernel: bool, lower_bound: float | None, A_log: Any):
    """FLA's gate flags -> (kdakit gate name, lower_bound to pass)."""
    if not use_gate_in_kernel:
        return "precomputed", None
    if lower_bound is not None:
        return "lower_bound", lower_bound
    if A_log is None:
        raise ValueError(
            "A_log: required when use_gate_in_kernel=True and lower_bound is not set (softplus "
            "gate -exp(A_log) * softplus(g + dt_bias)); got None"
        )
    return "softplus", None


def _check_packed(q: Any, cu_seqlens: Any, initial_state: Any, pooled: bool = False) -> None:
    if cu_seqlens is None:
        return
    if q.shape[0] != 1:
        raise ValueError(
            f"cu_seqlens: expected batch size 1 with cu_seqlens (flatten the sequences into one "
            f"row), got batch size {q.shape[0]}"
        )
    n = cu_seqlens.shape[0] - 1
    if initial_state is not None and initial_state.shape[0] != n and not pooled:
        raise ValueError(
            f"initial_state: expected one state per sequence, {n} (len(cu_seqlens) - 1), "
            f"got {initial_state.shape[0]}"
        )


def chunk_kda(
    q,
    k,
    v,
    g,
    beta,
    scale: float | None = None,
    initial_state=None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    cp_context=None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs,
):
    r"""Chunked KDA prefill with FLA's ``chunk_kda`` signature.

    Per sequence and value head, state S (K x V), for each token t:
    ``S <- diag(exp(gamma_t)) S``; ``S <- S + beta_t k_t (v_t - S^T k_t)^T``;
    ``o_t = S^T (scale * q_t)``.

    Args:
        q, k: ``[B, T, H, K]``, bfloat16 / float16 / float32 (torch) or float16 / float32 (numpy).
        v: ``[B, T, HV, V]``, dtype of q; ``HV % H == 0`` (GVA).
        g: ``[B, T, HV, K]``: the log decay itself (``use_gate_in_kernel=False``, g <= 0) or the
            raw gate input (``use_gate_in_kernel=True``).
        beta: ``[B, T, HV]``: beta itself, or logits with ``use_beta_sigmoid_in_kernel=True``.
        scale: multiplies q after the optional L2 norm; default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``), float32
            (bfloat16 also accepted); zeros when None. N = B, or len(cu_seqlens) - 1.
        output_final_state: also return the final state, float32, same layout.
        use_qk_l2norm_in_kernel: ``x / sqrt(sum(x * x) + 1e-6)`` on q and k.
        use_gate_in_kernel: compute gamma from g. With ``lower_bound`` set: the lower-bound gate
            ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (A_log may be None:
            ``lower_bound * sigmoid(g + dt_bias)``); otherwise the softplus gate
            ``-exp(A_log) * softplus(g + dt_bias)`` with ``A_log`` required. ``A_log`` ``[HV]``
            and ``dt_bias`` ``[HV * K]`` or ``[HV, K]`` (float32) come as keyword arguments.
        use_beta_sigmoid_in_kernel: ``beta <- sigmoid(beta)``.
        allow_neg_eigval: ``beta <- 2 * sigmoid(beta)``; requires the beta sigmoid.
        safe_gate: FLA's switch to a faster kernel that relies on the gate being bounded below
            by ``lower_bound``. kdakit's kernels are exponent-safe for every gate, so it changes
            nothing numerically; it is checked as in FLA (with ``use_gate_in_kernel``, it needs
            ``lower_bound`` in ``[-5, 0)``). The gate is chosen by ``lower_bound`` alone.
        lower_bound: in ``[-5, 0)``; with ``use_gate_in_kernel`` it selects the lower-bound gate.
        disable_recompute: a training (backward) option; no effect in inference.
        return_intermediate_states: also return ``h``, the state before each chunk of
            ``chunk_size`` tokens: ``[B, NT, HV, K, V]`` with ``NT = ceil(T / chunk_size)``, or
            ``[1, total chunks, HV, K, V]`` with cu_seqlens; float32 (FLA: bfloat16). kdakit
            writes them in 64-token steps, so it needs ``chunk_size=64``.
        state_v_first: V-first state layout ``[.., V, K]`` (kdakit's serving layout).
        cu_seqlens: ``[N + 1]`` int32/int64 offsets of a packed batch (B = 1).
        cu_seqlens_cpu: the same offsets on the host; used to size ``h`` without a device read and
            to choose the CUDA kernel by the longest sequence too (kdakit.prefill).
        cp_context: context parallelism is not supported (NotImplementedError).
        use_graph: FLA's switch to a fixed-shape chunk list for CUDA graph capture (cu_seqlens
            padded with zero-length tail sequences to ``max_num_seqs + 1`` entries). kdakit is
            graph-safe for any cu_seqlens (its plan is built on the device, zero-length
            sequences are allowed), so it changes nothing; with ``max_num_seqs`` the length of
            cu_seqlens is checked as in FLA.
        max_num_seqs: the static sequence count of ``use_graph``; default ``len(cu_seqlens) - 1``.
        **kwargs: ``A_log``, ``dt_bias``, ``chunk_size`` (32 or 64, default 64),
            ``transpose_state_layout`` (deprecated alias of ``state_v_first``), and the serving
            extras (SGLang's spelling where it has one):

            * ``initial_state_indices``: int32 ``[N]``. ``initial_state`` is then a state pool
              ``[num_slots, HV, K, V]`` (``[.., V, K]`` with ``state_v_first``), float32 or
              bfloat16, any slot stride; sequence n starts from slot
              ``initial_state_indices[n]`` (negative: zeros) and its final state is written
              back into the pool, always (``output_final_state`` changes nothing), to the same
              slot or to ``final_state_indices[n]`` (negative: not written).
            * ``final_state_indices`` (kdakit): int32 ``[N]``, the slots the final states go to
              when they differ from the ones read (prefix caching: resume from a cached slot,
              write a new one). No sequence may write a slot another one reads or writes.
            * ``output_intermediate_states``: SGLang's name of ``return_intermediate_states``.
            * ``plan`` (kdakit): a ``kdakit.PrefillPlan`` built once per forward step by
              ``kdakit.prefill_plan(cu_seqlens, num_tokens=T, num_v_heads=HV)`` and passed to
              every layer, which then skips building the per-batch metadata (kdakit.plan).

    Returns:
        ``(o, final_state)``, or ``(o, final_state, h)`` with ``return_intermediate_states``;
        ``o`` is ``[B, T, HV, V]`` in the dtype of v; ``final_state`` None unless asked for.
        With ``initial_state_indices`` the pool itself is returned as ``final_state`` and ``h``
        is in the pool's dtype.

    Runs on the sm_90a kernels for CUDA tensors; numpy arrays and CPU tensors run kdakit's fp32
    chunked CPU backend (the GPU algorithm in C++).
    """
    state_v_first = _state_v_first(state_v_first, kwargs)
    _reject_unknown("chunk_kda", kwargs, ("A_log", "dt_bias", "chunk_size",
                                          "initial_state_indices", "final_state_indices",
                                          "output_intermediate_states", "plan"))
    if cp_context is not None:
        raise NotImplementedError("cp_context: context parallelism is not supported by kdakit")
    if use_graph and max_num_seqs is not None:
        if cu_seqlens is None:
            raise ValueError("use_graph with max_num_seqs: needs cu_seqlens (a packed batch)")
        if len(cu_seqlens) - 1 != max_num_seqs:
            raise ValueError(
                f"cu_seqlens: use_graph needs exactly max_num_seqs + 1 = {max_num_seqs + 1} entries "
                f"(pad with zero-length sequences), got {len(cu_seqlens)}")
    chunk_size = kwargs.get("chunk_size", 64)
    if chunk_size not in _FLA_CHUNK_SIZES:
        raise ValueError(f"chunk_size: expected 32 or 64, got {chunk_size}")
    A_log = kwargs.get("A_log") if use_gate_in_kernel else None
    dt_bias = kwargs.get("dt_bias") if use_gate_in_kernel else None
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError("lower_bound: required by safe_gate=True with use_gate_in_kernel=True")
        if not -5 <= lower_bound < 0:
            raise ValueError(f"lower_bound: expected a value in [-5, 0), got {lower_bound}")
    initial_state_indices = kwargs.get("initial_state_indices")
    final_state_indices = kwargs.get("final_state_indices")
    pooled = initial_state_indices is not None
    if "output_intermediate_states" in kwargs:
        alias = bool(kwargs["output_intermediate_states"])
        if return_intermediate_states and not alias:
            raise ValueError(
                "output_intermediate_states: False contradicts return_intermediate_states=True "
                "(they are one option; pass either)")
        return_intermediate_states = alias
    if pooled and initial_state is None:
        raise ValueError(
            "initial_state: required with initial_state_indices (it is the state pool)")
    if final_state_indices is not None and not pooled:
        raise ValueError(
            "final_state_indices: only read together with initial_state_indices (a state pool)")
    _check_packed(q, cu_seqlens, initial_state, pooled)
    gate, lb = _gate(use_gate_in_kernel, lower_bound, A_log)
    if return_intermediate_states and chunk_size != 64:
        raise NotImplementedError(
            "chunk_size: intermediate states are written every 64 tokens; chunk_size=32 with "
            "return_intermediate_states=True is not supported"
        )

    kind = _arrays.classify({"q": q})
    if pooled:
        state_args = dict(
            initial_state=initial_state, initial_state_indices=initial_state_indices,
            final_state=initial_state,
            final_state_indices=(initial_state_indices if final_state_indices is None
                                 else final_state_indices),
            state_dtype=None)
    else:
        state_args = dict(initial_state=initial_state, output_final_state=output_final_state,
                          state_dtype="float32")
    o, final_state, h = prefill(
        q, k, v, g, beta,
        gate=gate, A_log=A_log, dt_bias=dt_bias, lower_bound=lb, scale=scale,
        use_qk_l2norm=use_qk_l2norm_in_kernel, use_beta_sigmoid=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
        state_layout="v_first" if state_v_first else "k_first",
        chunk_state_interval=64 if return_intermediate_states else 0,
        plan=kwargs.get("plan"), backend="auto" if kind.is_cuda else "chunked", **state_args,
    )
    if not return_intermediate_states:
        return o, final_state
    B = q.shape[0]
    h = h.reshape((B, h.shape[0] // B) + tuple(h.shape[1:]))
    return o, final_state, h


def fused_recurrent_kda(
    q,
    k,
    v,
    g,
    beta,
    A_log=None,
    dt_bias=None,
    scale: float | None = None,
    initial_state=None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens=None,
    *,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    inplace_final_state: bool | None = None,
    out=None,
    **kwargs,
):
    r"""Token-serial KDA (decode) with FLA's ``fused_recurrent_kda`` signature, plus the serving
    arguments of FLA's ``fused_recurrent_kda_fwd`` as keywords.

    Same recurrence, flags and gate choice as ``chunk_kda``: q, k ``[B, T, H, K]``; v
    ``[B, T, HV, V]``; g ``[B, T, HV, K]``; beta ``[B, T, HV]`` (FLA's per-channel
    ``[B, T, HV, V]`` beta is not supported); A_log ``[HV]`` and dt_bias ``[HV * K]`` /
    ``[HV, K]`` (float32) are positional here, as in FLA; o ``[B, T, HV, V]`` in v's dtype.

    Dense mode (no ``ssm_state_indices``): ``initial_state`` ``[N, HV, K, V]`` (``[N, HV, V, K]``
    with ``state_v_first``) or None; returns ``(o, final_state)`` with a new float32 final state
    when ``output_final_state``, else ``(o, None)``. With ``inplace_final_state=True`` the final
    state is written into ``initial_state`` itself, which is returned.

    Pool mode (``ssm_state_indices`` int32 ``[N]`` or ``[N, 1 + S]``): ``initial_state`` is the
    state pool ``[num_slots, HV, ...]``, float32 or bfloat16, updated in place; sequence n
    starts from slot ``ssm_state_indices[n, num_accepted_tokens[n] - 1]`` (column 0 without
    ``num_accepted_tokens`` int32 ``[N]``); with one column its final state goes back there,
    with ``1 + S`` columns the state after token t goes to slot ``ssm_state_indices[n, t]``.
    Negative slots are padding rows (zero output, no state touched). Returns
    ``(o, initial_state)``. ``inplace_final_state=False`` is not supported in pool mode.

    ``out``: preallocated ``o`` ``[B, T, HV, V]``. ``**kwargs``: ``transpose_state_layout``
    (deprecated alias of ``state_v_first``).

    Runs on the sm_90a decode kernels for CUDA tensors; numpy arrays and CPU tensors run the
    float64 CPU reference (token by token, the specification).
    """
    state_v_first = _state_v_first(state_v_first, kwargs)
    _reject_unknown("fused_recurrent_kda", kwargs, ())
    if beta is not None and getattr(beta, "ndim", 3) == 4:
        raise NotImplementedError(
            "beta: a per-channel beta [B, T, HV, V] is not supported; expected [B, T, HV]"
        )
    if ssm_state_indices is None:
        _check_packed(q, cu_seqlens, initial_state)
    elif cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(
            f"cu_seqlens: expected batch size 1 with cu_seqlens, got batch size {q.shape[0]}"
        )
    if not use_gate_in_kernel:
        A_log, dt_bias = None, None
    gate, lb = _gate(use_gate_in_kernel, lower_bound, A_log)
    layout = "v_first" if state_v_first else "k_first"
    kind = _arrays.classify({"q": q, "initial_state": initial_state,
                             "ssm_state_indices": ssm_state_indices})

    if ssm_state_indices is not None:
        if initial_state is None:
            raise ValueError("initial_state: required with ssm_state_indices (it is the state pool)")
        if inplace_final_state is False:
            raise NotImplementedError(
                "inplace_final_state: kdakit updates the state pool in place; "
                "inplace_final_state=False with ssm_state_indices is not supported"
            )
        pool, indices, result_state = initial_state, ssm_state_indices, initial_state
    else:
        if num_accepted_tokens is not None:
            raise ValueError("num_accepted_tokens: only read together with ssm_state_indices")
        N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
        HV, K, V = v.shape[2], q.shape[3], v.shape[3]
        if inplace_final_state:
            if initial_state is None:
                raise ValueError("initial_state: required with inplace_final_state=True")
            pool = initial_state
        else:
            # NOTE: the decode entry point updates a pool in place; the dense form runs it on a
            # fresh float32 pool of N slots holding a copy of the initial state.
            shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
            if initial_state is None:
                pool = _arrays.zeros(kind, shape, "float32")
            elif tuple(initial_state.shape) != shape:
                dims = "[N, HV, V, K]" if state_v_first else "[N, HV, K, V]"
                raise ValueError(
                    f"initial_state: expected shape {dims} = {list(shape)}, "
                    f"got {list(initial_state.shape)}"
                )
            else:
                pool = _arrays.empty(kind, shape, "float32")
                _arrays.copy_into(pool, initial_state)
        indices = _arrays.arange_int32(kind, N)
        result_state = pool if (inplace_final_state or output_final_state) else None

    if ssm_state_indices is None and indices.shape[0] == 0:
        # NOTE: no sequences: nothing to run (the decode entry point needs a non-empty pool).
        o = out if out is not None else _arrays.empty(kind, tuple(v.shape), _arrays.dtype_name(v))
        return o, result_state
    o = decode(
        q, k, v, g, beta, pool, indices,
        gate=gate, A_log=A_log, dt_bias=dt_bias, lower_bound=lb, scale=scale,
        use_qk_l2norm=use_qk_l2norm_in_kernel, use_beta_sigmoid=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, cu_seqlens=cu_seqlens,
        num_accepted_tokens=num_accepted_tokens, state_layout=layout, out=out,
    )
    return o, result_state
