"""Prefill benchmark: kdakit beside FLA ``chunk_kda`` and FlashKDA ``flash_kda.fwd`` on the cases of
TARGETS.md (T = 8192 tokens at H = 96/64/32, few heads with T = 32768, the softplus gate).

Inputs per case (kdakit.testing.prefill_inputs): bf16 q/k/v/g/beta, fp32 A_log/dt_bias,
lower-bound gate -5 (or softplus), q/k L2 norm and beta sigmoid in kernel, fp32 V-first initial
state, final state returned. Every callable writes into preallocated outputs; kdakit gets its
workspace once, outside the timed region. Times: kdakit.testing.time_cuda (L2 flushed, median),
under a CUDA graph where capture works (kdakit always; a peer whose capture fails is timed
eagerly, and the row says so). The output of each peer is compared with kdakit's (rel. L2) so
that a ratio is never reported for a wrong answer unnoticed. Each row also gives kdakit's rate
against the case's two floors (kdakit.testing.floors: the fewest bytes any implementation moves,
the chunked math's FLOPs): TB/s and TFLOP/s, and "x floor", its time over the larger of bytes at
4.27 TB/s and FLOPs at 681 TFLOP/s (the H200 ceilings of TARGETS.md).

Usage::

    python -m kdakit.bench.prefill [--cases H96-fixed,H32] [--peers fla,flash_kda]
        [--peer-cases H96-fixed,H32-1024x8] [--fla-cases H96-fixed] [--repeats 20]
        [--json out.json] [--png out.png]

``--cases`` and ``--peer-cases`` keep cases whose name contains one of the comma-separated
substrings; a ``--cases`` key that names no case but spells a packed shape (``H16-4096+4x1K``:
heads, then lengths or count x length, K = 1024) adds that shape (testing.shape_case); a key
that does neither is an error. Peers run
only on ``--peer-cases`` (default: every selected case). FLA autotunes each new shape on its
first call (up to a minute), hence ``--peer-cases``. ``--host-lengths`` also gives kdakit the
packed cases' offsets on the host (``cu_seqlens_cpu``), the longest-length hint that steers
packed batches of sequences up to 1024 tokens onto the 16-token-tile kernel (the default runs
leave it out, as before).

``--rounds N`` times every party of a row N times in turn (kdakit, then each peer, N times over)
and keeps each one's best median, the same rule for all: a one-off slow median (the card's clock
after a long peer run) then moves no ratio.

``--pool`` (issue 7) times, on the packed cases H = 32 and H = 96, 1024x8 and mixed (fp32 V-first
pool of 2N + 1 + entries slots, distinct random slots), each against prefill straight from the
pool in place (``pool``, the row's kdakit time):

* ``gather+scatter``: what vLLM does today: ``index_select`` the pool, prefill dense,
  ``index_copy_`` the final states back (one graph);
* ``dense``: the prefill alone on dense states (no pool traffic);
* ``elsewhere``: read slot a, write slot b of the same pool (prefix caching);
* ``chunks/1024``: pool in place plus one boundary state per 1024 tokens into a dense buffer
  (target: under 5% over ``pool``);
* ``rows/1024``: the same boundary states written into rows of the state pool
  (``chunk_state_indices``; reported as not built while the kernels refuse it).

Before timing, the pool variants are checked against gather+scatter on the same pool contents
(``relL2 vs gather``). Usage: ``python -m kdakit.bench.prefill --pool [--cases H32] [--json f]``.

Plan once per step against plan per call (kdakit.plan)::

    python -m kdakit.bench.prefill --plan-compare [--cases 64x128,32x256,16x512]
        [--plan-layers 20] [--json plan.json]

times, under one CUDA graph each, a forward step of ``--plan-layers`` KDA layers (same inputs,
one shared workspace) two ways: every layer builds its own plan (``prefill(workspace=ws)``, the
default without a plan), and one ``prefill_plan`` followed by every layer with ``plan=``. It
prints both per-step times, the saving per layer, and the plan kernel alone. Default cases: the
many-short-sequence cases of TARGETS.md (H = 96, 64x128, 32x256, 16x512; the last one takes the
token-serial kernel, which needs no plan, so there both times should agree).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from .. import testing
from ..testing import floors

LOWER_BOUND = -5.0
# NOTE: on these inputs kdakit and the peers each sit 4-7e-3 (relative L2 of o) from each other on
# the H200 (session 19 run), as each does from float64. A row ten times past that, or with NaN/inf
# where the other has none, means one of them computes something else (session 19: a tile16 bug
# read 1e34 against FLA), and its ratio is no speedup: the run names it and exits with status 1.
PEER_AGREEMENT = 0.05


def peer_agreement(o, peer_o) -> tuple[float, str | None]:
    """kdakit's output ``o`` against a peer's (same shape; torch tensors or numpy arrays): the
    relative L2 of o, and None when they agree (within PEER_AGREEMENT, NaN/inf at the same
    positions) or else why not."""
    c = testing.compare(o, peer_o, "o")
    ok = c.rel_l2 <= PEER_AGREEMENT and c.nonfinite_match
    return c.rel_l2, None if ok else c.describe(PEER_AGREEMENT)


def _select(cases, spec: str | None):
    """The cases whose names contain one of the comma-separated keys of ``spec`` (all without
    one), plus, for a key that names no case, the packed shape it spells (testing.shape_case,
    e.g. ``H16-4096+4x1K``). A key that does neither raises ValueError (a typo would otherwise
    time fewer rows than asked for, without a word)."""
    if not spec:
        return list(cases)
    keys = [s for s in spec.split(",") if s]
    picked = [c for c in cases if any(k in c.name for k in keys)]
    unknown = []
    for k in keys:
        if any(k in c.name for c in cases):
            continue
        extra = testing.shape_case(k)
        if extra is None:
            unknown.append(k)
        else:
            picked.append(extra)
    if unknown:
        raise ValueError(f"no case name contains {', '.join(map(repr, unknown))} and it spells no packed "
                         "shape (H<heads>-<len>[+<n>x<len>...], e.g. H16-4096+4x1K)")
    return picked


def _kdakit_call(case, x, host_lengths: bool = False, **states) -> tuple[tuple, dict]:
    """The positional inputs and keyword arguments of every timed kdakit.prefill call of a case
    (the benchmark's gate, flags and V-first layout), plus the given state arguments. With
    ``host_lengths`` a packed case also passes its offsets on the host (``cu_seqlens_cpu``, as an
    engine that keeps them there would), from which kdakit takes the longest length as a routing
    hint."""
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    kwargs = dict(gate=case.gate, A_log=x["A_log"], dt_bias=x["dt_bias"],
                  lower_bound=LOWER_BOUND if case.gate == "lower_bound" else None,
                  use_qk_l2norm=True, use_beta_sigmoid=True, cu_seqlens=x["cu_seqlens"],
                  state_layout="v_first", **states)
    if host_lengths and x["cu_seqlens"] is not None:
        kwargs["cu_seqlens_cpu"] = x["cu_seqlens"].cpu()
    return args, kwargs


def _kdakit_runner(case, x, host_lengths: bool = False) -> tuple[Callable[[], Any], Any]:
    import torch

    import kdakit

    B, T, HV, V = case.B, case.T, case.num_v_heads, case.V
    out = torch.empty((B, T, HV, V), dtype=torch.bfloat16, device="cuda")
    final = torch.empty_like(x["initial_state"])
    args, kwargs = _kdakit_call(case, x, host_lengths, initial_state=x["initial_state"],
                                final_state=final)
    nbytes = kdakit.prefill_workspace_size(*args, **kwargs)
    workspace = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device="cuda")

    def run():
        kdakit.prefill(*args, **kwargs, workspace=workspace, out=out)

    return run, out


def _fla_runner(fla, case, x) -> tuple[Callable[[], Any], Any] | None:
    fn = fla.functions.get("chunk_kda")
    if fn is None:
        return None
    holder = {}
    kwargs = dict(initial_state=x["initial_state"], output_final_state=True,
                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                  state_v_first=True, cu_seqlens=x["cu_seqlens"])
    if case.gate == "lower_bound":
        # NOTE: safe_gate selects FLA's faster kernel for a bounded gate; same math.
        kwargs.update(lower_bound=LOWER_BOUND, safe_gate=True)

    def run():
        holder["o"] = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], **kwargs)[0]

    return run, holder


def _flash_kda_runner(fkda, case, x) -> tuple[Callable[[], Any], Any] | None:
    import torch

    fn = fkda.functions.get("fwd")
    if fn is None or case.gate != "lower_bound" or case.num_v_heads != case.H:
        return None  # FlashKDA: lower-bound gate only, no GVA
    out = torch.empty((case.B, case.T, case.H, case.V), dtype=torch.bfloat16, device="cuda")
    final = torch.empty_like(x["initial_state"])
    dt_bias = x["dt_bias"].view(case.H, case.K)

    def run():
        fn(x["q"], x["k"], x["v"], x["g"], x["beta"], case.K ** -0.5, out, x["A_log"], dt_bias,
           LOWER_BOUND, initial_state=x["initial_state"], final_state=final,
           cu_seqlens=x["cu_seqlens"])

    return run, out


def _time(run, repeats: int) -> tuple[float | None, str]:
    """Median ms under a CUDA graph, else eager; (None, why) when the callable fails."""
    import torch

    try:
        return testing.time_cuda(run, repeats=repeats, graph=True).median_ms, "graph"
    except Exception:  # noqa: BLE001 - capture not supported by this callable: time it eagerly
        torch.cuda.synchronize()
    try:
        return testing.time_cuda(run, repeats=repeats, graph=False).median_ms, "eager"
    except Exception as err:  # noqa: BLE001 - a peer that fails is reported, not raised
        torch.cuda.synchronize()
        return None, f"failed: {type(err).__name__}: {err}"


# The packed shapes of the --pool mode, per head count.
_POOL_SHAPES = ("1024x8", "mixed")
_POOL_HEADS = (32, 96)
_POOL_INTERVAL = 1024


def _pool_cases() -> list:
    """H32/H96 x 1024x8/mixed, the lengths of the TARGETS.md cases of those names."""
    by_name = {c.name: c for c in testing.prefill_bench_cases()}
    return [testing.PrefillCase(name=f"H{h}-{shape}-pool", seqlens=by_name[f"H96-{shape}"].seqlens,
                                H=h)
            for h in _POOL_HEADS for shape in _POOL_SHAPES]


def _pool_variants(case, x) -> tuple[dict[str, Callable[[], Any]], Callable[[], None], Any, Any,
                                     tuple[Any, Any]]:
    """The timed callables of one --pool case, a function that restores the pool's starting
    contents, the output buffer, the pool and the (read, write-elsewhere) slots."""
    import torch

    import kdakit

    N, HV, K, V = case.N, case.num_v_heads, case.K, case.V
    entries = sum(-(-n // _POOL_INTERVAL) for n in case.seqlens)
    slots = 2 * N + 1 + entries
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    pool = 0.1 * torch.randn((slots, HV, V, K), device="cuda", generator=gen)
    start = pool.clone()
    perm = torch.randperm(2 * N + 1, device="cuda", generator=gen).to(torch.int32)
    read, other = perm[:N].contiguous(), perm[N:2 * N].contiguous()
    read_long = read.long()
    rows = torch.arange(2 * N + 1, slots, dtype=torch.int32, device="cuda")  # entry e -> a slot
    out = torch.empty((case.B, case.T, HV, V), dtype=torch.bfloat16, device="cuda")
    dense_init = torch.empty((N, HV, V, K), device="cuda")
    dense_final = torch.empty_like(dense_init)
    chunks = torch.empty((entries, HV, V, K), device="cuda")
    args, common = _kdakit_call(case, x)
    in_place = dict(initial_state=pool, initial_state_indices=read, final_state=pool,
                    final_state_indices=read)
    configs = {
        "pool": in_place,
        "dense": dict(initial_state=dense_init, final_state=dense_final),
        "elsewhere": dict(in_place, final_state_indices=other),
        f"chunks/{_POOL_INTERVAL}": dict(in_place, chunk_state_interval=_POOL_INTERVAL,
                                         chunk_states=chunks),
        f"rows/{_POOL_INTERVAL}": dict(in_place, chunk_state_interval=_POOL_INTERVAL,
                                       chunk_states=pool, chunk_state_indices=rows),
    }

    def prefill_with(kw):
        nbytes = kdakit.prefill_workspace_size(*args, **common, **kw)
        ws = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device="cuda")
        return lambda: kdakit.prefill(*args, **common, **kw, workspace=ws, out=out)

    runs = {name: prefill_with(kw) for name, kw in configs.items()}
    dense = runs["dense"]

    def gather_scatter():
        torch.index_select(pool, 0, read_long, out=dense_init)
        dense()
        pool.index_copy_(0, read_long, dense_final)

    runs["gather+scatter"] = gather_scatter

    def restore():
        pool.copy_(start)

    return runs, restore, out, pool, (read_long, other.long())


def pool_main(args, cases) -> int:
    """The --pool mode: pool-indexed prefill against gather + prefill + scatter, and the cost
    of boundary states (see the module docstring), on the pool cases main selected."""
    import torch

    peers = ["gather+scatter", "dense", "elsewhere", f"chunks/{_POOL_INTERVAL}",
             f"rows/{_POOL_INTERVAL}"]
    rows = []
    for case in cases:
        x = testing.prefill_inputs(case, lib="torch", device="cuda", seed=0)
        runs, restore, out, pool, (read, other) = _pool_variants(case, x)
        row = testing.Row(case=case.name, kdakit_ms=None,
                          repro=testing.repro_command("kdakit.bench.prefill", "--pool", "--cases",
                                                      case.name))
        notes = []
        # NOTE: one step of each from the same pool contents, checked before anything is timed.
        restore()
        runs["gather+scatter"]()
        torch.cuda.synchronize()
        want_o, want_pool = out.float().cpu(), pool.clone().cpu()
        for name in ("pool", "elsewhere", f"chunks/{_POOL_INTERVAL}", f"rows/{_POOL_INTERVAL}"):
            restore()
            try:
                runs[name]()
            except NotImplementedError as err:
                runs.pop(name)
                notes.append(f"{name}: not built ({str(err).split(';')[0]})")
                continue
            torch.cuda.synchronize()
            written = other if name == "elsewhere" else read
            err_o = testing.rel_l2(out.float().cpu(), want_o)
            err_pool = testing.rel_l2(pool[written].cpu(), want_pool[read.cpu()])
            row.metrics[f"relL2 {name}"] = max(err_o, err_pool)
        for name in ["pool"] + peers:
            if name not in runs:
                row.peers_ms[name] = None
                continue
            restore()
            ms, how = _time(runs[name], args.repeats)
            if how != "graph":
                notes.append(f"{name} {how}")
            if name == "pool":
                row.kdakit_ms = ms
            else:
                row.peers_ms[name] = ms
        chunk_ms = row.peers_ms.get(f"chunks/{_POOL_INTERVAL}")
        if chunk_ms is not None and row.kdakit_ms:
            row.metrics["chunk cost %"] = 100.0 * (chunk_ms - row.kdakit_ms) / row.kdakit_ms
        rows.append(row)
        print(f"{case.name:<18} {case.label():<40} pool {row.kdakit_ms} ms  "
              + "  ".join(f"{n} {row.peers_ms.get(n)}" for n in peers)
              + (f"  ({'; '.join(notes)})" if notes else ""), flush=True)
        del x, runs
        testing.cooldown(args.cooldown)

    print()
    testing.print_table(rows, peers, title=(
        f"kdakit prefill from a state pool on {torch.cuda.get_device_name()} (ms, median; "
        f"xName = that variant's time / pool time; chunk cost = boundary states every "
        f"{_POOL_INTERVAL} tokens, target < 5%)"))
    meta = {"device": torch.cuda.get_device_name(), "mode": "pool",
            "interval": _POOL_INTERVAL, "argv": sys.argv[1:]}
    if args.json:
        print("json:", testing.write_json(args.json, rows, meta))
    return 0


PLAN_COMPARE_CASES = "H96-64x128,H96-32x256,H96-16x512"


def _plan_compare(cases, layers: int, repeats: int, cooldown: float, json_path: str) -> int:
    """Plan per call vs plan once per step (see the module docstring)."""
    import torch

    import kdakit

    rows = []
    for case in cases:
        x = testing.prefill_inputs(case, lib="torch", device="cuda", seed=0)
        B, T, HV, V = case.B, case.T, case.num_v_heads, case.V
        out = torch.empty((B, T, HV, V), dtype=torch.bfloat16, device="cuda")
        final = torch.empty_like(x["initial_state"])
        args, kwargs = _kdakit_call(case, x, initial_state=x["initial_state"], final_state=final)
        batch = dict(num_seqs=case.N) if case.packed else dict(batch=B)
        nbytes = kdakit.prefill_workspace_size(num_tokens=T, num_v_heads=HV, **batch)
        ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
        cu = x["cu_seqlens"]

        def plan():
            return kdakit.prefill_plan(cu, num_tokens=T, num_v_heads=HV, workspace=ws,
                                       batch=None if case.packed else B)

        def per_call():
            for _ in range(layers):
                kdakit.prefill(*args, **kwargs, workspace=ws, out=out)

        def once():
            p = plan()
            for _ in range(layers):
                kdakit.prefill(*args, **kwargs, plan=p, out=out)

        t_call, _ = _time(per_call, repeats)
        t_once, _ = _time(once, repeats)
        t_plan, _ = _time(plan, repeats)
        row = testing.Row(case=case.name, kdakit_ms=t_once,
                          peers_ms={"plan per call": t_call},
                          repro=testing.repro_command("kdakit.bench.prefill", "--plan-compare",
                                                      "--cases", case.name, "--plan-layers",
                                                      str(layers)))
        if t_call is not None and t_once is not None:
            row.metrics["saved us/layer"] = 1e3 * (t_call - t_once) / layers
        if t_plan is not None:
            row.metrics["plan kernel us"] = 1e3 * t_plan
        rows.append(row)
        print(f"{case.name:<14} {case.label():<40} {layers} layers: plan per call {t_call} ms, "
              f"plan once {t_once} ms, plan alone {t_plan} ms", flush=True)
        del x
        testing.cooldown(cooldown)
    print()
    testing.print_table(rows, ["plan per call"],
                        title=f"kdakit prefill step of {layers} layers on "
                        f"{torch.cuda.get_device_name()}: plan once (kdakit ms) vs plan per call "
                        "(ratio > 1: planning once saves time)")
    if json_path:
        meta = {"device": torch.cuda.get_device_name(), "mode": "plan-compare", "layers": layers}
        print("json:", testing.write_json(json_path, rows, meta))
    return 0


def _kernel_breakdown(cases, repeats: int, cooldown: float, json_path: str) -> int:
    """The --kernels mode: device time per kernel of one kdakit call (see the module docstring)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for case in cases:
        x = testing.prefill_inputs(case, lib="torch", device="cuda", seed=0)
        run, _ = _kdakit_runner(case, x)
        graph_ms, _ = _time(run, repeats)
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                run()
            torch.cuda.synchronize()
        kernels = {}
        for ev in prof.events():
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            # the kernel's qualified name without "void ", template arguments and parameters
            # (an anonymous namespace's "(anonymous namespace)::" would cut it at its "(")
            name = ev.name.replace("(anonymous namespace)::", "").removeprefix("void ")
            name = name.split("<")[0].split("(")[0].strip()
            t, n = kernels.get(name, (0.0, 0))
            kernels[name] = (t + (ev.time_range.end - ev.time_range.start), n + 1)  # us
        total_us = sum(t for t, _ in kernels.values()) / repeats
        row = testing.Row(case=case.name, kdakit_ms=graph_ms,
                          repro=testing.repro_command("kdakit.bench.prefill", "--kernels",
                                                      "--cases", case.name))
        row.metrics["kernel sum ms"] = total_us / 1e3
        print(f"{case.name:<22} {case.label():<40} graph {graph_ms} ms, kernels {total_us / 1e3:.4f} ms")
        for name, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
            us = t / repeats
            row.metrics[f"{name} ms"] = us / 1e3
            print(f"    {us:9.1f} us  {n / repeats:5.1f}x  {100.0 * us / max(total_us, 1e-9):5.1f}%  {name}")
        rows.append(row)
        del x, run
        testing.cooldown(cooldown)
    if json_path:
        meta = {"device": torch.cuda.get_device_name(), "mode": "kernels"}
        print("json:", testing.write_json(json_path, rows, meta))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kdakit.bench.prefill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="",
                    help="comma-separated name substrings (default: all); a key that names no case and "
                         "spells a packed shape, e.g. H16-4096+4x1K, adds that shape")
    ap.add_argument("--peers", default="fla,flash_kda", help="peers to time: fla, flash_kda, none")
    ap.add_argument("--peer-cases", default="", help="cases on which the peers run (default: all)")
    ap.add_argument("--fla-cases", default="",
                    help="cases on which FLA runs, overriding --peer-cases for FLA (it autotunes)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time kdakit and each peer this many times in turn per row, keeping each "
                         "one's best median")
    ap.add_argument("--cooldown", type=float, default=0.3, help="seconds between cases")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--png", default="", help="write a bar plot here (needs matplotlib)")
    ap.add_argument("--pool", action="store_true",
                    help="time prefill from a state pool against gather + prefill + scatter, "
                         "and the cost of boundary states (issue 7)")
    ap.add_argument("--plan-compare", action="store_true",
                    help="time a step of --plan-layers layers with the plan built per call "
                    f"against one plan per step (default cases: {PLAN_COMPARE_CASES})")
    ap.add_argument("--plan-layers", type=int, default=20,
                    help="KDA layers per step for --plan-compare (Kimi-Linear-48B-A3B: 20)")
    ap.add_argument("--host-lengths", action="store_true",
                    help="kdakit also gets packed cases' offsets on the host (cu_seqlens_cpu), "
                    "the longest-length hint an engine with host offsets passes")
    ap.add_argument("--kernels", action="store_true",
                    help="device time of each kernel of one kdakit call (torch.profiler), beside "
                    "the CUDA-graph time of the call")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if sum((args.pool, args.plan_compare, args.kernels)) > 1:
        ap.error("--pool, --plan-compare and --kernels are separate modes; pass one")
    # The rows, selected (and their keys checked) before the GPU is, so a typo fails on any machine.
    cases, peer_cases, fla_cases = [], set(), set()
    try:
        if args.pool:
            cases = _select(_pool_cases(), args.cases)
        else:
            cases = _select(testing.prefill_bench_cases(), args.cases or (PLAN_COMPARE_CASES if args.plan_compare
                                                                             else None))
            peer_cases = {c.name for c in _select(cases, args.peer_cases)}
            fla_cases = {c.name for c in _select(cases, args.fla_cases)} if args.fla_cases else peer_cases
    except ValueError as e:
        ap.error(f"--cases/--peer-cases/--fla-cases: {e}")

    ok, why = testing.cuda_available()
    if not ok:
        print(f"kdakit.bench.prefill: needs a CUDA GPU ({why})")
        return 0
    if args.pool:
        return pool_main(args, cases)
    import torch

    if args.kernels:
        return _kernel_breakdown(cases, args.repeats, args.cooldown, args.json)
    if args.plan_compare:
        return _plan_compare(cases, max(1, args.plan_layers), args.repeats, args.cooldown,
                             args.json)

    wanted = {p for p in args.peers.split(",") if p and p != "none"}
    peers = {}
    if "fla" in wanted:
        peers["FLA"] = testing.import_fla()
    if "flash_kda" in wanted:
        peers["FlashKDA"] = testing.import_flash_kda()
    for p in peers.values():
        print(p.describe())
    live = [name for name, p in peers.items() if p.available]

    rows = []
    disagreements = []
    for case in cases:
        x = testing.prefill_inputs(case, lib="torch", device="cuda", seed=0)
        run, out = _kdakit_runner(case, x, args.host_lengths)
        ms, how = _time(run, args.repeats)
        repro = ["--cases", case.name] + (["--host-lengths"] if args.host_lengths else [])
        row = testing.Row(case=case.name, kdakit_ms=ms,
                          repro=testing.repro_command("kdakit.bench.prefill", *repro))
        notes = [] if how == "graph" else [f"kdakit {how}"]
        # NOTE: kdakit's time first, so a peer stuck in autotuning leaves it on record.
        print(f"{case.name:<22} {case.label():<40} kdakit {ms if ms is None else round(ms, 4)} ms"
              + ("" if how == "graph" else f" ({how})"), flush=True)
        peer_runs, agreement = {}, {}
        for name in live:
            if case.name not in (fla_cases if name == "FLA" else peer_cases):
                row.peers_ms[name] = None
                continue
            maker = _fla_runner if name == "FLA" else _flash_kda_runner
            made = maker(peers[name], case, x)
            if made is None:
                row.peers_ms[name] = None
                notes.append(f"{name}: case not supported")
                continue
            peer_run, peer_out = made
            pms, phow = _time(peer_run, args.repeats)
            row.peers_ms[name] = pms
            if phow != "graph":
                notes.append(f"{name} {phow}")
            if pms is not None and ms is not None:
                peer_runs[name] = peer_run
                peer_run()
                run()
                torch.cuda.synchronize()
                po = peer_out["o"] if isinstance(peer_out, dict) else peer_out
                rel, why = peer_agreement(out.float().cpu(), po.float().cpu())
                agreement[f"relL2 vs {name}"] = rel
                if why is not None:
                    disagreements.append(f"{case.name}: kdakit and {name} disagree ({why})")
        # Rounds 2 .. N, the same rule for every party: each keeps its best median (a failed
        # retime keeps the one it had).
        for _ in range(args.rounds - 1 if ms is not None else 0):
            ms = min(ms, _time(run, args.repeats)[0] or ms)
            for name, peer_run in peer_runs.items():
                best = row.peers_ms[name]
                row.peers_ms[name] = min(best, _time(peer_run, args.repeats)[0] or best)
        row.kdakit_ms = ms
        if ms is not None:
            tokens = case.total_tokens * case.num_v_heads
            row.metrics["Mtok*head/ms"] = tokens / ms / 1e6
            f = floors.prefill_floors(case)
            row.metrics["TB/s"] = f.bytes / ms / 1e9
            row.metrics["TFLOP/s"] = f.flops / ms / 1e9
            row.metrics["x floor"] = ms / f.ms
        row.metrics.update(agreement)
        rows.append(row)
        if args.json:  # after every row: a run cut short by a time limit keeps what it measured
            testing.write_json(args.json, rows, {"device": torch.cuda.get_device_name(), "partial": True})
        if any(row.peers_ms.get(n) is not None for n in live) or notes:
            print(f"{'':<22} " + "".join(f"  {n} {row.peers_ms.get(n)} ms" for n in live)
                  + (f"  ({'; '.join(notes)})" if notes else ""), flush=True)
        del x
        testing.cooldown(args.cooldown)

    print()
    testing.print_table(rows, live, title=f"kdakit prefill on {torch.cuda.get_device_name()} "
                        "(ms, median; xPeer = peer time / kdakit time)")
    for name, p in peers.items():
        if not p.available:
            print(f"{name}: not importable ({p.reason})")
    meta = {"device": torch.cuda.get_device_name(), "rounds": args.rounds,
            "peers": {n: p.describe() for n, p in peers.items()},
            "argv": sys.argv[1:] if argv is None else argv, "disagreements": disagreements}
    if args.json:
        print("json:", testing.write_json(args.json, rows, meta))
    if args.png:
        path = testing.plot_bars(args.png, rows, live, title="kdakit prefill")
        print("png:", path if path else "not written (matplotlib not importable)")
    for d in disagreements:
        print(f"DISAGREEMENT (relative L2 of o above {PEER_AGREEMENT}): {d}")
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
