"""kdakit.testing: the comparison, case, input and report helpers the tests and benchmarks
share must themselves catch what they are meant to catch."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kdakit import testing


def test_rel_l2_and_worst_element():
    ref = np.array([[1.0, 2.0], [3.0, 4.0]])
    x = ref.copy()
    x[1, 0] += 0.5
    c = testing.compare(x, ref, "x")
    assert math.isclose(c.rel_l2, 0.5 / math.sqrt(30.0))
    assert c.worst_index == (1, 0) and c.worst_value == 3.5 and c.worst_ref == 3.0
    with pytest.raises(AssertionError, match=r"worst element \[1, 0\]"):
        testing.assert_close(x, ref, 1e-3, "x")
    assert testing.assert_close(x, ref, 0.1, "x").rel_l2 < 0.1


def test_nan_positions_must_match():
    ref = np.array([1.0, np.nan, 3.0])
    same = np.array([1.0, np.nan, 3.0])
    moved = np.array([np.nan, 2.0, 3.0])
    assert testing.compare(same, ref).nonfinite_match
    c = testing.compare(moved, ref)
    assert not c.nonfinite_match and c.nonfinite_mismatch_index == (0,)
    with pytest.raises(AssertionError):
        testing.assert_close(moved, ref, 1.0, allow_nonfinite=True)
    with pytest.raises(AssertionError, match="non-finite"):
        testing.assert_close(np.array([1.0, np.inf]), np.array([1.0, 2.0]), 10.0)


def test_inputs_are_fresh_and_never_zero():
    case = testing.PrefillCase(name="t", seqlens=(5, 0, 7), H=2, HV=4, K=8, V=4, dtype="float32")
    a, b = testing.prefill_inputs(case), testing.prefill_inputs(case)
    assert a["q"].shape == (1, 12, 2, 8) and a["v"].shape == (1, 12, 4, 4)
    assert a["initial_state"].shape == (3, 4, 4, 8)  # V-first
    assert list(a["cu_seqlens"]) == [0, 5, 5, 12]
    assert not np.array_equal(a["q"], b["q"]) and np.all(a["q"] != 0)
    pre = testing.prefill_inputs(case.with_(gate="precomputed"))
    assert np.all(pre["g"] <= 0) and pre["A_log"] is None


def test_decode_inputs_pool_indices():
    case = testing.DecodeCase(name="t", batch=4, H=1, K=8, V=8, spec=2, tokens=3,
                              padding_rows=1, dtype="float32")
    d = testing.decode_inputs(case)
    idx = d["state_indices"]
    assert idx.shape == (4, 3) and idx.dtype == np.int32
    assert np.all(idx[-1] == -1)
    live = idx[:-1].ravel()
    assert len(set(live.tolist())) == live.size and live.max() < case.slots
    assert np.all((d["num_accepted_tokens"] >= 1) & (d["num_accepted_tokens"] <= 3))


def test_case_lists_cover_targets():
    names = [c.name for c in testing.prefill_bench_cases()]
    assert "H96-fixed" in names and "H4-T32K" in names and "H32-fixed-softplus" in names
    few = ("T8K", "T32K", "T128K", "32K+8x1K")
    assert all(c.total_tokens == 8192 for c in testing.prefill_bench_cases()
               if not any(k in c.name for k in few))
    # issue 6: H = 4, 8, 16, 32 at 8K / 32K / 128K (H32 at 8K is H32-fixed) and 32K + 8 x 1K
    for h in (4, 8, 16, 32):
        for k in few:
            if (h, k) != (32, "T8K"):
                assert f"H{h}-{k}" in names
    assert len(testing.decode_bench_cases()) == 10
    cats = {c.category for c in testing.prefill_test_cases()}
    assert cats == {"regular", "irregular", "corner"}
    with pytest.raises(ValueError):
        testing.PrefillCase(name="bad", seqlens=(3, 4), packed=False)


def test_table_json_and_plot(tmp_path):
    rows = [testing.Row("a", 1.0, {"FLA": 3.0}, {"TB/s": 2.5}, repro="python -m x --case a"),
            testing.Row("b", 2.0, {"FLA": None}, repro="python -m x --case b")]
    text = testing.format_table(rows, ["FLA"])
    lines = text.splitlines()
    assert lines[-1].startswith("geomean") and "3.00x" in lines[2]
    assert math.isclose(testing.geomean([1.0, 4.0]), 2.0)
    path = testing.write_json(tmp_path / "r.json", rows, {"gpu": "none"})
    doc = json.loads(path.read_text())
    assert [r["repro"] for r in doc["rows"]] == ["python -m x --case a", "python -m x --case b"]
    png = testing.plot_bars(tmp_path / "r.png", rows, ["FLA"])
    if png is not None:
        assert png.read_bytes()[:4] == b"\x89PNG"
    assert testing.repro_command("kdakit.bench.prefill", "--case", "H96 fixed") == \
        "python -m kdakit.bench.prefill --case 'H96 fixed'"


def test_peer_imports_report_a_reason():
    peer = testing.import_flash_kda()
    if not peer.available:
        assert "not importable" in peer.describe() and peer.reason
    ok, reason = testing.cuda_available()
    assert ok or reason


def test_prefill_bench_modes_exclude_each_other(capsys):
    from kdakit.bench import prefill as bench

    for modes in (["--kernels", "--pool"], ["--kernels", "--plan-compare"], ["--pool", "--plan-compare"]):
        with pytest.raises(SystemExit) as err:
            bench.main(modes)
        assert err.value.code == 2
        assert "separate modes" in capsys.readouterr().err


def test_prefill_bench_kernels_mode_without_gpu(capsys):
    ok, _ = testing.cuda_available()
    if ok:
        pytest.skip("a CUDA GPU is present: the mode would profile the kernels")
    from kdakit.bench import prefill as bench

    assert bench.main(["--kernels", "--cases", "H4-T8K"]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out
