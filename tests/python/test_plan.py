"""The plan step through the Python package on the CPU backend (numpy arrays): prefill_plan
returns a plan without a workspace that prefill / chunk_kda accept and that changes nothing;
the sizes a plan was built for are checked at every use; bad arguments name themselves; the
workspace size from sizes alone. The GPU side is in test_gpu_graphs.py."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kdakit
from kdakit import testing

CASE = testing.PrefillCase(name="plan", seqlens=(40, 0, 71), H=2, HV=4, K=16, V=16,
                           dtype="float32")


def raises(exc, name):
    """pytest.raises for an error whose message names the argument ``name``."""
    return pytest.raises(exc, match=rf"(^|\W){re.escape(name)}\W")


@pytest.fixture
def x():
    return testing.prefill_inputs(CASE)


def _prefill(x, **extra):
    return kdakit.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                          dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
                          initial_state=x["initial_state"], output_final_state=True,
                          **testing.prefill_kwargs(CASE), **extra)


def test_cpu_plan_is_accepted_and_changes_nothing(x):
    plan = kdakit.prefill_plan(x["cu_seqlens"], num_tokens=CASE.T, num_v_heads=4)
    assert isinstance(plan, kdakit.PrefillPlan)
    assert plan.workspace is None
    assert (plan.batch, plan.seqlen, plan.num_seqs, plan.packed) == (1, CASE.T, 3, True)
    ref = _prefill(x)
    for layer in range(2):  # one plan, several layers
        got = _prefill(x, plan=plan)
        assert np.array_equal(got.o, ref.o), f"layer {layer}: o differs with a plan"
        assert np.array_equal(got.final_state, ref.final_state)


def test_chunk_kda_takes_a_plan(x):
    plan = kdakit.prefill_plan(x["cu_seqlens"], num_tokens=CASE.T, num_v_heads=4)
    kw = dict(initial_state=x["initial_state"], output_final_state=True,
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, state_v_first=True,
              cu_seqlens=x["cu_seqlens"], A_log=x["A_log"], dt_bias=x["dt_bias"])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o_ref, s_ref = kdakit.chunk_kda(*args, **kw)
    o, s = kdakit.chunk_kda(*args, **kw, plan=plan)
    assert np.array_equal(o, o_ref) and np.array_equal(s, s_ref)
    with raises(ValueError, "plan"):
        kdakit.chunk_kda(*args, **dict(kw, cu_seqlens=None, initial_state=None), plan=plan)


def test_fixed_batch_plan():
    case = CASE.with_(seqlens=(33, 33), packed=False)
    x = testing.prefill_inputs(case)
    plan = kdakit.prefill_plan(None, num_tokens=33, num_v_heads=4, batch=2)
    assert (plan.batch, plan.num_seqs, plan.packed) == (2, 2, False)
    got = kdakit.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                         dt_bias=x["dt_bias"], plan=plan, **testing.prefill_kwargs(case))
    ref = kdakit.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                         dt_bias=x["dt_bias"], **testing.prefill_kwargs(case))
    assert np.array_equal(got.o, ref.o)


def test_a_plan_for_other_sizes_is_rejected(x):
    other_T = kdakit.prefill_plan(x["cu_seqlens"], num_tokens=CASE.T + 1, num_v_heads=4)
    with pytest.raises(ValueError, match=r"plan: built for B = 1, T = 112, N = 3, but the call "
                                         r"has B = 1, T = 111, N = 3"):
        _prefill(x, plan=other_T)
    other_N = kdakit.prefill_plan(x["cu_seqlens"][:-1], num_tokens=CASE.T, num_v_heads=4)
    with raises(ValueError, "plan"):
        _prefill(x, plan=other_N)
    fixed = kdakit.prefill_plan(None, num_tokens=CASE.T, num_v_heads=4, batch=1)
    with pytest.raises(ValueError, match="plan: built for a fixed batch"):
        _prefill(x, plan=fixed)
    fewer_heads = kdakit.prefill_plan(x["cu_seqlens"], num_tokens=CASE.T, num_v_heads=2)
    with pytest.raises(ValueError, match="plan: its workspace is sized for 2 value heads"):
        _prefill(x, plan=fewer_heads)
    more_heads = kdakit.prefill_plan(x["cu_seqlens"], num_tokens=CASE.T, num_v_heads=8)
    _prefill(x, plan=more_heads)  # a workspace for more value heads serves fewer


def test_plan_argument_errors(x):
    plan = kdakit.prefill_plan(x["cu_seqlens"], num_tokens=CASE.T, num_v_heads=4)
    with pytest.raises(ValueError, match="plan: carries its own workspace"):
        _prefill(x, plan=plan, workspace=np.zeros(16, np.uint8))
    with raises(TypeError, "plan"):
        _prefill(x, plan=(None, 1, CASE.T, 3, 4, True))


def test_prefill_plan_argument_errors(x):
    cu = x["cu_seqlens"]
    with raises(ValueError, "cu_seqlens"):
        kdakit.prefill_plan(cu.reshape(1, -1), num_tokens=CASE.T, num_v_heads=4)
    with raises(ValueError, "batch"):
        kdakit.prefill_plan(None, num_tokens=CASE.T, num_v_heads=4)
    with raises(ValueError, "batch"):
        kdakit.prefill_plan(cu, num_tokens=CASE.T, num_v_heads=4, batch=2)
    with raises(ValueError, "num_tokens"):
        kdakit.prefill_plan(cu, num_tokens=-1, num_v_heads=4)
    with raises(ValueError, "num_v_heads"):
        kdakit.prefill_plan(cu, num_tokens=CASE.T, num_v_heads=0)
    with raises(TypeError, "num_tokens"):
        kdakit.prefill_plan(cu, num_tokens=float(CASE.T), num_v_heads=4)
    with raises(ValueError, "workspace"):
        kdakit.prefill_plan(cu, num_tokens=CASE.T, num_v_heads=4, workspace=np.zeros(8, np.uint8))
    with raises(ValueError, "stream"):
        kdakit.prefill_plan(cu, num_tokens=CASE.T, num_v_heads=4, stream=1)
    with raises(TypeError, "cu_seqlens"):
        kdakit.prefill_plan([0, 3], num_tokens=3, num_v_heads=4)


def test_native_prefill_plan_needs_cuda_arrays(x):
    from kdakit._ext import ext

    with raises(ValueError, "workspace"):
        ext().prefill_plan(x["cu_seqlens"], np.zeros(1 << 16, np.uint8), seqlen=CASE.T,
                           num_v_heads=4)


def test_workspace_size_from_sizes():
    size = kdakit.prefill_workspace_size(num_tokens=8192, num_v_heads=32, num_seqs=64)
    if not kdakit.built_with_cuda():
        assert size == 0
        return
    assert size > 0
    assert size >= kdakit.prefill_workspace_size(num_tokens=4096, num_v_heads=32, num_seqs=64)
    assert size >= kdakit.prefill_workspace_size(num_tokens=8192, num_v_heads=16, num_seqs=64)
    assert size >= kdakit.prefill_workspace_size(num_tokens=8192, num_v_heads=32, num_seqs=8)
    assert kdakit.prefill_workspace_size(num_tokens=100, num_v_heads=4, batch=2) > 0


def test_workspace_size_form_errors(x):
    with pytest.raises(TypeError, match="sizes form"):
        kdakit.prefill_workspace_size(num_tokens=10, num_v_heads=4, num_seqs=2, gate="softplus")
    with pytest.raises(TypeError, match="num_tokens= and num_v_heads="):
        kdakit.prefill_workspace_size(num_tokens=10)
    with pytest.raises(TypeError, match="either tensors or sizes"):
        kdakit.prefill_workspace_size(x["q"], x["k"], x["v"], x["g"], x["beta"], num_tokens=10)
    with raises(ValueError, "batch"):
        kdakit.prefill_workspace_size(num_tokens=10, num_v_heads=4, num_seqs=2, batch=2)
    with raises(ValueError, "batch"):
        kdakit.prefill_workspace_size(num_tokens=10, num_v_heads=4)
    with raises(ValueError, "num_seqs"):
        kdakit.prefill_workspace_size(num_tokens=10, num_v_heads=4, num_seqs=-1)


def test_host_offsets_give_the_longest_sequence_hint(x):
    """cu_seqlens_cpu (host offsets) becomes the C++ max_seqlen routing hint; without host
    offsets the hint is 0 (unknown: no device read), and a CPU call with it matches one
    without (the hint only chooses among CUDA kernels)."""
    from kdakit import ops

    options = testing.prefill_kwargs(CASE)
    common = dict(
        A_log=x["A_log"], dt_bias=x["dt_bias"], scale=None, scalar_gate=False, cu_seqlens=x["cu_seqlens"],
        initial_state=x["initial_state"], initial_state_indices=None, final_state=None,
        final_state_indices=None, output_final_state=True, state_layout="v_first",
        state_dtype=None, chunk_state_interval=0, chunk_states=None, chunk_state_indices=None,
        chunk_state_dtype=None, out=None, backend="auto",
        **{k: options[k] for k in ("gate", "lower_bound", "use_qk_l2norm", "use_beta_sigmoid",
                                   "allow_neg_eigval")},
    )
    _, _, args = ops._prefill_call(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens_cpu=None, **common)
    assert args["max_seqlen"] == 0
    _, _, args = ops._prefill_call(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                   cu_seqlens_cpu=np.asarray(x["cu_seqlens"]), **common)
    assert args["max_seqlen"] == max(CASE.seqlens) == 71
    with_hint = _prefill(x, cu_seqlens_cpu=np.asarray(x["cu_seqlens"]))
    without = _prefill(x)
    assert np.array_equal(with_hint.o, without.o)
    assert np.array_equal(with_hint.final_state, without.final_state)
    # The extension validates a hint it is handed directly: [0, T], 0 unknown.
    _, arrays, args = ops._prefill_call(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens_cpu=None, **common)
    T = x["q"].shape[1]
    for bad in (-1, T + 1):
        with raises(ValueError, "max_seqlen"):
            ops.ext().prefill(*arrays, **{**args, "max_seqlen": bad})
    ops.ext().prefill(*arrays, **{**args, "max_seqlen": T})
