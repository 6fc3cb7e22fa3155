"""kdakit's PyTorch custom ops (kdakit.torch_ops) on CPU tensors, which run the CPU backend:
torch.library.opcheck on kdakit::prefill and kdakit::decode (schema and mutation annotations,
fake implementations, AOT dispatch with static and dynamic shapes), and torch.compile with
fullgraph=True of engine-style code that calls kdakit.chunk_kda, kdakit.prefill with a plan,
and kdakit.fused_recurrent_kda over a pool updated in place: the compiled results (outputs,
pools, states) equal eager ones bit for bit. Skipped when torch is not importable; the CUDA
versions are in test_gpu_graphs.py."""

from __future__ import annotations

import pytest

from kdakit import testing

torch = pytest.importorskip("torch")
import kdakit  # noqa: E402  (after torch: registers the custom ops)
import kdakit.torch_ops  # noqa: E402, F401

PREFILL_CASE = testing.PrefillCase(name="ops", seqlens=(40, 0, 71), H=2, HV=4, K=16, V=16,
                                   dtype="float32")
DECODE_CASE = testing.DecodeCase(name="ops", batch=3, H=2, HV=4, K=16, V=16, dtype="float32",
                                 padding_rows=1)


def _prefill_op_args(x, *, in_place=False, chunk_states=False, cu=True):
    """Positional arguments of torch.ops.kdakit.prefill for the inputs ``x``."""
    case = PREFILL_CASE
    N = case.N if cu else x["q"].shape[0]
    HV, K, V = case.num_v_heads, case.K, case.V
    o = torch.full_like(x["v"], float("nan"))
    pool = idx = None
    init, final = x["initial_state"], torch.full((N, HV, V, K), float("nan"))
    if in_place:
        pool = torch.randn(N + 2, HV, V, K) * 0.1
        idx = torch.tensor([3, -1, 0][:N], dtype=torch.int32)
        init, final = None, pool
    chunks = torch.full((4, HV, V, K), float("nan")) if chunk_states else None
    return (x["q"], x["k"], x["v"], x["g"], x["beta"], o, x["A_log"], x["dt_bias"],
            x["cu_seqlens"] if cu else None, init, None, final, idx, chunks, None,
            64 if chunk_states else 0, False, in_place, "lower_bound", "v_first", K ** -0.5,
            -5.0, True, True, False, False, "auto")


@pytest.mark.parametrize("variant", ["dense", "pool_in_place", "chunk_states"])
def test_opcheck_prefill(variant):
    x = testing.prefill_inputs(PREFILL_CASE, lib="torch")
    args = _prefill_op_args(x, in_place=variant == "pool_in_place",
                            chunk_states=variant == "chunk_states")
    torch.library.opcheck(torch.ops.kdakit.prefill.default, args)


def test_opcheck_prefill_fixed_batch():
    case = PREFILL_CASE.with_(seqlens=(33, 33), packed=False)
    x = testing.prefill_inputs(case, lib="torch")
    torch.library.opcheck(torch.ops.kdakit.prefill.default, _prefill_op_args(x, cu=False))


def _decode_op_args(x, case):
    o = torch.full_like(x["v"], float("nan"))
    return (x["q"], x["k"], x["v"], x["g"], x["beta"], o, x["state"], x["state_indices"],
            x["A_log"], x["dt_bias"], x["cu_seqlens"], x["num_accepted_tokens"], "lower_bound",
            "v_first", case.K ** -0.5, -5.0, True, True, False, False, False, "auto")


@pytest.mark.parametrize("case", [DECODE_CASE, DECODE_CASE.with_(tokens=3, spec=2),
                                  DECODE_CASE.with_(packed=True, tokens=2)],
                         ids=["one_token", "speculative", "packed"])
def test_opcheck_decode(case):
    x = testing.decode_inputs(case, lib="torch")
    torch.library.opcheck(torch.ops.kdakit.decode.default, _decode_op_args(x, case))


def test_ops_declare_their_mutations():
    prefill = torch.ops.kdakit.prefill.default._schema
    mutated = {a.name for a in prefill.arguments if a.alias_info and a.alias_info.is_write}
    assert mutated == {"o", "final_state", "chunk_states", "workspace"}
    decode = torch.ops.kdakit.decode.default._schema
    assert {a.name for a in decode.arguments if a.alias_info and a.alias_info.is_write} == \
        {"o", "state"}
    plan = torch.ops.kdakit.prefill_plan.default._schema
    assert {a.name for a in plan.arguments if a.alias_info and a.alias_info.is_write} == \
        {"workspace"}


# ------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True)
# ------------------------------------------------------------------------------------------

FLA_KW = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, state_v_first=True)


def _prefill_step(q, k, v, g, beta, h0, cu, A_log, dt_bias, plan):
    """Two KDA layers of one step sharing one plan, with some torch math around them."""
    o1, s1 = kdakit.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                              cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias, plan=plan, **FLA_KW)
    o2, s2 = kdakit.chunk_kda(q * 0.5, k, o1, g, beta, initial_state=s1, output_final_state=True,
                              cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias, plan=plan, **FLA_KW)
    return o1 + o2, s2


def test_compile_fullgraph_prefill_layers_with_plan():
    x = testing.prefill_inputs(PREFILL_CASE, lib="torch")
    plan = kdakit.prefill_plan(x["cu_seqlens"], num_tokens=PREFILL_CASE.T, num_v_heads=4)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["cu_seqlens"],
            x["A_log"], x["dt_bias"], plan)
    eager = _prefill_step(*args)
    torch._dynamo.reset()
    compiled = torch.compile(_prefill_step, fullgraph=True, backend="aot_eager")(*args)
    for name, a, b in zip(("o", "state"), eager, compiled):
        assert torch.equal(a, b), f"{name}: compiled differs from eager"


def _pool_step(q, k, v, g, beta, pool, idx, A_log, dt_bias):
    """A decode step over a pool updated in place, then a read of the updated pool."""
    o, _ = kdakit.fused_recurrent_kda(q, k, v, g, beta, A_log, dt_bias, initial_state=pool,
                                      ssm_state_indices=idx, **FLA_KW)
    return o * 2, pool.amax(dim=(1, 2, 3))  # max: exact in any reduction order


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_decode_pool_in_place(backend):
    x = testing.decode_inputs(DECODE_CASE, lib="torch")
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    pool_eager, pool_compiled = x["state"].clone(), x["state"].clone()
    eager = _pool_step(*args, pool_eager, x["state_indices"], x["A_log"], x["dt_bias"])
    torch._dynamo.reset()
    step = torch.compile(_pool_step, fullgraph=True, backend=backend)
    compiled = step(*args, pool_compiled, x["state_indices"], x["A_log"], x["dt_bias"])
    assert not torch.equal(pool_eager, x["state"]), "the step must change the pool"
    assert torch.equal(pool_compiled, pool_eager), "the compiled step must update the pool"
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def _native_step(q, k, v, g, beta, pool, idx, cu, A_log, dt_bias):
    """kdakit.prefill into a pool in place, then kdakit.decode over the same pool."""
    o = kdakit.prefill(q, k, v, g, beta, gate="lower_bound", lower_bound=-5.0, A_log=A_log,
                       dt_bias=dt_bias, use_qk_l2norm=True, use_beta_sigmoid=True,
                       cu_seqlens=cu, initial_state=pool, initial_state_indices=idx,
                       final_state=pool, final_state_indices=idx).o
    n = idx.shape[0]
    last = o[:, :n].transpose(0, 1).contiguous()  # one more token per sequence
    d = kdakit.decode(q[:, :n].transpose(0, 1).contiguous(), k[:, :n].transpose(0, 1).contiguous(),
                      last, g[:, :n].transpose(0, 1).contiguous(),
                      beta[:, :n].transpose(0, 1).contiguous(), pool, idx, gate="lower_bound",
                      lower_bound=-5.0, A_log=A_log, dt_bias=dt_bias, use_qk_l2norm=True,
                      use_beta_sigmoid=True)
    return o, d


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_native_prefill_then_decode(dynamic):
    case = PREFILL_CASE
    x = testing.prefill_inputs(case, lib="torch")
    HV, K, V = case.num_v_heads, case.K, case.V
    pool = torch.randn(6, HV, V, K) * 0.1
    idx = torch.tensor([4, 1, -1], dtype=torch.int32)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    pool_eager, pool_compiled = pool.clone(), pool.clone()
    eager = _native_step(*args, pool_eager, idx, x["cu_seqlens"], x["A_log"], x["dt_bias"])
    torch._dynamo.reset()
    step = torch.compile(_native_step, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    compiled = step(*args, pool_compiled, idx, x["cu_seqlens"], x["A_log"], x["dt_bias"])
    assert torch.equal(pool_compiled, pool_eager)
    assert not torch.equal(pool_compiled, pool)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def _step_with_plan(q, k, v, g, beta, h0, cu, A_log, dt_bias):
    """The plan built inside the compiled region, from the traced token count."""
    plan = kdakit.prefill_plan(cu, num_tokens=q.shape[1], num_v_heads=v.shape[2])
    return _prefill_step(q, k, v, g, beta, h0, cu, A_log, dt_bias, plan)


def test_compile_fullgraph_plan_inside_the_step_dynamic_shapes():
    torch._dynamo.reset()
    step = torch.compile(_step_with_plan, fullgraph=True, backend="aot_eager", dynamic=True)
    for lengths in ((40, 0, 71), (5, 90, 7, 1)):  # two batch shapes, one compiled graph
        case = PREFILL_CASE.with_(seqlens=lengths)
        x = testing.prefill_inputs(case, lib="torch")
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["cu_seqlens"],
                x["A_log"], x["dt_bias"])
        for a, b in zip(_step_with_plan(*args), step(*args)):
            assert torch.equal(a, b), f"lengths {lengths}: compiled differs from eager"
