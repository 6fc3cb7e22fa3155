"""Helpers shared by kdakit's tests and benchmarks.

* compare: relative L2 error with NaN/inf position checks and a worst-element report.
* cases: PrefillCase / DecodeCase dataclasses (regular, irregular, corner) and the benchmark
  case lists of TARGETS.md.
* generate: fresh random inputs for a case, as numpy arrays or torch tensors.
* bench: CUDA-event / CUDA-graph timing with L2 flush, cooldown, peer imports (FLA, FlashKDA).
* report: table printer (geometric mean last), JSON results with repro commands, PNG bars.
* floors: a prefill case's fewest bytes and its chunked FLOPs over the H200 ceilings.
"""

from .bench import Peer, Timing, cooldown, cuda_available, import_fla, import_flash_kda, time_cuda
from .cases import (DecodeCase, PrefillCase, decode_bench_cases, decode_test_cases,
                    prefill_bench_cases, prefill_test_cases, shape_case)
from .compare import Comparison, assert_close, compare, rel_l2, to_float64
from .floors import PrefillFloors, prefill_floors
from .generate import (decode_inputs, decode_kwargs, prefill_inputs, prefill_kwargs, to_torch,
                       torch_available)
from .report import Row, format_table, geomean, plot_bars, print_table, repro_command, write_json

__all__ = [
    "Comparison", "assert_close", "compare", "rel_l2", "to_float64",
    "PrefillCase", "DecodeCase", "prefill_test_cases", "decode_test_cases",
    "prefill_bench_cases", "shape_case", "decode_bench_cases",
    "prefill_inputs", "decode_inputs", "prefill_kwargs", "decode_kwargs", "to_torch",
    "torch_available",
    "Peer", "Timing", "cooldown", "cuda_available", "import_fla", "import_flash_kda", "time_cuda",
    "PrefillFloors", "prefill_floors",
    "Row", "format_table", "geomean", "plot_bars", "print_table", "repro_command", "write_json",
]
