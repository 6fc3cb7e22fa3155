"""tools/chunked_rounding_model.py: its rounding helpers, and that its model of the chunked
kernels meets the contract's bars on a short input where the float64 recurrence is cheap. CPU only."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "tools" / "chunked_rounding_model.py"
_spec = importlib.util.spec_from_file_location("chunked_rounding_model", _PATH)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def test_f16_scales_by_a_power_of_two_and_rounds_to_ten_bits():
    rng = np.random.default_rng(1)
    # past fp16's largest value (65504): the scale brings the operand into range
    x = rng.uniform(1e5, 3e5, 4096) * rng.choice([-1.0, 1.0], 4096)
    y = tool.f16(x)
    assert np.all(np.isfinite(y))
    assert np.max(np.abs(y - x) / np.abs(x)) <= 2.0**-11  # half a unit of the tenth bit
    assert np.array_equal(tool.f16(np.zeros(3)), np.zeros(3))
    # an exact power of two and a value already representable pass through unchanged
    assert np.array_equal(tool.f16(np.array([0.75, -1024.0])), np.array([0.75, -1024.0]))


def test_bf_keeps_eight_bits():
    x = np.array([1.0 + 2.0**-8, 1.0 + 2.0**-7, 3.0])
    assert np.array_equal(tool.bf(x), np.array([1.0, 1.0 + 2.0**-7, 3.0]))  # ties to even


@pytest.mark.parametrize("split", [{"AM", "Kh", "S_wq"}, {"AM", "f16rec"}, {"AM", "f16rec_fixed"}])
def test_modelled_kernels_meet_the_bars_on_a_short_input(split):
    x = tool.inputs(256, "lower_bound", np.random.default_rng(0))
    o_ref, s_ref = tool.reference(*x)
    o, s = tool.chunked(*x, split)
    assert tool.rel(o, o_ref) < 4e-3
    assert tool.rel(s, s_ref) < 2e-3
