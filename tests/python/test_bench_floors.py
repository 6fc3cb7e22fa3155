"""The prefill benchmark's floors (kdakit.testing.floors) against the table a session computed
independently for the design (docs/design/20261129-prefill.md, "Floors and prediction per case":
min bytes in GB to three decimals, FLOPs in G to the unit). CPU only."""

from __future__ import annotations

import pytest

from kdakit.testing import floors
from kdakit.testing.cases import PrefillCase, prefill_bench_cases

# case: (min bytes GB, chunked FLOP G), as tabulated in the design note
DESIGN_TABLE = {
    "H96-fixed": (1.021, 144), "H96-mixed": (1.084, 143), "H96-1024x8": (1.109, 144),
    "H96-512x16": (1.210, 144), "H96-256x32": (1.411, 144), "H96-64x128": (2.619, 144),
    "H96-32x256": (4.229, 110), "H96-16x512": (7.451, 94), "H96-4096+8x512": (1.121, 144),
    "H64-fixed": (0.681, 96), "H64-mixed": (0.722, 96), "H64-1024x8": (0.739, 96),
    "H32-fixed": (0.340, 48), "H32-1024x8": (0.370, 48),
    "H4-T32K": (0.169, 24), "H8-T32K": (0.337, 48), "H16-T32K": (0.674, 96),
}


@pytest.mark.parametrize("name", sorted(DESIGN_TABLE))
def test_floors_match_the_design_table(name):
    case = next(c for c in prefill_bench_cases() if c.name == name)
    f = floors.prefill_floors(case)
    gb, gflop = DESIGN_TABLE[name]
    assert round(f.bytes / 1e9, 3) == pytest.approx(gb, abs=1.5e-3)
    assert round(f.flops / 1e9) == pytest.approx(gflop, abs=1)


def test_floor_is_the_larger_time_at_the_measured_ceilings():
    fixed = next(c for c in prefill_bench_cases() if c.name == "H96-fixed")
    f = floors.prefill_floors(fixed)
    assert f.bytes_ms == pytest.approx(f.bytes / 4.27e12 * 1e3)
    assert f.flops_ms == pytest.approx(f.flops / 681e12 * 1e3)
    assert f.ms == max(f.bytes_ms, f.flops_ms) == pytest.approx(0.239, abs=1e-3)


def test_gva_heads_states_and_partial_chunks():
    base = PrefillCase(name="x", seqlens=(100, 0, 64), H=2, HV=6, K=128, V=64)
    f = floors.prefill_floors(base)
    tokens = 164
    per_token = 2 * 2 * 128 * 2 + 6 * 128 * 2 + 2 * 6 * 64 * 2 + 6 * 2  # q k | g | v o | beta
    states = 3 * 6 * 128 * 64 * 4
    assert f.bytes == tokens * per_token + 2 * states
    assert floors.prefill_floors(base.with_(initial_state=False)).bytes == tokens * per_token + states
    assert floors.prefill_floors(base.with_(state_dtype="bfloat16")).bytes == tokens * per_token + states
    # chunks of 64, 36 and 64 tokens; the empty sequence adds nothing
    assert f.flops == 6 * (2 * floors._chunk_flops(64, 128, 64) + floors._chunk_flops(36, 128, 64))
    c = 36
    assert floors._chunk_flops(c, 128, 64) == pytest.approx(
        3 * 2 * c * c * 128 + 2 * 2 * c * c * 64 + 2 * c**3 / 3 + 3 * 2 * c * 128 * 64)
