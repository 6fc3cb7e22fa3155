"""Benchmark results: a table printer (one line per case, milliseconds and the ratio of each peer
to kdakit, geometric mean last), a JSON writer with a repro command on every row, and a PNG bar
plot when matplotlib is importable."""

from __future__ import annotations

import json
import math
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["Row", "geomean", "format_table", "print_table", "write_json", "plot_bars",
           "repro_command"]


@dataclass
class Row:
    """One benchmark case: its name, kdakit's time and the peers' times (ms; None when a peer
    could not run the case), extra metrics (e.g. TB/s) and the command that reproduces it."""

    case: str
    kdakit_ms: float | None
    peers_ms: dict[str, float | None] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    repro: str = ""

    def ratio(self, peer: str) -> float | None:
        """peer time / kdakit time (> 1: kdakit is faster)."""
        p = self.peers_ms.get(peer)
        if p is None or not self.kdakit_ms:
            return None
        return p / self.kdakit_ms


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def repro_command(module: str, *args: str) -> str:
    """``python -m <module> <args>`` with shell quoting."""
    return " ".join(["python", "-m", module] + [shlex.quote(a) for a in args])


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(rows: Sequence[Row], peers: Sequence[str], title: str = "") -> str:
    """The table as text: case, kdakit ms, each peer's ms and ratio, metrics; geomean last."""
    metric_names: list[str] = []
    for r in rows:
        for m in r.metrics:
            if m not in metric_names:
                metric_names.append(m)
    width = max([len(r.case) for r in rows] + [len("geomean"), 4])
    head = f"{'case':<{width}}  {'kdakit ms':>10}"
    for p in peers:
        head += f"  {p + ' ms':>14}  {'x' + p:>10}"
    for m in metric_names:
        head += f"  {m:>9}"
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    for r in rows:
        line = f"{r.case:<{width}}  {_fmt(r.kdakit_ms, '10.4f')}"
        for p in peers:
            line += f"  {_fmt(r.peers_ms.get(p), '14.4f')}  {_fmt(r.ratio(p), '9.2f')}x"
        for m in metric_names:
            line += f"  {_fmt(r.metrics.get(m), '9.3f')}"
        lines.append(line)
    gm = f"{'geomean':<{width}}  {_fmt(geomean([r.kdakit_ms for r in rows]), '10.4f')}"
    for p in peers:
        gm += f"  {_fmt(geomean([r.peers_ms.get(p) for r in rows]), '14.4f')}"
        gm += f"  {_fmt(geomean([r.ratio(p) for r in rows]), '9.2f')}x"
    lines.append(gm)
    return "\n".join(lines)


def print_table(rows: Sequence[Row], peers: Sequence[str], title: str = "", file=None) -> None:
    print(format_table(rows, peers, title), file=file or sys.stdout, flush=True)


def write_json(path: str | Path, rows: Sequence[Row], meta: dict[str, Any] | None = None) -> Path:
    """Writes ``{"meta": ..., "rows": [...]}``; every row carries its repro command."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta or {}, "rows": [asdict(r) for r in rows]}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def plot_bars(path: str | Path, rows: Sequence[Row], peers: Sequence[str], title: str = ""
              ) -> Path | None:
    """A grouped bar chart of milliseconds per case (kdakit and each peer) as PNG; returns None
    (and writes nothing) when matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = ["kdakit"] + list(peers)
    n = len(rows)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * n * len(names)), 4.5))
    for i, name in enumerate(names):
        vals = [(r.kdakit_ms if name == "kdakit" else r.peers_ms.get(name)) or 0.0 for r in rows]
        ax.bar([j + i * width for j in range(n)], vals, width=width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(n)])
    ax.set_xticklabels([r.case for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("ms (lower is better)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
