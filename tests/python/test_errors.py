"""Bad arguments raise ValueError (values, shapes), TypeError (dtypes, devices, array types) or
NotImplementedError (valid but unsupported) naming the argument (CONTRACT.md section 5), from
the Python layer, the binding or the C++ validation alike; nothing is written on failure."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kdakit
from kdakit import testing

CASE = testing.PrefillCase(name="err", seqlens=(20, 20), packed=False, H=2, K=16, V=16,
                           dtype="float32")


@pytest.fixture
def x():
    """Fresh valid inputs (lower-bound gate) as a dict."""
    return testing.prefill_inputs(CASE)


def fla(x, **overrides):
    kw = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"],
              dt_bias=x["dt_bias"], initial_state=None, use_gate_in_kernel=True,
              lower_bound=-5.0, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    kw.update(overrides)
    return kdakit.chunk_kda(**kw)


def raises(exc, name):
    """pytest.raises for an error whose message names the argument ``name``."""
    return pytest.raises(exc, match=rf"(^|\W){re.escape(name)}\W")


def test_the_baseline_is_valid(x):
    o, _ = fla(x)
    assert o.shape == x["v"].shape


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_wrong_rank(x, name):
    with raises(ValueError, name):
        fla(x, **{name: x[name][0]})


def test_k_shape_mismatch(x):
    with raises(ValueError, "k"):
        fla(x, k=np.ascontiguousarray(x["k"][:, :10]))


def test_g_and_beta_shapes(x):
    with raises(ValueError, "g"):
        fla(x, g=np.ascontiguousarray(x["g"][..., :8]))
    with raises(ValueError, "beta"):
        fla(x, beta=np.ascontiguousarray(x["beta"][:, :, :1]))


def test_dtype_mismatch_and_unsupported_dtype(x):
    with raises(TypeError, "v"):
        fla(x, v=x["v"].astype(np.float16))
    with raises(TypeError, "q"):
        fla(x, q=x["q"].astype(np.float64), k=x["k"].astype(np.float64))


def test_non_array_argument(x):
    with raises(TypeError, "q"):
        fla(x, q=x["q"].tolist())


def test_gate_arguments(x):
    with raises(ValueError, "A_log"):
        fla(x, lower_bound=None, A_log=None)
    with raises(ValueError, "lower_bound"):
        fla(x, lower_bound=-6.0)
    with raises(ValueError, "lower_bound"):
        fla(x, lower_bound=None, safe_gate=True)
    with raises(ValueError, "A_log"):
        fla(x, A_log=x["A_log"][:1])
    with raises(TypeError, "A_log"):
        fla(x, A_log=x["A_log"].astype(np.float64))
    with raises(ValueError, "dt_bias"):
        fla(x, dt_bias=x["dt_bias"][:5])


def test_allow_neg_eigval_needs_beta_sigmoid(x):
    with raises(ValueError, "allow_neg_eigval"):
        fla(x, allow_neg_eigval=True, use_beta_sigmoid_in_kernel=False)


def test_gva_heads_must_divide(x):
    q3 = np.ascontiguousarray(np.concatenate([x["q"], x["q"][:, :, :1]], axis=2))
    with raises(ValueError, "v"):
        fla(x, q=q3, k=q3)


def test_packed_batch_arguments(x):
    cu = np.array([0, 10, 20], dtype=np.int64)
    with raises(ValueError, "cu_seqlens"):
        fla(x, cu_seqlens=cu)  # B = 2
    flat = {n: np.ascontiguousarray(x[n].reshape((1, 40) + x[n].shape[2:]))
            for n in ("q", "k", "v", "g", "beta")}
    flat.update(A_log=x["A_log"], dt_bias=x["dt_bias"])
    with raises(TypeError, "cu_seqlens"):
        fla(flat, cu_seqlens=cu.astype(np.float32))
    with raises(ValueError, "initial_state"):
        fla(flat, cu_seqlens=cu, initial_state=np.zeros((3, 2, 16, 16), np.float32))


def test_state_shape_and_dtype(x):
    with raises(ValueError, "initial_state"):
        fla(x, initial_state=np.zeros((2, 2, 16, 8), np.float32))
    with raises(TypeError, "initial_state"):
        fla(x, initial_state=np.zeros((2, 2, 16, 16), np.float16))


def test_last_dim_must_be_contiguous(x):
    wide = np.repeat(x["q"], 2, axis=-1)[..., ::2]
    with raises(ValueError, "q"):
        fla(x, q=wide)


def test_unsupported_head_dim_is_not_implemented_from_cpp():
    case = CASE.with_(K=300, V=8, seqlens=(2,))
    x = testing.prefill_inputs(case)
    with pytest.raises(NotImplementedError, match="K = 300"):
        fla(x)


def test_fla_keyword_arguments(x):
    with pytest.raises(TypeError, match="unexpected keyword"):
        fla(x, chunk_sz=64)
    with raises(ValueError, "chunk_size"):
        fla(x, chunk_size=16)
    with pytest.raises(NotImplementedError, match="cp_context"):
        fla(x, cp_context=object())
    with raises(ValueError, "state_v_first"):
        fla(x, state_v_first=True, transpose_state_layout=True)


def test_native_gate_names(x):
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    with raises(ValueError, "gate"):
        kdakit.prefill(*args, gate="sigmoid")
    with raises(ValueError, "lower_bound"):
        kdakit.prefill(*args, gate="lower_bound")
    with raises(ValueError, "lower_bound"):
        kdakit.prefill(*args, gate="softplus", A_log=x["A_log"], lower_bound=-5.0)
    with raises(ValueError, "A_log"):
        kdakit.prefill(*args, gate="precomputed", A_log=x["A_log"])
    with raises(ValueError, "state_layout"):
        kdakit.prefill(*args, state_layout="vk")


def test_native_backend_choice(x):
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    with raises(ValueError, "backend"):
        kdakit.prefill(*args, backend="cuda")
    with raises(ValueError, "backend"):
        kdakit.prefill(*args, backend="fast")


def test_chunk_states_capacity(x):
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    small = np.zeros((1, 2, 16, 16), np.float32)  # needs B * ceil(20 / 64) = 2
    with raises(ValueError, "num_chunk_states"):
        kdakit.prefill(*args, chunk_state_interval=64, chunk_states=small)
    with raises(ValueError, "chunk_state_interval"):
        kdakit.prefill(*args, chunk_state_interval=48)


def test_partial_state_aliasing_is_rejected(x):
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    buf = np.zeros((3, 2, 16, 16), np.float32)
    with raises(ValueError, "final_state"):
        kdakit.prefill(*args, initial_state=buf[:2], final_state=buf[1:])


def test_decode_arguments():
    case = testing.DecodeCase(name="err", batch=2, H=2, K=16, V=16, dtype="float32")
    d = testing.decode_inputs(case)
    args = (d["q"], d["k"], d["v"], d["g"], d["beta"])
    kw = dict(A_log=d["A_log"], dt_bias=d["dt_bias"], **testing.decode_kwargs(case))
    with raises(TypeError, "state_indices"):
        kdakit.decode(*args, d["state"], d["state_indices"].astype(np.int64), **kw)
    with raises(ValueError, "state_indices"):
        kdakit.decode(*args, d["state"], d["state_indices"][:1], **kw)
    with raises(ValueError, "state"):
        kdakit.decode(*args, d["state"][:, :, :8], d["state_indices"], **kw)
    with raises(ValueError, "backend"):
        kdakit.decode(*args, d["state"], d["state_indices"], backend="chunked", **kw)
    with raises(ValueError, "num_accepted_tokens"):
        kdakit.decode(*args, d["state"], d["state_indices"],
                      num_accepted_tokens=np.ones(3, np.int32), **kw)


def test_fused_recurrent_pool_arguments():
    case = testing.DecodeCase(name="err", batch=2, H=2, K=16, V=16, dtype="float32")
    d = testing.decode_inputs(case)
    args = (d["q"], d["k"], d["v"], d["g"], d["beta"])
    with pytest.raises(NotImplementedError, match="inplace_final_state"):
        kdakit.fused_recurrent_kda(*args, initial_state=d["state"],
                                   ssm_state_indices=d["state_indices"], inplace_final_state=False)
    with raises(ValueError, "initial_state"):
        kdakit.fused_recurrent_kda(*args, ssm_state_indices=d["state_indices"])
    with pytest.raises(NotImplementedError, match="beta"):
        kdakit.fused_recurrent_kda(*args[:4], np.zeros((2, 1, 2, 16), np.float32))


def test_failed_call_leaves_the_pool_unchanged():
    case = testing.DecodeCase(name="err", batch=2, H=2, K=16, V=16, dtype="float32")
    d = testing.decode_inputs(case)
    before = d["state"].copy()
    with raises(ValueError, "lower_bound"):
        kdakit.decode(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], d["state_indices"],
                      gate="lower_bound", lower_bound=1.0, A_log=d["A_log"])
    assert np.array_equal(d["state"], before)


def test_cpu_calls_take_no_stream_and_need_no_workspace(x):
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    assert kdakit.prefill_workspace_size(*args) == 0
    with raises(ValueError, "stream"):
        kdakit.prefill(*args, stream=1)
    with pytest.raises(TypeError, match="unexpected arguments"):
        kdakit.prefill_workspace_size(*args, gates="softplus")


def test_pool_arguments_of_prefill(x):
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    pool = np.zeros((5, 2, 16, 16), np.float32)
    idx = np.array([0, 1], np.int32)
    # One pool read through indices and written densely is partial aliasing.
    with pytest.raises(ValueError, match="final_state: partial state aliasing"):
        kdakit.prefill(*args, initial_state=pool, initial_state_indices=idx, final_state=pool[:2])
    # Read slot a, write slot b of one pool is fine; a shifted view of it is not.
    kdakit.prefill(*args, initial_state=pool, initial_state_indices=idx, final_state=pool,
                   final_state_indices=np.array([2, 3], np.int32))
    with pytest.raises(ValueError, match="final_state: partial state aliasing"):
        kdakit.prefill(*args, initial_state=pool[:4], initial_state_indices=idx,
                       final_state=pool[1:], final_state_indices=idx)  # 4 slots each


def test_chunk_state_pool_arguments(x):
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    rows = np.zeros((4, 2, 16, 16), np.float32)
    idx = np.array([0, 1], np.int32)  # B * ceil(20 / 64) = 2 entries
    with raises(ValueError, "chunk_states"):
        kdakit.prefill(*args, chunk_state_interval=64, chunk_state_indices=idx)
    with raises(TypeError, "chunk_state_indices"):
        kdakit.prefill(*args, chunk_state_interval=64, chunk_states=rows,
                       chunk_state_indices=idx.astype(np.int64))
    with raises(ValueError, "chunk_state_indices"):
        kdakit.prefill(*args, chunk_state_interval=64, chunk_states=rows,
                       chunk_state_indices=idx[:1])
    with raises(ValueError, "chunk_states"):
        kdakit.prefill(*args, chunk_state_interval=64, chunk_states=rows[:, :1],
                       chunk_state_indices=idx)
    with raises(ValueError, "chunk_states"):
        kdakit.prefill(*args, chunk_state_interval=64, chunk_states=rows.reshape(2, 2, 2, 16, 16),
                       chunk_state_indices=idx)
    # Into the state pool: only as the same pool (same array), indexed on both sides.
    pool = np.zeros((6, 2, 16, 16), np.float32)
    kdakit.prefill(*args, initial_state=pool, initial_state_indices=idx, final_state=pool,
                   final_state_indices=np.array([2, 3], np.int32), chunk_state_interval=64,
                   chunk_states=pool, chunk_state_indices=np.array([4, 5], np.int32))
    with raises(ValueError, "chunk_states"):
        kdakit.prefill(*args, initial_state=pool, initial_state_indices=idx, final_state=pool,
                       final_state_indices=idx, chunk_state_interval=64, chunk_states=pool[1:],
                       chunk_state_indices=idx)
    with raises(ValueError, "chunk_states"):
        kdakit.prefill(*args, initial_state=pool[:2], output_final_state=True,
                       chunk_state_interval=64, chunk_states=pool, chunk_state_indices=idx)


def test_chunk_kda_pool_arguments(x):
    pool = np.zeros((4, 2, 16, 16), np.float32)
    idx = np.array([0, 1], np.int32)
    with raises(ValueError, "initial_state"):
        fla(x, initial_state_indices=idx)
    with raises(ValueError, "final_state_indices"):
        fla(x, final_state_indices=idx)
    with raises(ValueError, "output_intermediate_states"):
        fla(x, return_intermediate_states=True, output_intermediate_states=False)
    with raises(TypeError, "initial_state_indices"):
        fla(x, initial_state=pool, initial_state_indices=idx.astype(np.int64))
    o, state = fla(x, initial_state=pool, initial_state_indices=idx)
    assert state is pool


def test_chunk_kda_use_graph(x):
    """FLA 0.6.0's use_graph / max_num_seqs: cu_seqlens padded with zero-length tail sequences
    gives the unpadded result (kdakit is graph-safe for any cu_seqlens); a length that does not
    match max_num_seqs is named."""
    packed = {name: x[name].reshape(1, -1, *x[name].shape[2:]) for name in ("q", "k", "v", "g", "beta")}
    cu = np.array([0, 20, 40], np.int64)
    padded = np.array([0, 20, 40, 40, 40], np.int64)
    o_ref, _ = fla(x, **packed, cu_seqlens=cu)
    o, _ = fla(x, **packed, cu_seqlens=padded, use_graph=True, max_num_seqs=4)
    np.testing.assert_array_equal(o, o_ref)
    with raises(ValueError, "cu_seqlens"):
        fla(x, **packed, cu_seqlens=padded, use_graph=True, max_num_seqs=3)
    with raises(ValueError, "cu_seqlens"):  # a fixed batch has no sequence list to pad
        fla(x, **packed, use_graph=True, max_num_seqs=1)
