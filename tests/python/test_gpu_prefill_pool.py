"""The CUDA prefill straight from a state pool, through the Python package, against the float64
CPU reference backend on copies of the same inputs: one pool read through
``initial_state_indices`` and written through other ``final_state_indices`` (prefix caching;
slot stride padded, fp32 and bf16, both layouts, chunked and token-serial paths), boundary
states every 64 and every 1024 tokens, the round trip "prefill, save the boundary state,
prefill the rest from it" against one prefill, chunk_kda's SGLang-style pool arguments, and
CUDA-graph replay. Slots nobody writes must keep their bits. Features the kernels do not build
yet (chunk states into pool rows, chunk states in another dtype) must raise
NotImplementedError naming the argument, or else match the reference. Skipped without torch,
a CUDA device or a CUDA build.

Bars (CONTRACT.md section 6): output 4e-3, fp32 state 2e-3; a bf16 state adds its own storage
rounding (8e-3)."""

from __future__ import annotations

import numpy as np
import pytest

import kdakit
from kdakit import testing

pytestmark = pytest.mark.requires_cuda

OUTPUT_BAR = 4e-3
STATE_BAR = {"float32": 2e-3, "bfloat16": 8e-3}


def _cpu(v):
    return v.cpu() if hasattr(v, "cpu") else v


def _setup(seqlens, slots, state_dtype="float32", state_layout="v_first", H=2):
    """Inputs of a packed K = V = 128 case on CUDA and a pool of `slots` slots whose slot stride
    is padded (a slice of a wider buffer), as (case, inputs, pool)."""
    import torch

    case = testing.PrefillCase(name="pool", seqlens=tuple(seqlens), H=H, K=128, V=128,
                               state_dtype=state_dtype, state_layout=state_layout)
    x = testing.prefill_inputs(case, lib="torch", device="cuda")
    wide = 0.1 * torch.randn((slots, case.num_v_heads + 1, 128, 128), device="cuda")
    pool = wide.to(getattr(torch, state_dtype))[:, : case.num_v_heads]
    assert (slots == 1 or not pool.is_contiguous()) and pool[0].is_contiguous()
    return case, x, pool


def _kw(case, x, cpu=False):
    kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
              **testing.prefill_kwargs(case))
    return {k: _cpu(v) for k, v in kw.items()} if cpu else kw


def _args(x, cpu=False):
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    return tuple(a.cpu() for a in args) if cpu else args


def _int32(values):
    import torch

    return torch.tensor(values, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("state_dtype,state_layout,seqlens", [
    ("float32", "v_first", (300, 0, 129, 64, 1000)),
    ("bfloat16", "k_first", (300, 0, 129, 64, 1000)),
    ("float32", "v_first", (1, 2, 3, 5, 8, 13, 21, 0, 16)),  # token-serial path
])
def test_read_a_cached_slot_write_a_new_one(state_dtype, state_layout, seqlens):
    import torch

    N = len(seqlens)
    case, x, pool = _setup(seqlens, 2 * N + 3, state_dtype, state_layout)
    perm = np.random.default_rng().permutation(2 * N + 3)
    read = perm[:N].astype(np.int32)
    read[1] = -1  # starts from zeros
    write = perm[N: 2 * N].astype(np.int32)
    write[2] = -1  # not written
    before = pool.clone()
    pool_cpu = pool.cpu()
    got = kdakit.prefill(*_args(x), **_kw(case, x), initial_state=pool,
                         initial_state_indices=_int32(read), final_state=pool,
                         final_state_indices=_int32(write))
    ref = kdakit.prefill(*_args(x, True), **_kw(case, x, True), initial_state=pool_cpu,
                         initial_state_indices=torch.from_numpy(read), final_state=pool_cpu,
                         final_state_indices=torch.from_numpy(write), backend="reference")
    testing.assert_close(got.o, ref.o, OUTPUT_BAR, "o")
    testing.assert_close(pool, pool_cpu, STATE_BAR[state_dtype], "pool")
    untouched = sorted(set(range(pool.shape[0])) - set(write.tolist()))
    assert torch.equal(pool[untouched], before[untouched]), "a slot nobody writes changed"


@pytest.mark.parametrize("interval", [64, 1024])
def test_boundary_states_match_reference(interval):
    seqlens = (2100, 0, 1024, 700)
    case, x, pool = _setup(seqlens, 4)
    cu_cpu = x["cu_seqlens"].cpu()
    kw = dict(initial_state=x["initial_state"], output_final_state=True,
              chunk_state_interval=interval, cu_seqlens_cpu=cu_cpu)
    got = kdakit.prefill(*_args(x), **_kw(case, x), **kw)
    kw_cpu = {k: _cpu(v) for k, v in kw.items()}
    ref = kdakit.prefill(*_args(x, True), **_kw(case, x, True), **kw_cpu, backend="reference")
    assert got.chunk_states.shape[0] == sum(-(-n // interval) for n in seqlens)
    testing.assert_close(got.o, ref.o, OUTPUT_BAR, "o")
    testing.assert_close(got.chunk_states, ref.chunk_states, STATE_BAR["float32"], "chunk_states")
    testing.assert_close(got.final_state, ref.final_state, STATE_BAR["float32"], "final_state")


@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_prefill_in_pieces_equals_one_prefill(state_dtype):
    """Save each sequence's state at a 64-token offset (a dense chunk state, picked on the
    host), prefill the rest of the sequence from it: the outputs and final states of one
    prefill, within the bar (the measured errors are printed)."""
    import torch

    seqlens = (1000, 333, 64, 700)
    split = (512, 128, 0, 640)
    case, x, _ = _setup(seqlens, 1, state_dtype)
    init = x["initial_state"].to(getattr(torch, state_dtype))
    whole = kdakit.prefill(*_args(x), **_kw(case, x), initial_state=init, output_final_state=True,
                           chunk_state_interval=64, cu_seqlens_cpu=x["cu_seqlens"].cpu())
    entry = np.cumsum([0] + [-(-n // 64) for n in seqlens])[:-1] + np.array(split) // 64
    boundary = whole.chunk_states[torch.from_numpy(entry).cuda()].contiguous()

    cu = case.cu_seqlens
    keep = torch.from_numpy(np.concatenate(
        [np.arange(cu[n] + split[n], cu[n + 1]) for n in range(len(seqlens))])).cuda()
    rest = testing.PrefillCase(name="rest", seqlens=tuple(n - s for n, s in zip(seqlens, split)),
                               H=case.H, K=128, V=128, state_dtype=state_dtype)
    xr = dict(x)
    for name in ("q", "k", "v", "g", "beta"):
        xr[name] = x[name][:, keep].contiguous()
    xr["cu_seqlens"] = torch.tensor(rest.cu_seqlens, dtype=torch.int64, device="cuda")
    tail = kdakit.prefill(*_args(xr), **_kw(rest, xr), initial_state=boundary,
                          output_final_state=True)
    head_case = testing.PrefillCase(name="head", seqlens=split, H=case.H, K=128, V=128)
    first = torch.from_numpy(np.concatenate(
        [np.arange(cu[n], cu[n] + split[n]) for n in range(len(seqlens))])).cuda()
    xh = dict(x)
    for name in ("q", "k", "v", "g", "beta"):
        xh[name] = x[name][:, first].contiguous()
    xh["cu_seqlens"] = torch.tensor(head_case.cu_seqlens, dtype=torch.int64, device="cuda")
    head = kdakit.prefill(*_args(xh), **_kw(head_case, xh), initial_state=init,
                          output_final_state=True)

    bar = STATE_BAR[state_dtype]
    c_b = testing.assert_close(boundary, head.final_state, bar, "boundary vs first part")
    c_o = testing.assert_close(tail.o, whole.o[:, keep], OUTPUT_BAR, "o (pieces)")
    c_f = testing.assert_close(tail.final_state, whole.final_state, bar, "final state (pieces)")
    print(c_b.describe(bar), c_o.describe(OUTPUT_BAR), c_f.describe(bar), sep="\n")


def test_chunk_states_into_pool_rows():
    import torch

    seqlens = (200, 64, 130)
    case, x, pool = _setup(seqlens, 10)
    idx = kdakit.chunk_state_indices_at(seqlens, [[128], [0], [64]], [[7], [8], [9]])
    read, write = np.array([0, 1, 2], np.int32), np.array([3, 4, 5], np.int32)
    before, pool_cpu = pool.clone(), pool.cpu()
    kw = dict(initial_state_indices=read, final_state_indices=write, chunk_state_interval=64,
              chunk_state_indices=idx)
    got = kdakit.prefill(*_args(x), **_kw(case, x), initial_state=pool, final_state=pool,
                         chunk_states=pool,
                         **{k: torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v
                            for k, v in kw.items()})
    ref = kdakit.prefill(*_args(x, True), **_kw(case, x, True), initial_state=pool_cpu,
                         final_state=pool_cpu, chunk_states=pool_cpu, backend="reference",
                         **{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                            for k, v in kw.items()})
    testing.assert_close(got.o, ref.o, OUTPUT_BAR, "o")
    testing.assert_close(pool, pool_cpu, STATE_BAR["float32"], "pool")
    assert torch.equal(pool[[0, 1, 2, 6]], before[[0, 1, 2, 6]])


def test_chunk_states_in_their_own_dtype():
    import torch

    case, x, _ = _setup((300, 65), 1)
    kw = dict(initial_state=x["initial_state"], output_final_state=True, chunk_state_interval=64,
              cu_seqlens_cpu=x["cu_seqlens"].cpu(), chunk_state_dtype="bfloat16")
    got = kdakit.prefill(*_args(x), **_kw(case, x), **kw)
    ref = kdakit.prefill(*_args(x, True), **_kw(case, x, True),
                         **{k: _cpu(v) for k, v in kw.items()}, backend="reference")
    assert got.chunk_states.dtype == torch.bfloat16
    testing.assert_close(got.chunk_states, ref.chunk_states, STATE_BAR["bfloat16"], "chunk_states")


def test_chunk_kda_sglang_pool_arguments():
    import torch

    seqlens = (300, 77, 0, 129)
    case, x, _ = _setup(seqlens, 1, H=2)
    pool = 0.1 * torch.randn((6, case.num_v_heads, 128, 128), device="cuda")  # FLA: K-first
    slots = _int32([4, 0, 5, 2])
    before = pool.clone()
    fla = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
               use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, A_log=x["A_log"],
               dt_bias=x["dt_bias"])
    o, state, h = kdakit.chunk_kda(*_args(x), initial_state=pool, initial_state_indices=slots,
                                   output_intermediate_states=True, cu_seqlens=x["cu_seqlens"],
                                   cu_seqlens_cpu=x["cu_seqlens"].cpu(), **fla)
    assert state is pool
    pool_cpu = before.cpu()
    o_ref, _, h_ref = kdakit.chunk_kda(
        *_args(x, True), initial_state=pool_cpu, initial_state_indices=slots.cpu(),
        output_intermediate_states=True, cu_seqlens=x["cu_seqlens"].cpu(),
        **{k: _cpu(v) for k, v in fla.items()})
    testing.assert_close(o, o_ref, OUTPUT_BAR, "o")
    testing.assert_close(h, h_ref, STATE_BAR["float32"], "h")
    testing.assert_close(pool, pool_cpu, STATE_BAR["float32"], "pool")
    assert torch.equal(pool[[1, 3]], before[[1, 3]])


def test_graph_replay_of_a_prefix_caching_step():
    """Captured once (preallocated outputs and workspace), replayed with fresh pool contents:
    the same bits as an eager call on the same contents."""
    import torch

    case, x, pool = _setup((300, 129, 64), 9)
    read, write = _int32([0, 1, -1]), _int32([3, 4, 5])
    out = torch.empty_like(x["v"])
    kw = dict(**_kw(case, x), initial_state=pool, initial_state_indices=read, final_state=pool,
              final_state_indices=write)
    ws = torch.empty(kdakit.prefill_workspace_size(*_args(x), **kw), dtype=torch.uint8,
                     device="cuda")
    start = pool.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kdakit.prefill(*_args(x), **kw, workspace=ws, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    eager_o, eager_pool = out.clone(), pool.clone()
    graph = torch.cuda.CUDAGraph()
    pool.copy_(start)
    with torch.cuda.graph(graph):
        kdakit.prefill(*_args(x), **kw, workspace=ws, out=out)
    pool.copy_(start)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager_o.view(torch.int16))
    assert torch.equal(pool.view(torch.int32), eager_pool.view(torch.int32))
