"""GPU benchmark utilities shared by the benchmark programs (kdakit.bench.*).

Timing method: the callable is captured once in a CUDA graph (``graph=True``) or launched
directly, then run ``repeats`` times; before each timed run a 256 MB buffer is overwritten so
that the L2 cache (50 MB on H200) holds none of the inputs, and the run is bracketed by CUDA
events on the current stream. The result is the median. A cooldown pause between cases keeps
clocks comparable.

Peers are imported here, so that every benchmark reports a missing peer the same way:
``import_fla()`` (flash-linear-attention: ``fla.ops.kda.chunk_kda`` / ``fused_recurrent_kda``),
``import_flash_kda()`` (FlashKDA: ``flash_kda.fwd``); each returns a Peer whose ``reason`` says
why it is not importable.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = [
    "L2_FLUSH_BYTES",
    "Timing",
    "Peer",
    "cuda_available",
    "time_cuda",
    "cooldown",
    "import_fla",
    "import_flash_kda",
]

L2_FLUSH_BYTES = 256 * 1024 * 1024  # > 5x the 50 MB L2 of an H200


@dataclass
class Timing:
    """Times of one measured callable, in milliseconds."""

    times_ms: list[float]
    graph: bool

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def stdev_ms(self) -> float:
        return statistics.pstdev(self.times_ms) if len(self.times_ms) > 1 else 0.0


@dataclass
class Peer:
    """A peer implementation: its callables by name, or why it cannot be imported."""

    name: str
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    reason: str = ""

    @property
    def available(self) -> bool:
        return not self.reason

    def describe(self) -> str:
        return f"{self.name}: available" if self.available else f"{self.name}: not importable: {self.reason}"


def cuda_available() -> tuple[bool, str]:
    """(True, "") when torch, a CUDA device and a CUDA build of kdakit are all there, else
    (False, what is missing)."""
    try:
        import torch
    except ImportError as err:
        return False, f"torch is not importable ({err})"
    if not torch.cuda.is_available():
        return False, "no CUDA device visible to torch"
    try:
        from .._ext import built_with_cuda

        if not built_with_cuda():
            return False, "kdakit was built without CUDA (nvcc not found at build time)"
    except ImportError as err:
        return False, str(err)
    return True, ""


_flush_buffer = None


def _flush_l2(torch) -> None:
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    _flush_buffer.fill_(1)


def time_cuda(fn: Callable[[], Any], repeats: int = 30, warmup: int = 3, graph: bool = True,
              flush_l2: bool = True) -> Timing:
    """Median-of-``repeats`` GPU time of ``fn`` (which launches work on the current stream).

    With ``graph=True`` ``fn`` is captured once into a CUDA graph (after ``warmup`` eager calls
    on a side stream, as capture requires) and the graph is replayed; the time then excludes
    Python and launch overhead, as in a serving engine's graph replay."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        run = g.replay

    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        if flush_l2:
            _flush_l2(torch)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return Timing(times_ms=times, graph=graph)


def cooldown(seconds: float = 0.5) -> None:
    """Pause between cases so that the GPU's clocks and temperature settle."""
    if seconds > 0:
        time.sleep(seconds)


def _import_attr(module: str, attr: str) -> tuple[Callable[..., Any] | None, str]:
    try:
        mod = __import__(module, fromlist=[attr])
    except Exception as err:  # noqa: BLE001 - any import failure is reported, not raised
        return None, f"import {module} failed: {type(err).__name__}: {err}"
    fn = getattr(mod, attr, None)
    if fn is None:
        return None, f"{module} has no attribute {attr}"
    return fn, ""


def import_fla() -> Peer:
    """FLA's Triton KDA: functions 'chunk_kda' and 'fused_recurrent_kda'."""
    peer = Peer("FLA")
    reasons = []
    for attr in ("chunk_kda", "fused_recurrent_kda"):
        fn, reason = _import_attr("fla.ops.kda", attr)
        if fn is None:
            reasons.append(reason)
        else:
            peer.functions[attr] = fn
    if not peer.functions:
        peer.reason = "; ".join(reasons)
    return peer


def import_flash_kda() -> Peer:
    """FlashKDA's CUTLASS prefill: function 'fwd'."""
    peer = Peer("FlashKDA")
    fn, reason = _import_attr("flash_kda", "fwd")
    if fn is None:
        peer.reason = reason
    else:
        peer.functions["fwd"] = fn
    return peer
