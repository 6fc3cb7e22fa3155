"""kdakit's GPU benchmarks, run by ``python -m kdakit bench``.

Each module is a program with a ``main(argv)`` entry point that times kdakit beside its peers
(FLA, FlashKDA) in the same run and prints one line per case with ratios and a geometric mean:

* kdakit.bench.prefill: chunked prefill over the cases of TARGETS.md.
* kdakit.bench.decode: decode over a state pool.

They share kdakit.testing (cases, inputs, timing, results). Run one alone with
``python -m kdakit.bench.prefill --help``.
"""

BENCHMARKS = ("prefill", "decode")
