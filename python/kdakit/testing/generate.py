"""Fresh random inputs for a PrefillCase or DecodeCase, as numpy arrays or torch tensors.

Every call draws new values (no fixed seed unless one is passed), never zeros. Value ranges:
q, k, v ~ N(0, 1) (q, k ~ N(0, 1/K) without the q/k L2 norm); raw gate input g ~ N(0, 1) for the softplus / lower-bound gates and a
precomputed log decay in about [-0.7, -0.02] otherwise; beta logits ~ N(0, 1) with the beta
sigmoid, else beta ~ U(0, 1); A_log = log U(1, 8); dt_bias ~ N(0, 0.5); states ~ N(0, 0.1).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .cases import DecodeCase, PrefillCase

__all__ = ["prefill_inputs", "decode_inputs", "prefill_kwargs", "decode_kwargs", "to_torch"]

_NUMPY = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64}


def to_torch(x: np.ndarray, dtype: str | None = None, device: str = "cpu"):
    """A torch tensor from a numpy array, cast to ``dtype`` (e.g. 'bfloat16') on ``device``."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.to(device=device, dtype=getattr(torch, dtype) if dtype else t.dtype)


def _cast(x: np.ndarray, dtype: str, lib: str, device: str):
    if lib == "torch":
        return to_torch(x.astype(np.float32) if x.dtype.kind == "f" else x, dtype, device)
    if dtype not in _NUMPY:
        raise TypeError(f"numpy has no {dtype}; use lib='torch' for {dtype} inputs")
    return np.ascontiguousarray(x.astype(_NUMPY[dtype]))


def _gate_values(rng: np.random.Generator, gate: str, shape: tuple[int, ...]) -> np.ndarray:
    if gate == "precomputed":
        x = rng.standard_normal(shape) + 2.0
        return -np.log1p(np.exp(-x))  # log(sigmoid(x)) <= 0
    return rng.standard_normal(shape)


def _common(rng, case, B, T, lib, device) -> dict[str, Any]:
    H, HV, K, V = case.H, case.num_v_heads, case.K, case.V
    dt = case.dtype
    # g and beta follow q's dtype on the GPU path (bf16 in the benchmarks), fp32 in numpy.
    gdt = dt if lib == "torch" else "float32"
    # NOTE: without the in-kernel L2 norm, q and k are drawn with norm ~1 (as a caller's own
    # normalisation would leave them); N(0, 1) keys of norm sqrt(K) make beta * ||k||^2 > 2 and
    # the delta rule diverge, which tests nothing but overflow.
    qk_scale = 1.0 if case.use_qk_l2norm else K ** -0.5
    out = {
        "q": _cast(qk_scale * rng.standard_normal((B, T, H, K)), dt, lib, device),
        "k": _cast(qk_scale * rng.standard_normal((B, T, H, K)), dt, lib, device),
        "v": _cast(rng.standard_normal((B, T, HV, V)), dt, lib, device),
        "g": _cast(_gate_values(rng, case.gate, (B, T, HV, K)), gdt, lib, device),
        "beta": _cast(rng.standard_normal((B, T, HV)) if case.use_beta_sigmoid
                      else rng.uniform(0.0, 1.0, (B, T, HV)), gdt, lib, device),
        "A_log": None,
        "dt_bias": None,
    }
    if case.gate != "precomputed":
        if case.use_A_log or case.gate == "softplus":
            out["A_log"] = _cast(np.log(rng.uniform(1.0, 8.0, (HV,))), "float32", lib, device)
        if case.use_dt_bias:
            out["dt_bias"] = _cast(0.5 * rng.standard_normal((HV * K,)), "float32", lib, device)
    return out


def _state_shape(case, n: int) -> tuple[int, ...]:
    HV, K, V = case.num_v_heads, case.K, case.V
    return (n, HV, V, K) if case.state_layout == "v_first" else (n, HV, K, V)


def prefill_inputs(case: PrefillCase, lib: str = "numpy", device: str = "cpu",
                   seed: int | None = None) -> dict[str, Any]:
    """Inputs of ``case``: q, k, v, g, beta, A_log, dt_bias, cu_seqlens (int64, or None),
    initial_state (or None)."""
    rng = np.random.default_rng(seed)
    out = _common(rng, case, case.B, case.T, lib, device)
    cu = case.cu_seqlens
    out["cu_seqlens"] = None if cu is None else _cast(np.array(cu, dtype=np.int64), "int64", lib, device)
    out["initial_state"] = None
    if case.initial_state:
        out["initial_state"] = _cast(0.1 * rng.standard_normal(_state_shape(case, case.N)),
                                     case.state_dtype, lib, device)
    return out


def prefill_kwargs(case: PrefillCase) -> dict[str, Any]:
    """The options of ``case`` as keyword arguments of ``kdakit.prefill``."""
    return dict(
        gate=case.gate,
        lower_bound=case.lower_bound if case.gate == "lower_bound" else None,
        use_qk_l2norm=case.use_qk_l2norm,
        use_beta_sigmoid=case.use_beta_sigmoid,
        allow_neg_eigval=case.allow_neg_eigval,
        state_layout=case.state_layout,
    )


def decode_inputs(case: DecodeCase, lib: str = "numpy", device: str = "cpu",
                  seed: int | None = None) -> dict[str, Any]:
    """Inputs of ``case``: q, k, v, g, beta, A_log, dt_bias, cu_seqlens (packed only), state
    (the pool, random), state_indices (int32 [N] or [N, 1 + spec], distinct slots; the last
    ``padding_rows`` rows -1) and num_accepted_tokens (int32 [N] with spec, else None)."""
    rng = np.random.default_rng(seed)
    N, T = case.batch, case.tokens
    if case.packed:
        out = _common(rng, case, 1, N * T, lib, device)
        out["cu_seqlens"] = _cast(np.arange(N + 1, dtype=np.int64) * T, "int64", lib, device)
    else:
        out = _common(rng, case, N, T, lib, device)
        out["cu_seqlens"] = None
    cols = 1 + case.spec
    if case.slots < N * cols:
        raise ValueError(f"{case.name}: {case.slots} slots cannot hold {N * cols} distinct indices")
    idx = rng.permutation(case.slots)[: N * cols].reshape(N, cols).astype(np.int32)
    if case.padding_rows:
        idx[N - case.padding_rows:, :] = -1
    if not case.spec:
        idx = idx[:, 0].copy()
    out["state_indices"] = _cast(idx, "int32", lib, device)
    out["num_accepted_tokens"] = None
    if case.spec:
        acc = rng.integers(1, cols + 1, size=(N,)).astype(np.int32)
        out["num_accepted_tokens"] = _cast(acc, "int32", lib, device)
    out["state"] = _cast(0.1 * rng.standard_normal(_state_shape(case, case.slots)),
                         case.state_dtype, lib, device)
    return out


def decode_kwargs(case: DecodeCase) -> dict[str, Any]:
    """The options of ``case`` as keyword arguments of ``kdakit.decode``."""
    return dict(
        gate=case.gate,
        lower_bound=case.lower_bound if case.gate == "lower_bound" else None,
        use_qk_l2norm=case.use_qk_l2norm,
        use_beta_sigmoid=case.use_beta_sigmoid,
        allow_neg_eigval=case.allow_neg_eigval,
        state_layout=case.state_layout,
    )


def torch_available() -> bool:
    """Whether torch can be imported."""
    if "torch" in sys.modules:
        return True
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
