"""torch CPU tensors: outputs come back as torch tensors in the inputs' dtype, bfloat16 works
(inputs and state), gradients are refused, and mixing array libraries is an error. Skipped
when torch is not importable."""

from __future__ import annotations

import numpy as np
import pytest

import kda_numpy
import kdakit
from kdakit import testing

pytest.importorskip("torch")
import torch  # noqa: E402

BF16_BAR = 4e-3  # CONTRACT.md section 6 output bar: bf16 rounding of o dominates
FP32_BAR = 1e-4


def _numpy(x):
    return None if x is None else testing.to_float64(x)


def _reference(case, x):
    init = x["initial_state"]
    init_kf = None if init is None else np.swapaxes(_numpy(init), -1, -2)
    o, final = kda_numpy.kda(
        _numpy(x["q"]), _numpy(x["k"]), _numpy(x["v"]), _numpy(x["g"]), _numpy(x["beta"]),
        gate=case.gate, A_log=_numpy(x["A_log"]), dt_bias=_numpy(x["dt_bias"]),
        lower_bound=case.lower_bound if case.gate == "lower_bound" else None,
        use_qk_l2norm=case.use_qk_l2norm, use_beta_sigmoid=case.use_beta_sigmoid,
        initial_state=init_kf, cu_seqlens=case.cu_seqlens)
    return o, np.swapaxes(final, -1, -2)


@pytest.mark.parametrize("dtype,bar", [("float32", FP32_BAR), ("bfloat16", BF16_BAR)])
def test_chunk_kda_torch_cpu(dtype, bar):
    case = testing.PrefillCase(name="t", seqlens=(70, 0, 33), H=2, HV=4, K=32, V=32, dtype=dtype)
    x = testing.prefill_inputs(case, lib="torch")
    o_ref, final_ref = _reference(case, x)
    o, final = kdakit.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                initial_state=x["initial_state"], output_final_state=True,
                                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                use_beta_sigmoid_in_kernel=True, lower_bound=-5.0,
                                state_v_first=True, cu_seqlens=x["cu_seqlens"],
                                A_log=x["A_log"], dt_bias=x["dt_bias"])
    assert isinstance(o, torch.Tensor) and o.dtype == getattr(torch, dtype)
    assert final.dtype == torch.float32 and final.shape == (3, 4, 32, 32)
    testing.assert_close(o, o_ref, bar, "o")
    testing.assert_close(final, final_ref, bar, "final_state")


def test_decode_bf16_pool_torch_cpu():
    case = testing.DecodeCase(name="bf16", batch=3, H=2, K=32, V=32, dtype="bfloat16",
                              state_dtype="bfloat16")
    x = testing.decode_inputs(case, lib="torch")
    before = x["state"].clone()
    o = kdakit.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["state_indices"],
                      A_log=x["A_log"], dt_bias=x["dt_bias"], **testing.decode_kwargs(case))
    o_ref, pool_ref = kda_numpy.kda_pool_decode(
        _numpy(x["q"]), _numpy(x["k"]), _numpy(x["v"]), _numpy(x["g"]), _numpy(x["beta"]),
        _numpy(before), x["state_indices"].numpy(), gate="lower_bound",
        A_log=_numpy(x["A_log"]), dt_bias=_numpy(x["dt_bias"]), lower_bound=-5.0,
        use_qk_l2norm=True, use_beta_sigmoid=True)
    assert o.dtype == torch.bfloat16 and x["state"].dtype == torch.bfloat16
    testing.assert_close(o, o_ref, BF16_BAR, "o")
    testing.assert_close(x["state"], pool_ref, BF16_BAR, "pool")


def test_fused_recurrent_kda_torch_pool_and_int32_cu_seqlens():
    case = testing.DecodeCase(name="t", batch=3, H=2, K=16, V=16, dtype="float32", packed=True)
    x = testing.decode_inputs(case, lib="torch")
    cu32 = x["cu_seqlens"].to(torch.int32)
    o, pool = kdakit.fused_recurrent_kda(
        x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"],
        initial_state=x["state"], use_gate_in_kernel=True, lower_bound=-5.0,
        use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True,
        cu_seqlens=cu32, ssm_state_indices=x["state_indices"])
    assert pool is x["state"] and isinstance(o, torch.Tensor)
    assert torch.isfinite(o).all()


def test_requires_grad_is_refused():
    case = testing.PrefillCase(name="t", seqlens=(8,), packed=False, H=1, K=16, V=16,
                               dtype="float32", gate="precomputed")
    x = testing.prefill_inputs(case, lib="torch")
    q = x["q"].clone().requires_grad_(True)
    with pytest.raises(NotImplementedError, match="training is not supported yet"):
        kdakit.chunk_kda(q, x["k"], x["v"], x["g"], x["beta"])
    with pytest.raises(RuntimeError, match="training is not supported yet"):
        kdakit.fused_recurrent_kda(q, x["k"], x["v"], x["g"], x["beta"])


def test_mixing_numpy_and_torch_is_a_type_error():
    case = testing.PrefillCase(name="t", seqlens=(8,), packed=False, H=1, K=16, V=16,
                               dtype="float32", gate="precomputed")
    x = testing.prefill_inputs(case, lib="torch")
    with pytest.raises(TypeError, match="k"):
        kdakit.chunk_kda(x["q"], x["k"].numpy(), x["v"], x["g"], x["beta"])


def test_torch_outputs_can_be_preallocated():
    case = testing.PrefillCase(name="t", seqlens=(9, 9), packed=False, H=1, K=16, V=16,
                               dtype="float32")
    x = testing.prefill_inputs(case, lib="torch")
    out = torch.full((2, 9, 1, 16), float("nan"))
    res = kdakit.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                         dt_bias=x["dt_bias"], out=out, **testing.prefill_kwargs(case))
    assert res.o is out and torch.isfinite(out).all()
