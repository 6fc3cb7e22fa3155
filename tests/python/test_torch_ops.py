"""kdakit's PyTorch custom ops (kdakit.torch_ops) on CPU tensors, which run the CPU backend:
torch.library.opcheck on kdakit::prefill and kdakit::decode (schema and mutation annotations,
fake implementations, AOT dispatch with static and dynamic shapes), and torch.compile with
fullgraph=True of engine-style code that calls kdakit.chunk_kda, kdakit.prefill with a plan,
and kdakit.fused_recurrent_kda over a pool updated in place: the compiled results (outputs,
pools, states) equal eager ones bit for bit. Skipped when torch is not importable; the CUDA
versions are in test_gpu_graphs.py."""

from __future__ import annotations

import numpy as np
import pytest

from kdakit import testing

torch = pytest.importorskip("torch")
import kdakit  # noqa: E402  (after torch: registers the custom ops)
import kdakit.torch_ops  # noqa: E402, F401
from kdakit._ext import ext  # noqa: E402

PREFILL_CASE = testing.PrefillCase(name="ops", seqlens=(40, 0, 71), H=2, HV=4, K=16, V=16,
                                   dtype="float32")
DECODE_CASE = testing.DecodeCase(name="ops", batch=3, H=2, HV=4, K=16, V=16, dtype="float32",
                                 padding_rows=1)


def _prefill_op_args(x, *, in_place=False, read_elsewhere=False, chunk_states=False,
                     chunk_rows_in_pool=False, cu=True):
    """Positional arguments of torch.ops.kdakit.prefill for the inputs ``x``: dense states, a
    pool updated in place (``in_place``; with ``read_elsewhere`` read through other indices
    than the ones written: slot a / slot b), dense chunk states, or chunk states into rows of
    that pool (``chunk_rows_in_pool``, through chunk_state_indices)."""
    case = PREFILL_CASE
    N = case.N if cu else x["q"].shape[0]
    HV, K, V = case.num_v_heads, case.K, case.V
    o = torch.full_like(x["v"], float("nan"))
    pool = idx = read = rows = None
    init, final = x["initial_state"], torch.full((N, HV, V, K), float("nan"))
    if in_place:
        pool = torch.randn(N + 6, HV, V, K) * 0.1
        idx = torch.tensor([3, -1, 0][:N], dtype=torch.int32)
        if read_elsewhere:
            read = torch.tensor([4, 5, 6][:N], dtype=torch.int32)
        init, final = None, pool
    chunks = torch.full((4, HV, V, K), float("nan")) if chunk_states else None
    if chunk_rows_in_pool:
        # entries of seqlens (40, 0, 71) at C = 64: 1 + 0 + 2; rows 1, 2 of the pool, one skipped
        rows = torch.tensor([1, -1, 2], dtype=torch.int32)
        chunks = None
    interval = 64 if chunk_states or chunk_rows_in_pool else 0
    return (x["q"], x["k"], x["v"], x["g"], x["beta"], o, x["A_log"], x["dt_bias"],
            x["cu_seqlens"] if cu else None, init, read, final, idx, chunks, rows, None,
            interval, False, in_place, chunk_rows_in_pool, "lower_bound", "v_first", K ** -0.5,
            -5.0, True, True, False, False, "auto")


OPCHECK_VARIANTS = {
    "dense": {},
    "pool_in_place": dict(in_place=True),
    "pool_read_a_write_b": dict(in_place=True, read_elsewhere=True),
    "chunk_states": dict(chunk_states=True),
    "chunk_rows_in_the_pool": dict(in_place=True, read_elsewhere=True, chunk_rows_in_pool=True),
}


@pytest.mark.parametrize("variant", list(OPCHECK_VARIANTS))
def test_opcheck_prefill(variant):
    x = testing.prefill_inputs(PREFILL_CASE, lib="torch")
    args = _prefill_op_args(x, **OPCHECK_VARIANTS[variant])
    torch.library.opcheck(torch.ops.kdakit.prefill.default, args)


def test_op_pool_flags_match_the_direct_call():
    """state_in_place / chunk_states_in_pool: the op on a pool passed once writes what the
    extension writes when given the pool as initial_state, final_state and chunk_states."""
    x = testing.prefill_inputs(PREFILL_CASE, lib="torch")
    args = list(_prefill_op_args(x, in_place=True, read_elsewhere=True, chunk_rows_in_pool=True))
    pool, o = args[11], args[5]
    start = pool.clone()
    torch.ops.kdakit.prefill(*args)
    via_op, o_op = pool.clone(), o.clone()
    pool.copy_(start)
    o.fill_(float("nan"))
    ext().prefill(*args[:5], o, A_log=args[6], dt_bias=args[7], cu_seqlens=args[8],
                  initial_state=pool, initial_state_indices=args[10], final_state=pool,
                  final_state_indices=args[12], chunk_states=pool, chunk_state_indices=args[14],
                  chunk_state_interval=64, gate="lower_bound", state_layout="v_first",
                  scale=args[22], lower_bound=-5.0, use_qk_l2norm=True, use_beta_sigmoid=True)
    assert torch.equal(via_op, pool) and torch.equal(o_op.nan_to_num(7.0), o.nan_to_num(7.0))
    assert not torch.equal(pool[[0, 1, 2, 3]], start[[0, 1, 2, 3]])
    assert torch.equal(pool[4:], start[4:]), \
        "the slots read (4, 5, 6) and the slots nobody writes must keep their bits"


def test_op_rejects_a_pool_passed_twice_with_the_flags():
    x = testing.prefill_inputs(PREFILL_CASE, lib="torch")
    args = list(_prefill_op_args(x, in_place=True))
    args[9] = args[11]  # initial_state given although state_in_place reads final_state
    with pytest.raises(ValueError, match="state_in_place: pass the state pool once"):
        torch.ops.kdakit.prefill(*args)
    args = list(_prefill_op_args(x, in_place=True, chunk_rows_in_pool=True))
    args[13] = args[11]  # chunk_states given although chunk_states_in_pool writes final_state
    with pytest.raises(ValueError, match="chunk_states_in_pool: pass the state pool once"):
        torch.ops.kdakit.prefill(*args)


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


# Prefix caching from one pool (issue 7) through the op: PREFILL_CASE's sequences (40, 0, 71)
# resume from cached slots 4, 5, 6, write their final states to slots 3, -1 (skipped), 0 and
# their states at token 0 (sequence 0) and 64 (sequence 2) into rows 1 and 2 of the same pool.
POOL_SLOTS = 9
READ, WRITE, ROWS = [4, 5, 6], [3, -1, 0], [1, -1, 2]


def _pool_tensors(lib_tensor):
    HV, K, V = PREFILL_CASE.num_v_heads, PREFILL_CASE.K, PREFILL_CASE.V
    gen = torch.Generator().manual_seed(7)
    pool = torch.randn(POOL_SLOTS, HV, V, K, generator=gen) * 0.1
    idx = [lib_tensor(x) for x in (READ, WRITE, ROWS)]
    return pool, idx


def _prefix_cache_prefill(q, k, v, g, beta, pool, read, write, rows, cu, A_log, dt_bias,
                          plan=None):
    """Read slot a and write slot b of one pool, boundary states into rows of it."""
    return kdakit.prefill(q, k, v, g, beta, gate="lower_bound", lower_bound=-5.0, A_log=A_log,
                          dt_bias=dt_bias, use_qk_l2norm=True, use_beta_sigmoid=True,
                          cu_seqlens=cu, initial_state=pool, initial_state_indices=read,
                          final_state=pool, final_state_indices=write, chunk_state_interval=64,
                          chunk_states=pool, chunk_state_indices=rows, plan=plan).o


def _prefix_cache_step(*args):
    """One prefix-caching layer, then a read of the updated pool."""
    o = _prefix_cache_prefill(*args)
    return o * 2, args[5].amax(dim=(1, 2, 3))


def test_prefix_cache_step_through_the_op_equals_the_direct_call():
    x = testing.prefill_inputs(PREFILL_CASE, lib="torch")
    pool, idx = _pool_tensors(lambda a: torch.tensor(a, dtype=torch.int32))
    start = pool.clone()
    o = _prefix_cache_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, *idx,
                              x["cu_seqlens"], x["A_log"], x["dt_bias"])
    # the same call on numpy arrays goes straight to the extension
    xn = {key: (None if t is None else t.numpy()) for key, t in x.items()}
    pool_np = start.numpy().copy()
    o_np = _prefix_cache_prefill(xn["q"], xn["k"], xn["v"], xn["g"], xn["beta"], pool_np,
                                 *[np.array(a, np.int32) for a in (READ, WRITE, ROWS)],
                                 xn["cu_seqlens"], xn["A_log"], xn["dt_bias"])
    assert np.array_equal(o.numpy(), o_np)
    assert np.array_equal(pool.numpy(), pool_np)
    assert torch.equal(pool[4:], start[4:]), "the cached slots and unnamed rows must stay"
    assert not torch.equal(pool[[0, 1, 2, 3]], start[[0, 1, 2, 3]])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_prefix_cache_step(backend):
    x = testing.prefill_inputs(PREFILL_CASE, lib="torch")
    pool, idx = _pool_tensors(lambda a: torch.tensor(a, dtype=torch.int32))
    plan = kdakit.prefill_plan(x["cu_seqlens"], num_tokens=PREFILL_CASE.T, num_v_heads=4)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    pool_eager, pool_compiled = pool.clone(), pool.clone()
    eager = _prefix_cache_step(*args, pool_eager, *idx, x["cu_seqlens"], x["A_log"],
                               x["dt_bias"], plan)
    torch._dynamo.reset()
    step = torch.compile(_prefix_cache_step, fullgraph=True, backend=backend)
    compiled = step(*args, pool_compiled, *idx, x["cu_seqlens"], x["A_log"], x["dt_bias"], plan)
    assert not torch.equal(pool_eager, pool), "the step must change the pool"
    assert torch.equal(pool_compiled, pool_eager), "the compiled step must update the pool"
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def _sglang_step(q, k, v, g, beta, pool, slots, new_slots, cu, A_log, dt_bias):
    """chunk_kda with SGLang's pool argument, resuming from cached slots into new ones."""
    o, state = kdakit.chunk_kda(q, k, v, g, beta, initial_state=pool,
                                initial_state_indices=slots, final_state_indices=new_slots,
                                cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias, **FLA_KW)
    return o, state.amax(dim=(1, 2, 3))


def test_compile_fullgraph_chunk_kda_sglang_pool():
    x = testing.prefill_inputs(PREFILL_CASE, lib="torch")
    pool, (read, write, _) = _pool_tensors(lambda a: torch.tensor(a, dtype=torch.int32))
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    pool_eager, pool_compiled = pool.clone(), pool.clone()
    eager = _sglang_step(*args, pool_eager, read, write, x["cu_seqlens"], x["A_log"],
                         x["dt_bias"])
    torch._dynamo.reset()
    step = torch.compile(_sglang_step, fullgraph=True, backend="aot_eager")
    compiled = step(*args, pool_compiled, read, write, x["cu_seqlens"], x["A_log"], x["dt_bias"])
    assert torch.equal(pool_compiled, pool_eager)
    assert torch.equal(pool_eager[[4, 5, 6]], pool[[4, 5, 6]]), "the cached slots must stay"
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_chunk_rows_into_the_initial_pool_with_a_dense_final_state():
    """The one pool pattern the op's schema cannot state (chunk rows into the pool the initial
    states come from, final states elsewhere) runs as a direct call, with the numpy results."""
    x = testing.prefill_inputs(PREFILL_CASE, lib="torch")
    pool, (read, _, rows) = _pool_tensors(lambda a: torch.tensor(a, dtype=torch.int32))
    pool_np = pool.numpy().copy()
    kw = dict(gate="lower_bound", lower_bound=-5.0, use_qk_l2norm=True, use_beta_sigmoid=True,
              output_final_state=True, chunk_state_interval=64)
    got = kdakit.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                         dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"], initial_state=pool,
                         initial_state_indices=read, chunk_states=pool, chunk_state_indices=rows,
                         **kw)
    xn = {key: (None if t is None else t.numpy()) for key, t in x.items()}
    want = kdakit.prefill(xn["q"], xn["k"], xn["v"], xn["g"], xn["beta"], A_log=xn["A_log"],
                          dt_bias=xn["dt_bias"], cu_seqlens=xn["cu_seqlens"],
                          initial_state=pool_np, initial_state_indices=read.numpy(),
                          chunk_states=pool_np, chunk_state_indices=rows.numpy(), **kw)
    assert np.array_equal(got.o.numpy(), want.o)
    assert np.array_equal(got.final_state.numpy(), want.final_state)
    assert np.array_equal(pool.numpy(), pool_np)


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
