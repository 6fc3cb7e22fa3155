"""tools/prep_wide_pairs.py: the per-CTA count of wide-span (sub-block, channel) pairs that the
prep kernel sums per element. CPU only."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np

_PATH = pathlib.Path(__file__).resolve().parents[2] / "tools" / "prep_wide_pairs.py"
_spec = importlib.util.spec_from_file_location("prep_wide_pairs", _PATH)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def test_one_steep_channel_is_wide_in_every_sub_block():
    t, hv, k = 128, 2, 128
    g = np.zeros((t, hv, k))
    dt = np.full((hv, k), -30.0)  # softplus ~ 1e-13: no span
    dt[1, 5] = 3.0  # softplus(3) = 3.05; x exp(A_log) 8 x 16 tokens x log2(e) = 563 > 216
    n = tool.pairs_per_cta(g, dt, np.log(np.full(hv, 8.0)))
    assert n.shape == (t // 64, hv)
    assert (n[:, 0] == 0).all()
    assert (n[:, 1] == 4).all()  # four sub-blocks of one channel per chunk


def test_threshold_is_216_in_base_2_over_a_sub_block():
    t, hv, k = 64, 1, 128
    g = np.zeros((t, hv, k))
    # a per-token span of exactly 216 / 16 in base 2: not wide; a hair more: wide
    x = 216.0 / 16.0 / tool.LOG2E  # softplus value wanted, exp(A_log) = 1
    inv = np.log(np.expm1(x))  # softplus^-1
    dt = np.full((hv, k), -30.0)
    dt[0, 0] = inv - 1e-6
    dt[0, 1] = inv + 1e-6
    n = tool.pairs_per_cta(g, dt, np.zeros(hv))
    assert n.tolist() == [[4]]
