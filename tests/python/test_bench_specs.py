"""The decode benchmark's variant specs (``name[+pdl][+pf|+nopf]``): which environment each sets
for the dispatcher (src/cuda/sm90/decode/dispatch.cu reads it on every call) and which kernel the
dispatcher must then report. CPU only: nothing is launched."""

from __future__ import annotations

import os

import pytest

from kdakit.bench import decode as bench

ENV = ("KDAKIT_DECODE_VARIANT", "KDAKIT_DECODE_PDL", "KDAKIT_DECODE_PREFETCH", "KDAKIT_DECODE_PREFETCH_NEXT")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in ENV:
        monkeypatch.delenv(key, raising=False)
    yield
    for key in ENV:
        os.environ.pop(key, None)


@pytest.mark.parametrize("spec, env", [
    ("auto", {}),
    ("direct32", {"KDAKIT_DECODE_VARIANT": "direct32", "KDAKIT_DECODE_PDL": "0"}),
    ("staged64+pdl", {"KDAKIT_DECODE_VARIANT": "staged64", "KDAKIT_DECODE_PDL": "1"}),
    ("direct32+pdl+nopf", {"KDAKIT_DECODE_VARIANT": "direct32", "KDAKIT_DECODE_PDL": "1",
                           "KDAKIT_DECODE_PREFETCH": "0"}),
    ("staged+pdl+pf", {"KDAKIT_DECODE_VARIANT": "staged", "KDAKIT_DECODE_PDL": "1", "KDAKIT_DECODE_PREFETCH": "1"}),
    ("staged64x2+pdl+pfn", {"KDAKIT_DECODE_VARIANT": "staged64x2", "KDAKIT_DECODE_PDL": "1",
                            "KDAKIT_DECODE_PREFETCH_NEXT": "1"}),
    ("staged64x2+pdl+nopfn", {"KDAKIT_DECODE_VARIANT": "staged64x2", "KDAKIT_DECODE_PDL": "1",
                              "KDAKIT_DECODE_PREFETCH_NEXT": "0"}),
])
def test_spec_sets_exactly_its_environment(spec, env):
    os.environ["KDAKIT_DECODE_PREFETCH"] = "stale"  # a previous spec's setting must not survive
    bench._set_variant(spec)
    assert {k: os.environ[k] for k in ENV if k in os.environ} == env


@pytest.mark.parametrize("spec, ran", [
    ("auto", None),
    ("registers+pdl", "registers"),  # the register kernel is never launched with PDL
    ("direct32", "direct32"),
    ("direct32+pdl+pf", "direct32+pdl"),
    ("staged64+pdl+nopf", "staged64+pdl"),
])
def test_expected_dispatcher_report(spec, ran):
    assert bench._expected_ran(spec) == ran


def test_every_listed_variant_parses_to_a_dispatcher_name():
    names = {"auto", "registers", "staged", "staged64", "staged64x2", "direct32", "direct16"}
    for spec in bench.ALL_VARIANTS:
        name, mods = bench._parse_spec(spec)
        assert name in names, spec
        assert mods <= {"pdl", "pf", "nopf", "pfn", "nopfn"}, spec
        assert not {"pf", "nopf"} <= mods, spec


def test_prefill_bench_host_lengths_passes_host_offsets_of_packed_cases():
    """``--host-lengths``: kdakit.prefill gets the packed case's offsets on the host as well
    (cu_seqlens_cpu, the longest-length hint); a fixed case has none to give."""
    torch = pytest.importorskip("torch")
    from kdakit import testing
    from kdakit.bench import prefill as pbench

    by_name = {c.name: c for c in testing.prefill_bench_cases()}
    for name, packed in (("H32-1024x8", True), ("H32-fixed", False)):
        case = by_name[name]
        cu = torch.tensor(case.cu_seqlens, dtype=torch.int64) if packed else None
        x = {key: None for key in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")}
        x["cu_seqlens"] = cu
        _, plain = pbench._kdakit_call(case, x)
        _, hinted = pbench._kdakit_call(case, x, host_lengths=True)
        assert "cu_seqlens_cpu" not in plain
        if packed:
            assert hinted["cu_seqlens_cpu"].tolist() == list(case.cu_seqlens)
        else:
            assert "cu_seqlens_cpu" not in hinted


def test_prefill_bench_flags_a_peer_disagreement():
    """The prefill benchmark's check of kdakit's output against a peer's: a few 1e-3 apart (what
    two correct kernels differ by) passes; 1e17 times too large (session 19's tile16 bug, 1e34
    relative L2 against FLA), or NaN where the peer has a number, is named (and the run then exits
    with status 1)."""
    import numpy as np

    from kdakit.bench import prefill

    rng = np.random.default_rng()
    ref = rng.standard_normal((1, 300, 4, 128))
    close = ref * (1 + 5e-3 * rng.standard_normal(ref.shape))
    rel, why = prefill.peer_agreement(close, ref)
    assert why is None and 1e-3 < rel < prefill.PEER_AGREEMENT
    wrong = close.copy()
    wrong[0, 17, 2, :8] = 1e17
    rel, why = prefill.peer_agreement(wrong, ref)
    assert why is not None and rel > 1e10 and "rel_l2" in why
    holes = close.copy()
    holes[0, 5, 1, 3] = np.nan
    rel, why = prefill.peer_agreement(holes, ref)
    assert why is not None and "NaN/inf positions differ" in why


@pytest.mark.parametrize("name, heads, lens", [
    ("H16-4096+4x1K", 16, (4096,) + (1024,) * 4),
    ("H24-3K+8x1K", 24, (3072,) + (1024,) * 8),
    ("H4-100+2x7+0", 4, (100, 7, 7, 0)),
])
def test_prefill_bench_shape_case_spells_its_lengths(name, heads, lens):
    from kdakit import testing
    c = testing.shape_case(name)
    assert c is not None and c.name == name and c.H == heads and c.seqlens == lens and c.packed


@pytest.mark.parametrize("name", ["H16", "16-4096", "H16-", "H16-4096+", "H16-4k", "H0-64", "H16-2x"])
def test_prefill_bench_shape_case_rejects_other_names(name):
    from kdakit import testing
    assert testing.shape_case(name) is None


def test_prefill_bench_selects_a_shape_only_where_no_case_matches():
    from kdakit import testing
    from kdakit.bench import prefill
    cases = testing.prefill_bench_cases()
    picked = prefill._select(cases, "H32-32K+8x1K,H16-4096+4x1K")
    assert [c.name for c in picked] == ["H32-32K+8x1K", "H16-4096+4x1K"]
    assert picked[1].seqlens == (4096,) + (1024,) * 4


def test_prefill_bench_rejects_a_key_that_selects_nothing():
    from kdakit import testing
    from kdakit.bench import prefill
    with pytest.raises(ValueError, match="'H9-bogus'"):
        prefill._select(testing.prefill_bench_cases(), "H4-T32K,H9-bogus")
    # checked before the GPU is: argparse's exit status on any machine
    for flag in ("--cases", "--peer-cases", "--fla-cases"):
        with pytest.raises(SystemExit) as exc:
            prefill.main([flag, "H9-bogus"])
        assert exc.value.code == 2


def test_prefill_bench_rejects_rounds_below_one(capsys):
    from kdakit.bench import prefill
    with pytest.raises(SystemExit) as exc:
        prefill.main(["--rounds", "0"])
    assert exc.value.code == 2
    assert "--rounds" in capsys.readouterr().err


def test_decode_bench_rejects_a_key_that_selects_nothing(capsys):
    from kdakit.bench import decode
    with pytest.raises(SystemExit) as exc:
        decode.main(["--cases", "no-such-row"])
    assert exc.value.code == 2
    assert "'no-such-row'" in capsys.readouterr().err
