"""Arrays on a GPU other than the caller's current device (several GPUs in one process): the
extension makes the arrays' device current for the call (src/bindings/common.h,
ScopedCudaDevice) and restores the caller's, so prefill, its workspace size and decode run on
the arrays' device, against the float64 reference. Skipped with fewer than two CUDA devices."""

from __future__ import annotations

import pytest

import kdakit
from kdakit import testing

pytestmark = pytest.mark.requires_cuda

OUTPUT_BAR = 4e-3
STATE_BAR = 2e-3


def _two_devices():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    return torch


def _cpu(x):
    return None if x is None else x.cpu()


def test_prefill_on_the_arrays_device_not_the_current_one():
    torch = _two_devices()
    case = testing.PrefillCase(name="dev1", seqlens=(130, 0, 77), H=2, K=128, V=128)
    with torch.cuda.device(0):
        x = testing.prefill_inputs(case, lib="torch", device="cuda:1")
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
        kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
                  initial_state=x["initial_state"], output_final_state=True, **testing.prefill_kwargs(case))
        size = kdakit.prefill_workspace_size(*args, **kw)
        got = kdakit.prefill(*args, **kw)
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0, "the caller's current device must be restored"
    assert got.o.device == torch.device("cuda:1")
    assert size >= 0
    ref = kdakit.prefill(*(a.cpu() for a in args), **{k: _cpu(v) if hasattr(v, "cpu") else v for k, v in kw.items()},
                         backend="reference")
    testing.assert_close(got.o, ref.o, OUTPUT_BAR, "o")
    testing.assert_close(got.final_state, ref.final_state, STATE_BAR, "final_state")


def test_decode_on_the_arrays_device_not_the_current_one():
    torch = _two_devices()
    case = testing.DecodeCase(name="dev1", batch=5, H=2, HV=4, K=128, V=128, dtype="float32", padding_rows=1)
    with torch.cuda.device(0):
        x = testing.decode_inputs(case, lib="torch", device="cuda:1")
        pool = x["state"]
        before = pool.cpu()
        o = kdakit.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["state_indices"], A_log=x["A_log"],
                          dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
                          num_accepted_tokens=x["num_accepted_tokens"], **testing.decode_kwargs(case))
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0, "the caller's current device must be restored"
    ref_pool = before.clone()
    o_ref = kdakit.decode(*(x[n].cpu() for n in ("q", "k", "v", "g", "beta")), ref_pool, x["state_indices"].cpu(),
                          A_log=_cpu(x["A_log"]), dt_bias=_cpu(x["dt_bias"]), cu_seqlens=_cpu(x["cu_seqlens"]),
                          num_accepted_tokens=_cpu(x["num_accepted_tokens"]), backend="reference",
                          **testing.decode_kwargs(case))
    testing.assert_close(o, o_ref, OUTPUT_BAR, "o")
    testing.assert_close(pool, ref_pool, STATE_BAR, "state pool")
