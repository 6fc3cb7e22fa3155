"""A tiny pure-numpy float64 KDA recurrence, written from CONTRACT.md section 1, independent of
the C++ code: the oracle the Python tests hold kdakit's CPU paths against.

States here are K-first per (sequence, value head): S is K x V. Locals carry their dims as
suffixes (q_TK: tokens x K)."""

from __future__ import annotations

import numpy as np


def _softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def gate_values(g, *, gate, A_log=None, dt_bias=None, lower_bound=None):
    """gamma (natural-log decay per key channel) from g [..., HV, K], float64."""
    g = np.asarray(g, np.float64)
    if gate == "precomputed":
        return g
    HV, K = g.shape[-2], g.shape[-1]
    bias = np.zeros((HV, K)) if dt_bias is None else np.asarray(dt_bias, np.float64).reshape(HV, K)
    x = g + bias
    if gate == "softplus":
        return -np.exp(np.asarray(A_log, np.float64))[:, None] * _softplus(x)
    if gate == "lower_bound":
        a = 1.0 if A_log is None else np.exp(np.asarray(A_log, np.float64))[:, None]
        return lower_bound * _sigmoid(a * x)
    raise ValueError(gate)


def step(S_KV, q_K, k_K, v_V, gamma_K, beta):
    """One token: decay, delta rule, output. Returns (new S_KV, o_V)."""
    S_KV = np.exp(gamma_K)[:, None] * S_KV
    S_KV = S_KV + beta * np.outer(k_K, v_V - S_KV.T @ k_K)
    return S_KV, S_KV.T @ q_K


def preprocess(q, k, beta, *, scale, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval):
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    beta = np.asarray(beta, np.float64)
    if use_qk_l2norm:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    if use_beta_sigmoid:
        beta = _sigmoid(beta) * (2.0 if allow_neg_eigval else 1.0)
    return q * scale, k, beta


def kda(q, k, v, g, beta, *, scale=None, gate="precomputed", A_log=None, dt_bias=None,
        lower_bound=None, use_qk_l2norm=False, use_beta_sigmoid=False, allow_neg_eigval=False,
        initial_state=None, cu_seqlens=None):
    """o [B, T, HV, V] and final states [N, HV, K, V] (K-first) of a fixed or packed batch."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    q, k, beta = preprocess(q, k, beta, scale=scale, use_qk_l2norm=use_qk_l2norm,
                            use_beta_sigmoid=use_beta_sigmoid, allow_neg_eigval=allow_neg_eigval)
    gamma = gate_values(g, gate=gate, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound)
    v = np.asarray(v, np.float64)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in cu_seqlens]
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    o = np.zeros((B, T, HV, V))
    final = np.zeros((len(spans), HV, K, V))
    for n, (b, start, end) in enumerate(spans):
        for h in range(HV):
            hq = h // (HV // H)
            S_KV = np.zeros((K, V)) if initial_state is None else np.array(initial_state[n, h], np.float64)
            for t in range(start, end):
                S_KV, o[b, t, h] = step(S_KV, q[b, t, hq], k[b, t, hq], v[b, t, h],
                                        gamma[b, t, h], beta[b, t, h])
            final[n, h] = S_KV
    return o, final


def kda_pool_decode(q, k, v, g, beta, pool, state_indices, *, num_accepted_tokens=None,
                    null_slot_is_padding=False, cu_seqlens=None, state_v_first=True, **kw):
    """Decode over a pool, as kdakit.decode specifies it: returns (o, new pool). ``pool`` is
    [slots, HV, V, K] (V-first) or [slots, HV, K, V]; a copy is updated and returned."""
    pool = np.array(pool, np.float64)
    idx = np.asarray(state_indices).reshape(len(state_indices), -1)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    slots = pool.shape[0]
    scale = kw.pop("scale", None)
    scale = K ** -0.5 if scale is None else scale
    q, k, beta = preprocess(q, k, beta, scale=scale, use_qk_l2norm=kw.pop("use_qk_l2norm", False),
                            use_beta_sigmoid=kw.pop("use_beta_sigmoid", False),
                            allow_neg_eigval=kw.pop("allow_neg_eigval", False))
    gamma = gate_values(g, **kw)
    v = np.asarray(v, np.float64)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in cu_seqlens]
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    o = np.zeros((B, T, HV, V))
    cols = idx.shape[1]
    as_kv = (lambda s: s.T) if state_v_first else (lambda s: s)
    for n, (b, start, end) in enumerate(spans):
        acc = 1 if num_accepted_tokens is None else min(max(int(num_accepted_tokens[n]), 1), cols)
        slot = int(idx[n, acc - 1])
        if slot < 0 or slot >= slots or (null_slot_is_padding and slot == 0):
            continue  # padding row: zero output, no state touched
        for h in range(HV):
            hq = h // (HV // H)
            S_KV = as_kv(pool[slot, h]).copy()
            for i, t in enumerate(range(start, end)):
                S_KV, o[b, t, h] = step(S_KV, q[b, t, hq], k[b, t, hq], v[b, t, h],
                                        gamma[b, t, h], beta[b, t, h])
                if cols > 1 and i < cols:
                    dst = int(idx[n, i])
                    if 0 <= dst < slots:
                        pool[dst, h] = as_kv(S_KV)
            if cols == 1:
                pool[slot, h] = as_kv(S_KV)
    return o, pool
