"""The CUDA decode kernel through the Python package, against the float64 CPU reference backend
on the same inputs: kdakit.decode and the FLA-signature kdakit.fused_recurrent_kda on torch
CUDA tensors. Random pools whose untouched slots must stay bit-identical, padding rows (zero
output), chained decode steps, speculative decoding with random accepted counts, odd head
counts, GVA, bf16 and fp32 pools, K-first and V-first; outputs are poisoned (NaN) first.
Skipped without torch, a CUDA device or a CUDA build.

Every single-column V-first case also runs once per decode kernel variant (KDAKIT_DECODE_VARIANT,
KDAKIT_DECODE_PDL, KDAKIT_DECODE_PREFETCH; src/cuda/sm90/decode/dispatch.cu), and the variant the
dispatcher printed (KDAKIT_PRINT_CONFIGS) must be the forced one.

Bars: output 8e-3 for bf16 activations (bf16 output rounding dominates), fp32 pool 2e-5,
bf16 pool 8e-3 (its storage rounding)."""

from __future__ import annotations

import pytest

import kdakit

pytestmark = pytest.mark.requires_cuda

OUTPUT_BAR = 8e-3
STATE_BAR = {"float32": 2e-5, "bfloat16": 8e-3}


def _rel_l2(got, ref):
    import torch

    got, ref = got.double().cpu(), ref.double().cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), "NaN positions differ"
    mask = ~torch.isnan(ref)
    den = ref[mask].norm()
    return float((got[mask] - ref[mask]).norm() / (den if den > 0 else 1.0))


def _inputs(torch, B, T, H, HV, K, gen, dtype=None):
    dtype = dtype or torch.bfloat16
    dev = "cuda"
    return {
        "q": torch.randn(B, T, H, K, generator=gen, device=dev).to(dtype),
        "k": torch.randn(B, T, H, K, generator=gen, device=dev).to(dtype),
        "v": torch.randn(B, T, HV, K, generator=gen, device=dev).to(dtype),
        "g": (2 * torch.randn(B, T, HV, K, generator=gen, device=dev)).to(dtype),
        "beta": torch.randn(B, T, HV, generator=gen, device=dev).to(dtype),
        "A_log": (torch.rand(HV, generator=gen, device=dev) * 2 - 1.5).float(),
        "dt_bias": (torch.rand(HV, K, generator=gen, device=dev) * 2 - 1).float(),
    }


def _decode(x, pool, idx, out, backend="auto", **kw):
    return kdakit.decode(
        x["q"], x["k"], x["v"], x["g"], x["beta"], pool, idx, gate=kw.pop("gate", "lower_bound"),
        A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=kw.pop("lower_bound", -5.0),
        use_qk_l2norm=True, use_beta_sigmoid=True, out=out, backend=backend, **kw)


CASES = [
    # name, B, T, H, HV, cols, pool dtype, layout, accepted, padding rows
    ("fp32-vfirst", 8, 1, 4, 4, 1, "float32", "v_first", False, 0),
    ("bf16-vfirst", 8, 1, 4, 4, 1, "bfloat16", "v_first", False, 0),
    ("fp32-kfirst", 8, 1, 4, 4, 1, "float32", "k_first", False, 0),
    ("odd-heads", 5, 1, 3, 3, 1, "float32", "v_first", False, 0),
    ("gva", 6, 1, 2, 6, 1, "float32", "v_first", False, 0),
    ("padding", 9, 1, 4, 4, 1, "float32", "v_first", False, 3),
    ("spec-s3", 8, 4, 4, 4, 4, "float32", "v_first", True, 0),
    ("spec-s3-bf16-padding", 8, 4, 2, 4, 4, "bfloat16", "v_first", True, 2),
    ("spec-s3-kfirst", 6, 4, 4, 4, 4, "float32", "k_first", True, 0),
    # 6400 32-row slices, padding rows mixed in: many waves of the direct kernel (fp32 pool) or
    # of the 64-row staged kernel (bf16 pool) by default (dispatch.cu)
    ("many-items-fp32", 200, 1, 8, 8, 1, "float32", "v_first", False, 17),
    ("many-items-bf16", 200, 1, 8, 8, 1, "bfloat16", "v_first", False, 17),
    # 1200 heads: more than a wave of staged64x2 (6 x 132 fp32 / 8 x 132 bf16 CTAs)
    ("x2-waves-fp32", 400, 1, 3, 3, 1, "float32", "v_first", False, 41),
    ("x2-waves-bf16", 400, 1, 3, 3, 1, "bfloat16", "v_first", False, 41),
]


# "name[+pdl][+pf|+nopf]": KDAKIT_DECODE_VARIANT=name, KDAKIT_DECODE_PDL=1 with "+pdl" (else 0),
# KDAKIT_DECODE_PREFETCH=1 / 0 with "+pf" / "+nopf" (else the dispatcher's default).
VARIANTS = ["registers", "staged", "staged64", "direct32", "direct16", "direct32+pdl", "direct32+pdl+nopf",
            "staged+pdl", "staged+pdl+pf", "staged64+pdl", "staged64+pdl+pf", "staged64x2+pdl+pfn",
            "staged64x2+pdl"]
SINGLE_COLUMN = [c for c in CASES if c[5] == 1 and c[7] == "v_first"]


def _force_variant(monkeypatch, spec):
    """Sets the variant's environment; returns what the dispatcher prints for it."""
    name, *mods = spec.split("+")
    pdl = "pdl" in mods
    monkeypatch.setenv("KDAKIT_DECODE_VARIANT", name)
    monkeypatch.setenv("KDAKIT_DECODE_PDL", "1" if pdl else "0")
    if "nopf" in mods or "pf" in mods:
        monkeypatch.setenv("KDAKIT_DECODE_PREFETCH", "1" if "pf" in mods else "0")
    else:
        monkeypatch.delenv("KDAKIT_DECODE_PREFETCH", raising=False)
    if "nopfn" in mods or "pfn" in mods:
        monkeypatch.setenv("KDAKIT_DECODE_PREFETCH_NEXT", "1" if "pfn" in mods else "0")
    else:
        monkeypatch.delenv("KDAKIT_DECODE_PREFETCH_NEXT", raising=False)
    monkeypatch.setenv("KDAKIT_PRINT_CONFIGS", "1")
    return f"variant={name} pdl={1 if pdl and name != 'registers' else 0}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", SINGLE_COLUMN, ids=[c[0] for c in SINGLE_COLUMN])
def test_decode_variant_matches_reference(case, variant, monkeypatch, capfd):
    expected = _force_variant(monkeypatch, variant)
    test_decode_matches_reference(case)
    printed = capfd.readouterr().err
    assert expected in printed, f"the dispatcher did not run {variant}: {printed.strip()}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decode_matches_reference(case):
    import torch

    name, B, T, H, HV, cols, pool_dtype, layout, with_accepted, padding = case
    K = 128
    gen = torch.Generator(device="cuda")
    gen.manual_seed(hash(name) % (2**31))
    x = _inputs(torch, B, T, H, HV, K, gen)
    num_slots = B * cols + 5  # 5 slots nobody names
    pool = torch.rand(num_slots, HV, K, K, generator=gen, device="cuda").sub_(0.5).to(getattr(torch, pool_dtype))
    perm = torch.randperm(num_slots, generator=gen, device="cuda")[: B * cols].to(torch.int32)
    idx = perm.reshape(B, cols).contiguous() if cols > 1 else perm.contiguous()
    accepted = None
    if with_accepted:
        accepted = torch.randint(1, cols + 1, (B,), generator=gen, device="cuda", dtype=torch.int32)
    for n in range(padding):  # padding rows: start slot -1
        if cols > 1:
            idx[n, (int(accepted[n]) if accepted is not None else 1) - 1] = -1
        else:
            idx[n] = -1
    pool_in = pool.clone()
    out = torch.full((B, T, HV, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    _decode(x, pool, idx, out, num_accepted_tokens=accepted, state_layout=layout)

    ref_pool = pool_in.cpu()
    ref_out = torch.full((B, T, HV, K), float("nan"), dtype=torch.bfloat16)
    xc = {k: v.cpu() for k, v in x.items()}
    _decode(xc, ref_pool, idx.cpu(), ref_out, backend="reference",
            num_accepted_tokens=None if accepted is None else accepted.cpu(), state_layout=layout)

    assert _rel_l2(out, ref_out) <= OUTPUT_BAR
    for n in range(padding):
        assert torch.count_nonzero(out[n].float().cpu()) == 0, "padding row output must be zeros"
    got_pool = pool.cpu()
    for s in range(num_slots):
        if torch.equal(ref_pool[s].view(torch.int16), pool_in[s].cpu().view(torch.int16)):
            assert torch.equal(got_pool[s].view(torch.int16), ref_pool[s].view(torch.int16)), \
                f"slot {s} should be untouched"
        else:
            assert _rel_l2(got_pool[s], ref_pool[s]) <= STATE_BAR[pool_dtype], f"slot {s}"


@pytest.mark.parametrize("variant", ["auto", "direct32+pdl", "direct32+pdl+pf", "direct16", "staged", "staged+pdl+pf",
                                     "staged64+pdl+pf", "staged64+pdl"])
def test_decode_chained_steps_and_graph_replay(variant, monkeypatch):
    """Three steps on one pool with fresh inputs each step; the third replays a CUDA graph."""
    import torch

    if variant != "auto":
        _force_variant(monkeypatch, variant)

    B, H, K = 6, 4, 128
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    pool = torch.rand(B + 3, H, K, K, generator=gen, device="cuda").sub_(0.5)
    idx = torch.tensor([4, 0, -1, 7, 2, 5], dtype=torch.int32, device="cuda")
    ref_pool = pool.cpu()
    out = torch.empty(B, 1, H, K, dtype=torch.bfloat16, device="cuda")
    x = _inputs(torch, B, 1, H, H, K, gen)
    for step in range(3):
        fresh = _inputs(torch, B, 1, H, H, K, gen)
        for key in x:
            x[key].copy_(fresh[key])
        out.fill_(float("nan"))
        if step < 2:
            _decode(x, pool, idx, out)
        else:
            graph = torch.cuda.CUDAGraph()
            scratch_pool = pool.clone()
            with torch.cuda.graph(graph):
                _decode(x, scratch_pool, idx, out)
            scratch_pool.copy_(pool)
            graph.replay()
            torch.cuda.synchronize()
            pool.copy_(scratch_pool)
        ref_out = torch.empty(B, 1, H, K, dtype=torch.bfloat16)
        _decode({k: v.cpu() for k, v in x.items()}, ref_pool, idx.cpu(), ref_out, backend="reference")
        assert _rel_l2(out, ref_out) <= OUTPUT_BAR, f"step {step}"
    assert _rel_l2(pool, ref_pool) <= STATE_BAR["float32"]
    assert torch.equal(pool[1].cpu(), ref_pool[1]) and torch.equal(pool[3].cpu(), ref_pool[3])


def test_fused_recurrent_kda_pool_mode_matches_reference():
    """FLA's serving signature: ssm_state_indices, inplace_final_state, state_v_first."""
    import torch

    B, T, H, K = 4, 1, 2, 128
    gen = torch.Generator(device="cuda")
    gen.manual_seed(11)
    x = _inputs(torch, B, T, H, H, K, gen)
    pool = torch.rand(B + 2, H, K, K, generator=gen, device="cuda").sub_(0.5)
    idx = torch.tensor([3, 0, 5, 1], dtype=torch.int32, device="cuda")
    ref_pool = pool.cpu()
    o, state = kdakit.fused_recurrent_kda(
        x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
        initial_state=pool, ssm_state_indices=idx, inplace_final_state=True, state_v_first=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        lower_bound=-5.0)
    assert state.data_ptr() == pool.data_ptr()
    ref_out = torch.empty(B, T, H, K, dtype=torch.bfloat16)
    _decode({k: v.cpu() for k, v in x.items()}, ref_pool, idx.cpu(), ref_out, backend="reference")
    assert _rel_l2(o, ref_out) <= OUTPUT_BAR
    assert _rel_l2(pool, ref_pool) <= STATE_BAR["float32"]
