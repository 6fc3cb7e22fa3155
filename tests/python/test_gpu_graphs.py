"""Serving integration on the GPU through the Python package: one prefill plan reused by
several layers, CUDA graphs (torch.cuda.CUDAGraph) of a prefill step (prefill_plan + layers)
and of decode steps replayed after rewriting every input buffer (activations, gate parameters,
states and pools, slot indices, accepted counts, the cu_seqlens values with the same N),
explicit and current non-default streams, opcheck of the custom ops on CUDA tensors and a
fullgraph torch.compile of a step. Outputs are poisoned (NaN) before every replay and every
result is compared with the float64 CPU reference (backend="reference") on the same inputs,
so an element a replay does not write, or writes wrong, fails. Skipped without torch, a CUDA
device or a CUDA build.

Bars as in test_gpu_prefill.py / test_gpu_decode.py: prefill output 4e-3, fp32 state 2e-3;
decode output 8e-3 (bf16 rounding), fp32 pool 2e-5, bf16 pool 8e-3."""

from __future__ import annotations

import pytest

import kdakit
from kdakit import testing

pytestmark = pytest.mark.requires_cuda

PREFILL_O_BAR = 4e-3
PREFILL_STATE_BAR = 2e-3
DECODE_O_BAR = 8e-3
DECODE_STATE_BAR = {"float32": 2e-5, "bfloat16": 8e-3}
LB = -5.0
NAN = float("nan")

CASE = testing.PrefillCase(name="serve", seqlens=(130, 0, 77, 300), H=2, HV=4, K=128, V=128)
# New lengths per replay: same N = 4 and at most T = 507 tokens (the rest is an untouched tail).
LENGTHS = [(300, 77, 0, 130), (1, 400, 100, 6), (0, 0, 500, 0), (64, 64, 64, 64)]


def _cu(torch, lengths, dtype=None):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=dtype or torch.int64)


def _cpu(x):
    return None if x is None else x.cpu()


def _native(x, cu, backend="auto", **extra):
    """kdakit.prefill with the serving options (lower-bound gate, q/k norm, beta sigmoid)."""
    return kdakit.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], gate="lower_bound",
                          lower_bound=LB, A_log=x["A_log"], dt_bias=x["dt_bias"],
                          use_qk_l2norm=True, use_beta_sigmoid=True, cu_seqlens=cu,
                          backend=backend, **extra)


def _reference_pool_layer(x, cu, pool, idx):
    """float64 reference of a prefill into a pool in place; returns (o, pool) on the CPU."""
    import torch

    xc = {k: _cpu(v) for k, v in x.items()}
    pool_c, idx_c = pool.cpu(), idx.cpu()  # one index tensor: the in-place update
    out_c = torch.full(tuple(x["v"].shape), NAN, dtype=x["v"].dtype)
    _native(xc, cu.cpu(), backend="reference", initial_state=pool_c, initial_state_indices=idx_c,
            final_state=pool_c, final_state_indices=idx_c, out=out_c)
    return out_c, pool_c


def _reference_dense_layer(x, cu, h0):
    import torch

    xc = {k: _cpu(v) for k, v in x.items()}
    out_c = torch.full(tuple(x["v"].shape), NAN, dtype=x["v"].dtype)
    r = _native(xc, cu.cpu(), backend="reference", initial_state=h0.cpu(),
                output_final_state=True, out=out_c)
    return r.o, r.final_state


def _pool_and_indices(torch, gen, N, slots=7):
    pool = 0.1 * torch.randn((slots, CASE.num_v_heads, 128, 128), generator=gen, device="cuda")
    idx = torch.randperm(slots, generator=gen, device="cuda")[:N].to(torch.int32)
    idx[int(torch.randint(0, N, (1,), generator=gen, device="cuda"))] = -1  # starts from zeros
    return pool, idx


def test_plan_reused_by_layers_matches_reference_and_planning_per_call():
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    x0 = testing.prefill_inputs(CASE, lib="torch", device="cuda")
    cu = x0["cu_seqlens"]
    plan = kdakit.prefill_plan(cu, num_tokens=CASE.T, num_v_heads=CASE.num_v_heads)
    assert plan.workspace is not None and plan.workspace.is_cuda
    for layer in range(3):
        x = testing.prefill_inputs(CASE, lib="torch", device="cuda")
        pool, idx = _pool_and_indices(torch, gen, CASE.N)
        pool_fly = pool.clone()
        o_ref, pool_ref = _reference_pool_layer(x, cu, pool, idx)
        got = _native(x, cu, plan=plan, initial_state=pool, initial_state_indices=idx,
                      final_state=pool, final_state_indices=idx)
        testing.assert_close(got.o, o_ref, PREFILL_O_BAR, f"layer {layer} o")
        testing.assert_close(pool, pool_ref, PREFILL_STATE_BAR, f"layer {layer} pool")
        fly = _native(x, cu, initial_state=pool_fly, initial_state_indices=idx,
                      final_state=pool_fly, final_state_indices=idx)
        assert torch.equal(fly.o.view(torch.int16), got.o.view(torch.int16)), \
            "o: plan reused differs from planning per call"
        assert torch.equal(pool_fly.view(torch.int32), pool.view(torch.int32))


def test_prefill_step_graph_replays_with_new_contents():
    """prefill_plan + a pool layer (kdakit.prefill) + a dense layer (chunk_kda) sharing the
    plan, captured once and replayed with every input rewritten."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    x1 = testing.prefill_inputs(CASE, lib="torch", device="cuda")
    x2 = testing.prefill_inputs(CASE, lib="torch", device="cuda")
    cu = _cu(torch, LENGTHS[0]).cuda()
    T, HV = CASE.T, CASE.num_v_heads
    pool, idx = _pool_and_indices(torch, gen, CASE.N)
    out1 = torch.empty_like(x1["v"])
    ws = torch.empty(kdakit.prefill_workspace_size(num_tokens=T, num_v_heads=HV, num_seqs=CASE.N),
                     dtype=torch.uint8, device="cuda")
    fla_kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, lower_bound=LB, state_v_first=True)

    def step():
        plan = kdakit.prefill_plan(cu, num_tokens=T, num_v_heads=HV, workspace=ws)
        _native(x1, cu, plan=plan, initial_state=pool, initial_state_indices=idx,
                final_state=pool, final_state_indices=idx, out=out1)
        return kdakit.chunk_kda(x2["q"], x2["k"], x2["v"], x2["g"], x2["beta"],
                                initial_state=x2["initial_state"], output_final_state=True,
                                cu_seqlens=cu, A_log=x2["A_log"], dt_bias=x2["dt_bias"],
                                plan=plan, **fla_kw)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o2, final2 = step()

    for replay, lengths in enumerate(LENGTHS + LENGTHS[:1]):
        for x in (x1, x2):
            fresh = testing.prefill_inputs(CASE, lib="torch", device="cuda")
            for key, buf in x.items():
                if buf is not None and key != "cu_seqlens":
                    buf.copy_(fresh[key])
        cu.copy_(_cu(torch, lengths))
        new_pool, new_idx = _pool_and_indices(torch, gen, CASE.N)
        pool.copy_(new_pool)
        idx.copy_(new_idx)
        for buf in (out1, o2, final2):
            buf.fill_(NAN)
        o1_ref, pool_ref = _reference_pool_layer(x1, cu, pool, idx)
        o2_ref, final2_ref = _reference_dense_layer(x2, cu, x2["initial_state"])
        graph.replay()
        torch.cuda.synchronize()
        tag = f"replay {replay} lengths {lengths}"
        testing.assert_close(out1, o1_ref, PREFILL_O_BAR, f"{tag}: layer 1 o", allow_nonfinite=True)
        testing.assert_close(pool, pool_ref, PREFILL_STATE_BAR, f"{tag}: layer 1 pool")
        testing.assert_close(o2, o2_ref, PREFILL_O_BAR, f"{tag}: layer 2 o", allow_nonfinite=True)
        testing.assert_close(final2, final2_ref, PREFILL_STATE_BAR, f"{tag}: layer 2 final state")
        tail = sum(lengths)
        assert torch.isnan(out1[:, tail:].float()).all(), "tokens past cu[N] must stay untouched"


def _decode_inputs(torch, case):
    return testing.decode_inputs(case, lib="torch", device="cuda")


@pytest.mark.parametrize("case", [
    testing.DecodeCase(name="one-token", batch=8, H=4, padding_rows=2),
    testing.DecodeCase(name="bf16-pool", batch=8, H=4, state_dtype="bfloat16", padding_rows=1),
    testing.DecodeCase(name="spec-3", batch=6, H=2, HV=4, tokens=4, spec=3),
    testing.DecodeCase(name="packed", batch=5, H=4, tokens=2, packed=True),
], ids=lambda c: c.name)
def test_decode_graph_replays_with_new_contents(case):
    """kdakit.decode and fused_recurrent_kda (two layers, two pools) in one graph."""
    import torch

    x = _decode_inputs(torch, case)
    pool2 = x["state"].clone()
    out = torch.empty_like(x["v"])
    opts = dict(gate="lower_bound", lower_bound=LB, A_log=x["A_log"], dt_bias=x["dt_bias"],
                use_qk_l2norm=True, use_beta_sigmoid=True, cu_seqlens=x["cu_seqlens"],
                num_accepted_tokens=x["num_accepted_tokens"])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])

    def step():
        kdakit.decode(*args, x["state"], x["state_indices"], out=out, **opts)
        return kdakit.fused_recurrent_kda(
            *args, x["A_log"], x["dt_bias"], initial_state=pool2, use_gate_in_kernel=True,
            lower_bound=LB, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            state_v_first=True, cu_seqlens=x["cu_seqlens"], ssm_state_indices=x["state_indices"],
            num_accepted_tokens=x["num_accepted_tokens"])[0]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out2 = step()

    gen = torch.Generator()
    gen.manual_seed(3)
    for replay in range(3):
        fresh = _decode_inputs(torch, case)  # new tokens, pool, slots, padding, accepted counts
        if case.packed:
            # new offsets, same N: random cut points in [0, T]; tokens past cu[N] stay untouched
            total = int(x["q"].shape[1])
            cuts = torch.sort(torch.randint(0, total + 1, (case.batch,), generator=gen)).values
            fresh["cu_seqlens"] = torch.cat([torch.zeros(1, dtype=torch.int64), cuts]).cuda()
        for key, buf in x.items():
            if buf is not None:
                buf.copy_(fresh[key])
        pool2.copy_(fresh["state"] * 0.5)
        for buf in (out, out2):
            buf.fill_(NAN)
        refs = []
        for pool in (x["state"], pool2):
            pool_c = pool.cpu()
            out_c = torch.full(tuple(out.shape), NAN, dtype=out.dtype)
            xc = {k: _cpu(v) for k, v in x.items()}
            kdakit.decode(xc["q"], xc["k"], xc["v"], xc["g"], xc["beta"], pool_c,
                          xc["state_indices"], out=out_c, backend="reference",
                          **dict(opts, A_log=xc["A_log"], dt_bias=xc["dt_bias"],
                                 cu_seqlens=xc["cu_seqlens"],
                                 num_accepted_tokens=xc["num_accepted_tokens"]))
            refs.append((out_c, pool_c))
        graph.replay()
        torch.cuda.synchronize()
        for layer, (o, pool) in enumerate(((out, x["state"]), (out2, pool2))):
            o_ref, pool_ref = refs[layer]
            tag = f"replay {replay} layer {layer}"
            testing.assert_close(o, o_ref, DECODE_O_BAR, f"{tag}: o", allow_nonfinite=True)
            testing.assert_close(pool, pool_ref, DECODE_STATE_BAR[case.state_dtype],
                                 f"{tag}: pool")
            zero = o_ref.float() == 0
            assert torch.equal(o.float().cpu()[zero], o_ref.float()[zero]), \
                f"{tag}: padding rows must be written as zeros"


def test_explicit_and_current_non_default_streams():
    import torch

    x = testing.prefill_inputs(CASE, lib="torch", device="cuda")
    cu = x["cu_seqlens"]
    o_ref, final_ref = _reference_dense_layer(x, cu, x["initial_state"])
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    # explicit stream argument (the nanobind entry points)
    plan = kdakit.prefill_plan(cu, num_tokens=CASE.T, num_v_heads=CASE.num_v_heads, stream=stream)
    got = _native(x, cu, plan=plan, initial_state=x["initial_state"], output_final_state=True,
                  stream=stream)
    stream.synchronize()
    testing.assert_close(got.o, o_ref, PREFILL_O_BAR, "o (stream=)")
    testing.assert_close(got.final_state, final_ref, PREFILL_STATE_BAR, "final state (stream=)")
    # current stream (the custom ops read torch's current stream)
    with torch.cuda.stream(stream):
        plan = kdakit.prefill_plan(cu, num_tokens=CASE.T, num_v_heads=CASE.num_v_heads)
        again = _native(x, cu, plan=plan, initial_state=x["initial_state"],
                        output_final_state=True)
    stream.synchronize()
    assert torch.equal(again.o.view(torch.int16), got.o.view(torch.int16))
    # decode on an explicit stream
    case = testing.DecodeCase(name="s", batch=4, H=4, padding_rows=1)
    d = _decode_inputs(torch, case)
    torch.cuda.synchronize()  # the inputs were written on the default stream
    pool_c, xc = d["state"].cpu(), {k: _cpu(v) for k, v in d.items()}
    o = kdakit.decode(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], d["state_indices"],
                      gate="lower_bound", lower_bound=LB, A_log=d["A_log"], dt_bias=d["dt_bias"],
                      use_qk_l2norm=True, use_beta_sigmoid=True, stream=stream)
    o_c = kdakit.decode(xc["q"], xc["k"], xc["v"], xc["g"], xc["beta"], pool_c,
                        xc["state_indices"], gate="lower_bound", lower_bound=LB,
                        A_log=xc["A_log"], dt_bias=xc["dt_bias"], use_qk_l2norm=True,
                        use_beta_sigmoid=True, backend="reference")
    stream.synchronize()
    testing.assert_close(o, o_c, DECODE_O_BAR, "decode o (stream=)")
    testing.assert_close(d["state"], pool_c, DECODE_STATE_BAR["float32"], "decode pool (stream=)")


def test_opcheck_custom_ops_on_cuda():
    import torch

    import kdakit.torch_ops  # noqa: F401

    x = testing.prefill_inputs(CASE, lib="torch", device="cuda")
    cu, HV, T = x["cu_seqlens"], CASE.num_v_heads, CASE.T
    ws = torch.zeros(kdakit.prefill_workspace_size(num_tokens=T, num_v_heads=HV, num_seqs=CASE.N),
                     dtype=torch.uint8, device="cuda")
    torch.library.opcheck(torch.ops.kdakit.prefill_plan.default, (cu, ws, 1, T, HV))
    kdakit.prefill_plan(cu, num_tokens=T, num_v_heads=HV, workspace=ws)
    o = torch.empty_like(x["v"])
    final = torch.empty_like(x["initial_state"])
    torch.library.opcheck(torch.ops.kdakit.prefill.default, (
        x["q"], x["k"], x["v"], x["g"], x["beta"], o, x["A_log"], x["dt_bias"], cu,
        x["initial_state"], None, final, None, None, None, ws, 0, True, False, False,
        "lower_bound", "v_first", 128 ** -0.5, LB, True, True, False, False, "auto"))
    case = testing.DecodeCase(name="op", batch=4, H=4, tokens=3, spec=2)
    d = _decode_inputs(torch, case)
    torch.library.opcheck(torch.ops.kdakit.decode.default, (
        d["q"], d["k"], d["v"], d["g"], d["beta"], torch.empty_like(d["v"]), d["state"],
        d["state_indices"], d["A_log"], d["dt_bias"], None, d["num_accepted_tokens"],
        "lower_bound", "v_first", 128 ** -0.5, LB, True, True, False, False, False, "auto"))


def test_compile_fullgraph_step_on_cuda():
    import torch

    x = testing.prefill_inputs(CASE, lib="torch", device="cuda")
    cu = x["cu_seqlens"]
    fla_kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, lower_bound=LB, state_v_first=True)

    def step(q, k, v, g, beta, h0, A_log, dt_bias, plan):
        o1, s1 = kdakit.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                  cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias, plan=plan, **fla_kw)
        o2, s2 = kdakit.chunk_kda(q, k, o1, g, beta, initial_state=s1, output_final_state=True,
                                  cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias, plan=plan, **fla_kw)
        return o1.float() + o2.float(), s2

    plan = kdakit.prefill_plan(cu, num_tokens=CASE.T, num_v_heads=CASE.num_v_heads)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["A_log"],
            x["dt_bias"], plan)
    eager = step(*args)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
