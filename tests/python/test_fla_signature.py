"""kdakit.chunk_kda / fused_recurrent_kda take FLA's arguments: same names, order, kinds and
defaults (flash-linear-attention fla/ops/kda at bc3b101d, recorded here as data), so that
existing call sites work unchanged, positionally or by keyword. chunk_kda as of
flash-linear-attention 0.6.0 (PyPI), which added use_graph and max_num_seqs."""

from __future__ import annotations

import inspect

import pytest

import kdakit

P = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY
VAR_KW = inspect.Parameter.VAR_KEYWORD
REQUIRED = inspect.Parameter.empty

# (name, kind, default) of FLA's public functions.
FLA_CHUNK_KDA = [
    ("q", P, REQUIRED), ("k", P, REQUIRED), ("v", P, REQUIRED), ("g", P, REQUIRED),
    ("beta", P, REQUIRED), ("scale", P, None), ("initial_state", P, None),
    ("output_final_state", P, False), ("use_qk_l2norm_in_kernel", P, False),
    ("use_gate_in_kernel", P, False), ("use_beta_sigmoid_in_kernel", P, False),
    ("allow_neg_eigval", P, False), ("safe_gate", P, False), ("lower_bound", P, None),
    ("disable_recompute", P, False), ("return_intermediate_states", P, False),
    ("state_v_first", P, False), ("cu_seqlens", P, None), ("cu_seqlens_cpu", P, None),
    ("cp_context", P, None), ("use_graph", P, False), ("max_num_seqs", P, None),
    ("kwargs", VAR_KW, REQUIRED),
]
FLA_FUSED_RECURRENT_KDA = [
    ("q", P, REQUIRED), ("k", P, REQUIRED), ("v", P, REQUIRED), ("g", P, REQUIRED),
    ("beta", P, REQUIRED), ("A_log", P, None), ("dt_bias", P, None), ("scale", P, None),
    ("initial_state", P, None), ("output_final_state", P, False),
    ("use_qk_l2norm_in_kernel", P, False), ("use_gate_in_kernel", P, False),
    ("use_beta_sigmoid_in_kernel", P, False), ("allow_neg_eigval", P, False),
    ("lower_bound", P, None), ("state_v_first", P, False), ("cu_seqlens", P, None),
    ("kwargs", VAR_KW, REQUIRED),
]
# The serving arguments of FLA's fused_recurrent_kda_fwd that kdakit adds, keyword-only.
KDAKIT_RECURRENT_EXTRAS = [
    ("ssm_state_indices", KW, None), ("num_accepted_tokens", KW, None),
    ("inplace_final_state", KW, None), ("out", KW, None),
]


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_chunk_kda_signature_matches_fla():
    assert _params(kdakit.chunk_kda) == FLA_CHUNK_KDA


def test_fused_recurrent_kda_signature_is_fla_plus_keyword_extras():
    params = _params(kdakit.fused_recurrent_kda)
    positional = [p for p in params if p[1] != KW]
    extras = [p for p in params if p[1] == KW]
    assert positional == FLA_FUSED_RECURRENT_KDA
    assert extras == KDAKIT_RECURRENT_EXTRAS


@pytest.mark.parametrize("name", ["chunk_kda", "fused_recurrent_kda"])
def test_matches_installed_fla_when_importable(name):
    fla_kda = pytest.importorskip("fla.ops.kda", reason="flash-linear-attention not installed")
    ours = [p for p in _params(getattr(kdakit, name)) if p[1] != KW]
    theirs = [p for p in _params(getattr(fla_kda, name)) if p[1] != KW]
    assert [(n, k) for n, k, _ in ours] == [(n, k) for n, k, _ in theirs]
    assert [d for *_, d in ours] == [d for *_, d in theirs]


def test_docstrings_carry_formula_shapes_and_backends():
    for fn in (kdakit.chunk_kda, kdakit.fused_recurrent_kda, kdakit.prefill, kdakit.decode):
        doc = inspect.getdoc(fn)
        assert "[B, T, H, K]" in doc or "module docstring" in doc, fn.__name__
    assert "float64" in inspect.getdoc(kdakit.fused_recurrent_kda)
    assert "chunked CPU backend" in inspect.getdoc(kdakit.chunk_kda)
    assert "S^T (scale * q_t)" in inspect.getdoc(kdakit.ops)
