"""Fresh random inputs for a PrefillCase or DecodeCase, as numpy arrays or torch tensors.

Every call draws new values (no fixed seed unless one is passed), never zeros. Value ranges:
q, k, v ~ N(0, 1) (q, k ~ N(0, 1/K) without the q/k L2 norm); raw gate input g ~ N(0, 1) for
the softplus / lower-bound gates, a precomputed log decay log(sigmoid(N(2, 1))) otherwise; beta logits ~ N(0, 1) with the beta
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


class _NumpyDraw:
    """Random float values as numpy float64, cast at the end."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def normal(self, shape, std=1.0, mean=0.0):
        return mean + std * self.rng.standard_normal(shape)

    def uniform(self, lo, hi, shape):
        return self.rng.uniform(lo, hi, shape)

    def log_sigmoid(self, x):
        return -np.log1p(np.exp(-x))

    def log(self, x):
        return np.log(x)

    def cast(self, x, dtype):
        if dtype not in _NUMPY:
            raise TypeError(f"numpy has no {dtype}; use lib='torch' for {dtype} inputs")
        return np.ascontiguousarray(x.astype(_NUMPY[dtype]))


class _TorchDraw:
    """Random float values drawn by torch directly on the device (benchmark shapes reach
    hundreds of millions of elements), seeded from the numpy generator."""

    def __init__(self, rng: np.random.Generator, device: str):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(int(rng.integers(0, 2**62)))

    def normal(self, shape, std=1.0, mean=0.0):
        x = self.torch.randn(shape, generator=self.gen, device=self.device, dtype=self.torch.float32)
        return x.mul_(std).add_(mean)

    def uniform(self, lo, hi, shape):
        x = self.torch.rand(shape, generator=self.gen, device=self.device, dtype=self.torch.float32)
        return x.mul_(hi - lo).add_(lo)

    def log_sigmoid(self, x):
        return self.torch.nn.functional.logsigmoid(x)

    def log(self, x):
        return self.torch.log(x)

    def cast(self, x, dtype):
        return x.to(dtype=getattr(self.torch, dtype)).contiguous()


def _draw(rng: np.random.Generator, lib: str, device: str):
    if lib == "torch":
        return _TorchDraw(rng, device)
    if lib != "numpy":
        raise ValueError(f"lib: expected 'numpy' or 'torch', got {lib!r}")
    if device != "cpu":
        raise ValueError(f"device: numpy arrays live on the CPU, got {device!r}")
    return _NumpyDraw(rng)


def _index_array(x: np.ndarray, lib: str, device: str):
    return to_torch(x, None, device) if lib == "torch" else np.ascontiguousarray(x)


def _common(d, case, B, T, lib) -> dict[str, Any]:
    H, HV, K, V = case.H, case.num_v_heads, case.K, case.V
    dt = case.dtype
    # g and beta follow q's dtype with torch (bf16 in the benchmarks), fp32 with numpy.
    gdt = dt if lib == "torch" else "float32"
    # NOTE: without the in-kernel L2 norm, q and k are drawn with norm ~1 (as a caller's own
    # normalisation would leave them); N(0, 1) keys of norm sqrt(K) make beta * ||k||^2 > 2 and
    # the delta rule diverge, which tests nothing but overflow.
    qk_std = 1.0 if case.use_qk_l2norm else K ** -0.5
    if case.gate == "precomputed":
        g = d.log_sigmoid(d.normal((B, T, HV, K), mean=2.0))  # log(sigmoid(x)) <= 0
    else:
        g = d.normal((B, T, HV, K))
    beta = d.normal((B, T, HV)) if case.use_beta_sigmoid else d.uniform(0.0, 1.0, (B, T, HV))
    out = {
        "q": d.cast(d.normal((B, T, H, K), std=qk_std), dt),
        "k": d.cast(d.normal((B, T, H, K), std=qk_std), dt),
        "v": d.cast(d.normal((B, T, HV, V)), dt),
        "g": d.cast(g, gdt),
        "beta": d.cast(beta, gdt),
        "A_log": None,
        "dt_bias": None,
    }
    if case.gate != "precomputed":
        if case.use_A_log or case.gate == "softplus":
            out["A_log"] = d.cast(d.log(d.uniform(1.0, 8.0, (HV,))), "float32")
        if case.use_dt_bias:
            out["dt_bias"] = d.cast(d.normal((HV * K,), std=0.5), "float32")
    return out


def _state_shape(case, n: int) -> tuple[int, ...]:
    HV, K, V = case.num_v_heads, case.K, case.V
    return (n, HV, V, K) if case.state_layout == "v_first" else (n, HV, K, V)


def prefill_inputs(case: PrefillCase, lib: str = "numpy", device: str = "cpu",
                   seed: int | None = None) -> dict[str, Any]:
    """Inputs of ``case``: q, k, v, g, beta, A_log, dt_bias, cu_seqlens (int64, or None),
    initial_state (or None)."""
    rng = np.random.default_rng(seed)
    d = _draw(rng, lib, device)
    out = _common(d, case, case.B, case.T, lib)
    cu = case.cu_seqlens
    out["cu_seqlens"] = None if cu is None else _index_array(np.array(cu, dtype=np.int64), lib, device)
    out["initial_state"] = None
    if case.initial_state:
        out["initial_state"] = d.cast(d.normal(_state_shape(case, case.N), std=0.1),
                                      case.state_dtype)
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
    d = _draw(rng, lib, device)
    N, T = case.batch, case.tokens
    if case.packed:
        out = _common(d, case, 1, N * T, lib)
        out["cu_seqlens"] = _index_array(np.arange(N + 1, dtype=np.int64) * T, lib, device)
    else:
        out = _common(d, case, N, T, lib)
        out["cu_seqlens"] = None
    cols = 1 + case.spec
    if case.slots < N * cols:
        raise ValueError(f"{case.name}: {case.slots} slots cannot hold {N * cols} distinct indices")
    idx = rng.permutation(case.slots)[: N * cols].reshape(N, cols).astype(np.int32)
    if case.padding_rows:
        idx[N - case.padding_rows:, :] = -1
    if not case.spec:
        idx = idx[:, 0].copy()
    out["state_indices"] = _index_array(idx, lib, device)
    out["num_accepted_tokens"] = None
    if case.spec:
        acc = rng.integers(1, cols + 1, size=(N,)).astype(np.int32)
        out["num_accepted_tokens"] = _index_array(acc, lib, device)
    out["state"] = d.cast(d.normal(_state_shape(case, case.slots), std=0.1), case.state_dtype)
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
