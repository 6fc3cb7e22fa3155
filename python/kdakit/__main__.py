"""``python -m kdakit bench``: the project's main job.

With a CUDA GPU, torch and a CUDA build of kdakit it runs the GPU benchmarks
(kdakit.bench.prefill, then kdakit.bench.decode; a module that cannot be imported is reported
and skipped). Without, it runs one small case on the CPU backend (B=1, T=777, H=4, K=V=128,
lower-bound gate, q/k L2 norm, beta sigmoid, A_log, dt_bias, initial and final state, chunk
states) and prints the time and the relative L2 error of the fp32 chunked backend against the
float64 reference.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from . import testing
from .bench import BENCHMARKS

# CONTRACT.md section 6: the chunked path's bar against the float64 reference.
OUTPUT_BAR = 4e-3
STATE_BAR = 2e-3


def _cpu_case() -> testing.PrefillCase:
    return testing.PrefillCase(name="cpu-T777", seqlens=(777,), packed=False, H=4, K=128, V=128,
                               gate="lower_bound", lower_bound=-5.0, dtype="float32")


def run_cpu(repeats: int) -> int:
    """The CPU fallback of the main job; returns the exit status (1 if a bar is missed)."""
    from .ops import prefill

    case = _cpu_case()
    inputs = testing.prefill_inputs(case)
    kwargs = testing.prefill_kwargs(case)
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"])
    common = dict(kwargs, A_log=inputs["A_log"], dt_bias=inputs["dt_bias"],
                  initial_state=inputs["initial_state"], output_final_state=True,
                  chunk_state_interval=64)
    print(f"kdakit CPU backend: {case.label()}, B={case.B} T={case.T}, fp32 inputs, "
          "q/k L2 norm, beta sigmoid, initial + final state, chunk states every 64 tokens")
    results = {}
    for backend in ("chunked", "reference"):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            results[backend] = prefill(*args, **common, backend=backend)
            times.append(time.perf_counter() - start)
        times.sort()
        print(f"  {backend:<9} median {1e3 * times[len(times) // 2]:9.2f} ms over {repeats} runs")
    status = 0
    for field, bar in (("o", OUTPUT_BAR), ("final_state", STATE_BAR), ("chunk_states", STATE_BAR)):
        c = testing.compare(getattr(results["chunked"], field),
                            getattr(results["reference"], field), name=field)
        ok = c.rel_l2 <= bar and c.nonfinite_match
        status |= 0 if ok else 1
        print(f"  chunked vs float64 reference: {c.describe(bar)} {'ok' if ok else 'FAILED'}")
    return status


def run_gpu(bench_args: list[str]) -> int:
    status = 0
    for name in BENCHMARKS:
        module_name = f"kdakit.bench.{name}"
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001 - report and continue with the next benchmark
            print(f"{module_name}: not importable: {type(err).__name__}: {err}", flush=True)
            status = 1
            continue
        main = getattr(module, "main", None)
        if main is None:
            print(f"{module_name}: has no main(argv) entry point", flush=True)
            status = 1
            continue
        print(f"== {module_name}", flush=True)
        rc = main(list(bench_args))
        status |= int(rc or 0)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kdakit")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run the benchmarks (GPU) or the CPU accuracy check")
    bench.add_argument("--cpu", action="store_true",
                       help="run the CPU case even when a GPU is available")
    bench.add_argument("--repeats", type=int, default=3, help="timed runs of the CPU case")
    args, rest = parser.parse_known_args(argv)

    ok, reason = testing.cuda_available()
    if ok and not args.cpu:
        return run_gpu(rest)
    if rest:
        parser.error(f"unrecognized arguments for the CPU case: {' '.join(rest)}")
    if not args.cpu:
        print(f"no GPU run: {reason}; running the CPU backend instead", flush=True)
    return run_cpu(max(1, args.repeats))


if __name__ == "__main__":
    sys.exit(main())
