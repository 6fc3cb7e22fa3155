"""kdakit on the CPU backend with numpy arrays: chunk_kda (fp32 chunked), fused_recurrent_kda
and decode (float64 reference) and prefill (both backends) against the pure-numpy float64
recurrence of kda_numpy.py, on fresh random inputs for every gate, flag, layout and odd,
empty and packed lengths."""

from __future__ import annotations

import numpy as np
import pytest

import kda_numpy
import kdakit
from kdakit import testing

# fp32 inputs: the float64 reference path rounds only its outputs to fp32; the fp32 chunked
# path accumulates in fp32 (measured ~1e-6 relative error on these shapes).
REFERENCE_BAR = 1e-6
CHUNKED_BAR = 1e-4

NUMPY_CASES = [c for c in testing.prefill_test_cases() if c.state_dtype == "float32"]


def _ref_kwargs(case, inputs):
    return dict(gate=case.gate, A_log=inputs["A_log"], dt_bias=inputs["dt_bias"],
                lower_bound=case.lower_bound if case.gate == "lower_bound" else None,
                use_qk_l2norm=case.use_qk_l2norm, use_beta_sigmoid=case.use_beta_sigmoid,
                allow_neg_eigval=case.allow_neg_eigval)


def _to_k_first(state, case):
    return state if case.state_layout == "k_first" else np.swapaxes(state, -1, -2)


def _fla_kwargs(case, inputs):
    kw = dict(
        initial_state=inputs["initial_state"], output_final_state=True,
        use_qk_l2norm_in_kernel=case.use_qk_l2norm,
        use_gate_in_kernel=case.gate != "precomputed",
        use_beta_sigmoid_in_kernel=case.use_beta_sigmoid,
        allow_neg_eigval=case.allow_neg_eigval,
        lower_bound=case.lower_bound if case.gate == "lower_bound" else None,
        state_v_first=case.state_layout == "v_first", cu_seqlens=inputs["cu_seqlens"],
    )
    return kw


def _reference(case, inputs):
    init = inputs["initial_state"]
    o, final = kda_numpy.kda(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
        initial_state=None if init is None else _to_k_first(init, case),
        cu_seqlens=case.cu_seqlens, **_ref_kwargs(case, inputs))
    return o, _to_k_first(final, case)  # back to the case's layout


@pytest.mark.parametrize("case", NUMPY_CASES, ids=lambda c: f"{c.category}-{c.name}")
def test_chunk_kda_matches_float64_recurrence(case):
    inputs = testing.prefill_inputs(case)
    o_ref, final_ref = _reference(case, inputs)
    o, final = kdakit.chunk_kda(inputs["q"], inputs["k"], inputs["v"], inputs["g"],
                                inputs["beta"], A_log=inputs["A_log"], dt_bias=inputs["dt_bias"],
                                **_fla_kwargs(case, inputs))
    assert isinstance(o, np.ndarray) and o.dtype == np.float32 and o.shape == inputs["v"].shape
    assert final.dtype == np.float32
    testing.assert_close(o, o_ref, CHUNKED_BAR, "o")
    testing.assert_close(final, final_ref, CHUNKED_BAR, "final_state")


@pytest.mark.parametrize("case", NUMPY_CASES, ids=lambda c: f"{c.category}-{c.name}")
def test_fused_recurrent_kda_matches_float64_recurrence(case):
    inputs = testing.prefill_inputs(case)
    o_ref, final_ref = _reference(case, inputs)
    kw = _fla_kwargs(case, inputs)
    o, final = kdakit.fused_recurrent_kda(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["A_log"],
        inputs["dt_bias"], **kw)
    testing.assert_close(o, o_ref, REFERENCE_BAR, "o")
    testing.assert_close(final, final_ref, REFERENCE_BAR, "final_state")


@pytest.mark.parametrize("backend,bar", [("reference", REFERENCE_BAR), ("chunked", CHUNKED_BAR)])
def test_native_prefill_backends_and_chunk_states(backend, bar):
    case = testing.PrefillCase(name="native", seqlens=(150, 0, 64, 20), H=2, HV=4, K=32, V=16,
                               dtype="float32", gate="softplus")
    inputs = testing.prefill_inputs(case)
    o_ref, final_ref = _reference(case, inputs)
    o, final, chunk_states = kdakit.prefill(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
        A_log=inputs["A_log"], dt_bias=inputs["dt_bias"], cu_seqlens=inputs["cu_seqlens"],
        initial_state=inputs["initial_state"], output_final_state=True, chunk_state_interval=64,
        backend=backend, **testing.prefill_kwargs(case))
    testing.assert_close(o, o_ref, bar, "o")
    testing.assert_close(final, final_ref, bar, "final_state")
    # The state before tokens 0, 64, 128 of sequence 0, none for the empty one, before token 0
    # of the 64-token and the 20-token ones: the initial state of each, or a prefix's final.
    assert chunk_states.shape == (3 + 0 + 1 + 1, 4, 16, 32)
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    init_kf = _to_k_first(inputs["initial_state"], case)
    expected = []
    for n, (start, end) in enumerate([(0, 150), (150, 150), (150, 214), (214, 234)]):
        for c in range(start, end, 64):
            if c == start:
                expected.append(init_kf[n])
                continue
            _, f = kda_numpy.kda(q[:, start:c], k[:, start:c], v[:, start:c], g[:, start:c],
                                 beta[:, start:c], initial_state=init_kf[n:n + 1],
                                 **_ref_kwargs(case, inputs))
            expected.append(f[0])
    testing.assert_close(chunk_states, np.swapaxes(np.stack(expected), -1, -2), bar, "chunk_states")


def test_native_prefill_scalar_gate_is_gdn():
    case = testing.PrefillCase(name="gdn", seqlens=(37, 70), packed=True, H=2, K=16, V=16,
                               dtype="float32", gate="precomputed")
    inputs = testing.prefill_inputs(case)
    g_scalar = np.ascontiguousarray(inputs["g"][..., 0])
    g_full = np.repeat(g_scalar[..., None], case.K, axis=-1)
    o_ref, final_ref = kda_numpy.kda(inputs["q"], inputs["k"], inputs["v"], g_full, inputs["beta"],
                                     initial_state=np.swapaxes(inputs["initial_state"], -1, -2),
                                     cu_seqlens=case.cu_seqlens, use_qk_l2norm=True,
                                     use_beta_sigmoid=True)
    o, final, _ = kdakit.prefill(inputs["q"], inputs["k"], inputs["v"], g_scalar, inputs["beta"],
                                 scalar_gate=True, use_qk_l2norm=True, use_beta_sigmoid=True,
                                 cu_seqlens=inputs["cu_seqlens"],
                                 initial_state=inputs["initial_state"], output_final_state=True)
    testing.assert_close(o, o_ref, CHUNKED_BAR, "o")
    testing.assert_close(final, np.swapaxes(final_ref, -1, -2), CHUNKED_BAR, "final_state")


def test_prefill_pool_in_place_with_indices():
    case = testing.PrefillCase(name="pool", seqlens=(40, 9, 70), H=2, K=16, V=32, dtype="float32")
    inputs = testing.prefill_inputs(case)
    rng = np.random.default_rng()
    pool = (0.1 * rng.standard_normal((7, 2, 32, 16))).astype(np.float32)
    before = pool.copy()
    slots = np.array([5, -1, 2], dtype=np.int32)  # -1: start from zeros, do not write
    kdakit.prefill(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
                   A_log=inputs["A_log"], dt_bias=inputs["dt_bias"],
                   cu_seqlens=inputs["cu_seqlens"], initial_state=pool,
                   initial_state_indices=slots, final_state=pool, final_state_indices=slots,
                   **testing.prefill_kwargs(case))
    init = np.stack([np.swapaxes(before[5], -1, -2), np.zeros((2, 16, 32)),
                     np.swapaxes(before[2], -1, -2)])
    _, final_ref = kda_numpy.kda(inputs["q"], inputs["k"], inputs["v"], inputs["g"],
                                 inputs["beta"], initial_state=init, cu_seqlens=case.cu_seqlens,
                                 **_ref_kwargs(case, inputs))
    testing.assert_close(pool[5], np.swapaxes(final_ref[0], -1, -2), CHUNKED_BAR, "slot 5")
    testing.assert_close(pool[2], np.swapaxes(final_ref[2], -1, -2), CHUNKED_BAR, "slot 2")
    untouched = [0, 1, 3, 4, 6]
    assert np.array_equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("case", [c for c in testing.decode_test_cases() if c.state_dtype == "float32"],
                         ids=lambda c: f"{c.category}-{c.name}")
def test_decode_pool_matches_float64_recurrence(case):
    inputs = testing.decode_inputs(case)
    pool = inputs["state"]
    before = pool.copy()
    kw = testing.decode_kwargs(case)
    o = kdakit.decode(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], pool,
                      inputs["state_indices"], A_log=inputs["A_log"], dt_bias=inputs["dt_bias"],
                      cu_seqlens=inputs["cu_seqlens"],
                      num_accepted_tokens=inputs["num_accepted_tokens"], **kw)
    o_ref, pool_ref = kda_numpy.kda_pool_decode(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], before,
        inputs["state_indices"], num_accepted_tokens=inputs["num_accepted_tokens"],
        state_v_first=case.state_layout == "v_first", gate=case.gate, A_log=inputs["A_log"],
        dt_bias=inputs["dt_bias"], lower_bound=kw["lower_bound"],
        use_qk_l2norm=case.use_qk_l2norm, use_beta_sigmoid=case.use_beta_sigmoid)
    testing.assert_close(o, o_ref, REFERENCE_BAR, "o")
    testing.assert_close(pool, pool_ref, REFERENCE_BAR, "state pool")
    if case.padding_rows:
        assert np.all(o[-case.padding_rows:] == 0)


def test_fused_recurrent_kda_pool_mode_updates_in_place():
    case = testing.DecodeCase(name="vllm", batch=4, H=2, HV=4, K=32, V=32, dtype="float32",
                              state_layout="k_first", packed=True, tokens=1)
    inputs = testing.decode_inputs(case)
    pool = inputs["state"]
    before = pool.copy()
    o, returned = kdakit.fused_recurrent_kda(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
        A_log=inputs["A_log"], dt_bias=inputs["dt_bias"], initial_state=pool,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        lower_bound=-5.0, cu_seqlens=inputs["cu_seqlens"],
        ssm_state_indices=inputs["state_indices"])
    assert returned is pool
    o_ref, pool_ref = kda_numpy.kda_pool_decode(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], before,
        inputs["state_indices"], cu_seqlens=np.asarray(inputs["cu_seqlens"]), state_v_first=False,
        gate="lower_bound", A_log=inputs["A_log"], dt_bias=inputs["dt_bias"], lower_bound=-5.0,
        use_qk_l2norm=True, use_beta_sigmoid=True)
    testing.assert_close(o, o_ref, REFERENCE_BAR, "o")
    testing.assert_close(pool, pool_ref, REFERENCE_BAR, "pool")
    assert not np.array_equal(pool, before)


def test_fused_recurrent_kda_inplace_dense_state():
    case = testing.PrefillCase(name="dense", seqlens=(3, 3), packed=False, H=2, K=16, V=16,
                               dtype="float32", state_layout="k_first")
    inputs = testing.prefill_inputs(case)
    state = inputs["initial_state"]
    o_ref, final_ref = _reference(case, inputs)
    o, returned = kdakit.fused_recurrent_kda(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["A_log"],
        inputs["dt_bias"], initial_state=state, use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=-5.0,
        inplace_final_state=True)
    assert returned is state
    testing.assert_close(o, o_ref, REFERENCE_BAR, "o")
    testing.assert_close(state, final_ref, REFERENCE_BAR, "state")


def test_chunk_kda_without_final_state_and_intermediate_states_shape():
    case = testing.PrefillCase(name="h", seqlens=(130, 130), packed=False, H=2, K=16, V=16,
                               dtype="float32", state_layout="k_first")
    inputs = testing.prefill_inputs(case)
    o, final = kdakit.chunk_kda(inputs["q"], inputs["k"], inputs["v"], inputs["g"],
                                inputs["beta"], use_gate_in_kernel=True, lower_bound=-5.0,
                                A_log=inputs["A_log"], dt_bias=inputs["dt_bias"])
    assert final is None
    o2, final2, h = kdakit.chunk_kda(inputs["q"], inputs["k"], inputs["v"], inputs["g"],
                                     inputs["beta"], use_gate_in_kernel=True, lower_bound=-5.0,
                                     A_log=inputs["A_log"], dt_bias=inputs["dt_bias"],
                                     return_intermediate_states=True)
    assert final2 is None
    assert h.shape == (2, 3, 2, 16, 16)  # [B, ceil(T / 64), HV, K, V]
    assert np.array_equal(h[:, 0], np.zeros_like(h[:, 0]))  # no initial state: zeros first
    assert np.array_equal(o, o2)


def test_strided_views_and_readonly_inputs_match_contiguous():
    case = testing.PrefillCase(name="views", seqlens=(50, 50), packed=False, H=2, K=16, V=16,
                               dtype="float32")
    inputs = testing.prefill_inputs(case)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    # A fused projection buffer [B, T, 3 * H * K] with q, k, v as views into it.
    fused = np.concatenate([q.reshape(2, 50, -1), k.reshape(2, 50, -1), v.reshape(2, 50, -1)], -1)
    qv = fused[..., :32].reshape(2, 50, 2, 16)
    kv = fused[..., 32:64].reshape(2, 50, 2, 16)
    vv = fused[..., 64:].reshape(2, 50, 2, 16)
    assert qv.strides[1] == 3 * 32 * 4
    for a in (qv, kv, vv):
        a.flags.writeable = False
    kw = dict(A_log=inputs["A_log"], dt_bias=inputs["dt_bias"],
              initial_state=inputs["initial_state"], output_final_state=True,
              **testing.prefill_kwargs(case))
    o1, f1, _ = kdakit.prefill(q, k, v, inputs["g"], inputs["beta"], **kw)
    o2, f2, _ = kdakit.prefill(qv, kv, vv, inputs["g"], inputs["beta"], **kw)
    assert np.array_equal(o1, o2) and np.array_equal(f1, f2)


def test_runs_are_bitwise_reproducible():
    case = testing.PrefillCase(name="repeat", seqlens=(200, 57), H=2, K=32, V=32, dtype="float32")
    inputs = testing.prefill_inputs(case)
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"])
    kw = dict(A_log=inputs["A_log"], dt_bias=inputs["dt_bias"], cu_seqlens=inputs["cu_seqlens"],
              initial_state=inputs["initial_state"], output_final_state=True,
              **testing.prefill_kwargs(case))
    first = kdakit.prefill(*args, **kw)
    for _ in range(3):
        again = kdakit.prefill(*args, **kw)
        assert np.array_equal(first.o, again.o) and np.array_equal(first.final_state, again.final_state)


def test_deprecated_transpose_state_layout_alias():
    case = testing.PrefillCase(name="alias", seqlens=(33,), packed=False, H=1, K=16, V=8,
                               dtype="float32")
    inputs = testing.prefill_inputs(case)
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"])
    # NOTE: the inputs are drawn for the in-kernel q/k norm and beta sigmoid (the case's
    # defaults); without them the recurrence diverges and fp32 paths drift apart past the bar.
    flags = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    kw = dict(initial_state=inputs["initial_state"], output_final_state=True,
              use_gate_in_kernel=True, lower_bound=-5.0, A_log=inputs["A_log"], **flags)
    o_new, f_new = kdakit.chunk_kda(*args, state_v_first=True, **kw)
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        o_old, f_old = kdakit.chunk_kda(*args, transpose_state_layout=True, **kw)
    assert np.array_equal(o_new, o_old) and np.array_equal(f_new, f_old)
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        o_rec, _ = kdakit.fused_recurrent_kda(*args, inputs["A_log"], None,
                                              initial_state=inputs["initial_state"],
                                              use_gate_in_kernel=True, lower_bound=-5.0,
                                              transpose_state_layout=True, **flags)
    testing.assert_close(o_rec, o_new, CHUNKED_BAR, "o")


def test_main_job_cpu_case_runs_and_meets_the_bar(capsys):
    from kdakit.__main__ import main

    assert main(["bench", "--cpu", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 3 and "rel_l2" in out


@pytest.mark.parametrize("seqlens,packed", [((0, 0), False), ((), True), ((0, 0, 0), True)],
                         ids=["fixed-T0", "packed-N0", "packed-all-empty"])
def test_degenerate_batches_pass_states_through(seqlens, packed):
    case = testing.PrefillCase(name="empty", seqlens=seqlens, packed=packed, H=1, K=16, V=16,
                               dtype="float32", state_layout="k_first", category="corner")
    x = testing.prefill_inputs(case)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    kw = dict(initial_state=x["initial_state"], output_final_state=True, use_gate_in_kernel=True,
              lower_bound=-5.0, A_log=x["A_log"], cu_seqlens=x["cu_seqlens"])
    for fn in (kdakit.chunk_kda, kdakit.fused_recurrent_kda):
        o, final = fn(*args, **kw)
        assert o.shape == x["v"].shape
        assert np.array_equal(final, x["initial_state"]), fn.__name__
