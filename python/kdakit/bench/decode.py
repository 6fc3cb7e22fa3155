"""Decode benchmark: kdakit.decode beside FLA's ``fused_recurrent_kda_fwd`` (the kernel vLLM
calls for KDA decode) in the same run, on a state pool in HBM with a cold L2.

Cases (K = V = 128, bf16 q/k/v/g/beta, fp32 A_log/dt_bias, lower-bound gate -5, q/k L2 norm and
beta sigmoid in kernel, V-first pool updated in place, as in TARGETS.md):

* decode: one token per sequence, H = HV = 32 and 96, B = 1, 8, 32, 128, 512, fp32 and bf16 pool;
* spec: speculative decoding with S = 3 (state_indices [B, 4], 4 tokens, random accepted counts);
* prefill: short prefill (T tokens per sequence, pool slot in / out), against FLA's token-serial
  kernel, FLA ``chunk_kda`` with initial and final state (``--chunk-peer``) and kdakit's own
  chunked prefill (``kdakit.prefill`` with KDAKIT_PREFILL_PATH=chunked, the two-kernel path, on
  the same slots in place; its output is checked against the token-serial one).

Timing. Each measured call gets its own slots: the pool holds R disjoint slot sets, R large
enough that the R calls of one round touch >= 256 MB of state (5x the 50 MB L2), so no call
finds its state in L2. One CUDA graph captures the R calls (each its own index tensor); the
graph is replayed ``--repeats`` times and the time per call is the median replay time / R.
This is CUDA-graph time as a serving engine sees it (no launch or Python overhead), cold L2.
kdakit and FLA run on the same pool, index tensors and inputs.

Per row: time per call (us), state traffic (bytes of state read + written / time) in TB/s and as
a fraction of the 4.27 TB/s copy ceiling measured on H200 (TARGETS.md), FLA's time, and the
speedup; then a geometric mean. Decode rows also time the card's in-place SM copy (an
elementwise kernel) over the same bytes on the same rotation of pool regions, the per-row
reference for a fraction of the copy bandwidth (ramp, tail and cold L2 included alike). Each case
first checks kdakit's output against FLA's on the same inputs (relative L2), so a ratio never
hides a wrong answer.

Kernel variants: ``--variants`` takes a comma list of specs ``name[+pdl][+pf|+nopf]`` (``name``
a KDAKIT_DECODE_VARIANT value: registers, staged, staged64, staged64x2, direct32, direct16; ``+pdl`` sets
KDAKIT_DECODE_PDL=1, else a forced name runs without PDL; ``+pf`` / ``+nopf`` set
KDAKIT_DECODE_PREFETCH=1 / 0; ``+pfn`` / ``+nopfn``: KDAKIT_DECODE_PREFETCH_NEXT=1 / 0, staged64x2's
L2 prefetch of its second pass), ``auto`` (the
dispatcher's choice), or ``all`` (every spec of ALL_VARIANTS). The dispatcher reads
the variables on every call (src/cuda/sm90/decode/dispatch.cu), so each decode row is checked
against FLA and timed once per variant in the same process, beside one FLA timing; the kernel
that actually ran is read back from the dispatcher's KDAKIT_PRINT_CONFIGS line and printed (a
variant that does not fit a case is reported, not timed). Speculative and prefill rows have one
kernel and run once. After the rows: a compact table (case x variant: us, % of the 4.27 TB/s
ceiling, FLA/kdakit) and the geometric mean of FLA/kdakit per variant.

Usage::

    python -m kdakit.bench.decode [--quick] [--repeats 20] [--variants auto|all|spec,...]
                                  [--kinds decode,spec,prefill] [--cases SUBSTR,...] [--chunk-peer]
                                  [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass

from ..testing.floors import COPY_CEILING_TBPS  # H200 device-to-device copy, read + write

LOWER_BOUND = -5.0
ROTATION_BYTES = 256 * 1024 * 1024
MAX_POOL_BYTES = 24 * 1024**3
ALL_VARIANTS = ["auto", "staged", "staged+pdl", "staged64", "staged64+pdl", "staged64+pdl+pf",
                "staged64x2+pdl", "staged64x2+pdl+pfn", "staged64x2+pdl+nopfn", "direct32",
                "direct32+pdl", "direct32+pdl+nopf", "direct32+pdl+pf", "direct16", "direct16+pdl"]


@dataclass
class Case:
    name: str
    kind: str  # "decode", "spec", "prefill"
    H: int
    B: int
    T: int
    pool_dtype: str  # "float32" or "bfloat16"
    S: int = 0  # speculative tokens (index columns = 1 + S)
    chunk_peer: bool = False  # also time FLA chunk_kda (it autotunes per shape: minutes)


@dataclass
class Row:
    name: str
    variant: str
    kdakit_us: float
    state_tbps: float
    ceiling_fraction: float
    fla_us: float | None
    speedup: float | None
    fla_chunk_us: float | None
    rel_l2_vs_fla: float | None
    rotation: int
    copy_us: float | None = None  # decode rows: the in-place SM copy of the same bytes, cold L2
    kdakit_chunked_us: float | None = None  # prefill rows: kdakit.prefill on the chunked path
    rel_l2_chunked: float | None = None  # ... its output against the token-serial path's
    ran: str = ""  # the kernel the dispatcher reported (KDAKIT_PRINT_CONFIGS)
    repro: str = ""
    note: str = ""


def floor_us(case: Case) -> float:
    """State bytes (start state read, one write per sequence, or 1 + S with S) at the copy ceiling."""
    elem = 4 if case.pool_dtype == "float32" else 2
    writes = case.B * (min(case.T, 1 + case.S) if case.S else 1)
    return (case.B + writes) * case.H * 128 * 128 * elem / (COPY_CEILING_TBPS * 1e12) * 1e6


def cases(quick: bool) -> list[Case]:
    out = []
    Bs = (1, 32, 512) if quick else (1, 8, 32, 128, 512)
    for H in (32, 96):
        for dtype in ("float32", "bfloat16"):
            for B in Bs:
                out.append(Case(f"decode H{H} B{B} {'fp32' if dtype == 'float32' else 'bf16'}",
                                "decode", H, B, 1, dtype))
    for B in (32, 128):
        out.append(Case(f"spec S3 H32 B{B} fp32", "spec", 32, B, 4, "float32", S=3))
    for B, T, chunk_peer in ((16, 32, True), (64, 16, False), (8, 64, False)):
        out.append(Case(f"prefill H32 {B}x{T} fp32", "prefill", 32, B, T, "float32", chunk_peer=chunk_peer))
    return out


def _fla():
    try:
        from fla.ops.kda import chunk_kda
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return None, None, f"{type(err).__name__}: {err}"
    return fused_recurrent_kda_fwd, chunk_kda, ""


def _inputs(torch, case: Case, gen):
    H = HV = case.H
    K = V = 128
    B, T = case.B, case.T
    dev = "cuda"
    bf = torch.bfloat16
    x = {
        "q": torch.randn(B, T, H, K, generator=gen, device=dev).to(bf),
        "k": torch.randn(B, T, H, K, generator=gen, device=dev).to(bf),
        "v": torch.randn(B, T, HV, V, generator=gen, device=dev).to(bf),
        "g": (torch.randn(B, T, HV, K, generator=gen, device=dev) * 2).to(bf),
        "beta": torch.randn(B, T, HV, generator=gen, device=dev).to(bf),
        "A_log": (torch.rand(HV, generator=gen, device=dev) * 2 - 1.5).float(),
        "dt_bias": (torch.rand(HV * K, generator=gen, device=dev) * 2 - 1).float(),
    }
    return x


def _time_graph(torch, calls, repeats: int) -> float:
    """Median time per call (us) of the list of callables captured into one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(times)


def _copy_ceiling_tbps(torch) -> tuple[float, float]:
    """This card's copy bandwidth (bytes read + written per second, TB/s), measured like the
    decode rows (CUDA graph, median) on 1 GiB: an elementwise kernel from one buffer into another
    (an SM copy; ``copy_`` of a contiguous tensor would time the copy engines instead), and the
    same kernel in place (the decode pool's pattern: read and write one address)."""
    n = (1 << 30) // 4
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    copy_us = _time_graph(torch, [lambda: torch.mul(src, 1.0, out=dst)], 10)
    inplace_us = _time_graph(torch, [lambda: src.mul_(1.0)], 10)
    del src, dst
    return 2 * n * 4 / (copy_us * 1e6), 2 * n * 4 / (inplace_us * 1e6)


_VARIANT_ENV = ("KDAKIT_DECODE_VARIANT", "KDAKIT_DECODE_PDL", "KDAKIT_DECODE_PREFETCH", "KDAKIT_DECODE_PREFETCH_NEXT")


def _parse_spec(spec: str) -> tuple[str, set[str]]:
    """``name[+pdl][+pf|+nopf]`` -> (name, {"pdl", "pf", "nopf"} subset)."""
    name, *mods = spec.split("+")
    return name, set(mods)


def _set_variant(spec: str) -> None:
    """Environment of a variant spec ``name[+pdl][+pf|+nopf]`` (``auto``: the dispatcher's
    choice; a forced name without ``+pdl`` launches without PDL; ``+pf`` / ``+nopf``: with PDL,
    the L2 prefetch before griddepcontrol.wait forced on / off, else the dispatcher's default)."""
    for key in _VARIANT_ENV:
        os.environ.pop(key, None)
    name, mods = _parse_spec(spec)
    if "pdl" in mods:
        os.environ["KDAKIT_DECODE_PDL"] = "1"
    elif name != "auto":
        os.environ["KDAKIT_DECODE_PDL"] = "0"
    if "nopf" in mods or "pf" in mods:
        os.environ["KDAKIT_DECODE_PREFETCH"] = "1" if "pf" in mods else "0"
    if "nopfn" in mods or "pfn" in mods:
        os.environ["KDAKIT_DECODE_PREFETCH_NEXT"] = "1" if "pfn" in mods else "0"
    if name != "auto":
        os.environ["KDAKIT_DECODE_VARIANT"] = name


@contextlib.contextmanager
def _capture_stderr_fd():
    """Captures what native code writes to file descriptor 2; yields a list that gets the text."""
    sys.stderr.flush()
    saved = os.dup(2)
    out: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace"))


def _ran_variant(torch, call) -> str:
    """Runs call() once with KDAKIT_PRINT_CONFIGS=1 and returns 'variant[+pdl]' as printed."""
    os.environ["KDAKIT_PRINT_CONFIGS"] = "1"
    try:
        with _capture_stderr_fd() as text:
            call()
            torch.cuda.synchronize()
    finally:
        os.environ.pop("KDAKIT_PRINT_CONFIGS", None)
    m = re.search(r"variant=(\S+) pdl=(\d)", "".join(text))
    if not m:
        return "?"
    return m.group(1) + ("+pdl" if m.group(2) == "1" else "")


def _expected_ran(spec: str) -> str | None:
    """What the dispatcher must report for a forced spec (None for auto)."""
    name, mods = _parse_spec(spec)
    if name == "auto":
        return None
    return name + ("+pdl" if "pdl" in mods and name != "registers" else "")


def run_case(torch, kdakit, fla_rec, fla_chunk, case: Case, repeats: int, gen, variants: list[str],
             chunk_peer: bool) -> list[Row]:
    H = HV = case.H
    K = V = 128
    B, T = case.B, case.T
    dtype = getattr(torch, case.pool_dtype)
    elem = 4 if case.pool_dtype == "float32" else 2
    cols = 1 + case.S
    slots_per_call = B * cols
    rotation = max(2, math.ceil(ROTATION_BYTES / (slots_per_call * HV * K * V * elem)))
    rotation = min(rotation, max(1, MAX_POOL_BYTES // (slots_per_call * HV * K * V * elem)))
    num_slots = rotation * slots_per_call
    pool = (torch.rand(num_slots, HV, V, K, generator=gen, device="cuda") * 0.2 - 0.1).to(dtype)
    x = _inputs(torch, case, gen)
    o = torch.empty(B, T, HV, V, dtype=torch.bfloat16, device="cuda")
    o_fla = torch.empty_like(o)
    if case.kind == "prefill":
        # NOTE: FLA's pool mode writes the state after token t to slot idx[n, t]; a prefill of T
        # tokens therefore runs FLA in dense mode on contiguous views of the pool (B slots per
        # call), and kdakit on the same slots through indices r*B .. r*B + B - 1.
        perm = torch.arange(num_slots, device="cuda", dtype=torch.int32)
    else:
        perm = torch.randperm(num_slots, generator=gen, device="cuda").to(torch.int32)
    indices = [perm[r * slots_per_call:(r + 1) * slots_per_call].reshape(B, cols).contiguous()
               if cols > 1 else perm[r * B:(r + 1) * B].contiguous() for r in range(rotation)]
    accepted = None
    if case.S:
        accepted = torch.randint(1, cols + 1, (B,), generator=gen, device="cuda", dtype=torch.int32)
    common = dict(A_log=x["A_log"], dt_bias=x["dt_bias"])

    def kdakit_call(idx):
        return lambda: kdakit.decode(
            x["q"], x["k"], x["v"], x["g"], x["beta"], pool, idx, gate="lower_bound",
            lower_bound=LOWER_BOUND, use_qk_l2norm=True, use_beta_sigmoid=True,
            num_accepted_tokens=accepted, state_layout="v_first", out=o, **common)

    def fla_call(r):
        if case.kind == "prefill":
            state, idx = pool[r * B:(r + 1) * B], None
        else:
            state, idx = pool, indices[r]
        return lambda: fla_rec(
            x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=state, inplace_final_state=True,
            state_v_first=True, ssm_state_indices=idx, num_accepted_tokens=accepted,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            lower_bound=LOWER_BOUND, out=o_fla, **common)

    # --- FLA on the first slot set, then each variant on the same pool contents and inputs
    used = indices[0].reshape(-1).long()
    saved = pool[used].clone()
    after_fla = o_ref = None
    if fla_rec is not None:
        fla_call(0)()
        torch.cuda.synchronize()
        after_fla = pool[used].clone()
        o_ref = o_fla.clone()  # NOTE: FLA's timing below overwrites o_fla with other slot sets
        pool[used] = saved
    f_us = _time_graph(torch, [fla_call(r) for r in range(rotation)], repeats) if fla_rec is not None else None

    chunk_us = None
    if case.kind == "prefill" and case.chunk_peer and chunk_peer and fla_chunk is not None:
        h0 = torch.zeros(B, HV, K, V, dtype=torch.float32, device="cuda")

        def chunk_call():
            fla_chunk(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                      initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True, safe_gate=True,
                      use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=LOWER_BOUND)

        try:
            chunk_us = _time_graph(torch, [chunk_call], repeats)
        except Exception as err:  # noqa: BLE001 - a peer that cannot be captured is reported
            print(f"  FLA chunk_kda not timed: {type(err).__name__}: {err}", file=sys.stderr)

    chunked_us = chunked_o = None
    if case.kind == "prefill":
        # kdakit's own chunked prefill (KDAKIT_PREFILL_PATH=chunked, set in main) on the same
        # inputs and slot sets, dense V-first states updated in place: what the token-serial path
        # is chosen over.
        o_chunk = torch.empty_like(o)

        def prefill_call(r):
            state = pool[r * B:(r + 1) * B]
            args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
            kwargs = dict(gate="lower_bound", lower_bound=LOWER_BOUND, use_qk_l2norm=True, use_beta_sigmoid=True,
                          initial_state=state, final_state=state, state_layout="v_first", **common)
            ws = torch.empty(max(int(kdakit.prefill_workspace_size(*args, **kwargs)), 1), dtype=torch.uint8,
                             device="cuda")
            return lambda: kdakit.prefill(*args, **kwargs, workspace=ws, out=o_chunk)

        try:
            calls = [prefill_call(r) for r in range(rotation)]
            pool[used] = saved  # NOTE: FLA's timing above updated every slot set in place
            calls[0]()
            torch.cuda.synchronize()
            chunked_o = o_chunk.clone()
            pool[used] = saved
            chunked_us = _time_graph(torch, calls, repeats)
            pool[used] = saved
        except Exception as err:  # noqa: BLE001 - reported, the row is still timed
            print(f"  kdakit chunked prefill not timed: {type(err).__name__}: {err}", file=sys.stderr)

    copy_us = None
    if case.kind == "decode":
        # The card's in-place SM copy over the same bytes (one call's state, read and written),
        # on the same rotation of pool regions, so that ramp, tail and cold L2 weigh the same as in
        # the decode call: the per-row reference for "a fraction of the copy bandwidth".
        n = slots_per_call * HV * K * V
        flat = pool.view(-1)
        regions = [flat[r * n:(r + 1) * n] for r in range(rotation)]
        copy_us = _time_graph(torch, [lambda x=x: x.mul_(1.0) for x in regions], repeats)
        del regions, flat

    # Bytes: the start state read, every written state (1 per sequence, or per token with S).
    writes = B * (min(T, cols) if cols > 1 else 1)
    moved = (B + writes) * HV * K * V * elem
    rows = []
    for variant in (variants if case.kind == "decode" else ["auto"]):
        _set_variant(variant)
        rel = None
        pool[used] = saved
        ran = _ran_variant(torch, kdakit_call(indices[0]))
        expected = _expected_ran(variant)
        if expected is not None and ran != expected:
            print(f"  {case.name:28s} {variant:14s} not timed: the dispatcher ran {ran} (the variant does not fit)",
                  flush=True)
            continue
        if after_fla is not None:
            rel_o = float((o.float() - o_ref.float()).norm() / o_ref.float().norm().clamp_min(1e-30))
            rel_s = float((pool[used].float() - after_fla.float()).norm() / after_fla.float().norm())
            rel = max(rel_o, rel_s)
        try:
            k_us = _time_graph(torch, [kdakit_call(i) for i in indices], repeats)
        except Exception as err:  # noqa: BLE001 - one variant that cannot be captured is reported
            print(f"  {case.name:28s} {variant:14s} not timed: {type(err).__name__}: {err}", flush=True)
            torch.cuda.synchronize()
            continue
        tbps = moved / (k_us * 1e-6) / 1e12
        rel_chunked = None
        if chunked_o is not None:
            pool[used] = saved
            kdakit_call(indices[0])()
            torch.cuda.synchronize()
            rel_chunked = float((chunked_o.float() - o.float()).norm() / o.float().norm().clamp_min(1e-30))
            pool[used] = saved
        rows.append(Row(case.name, variant, k_us, tbps, tbps / COPY_CEILING_TBPS, f_us,
                        (f_us / k_us) if f_us else None, chunk_us, rel, rotation, copy_us, chunked_us, rel_chunked,
                        ran=ran,
                        repro=f"python -m kdakit.bench.decode --kinds {case.kind} --variants '{variant}' "
                              f"--cases '{case.name}'"))
    _set_variant("auto")
    del pool, saved, after_fla, o_ref
    torch.cuda.empty_cache()
    return rows


def _compact_table(rows: list[Row], variants: list[str]) -> str:
    """case x variant: 'us / % of ceiling / FLA/kdakit' per cell, then the best variant per case."""
    names = list(dict.fromkeys(r.name for r in rows))
    cols = [v for v in variants if any(r.variant == v for r in rows)]
    cell = {(r.name, r.variant): r for r in rows}
    lines = ["| case | FLA us | " + " | ".join(cols) + " | best |", "|---|---|" + "---|" * len(cols) + "---|"]
    for name in names:
        fla = next((cell[(name, v)].fla_us for v in cols if (name, v) in cell), None)
        parts, best = [], None
        for v in cols:
            r = cell.get((name, v))
            if r is None:
                parts.append("-")
                continue
            sp = f"x{r.speedup:.2f}" if r.speedup else "x-"
            parts.append(f"{r.kdakit_us:.2f} / {100 * r.ceiling_fraction:.0f}% / {sp}")
            if best is None or r.kdakit_us < best.kdakit_us:
                best = r
        fla_s = f"{fla:.2f}" if fla else "-"
        best_s = f"{best.variant} ({best.kdakit_us:.2f})" if best else "-"
        lines.append(f"| {name} | {fla_s} | " + " | ".join(parts) + f" | {best_s} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="B = 1, 32, 512 only")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--variants", default="auto",
                    help="comma list of variant specs name[+pdl][+pf|+nopf] timed on decode rows (auto = the dispatcher's "
                         "choice), or 'all' for " + ",".join(ALL_VARIANTS))
    ap.add_argument("--cases", default="", help="comma list of substrings: only cases whose name contains one")
    ap.add_argument("--chunk-peer", action="store_true", help="also time FLA chunk_kda on one prefill row (autotunes)")
    ap.add_argument("--kinds", default="decode,spec,prefill", help="comma list of row kinds to run")
    args = ap.parse_args(argv)
    variants = ALL_VARIANTS if args.variants == "all" else [v for v in args.variants.split(",") if v]
    wanted = [c for c in args.cases.split(",") if c]
    all_cases = cases(args.quick)
    unknown = [w for w in wanted if not any(w in c.name for c in all_cases)]
    if unknown:  # a typo would otherwise time fewer rows than asked for, without a word
        ap.error(f"--cases: no case name contains {', '.join(map(repr, unknown))}"
                 + (" (--quick keeps B = 1, 32 and 512 only)" if args.quick else ""))

    # NOTE: the prefill rows time kdakit.prefill on the chunked path beside the token-serial one;
    # the dispatcher reads KDAKIT_PREFILL_PATH once, before the first prefill call, and decode
    # calls do not read it.
    os.environ.setdefault("KDAKIT_PREFILL_PATH", "chunked")

    import torch

    import kdakit

    if not torch.cuda.is_available() or not kdakit.built_with_cuda():
        print("decode benchmark: needs a CUDA device and a CUDA build of kdakit", file=sys.stderr)
        return 2
    fla_rec, fla_chunk, reason = _fla()
    print(f"FLA: {'fla.ops.kda importable' if fla_rec else 'not importable: ' + reason}")
    print(f"device: {torch.cuda.get_device_name()}")
    copy_tbps, inplace_tbps = _copy_ceiling_tbps(torch)
    print(f"copy ceiling measured now (SM kernel, 1 GiB): {copy_tbps:.2f} TB/s into another buffer, "
          f"{inplace_tbps:.2f} TB/s in place (the tables' % use {COPY_CEILING_TBPS} TB/s, TARGETS.md)")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    kinds = set(args.kinds.split(","))
    for case in [c for c in all_cases if c.kind in kinds and (not wanted or any(w in c.name for w in wanted))]:
        for row in run_case(torch, kdakit, fla_rec, fla_chunk, case, args.repeats, gen, variants, args.chunk_peer):
            rows.append(row)
            print(f"  {row.name:28s} {row.variant:14s} kdakit {row.kdakit_us:9.2f} us  {row.state_tbps:5.2f} TB/s "
                  f"({100 * row.ceiling_fraction:5.1f}%)  FLA {row.fla_us or float('nan'):9.2f} us  "
                  f"x{row.speedup or float('nan'):5.2f}  rel-vs-FLA {row.rel_l2_vs_fla or float('nan'):.1e}  "
                  f"ran {row.ran}", flush=True)
        if args.json:  # after every case, so that a run cut short keeps its rows
            with open(args.json, "w") as f:
                json.dump([asdict(r) for r in rows], f, indent=1)

    print("\n| case | variant | floor us | kdakit us | state TB/s | % of 4.27 | FLA us | FLA/kdakit | FLA chunk us "
          "| rel vs FLA | kdakit chunked us | same-size copy us (copy / kdakit) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    floors = {c.name: floor_us(c) for c in all_cases}
    for r in rows:
        fla = f"{r.fla_us:.2f}" if r.fla_us else "-"
        sp = f"{r.speedup:.2f}" if r.speedup else "-"
        ch = f"{r.fla_chunk_us:.2f}" if r.fla_chunk_us else "-"
        rel = f"{r.rel_l2_vs_fla:.1e}" if r.rel_l2_vs_fla is not None else "-"
        fl = f"{floors[r.name]:.2f}" if not r.name.startswith("prefill") else "-"
        kc = (f"{r.kdakit_chunked_us:.2f} (o {r.rel_l2_chunked:.1e} apart)" if r.kdakit_chunked_us and
              r.rel_l2_chunked is not None else "-")
        cp = f"{r.copy_us:.2f} ({100 * r.copy_us / r.kdakit_us:.1f}%)" if r.copy_us else "-"
        print(f"| {r.name} | {r.variant} | {fl} | {r.kdakit_us:.2f} | {r.state_tbps:.2f} | "
              f"{100 * r.ceiling_fraction:.1f} | {fla} | {sp} | {ch} | {rel} | {kc} | {cp} |")
    for variant in variants:
        speedups = [r.speedup for r in rows if r.speedup and (r.variant == variant or
                                                            (r.variant == "auto" and not r.name.startswith("decode")))]
        if speedups:
            geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
            print(f"geometric mean FLA/kdakit, variant {variant}, over {len(speedups)} cases: {geo:.2f}")
    print("\ncompact (us / % of 4.27 TB/s / FLA/kdakit):")
    print(_compact_table(rows, variants if "auto" in variants else ["auto"] + variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
