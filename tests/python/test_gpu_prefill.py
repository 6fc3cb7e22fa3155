"""The CUDA prefill (plan -> prep -> recurrence kernels) through the Python package, against the
float64 CPU reference backend on the same inputs: kdakit.prefill and the FLA-signature
kdakit.chunk_kda on torch CUDA tensors, every gate, GVA, packed batches with empty sequences,
K-first/V-first and bf16 states, pools updated in place, chunk states, CUDA-graph replay, and
bitwise identical results run to run. Skipped without torch, a CUDA device or a CUDA build.

Bars (CONTRACT.md section 6): output 4e-3, fp32 final state 2e-3; a bf16 state adds its own
storage rounding (8e-3)."""

from __future__ import annotations

import pytest

import kdakit
from kdakit import testing

pytestmark = pytest.mark.requires_cuda

OUTPUT_BAR = 4e-3
STATE_BAR = {"float32": 2e-3, "bfloat16": 8e-3}


def _cases():
    base = testing.PrefillCase(name="", seqlens=(), H=2, K=128, V=128)
    return [
        base.with_(name="fixed-2x200", seqlens=(200, 200), packed=False),
        base.with_(name="packed-empty", seqlens=(130, 0, 1, 64, 257, 0)),
        base.with_(name="softplus-gva", seqlens=(100, 29), H=1, HV=3, gate="softplus"),
        base.with_(name="precomputed", seqlens=(93, 160), gate="precomputed", use_A_log=False,
                   use_dt_bias=False),
        base.with_(name="kfirst", seqlens=(65, 31), state_layout="k_first"),
        base.with_(name="bf16-state", seqlens=(140, 24), state_dtype="bfloat16"),
        base.with_(name="no-initial", seqlens=(66, 0), initial_state=False),
        base.with_(name="neg-eigval", seqlens=(70,), allow_neg_eigval=True),
        base.with_(name="long-1000", seqlens=(1000,), H=1, packed=False),
    ]


def _cpu(x):
    return None if x is None else x.cpu()


def _run(case, x, backend="auto", **extra):
    return kdakit.prefill(
        x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
        cu_seqlens=x["cu_seqlens"], initial_state=x["initial_state"], output_final_state=True,
        state_dtype=case.state_dtype, backend=backend, **testing.prefill_kwargs(case), **extra)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.name)
def test_prefill_matches_reference(case):
    x = testing.prefill_inputs(case, lib="torch", device="cuda")
    got = _run(case, x)
    ref = _run(case, {k: _cpu(v) for k, v in x.items()}, backend="reference")
    testing.assert_close(got.o, ref.o, OUTPUT_BAR, "o")
    testing.assert_close(got.final_state, ref.final_state, STATE_BAR[case.state_dtype], "final_state")
    import torch

    again = _run(case, x)
    bits = torch.int32 if case.state_dtype == "float32" else torch.int16
    assert torch.equal(again.o.view(torch.int16), got.o.view(torch.int16)), "o differs run to run"
    assert torch.equal(again.final_state.view(bits), got.final_state.view(bits)), \
        "final state differs run to run"


def test_pool_in_place_and_chunk_states():
    import torch

    case = testing.PrefillCase(name="pool", seqlens=(90, 0, 140, 3), H=2, K=128, V=128)
    x = testing.prefill_inputs(case, lib="torch", device="cuda")
    HV = case.num_v_heads
    pool = 0.1 * torch.randn((7, HV, 128, 128), device="cuda", dtype=torch.float32)
    idx = torch.tensor([5, 2, -1, 0], dtype=torch.int32, device="cuda")
    pool_cpu, idx_cpu = pool.cpu(), idx.cpu()
    kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], **testing.prefill_kwargs(case))
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    got = kdakit.prefill(*args, **kw, cu_seqlens=x["cu_seqlens"], initial_state=pool,
                         initial_state_indices=idx, final_state=pool, final_state_indices=idx,
                         chunk_state_interval=64, cu_seqlens_cpu=x["cu_seqlens"].cpu())
    ref = kdakit.prefill(*(a.cpu() for a in args), **{k: _cpu(v) if hasattr(v, "cpu") else v
                                                       for k, v in kw.items()},
                         cu_seqlens=x["cu_seqlens"].cpu(), initial_state=pool_cpu,
                         initial_state_indices=idx_cpu, final_state=pool_cpu,
                         final_state_indices=idx_cpu, chunk_state_interval=64,
                         backend="reference")
    testing.assert_close(got.o, ref.o, OUTPUT_BAR, "o")
    testing.assert_close(pool, pool_cpu, STATE_BAR["float32"], "pool (in place)")
    testing.assert_close(got.chunk_states, ref.chunk_states, STATE_BAR["float32"], "chunk_states")


def test_chunk_kda_fla_signature_and_graph_replay():
    import torch

    case = testing.PrefillCase(name="fla", seqlens=(300, 77, 0, 129), H=2, HV=4, K=128, V=128)
    x = testing.prefill_inputs(case, lib="torch", device="cuda")
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, state_v_first=True,
              A_log=x["A_log"], dt_bias=x["dt_bias"])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o, final = kdakit.chunk_kda(*args, initial_state=x["initial_state"],
                                cu_seqlens=x["cu_seqlens"], **kw)
    o_ref, final_ref = kdakit.chunk_kda(*(a.cpu() for a in args),
                                        initial_state=x["initial_state"].cpu(),
                                        cu_seqlens=x["cu_seqlens"].cpu(),
                                        **{k: _cpu(v) if hasattr(v, "cpu") else v for k, v in kw.items()})
    testing.assert_close(o, o_ref, OUTPUT_BAR, "o")
    testing.assert_close(final, final_ref, STATE_BAR["float32"], "final_state")

    # Captured once with preallocated outputs and workspace, replayed: same bits as eager.
    out = torch.empty_like(o)
    fin = torch.empty_like(final)
    pkw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
               initial_state=x["initial_state"], final_state=fin, **testing.prefill_kwargs(case))
    ws = torch.empty(kdakit.prefill_workspace_size(*args, **pkw), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kdakit.prefill(*args, **pkw, workspace=ws, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    eager_o, eager_fin = out.clone(), fin.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kdakit.prefill(*args, **pkw, workspace=ws, out=out)
    out.zero_()
    fin.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager_o.view(torch.int16))
    assert torch.equal(fin.view(torch.int32), eager_fin.view(torch.int32))
