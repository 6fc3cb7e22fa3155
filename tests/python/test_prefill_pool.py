"""Prefill straight from a state pool on the CPU backends (numpy): one pool read through
``initial_state_indices`` and written through other ``final_state_indices`` (prefix caching),
chunk states at chosen token offsets written into pool rows through ``chunk_state_indices``
(``kdakit.chunk_state_indices_at``), everything in one pool, the round trip "prefill, save the
boundary state, prefill the rest from it" against one prefill, and chunk_kda's SGLang-style
pool arguments. The float64 oracle is kda_numpy; untouched slots must keep their bits."""

from __future__ import annotations

import numpy as np
import pytest

import kda_numpy
import kdakit
from kdakit import testing

REFERENCE_BAR = 1e-6
CHUNKED_BAR = 1e-4
BACKENDS = [("reference", REFERENCE_BAR), ("chunked", CHUNKED_BAR)]


def _case(seqlens, **kw):
    return testing.PrefillCase(name="pool", seqlens=tuple(seqlens), H=2, HV=4, K=16, V=32,
                               dtype="float32", **kw)


def _args(x):
    return (x["q"], x["k"], x["v"], x["g"], x["beta"])


def _kw(case, x):
    return dict(A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
                **testing.prefill_kwargs(case))


def _oracle(case, x, init_vf, lo=None, hi=None):
    """kda_numpy over tokens [lo[n], hi[n]) of each sequence (default: all of them), from the
    V-first initial states init_vf [N, HV, V, K]; returns (o [1, T, HV, V] of those tokens in
    place, zeros elsewhere, V-first final states)."""
    cu = case.cu_seqlens
    N = len(case.seqlens)
    lo = [0] * N if lo is None else lo
    hi = list(case.seqlens) if hi is None else hi
    o = np.zeros(x["v"].shape)
    finals = []
    for n in range(N):
        a, b = cu[n] + lo[n], cu[n] + hi[n]
        sl = slice(a, b)
        o_n, f_n = kda_numpy.kda(
            x["q"][:, sl], x["k"][:, sl], x["v"][:, sl], x["g"][:, sl], x["beta"][:, sl],
            gate=case.gate, A_log=x["A_log"], dt_bias=x["dt_bias"],
            lower_bound=case.lower_bound if case.gate == "lower_bound" else None,
            use_qk_l2norm=case.use_qk_l2norm, use_beta_sigmoid=case.use_beta_sigmoid,
            initial_state=np.swapaxes(init_vf[n:n + 1], -1, -2))
        o[:, sl] = o_n
        finals.append(np.swapaxes(f_n[0], -1, -2))
    return o, np.stack(finals)


def _pool(rng, slots, case):
    return (0.1 * rng.standard_normal((slots, case.num_v_heads, case.V, case.K))).astype(np.float32)


@pytest.mark.parametrize("backend,bar", BACKENDS)
def test_read_a_cached_slot_write_a_new_one(backend, bar):
    case = _case((40, 0, 130, 9))
    x = testing.prefill_inputs(case)
    rng = np.random.default_rng()
    pool = _pool(rng, 10, case)
    before = pool.copy()
    read = np.array([3, 7, -1, 3], np.int32)  # two sequences resume from one cached slot
    write = np.array([0, 5, 8, 9], np.int32)
    kdakit.prefill(*_args(x), **_kw(case, x), initial_state=pool, initial_state_indices=read,
                   final_state=pool, final_state_indices=write, backend=backend)
    init = np.stack([before[s] if s >= 0 else np.zeros_like(before[0]) for s in read])
    _, finals = _oracle(case, x, init)
    for n, s in enumerate(write):
        testing.assert_close(pool[s], finals[n], bar, f"slot {s}")
    untouched = sorted(set(range(10)) - set(write.tolist()))
    assert np.array_equal(pool[untouched], before[untouched]), "a slot nobody writes changed"


@pytest.mark.parametrize("backend,bar", BACKENDS)
def test_boundary_states_at_chosen_offsets_into_pool_rows(backend, bar):
    case = _case((200, 64, 1, 130))
    x = testing.prefill_inputs(case)
    offsets = [[64, 192], [0], [], [128]]
    rows = [[4, 1], [6], [], [2]]
    idx = kdakit.chunk_state_indices_at(case.seqlens, offsets, rows)
    assert idx.tolist() == [-1, 4, -1, 1, 6, -1, -1, -1, 2]
    rng = np.random.default_rng()
    cache = _pool(rng, 8, case)
    before = cache.copy()
    kdakit.prefill(*_args(x), **_kw(case, x), initial_state=x["initial_state"],
                   output_final_state=True, chunk_state_interval=64, chunk_states=cache,
                   chunk_state_indices=idx, backend=backend)
    for n, (offs, dests) in enumerate(zip(offsets, rows)):
        for t, r in zip(offs, dests):
            _, want = _oracle(case, x, x["initial_state"], hi=[t] * len(case.seqlens))
            testing.assert_close(cache[r], want[n], bar, f"sequence {n} offset {t} -> row {r}")
    assert np.array_equal(cache[[0, 3, 5, 7]], before[[0, 3, 5, 7]]), "an unnamed row changed"


@pytest.mark.parametrize("backend,bar", BACKENDS)
def test_one_pool_for_everything_and_prefill_in_pieces(backend, bar):
    """vLLM's prefix-caching step in one call: read each sequence's cached slot, write its
    state at a 64-token offset into one new slot and its final state into another, all in one
    pool. Then prefill the rest from the saved slot: the same outputs and final states."""
    case = _case((200, 129, 70))
    x = testing.prefill_inputs(case)
    rng = np.random.default_rng()
    pool = _pool(rng, 12, case)
    before = pool.copy()
    read = np.array([0, 1, -1], np.int32)
    write = np.array([3, 4, 5], np.int32)
    split = [128, 64, 0]
    saved = [6, 7, 8]
    idx = kdakit.chunk_state_indices_at(case.seqlens, [[s] for s in split], [[r] for r in saved])
    whole = kdakit.prefill(*_args(x), **_kw(case, x), initial_state=pool,
                           initial_state_indices=read, final_state=pool,
                           final_state_indices=write, chunk_state_interval=64, chunk_states=pool,
                           chunk_state_indices=idx, backend=backend)
    init = np.stack([before[s] if s >= 0 else np.zeros_like(before[0]) for s in read])
    o_ref, finals = _oracle(case, x, init)
    testing.assert_close(whole.o, o_ref, bar, "o")
    for n in range(3):
        testing.assert_close(pool[write[n]], finals[n], bar, f"final slot {write[n]}")
    untouched = [2, 9, 10, 11]
    assert np.array_equal(pool[untouched], before[untouched])
    assert np.array_equal(pool[[0, 1]], before[[0, 1]]), "the cached slots read must stay"

    # The rest of each sequence, from the saved slots, as its own packed batch.
    cu = case.cu_seqlens
    keep = np.concatenate([np.arange(cu[n] + split[n], cu[n + 1]) for n in range(3)])
    rest = _case([L - s for L, s in zip(case.seqlens, split)])
    xr = {k: (x[k][:, keep] if k in ("q", "k", "v", "g", "beta") else x[k]) for k in x}
    xr = {k: (np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v) for k, v in xr.items()}
    xr["cu_seqlens"] = np.array(rest.cu_seqlens, np.int64)
    tail = kdakit.prefill(*_args(xr), **_kw(rest, xr), initial_state=pool,
                          initial_state_indices=np.array(saved, np.int32),
                          output_final_state=True, backend=backend)
    exact = backend == "chunked"  # same chunk boundaries, fp32 state saved exactly
    o_whole_rest = np.ascontiguousarray(whole.o[:, keep])
    if exact:
        assert np.array_equal(tail.o, o_whole_rest), "pieces: o differs from one prefill"
        assert np.array_equal(tail.final_state, pool[write]), "pieces: final state differs"
    else:
        testing.assert_close(tail.o, o_whole_rest, bar, "o (pieces)")
        testing.assert_close(tail.final_state, pool[write], bar, "final state (pieces)")


def test_chunk_kda_sglang_pool_arguments():
    case = _case((100, 64, 3))
    x = testing.prefill_inputs(case)
    rng = np.random.default_rng()
    pool_kf = np.ascontiguousarray(np.swapaxes(_pool(rng, 6, case), -1, -2))  # FLA: K-first
    before = pool_kf.copy()
    slots = np.array([4, 0, 2], np.int32)
    fla = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
               use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, A_log=x["A_log"],
               dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"])
    o, state, h = kdakit.chunk_kda(*_args(x), initial_state=pool_kf,
                                   initial_state_indices=slots, output_intermediate_states=True,
                                   **fla)
    assert state is pool_kf
    o_dense, final_dense, h_dense = kdakit.chunk_kda(
        *_args(x), initial_state=before[slots], output_final_state=True,
        return_intermediate_states=True, **fla)
    assert np.array_equal(o, o_dense)
    assert np.array_equal(h, h_dense)
    assert np.array_equal(pool_kf[slots], final_dense)
    assert np.array_equal(pool_kf[[1, 3, 5]], before[[1, 3, 5]])

    # A separate write slot per sequence: the cached slots stay.
    pool2 = before.copy()
    kdakit.chunk_kda(*_args(x), initial_state=pool2, initial_state_indices=slots,
                     final_state_indices=np.array([1, 3, 5], np.int32), **fla)
    assert np.array_equal(pool2[[1, 3, 5]], final_dense)
    assert np.array_equal(pool2[[0, 2, 4]], before[[0, 2, 4]])


def test_chunk_state_indices_at_default_rows_and_errors():
    idx = kdakit.chunk_state_indices_at([130, 0, 64], [[0, 128], [], [0]])
    assert idx.dtype == np.int32 and idx.tolist() == [0, -1, 1, 2]
    with pytest.raises(ValueError, match=r"offsets\[0\]: expected multiples of 64"):
        kdakit.chunk_state_indices_at([130], [[100]])
    with pytest.raises(ValueError, match=r"offsets\[0\]: .*its final state covers 128"):
        kdakit.chunk_state_indices_at([128], [[128]])
    with pytest.raises(ValueError, match=r"offsets\[0\]: offset 64 is given twice"):
        kdakit.chunk_state_indices_at([130], [[64, 64]])
    with pytest.raises(ValueError, match=r"rows\[0\]: expected one row per offset"):
        kdakit.chunk_state_indices_at([130], [[64]], [[1, 2]])
    with pytest.raises(ValueError, match="offsets: expected one list per sequence"):
        kdakit.chunk_state_indices_at([130, 5], [[64]])
    with pytest.raises(ValueError, match="interval: expected a positive multiple of 64"):
        kdakit.chunk_state_indices_at([130], [[0]], interval=96)


def test_chunk_states_in_their_own_dtype_torch_cpu(torch):
    """bf16 boundary states from an fp32 state (torch: numpy has no bf16): the chunked path's
    fp32 entries, rounded once; the final state stays fp32."""
    case = _case((150, 64))
    x = testing.prefill_inputs(case, lib="torch")
    kw = dict(**_kw(case, x), initial_state=x["initial_state"], output_final_state=True,
              chunk_state_interval=64)
    fp32 = kdakit.prefill(*_args(x), **kw)
    bf16 = kdakit.prefill(*_args(x), **kw, chunk_state_dtype="bfloat16")
    assert bf16.chunk_states.dtype == torch.bfloat16 and bf16.final_state.dtype == torch.float32
    assert torch.equal(bf16.chunk_states, fp32.chunk_states.to(torch.bfloat16))
    assert torch.equal(bf16.final_state, fp32.final_state)
