"""Accuracy checks: relative L2 error against a reference, with NaN/inf positions required to
match exactly and the worst element reported on failure (CONTRACT.md section 6)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["to_float64", "rel_l2", "Comparison", "compare", "assert_close"]


def to_float64(x: Any) -> np.ndarray:
    """A float64 numpy copy of a numpy array or torch tensor (any device, bf16 included)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().to(device="cpu", dtype=torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


@dataclass
class Comparison:
    """The outcome of comparing ``x`` with ``ref``."""

    name: str
    rel_l2: float  # ||x - ref|| / ||ref|| over the finite positions
    nonfinite_match: bool  # NaN and +-inf at the same positions in both
    worst_index: tuple[int, ...] | None  # index of the largest |x - ref|
    worst_value: float
    worst_ref: float
    nonfinite_mismatch_index: tuple[int, ...] | None

    def describe(self, bar: float | None = None) -> str:
        text = f"{self.name}: rel_l2 = {self.rel_l2:.3e}"
        if bar is not None:
            text += f" (bar {bar:.1e})"
        if self.worst_index is not None:
            text += (f"; worst element {list(self.worst_index)}: got {self.worst_value:.6g}, "
                     f"ref {self.worst_ref:.6g}")
        if not self.nonfinite_match:
            text += (f"; NaN/inf positions differ, first at "
                     f"{list(self.nonfinite_mismatch_index)}")
        return text


def compare(x: Any, ref: Any, name: str = "x") -> Comparison:
    """Compares ``x`` with ``ref`` (same shape; numpy arrays or torch tensors)."""
    a, r = to_float64(x), to_float64(ref)
    if a.shape != r.shape:
        raise ValueError(f"{name}: shape {a.shape} differs from the reference's {r.shape}")
    a_bad, r_bad = ~np.isfinite(a), ~np.isfinite(r)
    same_kind = (np.isnan(a) == np.isnan(r)) & (np.isposinf(a) == np.isposinf(r)) & (
        np.isneginf(a) == np.isneginf(r))
    mismatch = np.argwhere(~same_kind)
    finite = ~(a_bad | r_bad)
    diff = np.where(finite, a - r, 0.0)
    ref_norm = float(np.linalg.norm(np.where(finite, r, 0.0)))
    err_norm = float(np.linalg.norm(diff))
    if ref_norm > 0:
        rel = err_norm / ref_norm
    else:
        rel = 0.0 if err_norm == 0 else float("inf")
    worst = None
    worst_value = worst_ref = float("nan")
    if diff.size:
        flat = int(np.argmax(np.abs(diff)))
        worst = tuple(int(i) for i in np.unravel_index(flat, diff.shape))
        worst_value, worst_ref = float(a[worst]), float(r[worst])
    return Comparison(
        name=name,
        rel_l2=rel,
        nonfinite_match=mismatch.size == 0,
        worst_index=worst,
        worst_value=worst_value,
        worst_ref=worst_ref,
        nonfinite_mismatch_index=tuple(int(i) for i in mismatch[0]) if mismatch.size else None,
    )


def rel_l2(x: Any, ref: Any) -> float:
    """``||x - ref|| / ||ref||`` over the positions where both are finite."""
    return compare(x, ref).rel_l2


def assert_close(x: Any, ref: Any, bar: float, name: str = "x", allow_nonfinite: bool = False
                 ) -> Comparison:
    """Raises AssertionError unless ``rel_l2(x, ref) <= bar``, the NaN/inf positions match and
    (unless ``allow_nonfinite``) there are none. Returns the Comparison for printing."""
    c = compare(x, ref, name)
    ok = c.rel_l2 <= bar and c.nonfinite_match
    if not allow_nonfinite and not np.all(np.isfinite(to_float64(x))):
        ok = False
        bad = np.argwhere(~np.isfinite(to_float64(x)))[0]
        raise AssertionError(f"{c.describe(bar)}; non-finite value at {list(map(int, bad))}")
    if not ok:
        raise AssertionError(c.describe(bar))
    return c
