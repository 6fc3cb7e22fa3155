"""Test and benchmark cases as dataclasses, grouped into regular, irregular and corner cases,
plus the benchmark case lists of TARGETS.md (prefill at T = 8192 tokens, few heads with one long
sequence, decode over a state pool)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

__all__ = [
    "PrefillCase",
    "DecodeCase",
    "prefill_test_cases",
    "decode_test_cases",
    "prefill_bench_cases",
    "shape_case",
    "decode_bench_cases",
]

GATES = ("precomputed", "softplus", "lower_bound")


@dataclass(frozen=True)
class PrefillCase:
    """One prefill problem. ``seqlens`` are the sequence lengths; ``packed=True`` lays them out
    as one row with cu_seqlens (B = 1), ``packed=False`` as a fixed [B, T] batch (all lengths
    equal)."""

    name: str
    seqlens: tuple[int, ...]
    packed: bool = True
    H: int = 4
    HV: int = 0  # 0: same as H
    K: int = 128
    V: int = 128
    gate: str = "lower_bound"
    lower_bound: float = -5.0
    use_A_log: bool = True
    use_dt_bias: bool = True
    use_qk_l2norm: bool = True
    use_beta_sigmoid: bool = True
    allow_neg_eigval: bool = False
    initial_state: bool = True
    state_layout: str = "v_first"
    dtype: str = "bfloat16"  # q, k, v (and g, beta)
    state_dtype: str = "float32"
    category: str = "regular"  # regular | irregular | corner

    def __post_init__(self):
        if self.gate not in GATES:
            raise ValueError(f"gate: expected one of {GATES}, got {self.gate!r}")
        if not self.packed and len(set(self.seqlens)) > 1:
            raise ValueError(f"{self.name}: a fixed batch needs equal lengths, got {self.seqlens}")

    @property
    def num_v_heads(self) -> int:
        return self.HV or self.H

    @property
    def N(self) -> int:
        return len(self.seqlens)

    @property
    def B(self) -> int:
        return 1 if self.packed else len(self.seqlens)

    @property
    def T(self) -> int:
        return sum(self.seqlens) if self.packed else (self.seqlens[0] if self.seqlens else 0)

    @property
    def total_tokens(self) -> int:
        return sum(self.seqlens)

    @property
    def cu_seqlens(self) -> list[int] | None:
        if not self.packed:
            return None
        out = [0]
        for n in self.seqlens:
            out.append(out[-1] + n)
        return out

    def label(self) -> str:
        """A short description: heads, lengths, gate."""
        lens = _describe_lengths(self.seqlens)
        heads = f"H={self.H}" + (f"/HV={self.HV}" if self.HV and self.HV != self.H else "")
        return f"{heads} K={self.K} V={self.V} {lens} {self.gate}"

    def with_(self, **changes) -> "PrefillCase":
        return replace(self, **changes)


@dataclass(frozen=True)
class DecodeCase:
    """One decode problem: ``batch`` sequences of ``tokens`` tokens over a state pool of
    ``num_slots`` slots (default 2 * batch * (1 + spec) + 1, slots drawn without repetition). ``spec`` > 0
    makes state_indices [N, 1 + spec] with num_accepted_tokens (speculative decoding);
    ``padding_rows`` rows get slot -1."""

    name: str
    batch: int
    tokens: int = 1
    H: int = 32
    HV: int = 0
    K: int = 128
    V: int = 128
    gate: str = "lower_bound"
    lower_bound: float = -5.0
    use_A_log: bool = True
    use_dt_bias: bool = True
    use_qk_l2norm: bool = True
    use_beta_sigmoid: bool = True
    allow_neg_eigval: bool = False
    state_layout: str = "v_first"
    dtype: str = "bfloat16"
    state_dtype: str = "float32"
    num_slots: int = 0
    spec: int = 0
    padding_rows: int = 0
    packed: bool = False
    category: str = "regular"

    def __post_init__(self):
        if self.gate not in GATES:
            raise ValueError(f"gate: expected one of {GATES}, got {self.gate!r}")

    @property
    def num_v_heads(self) -> int:
        return self.HV or self.H

    @property
    def slots(self) -> int:
        return self.num_slots or 2 * self.batch * (1 + self.spec) + 1

    def label(self) -> str:
        heads = f"H={self.H}" + (f"/HV={self.HV}" if self.HV and self.HV != self.H else "")
        extra = f" spec={self.spec}" if self.spec else ""
        return f"{heads} B={self.batch} T={self.tokens} {self.state_dtype} pool{extra}"

    def with_(self, **changes) -> "DecodeCase":
        return replace(self, **changes)


def _describe_lengths(seqlens: tuple[int, ...]) -> str:
    if not seqlens:
        return "[]"
    if len(set(seqlens)) == 1 and len(seqlens) > 1:
        return f"{seqlens[0]}x{len(seqlens)}"
    if len(seqlens) <= 6:
        return "[" + ",".join(map(str, seqlens)) + "]"
    return f"[{seqlens[0]},...] ({len(seqlens)} seqs)"


# ------------------------------------------------------------------------------------------
# Test cases: small enough for the CPU backends.
# ------------------------------------------------------------------------------------------

def prefill_test_cases() -> list[PrefillCase]:
    """Regular, irregular and corner prefill cases, every gate and flag, small shapes."""
    base = PrefillCase(name="", seqlens=(), H=2, K=32, V=32, dtype="float32")
    cases = [
        base.with_(name="fixed-2x128", seqlens=(128, 128), packed=False),
        base.with_(name="packed-3", seqlens=(64, 130, 77)),
        base.with_(name="softplus", seqlens=(100, 29), gate="softplus"),
        base.with_(name="precomputed", seqlens=(93,), gate="precomputed", use_A_log=False,
                   use_dt_bias=False),
        base.with_(name="kfirst-gva", seqlens=(65, 31), H=2, HV=4, state_layout="k_first",
                   category="irregular"),
        base.with_(name="odd-lengths", seqlens=(1, 63, 65, 127), category="irregular"),
        base.with_(name="neg-eigval", seqlens=(70,), allow_neg_eigval=True, category="irregular"),
        base.with_(name="lb-no-A_log", seqlens=(90,), use_A_log=False, category="irregular"),
        base.with_(name="no-norm-no-sigmoid", seqlens=(45, 50), use_qk_l2norm=False,
                   use_beta_sigmoid=False, category="irregular"),
        base.with_(name="K64-V32", seqlens=(80,), K=64, V=32, category="irregular"),
        base.with_(name="empty-seqs", seqlens=(0, 17, 0, 3, 0), category="corner"),
        base.with_(name="single-token", seqlens=(1,), packed=False, category="corner"),
        base.with_(name="no-initial-state", seqlens=(66,), initial_state=False, category="corner"),
        base.with_(name="bf16-state", seqlens=(40, 24), state_dtype="bfloat16", category="corner"),
    ]
    return cases


def decode_test_cases() -> list[DecodeCase]:
    """Regular, irregular and corner decode cases, small shapes."""
    base = DecodeCase(name="", batch=3, H=2, K=32, V=32, dtype="float32")
    return [
        base.with_(name="one-token"),
        base.with_(name="softplus", gate="softplus"),
        base.with_(name="kfirst-gva", HV=4, state_layout="k_first", category="irregular"),
        base.with_(name="few-tokens", tokens=3, category="irregular"),
        base.with_(name="spec-2", tokens=3, spec=2, category="irregular"),
        base.with_(name="padding", batch=4, padding_rows=2, category="corner"),
        base.with_(name="bf16-pool", state_dtype="bfloat16", category="corner"),
    ]


# ------------------------------------------------------------------------------------------
# Benchmark cases (TARGETS.md): bf16 q/k/v/g/beta, fp32 A_log/dt_bias, lower-bound gate -5,
# q/k L2 norm and beta sigmoid in kernel, initial state given, final state returned, V-first.
# ------------------------------------------------------------------------------------------

_MIXED = (1300, 547, 2048, 963, 271, 3063)


def prefill_bench_cases() -> list[PrefillCase]:
    """The prefill cases of TARGETS.md, T = 8192 tokens in total, K = V = 128, then few heads
    with long sequences (issue 6: H = 4, 8, 16, 32 at T = 8K, 32K, 128K, and 32K + 8 x 1K
    packed) and the softplus gate."""
    shapes = {
        "fixed": (8192,),
        "mixed": _MIXED,
        "1024x8": (1024,) * 8,
        "512x16": (512,) * 16,
        "256x32": (256,) * 32,
        "64x128": (64,) * 128,
        "32x256": (32,) * 256,
        "16x512": (16,) * 512,
        "4096+8x512": (4096,) + (512,) * 8,
    }
    per_h = {
        96: list(shapes),
        64: ["fixed", "mixed", "1024x8"],
        32: ["fixed", "1024x8"],
    }
    cases = []
    for h, names in per_h.items():
        for n in names:
            cases.append(PrefillCase(name=f"H{h}-{n}", seqlens=shapes[n], H=h))
    # few heads, long sequences (issue 6): one sequence of 8K / 32K / 128K tokens, and one of 32K
    # packed with eight of 1K
    for h in (4, 8, 16, 32):
        for label, t in (("T8K", 8192), ("T32K", 32768), ("T128K", 131072)):
            if h == 32 and t == 8192:
                continue  # H32-fixed above
            cases.append(PrefillCase(name=f"H{h}-{label}", seqlens=(t,), H=h, category="irregular"))
        cases.append(PrefillCase(name=f"H{h}-32K+8x1K", seqlens=(32768,) + (1024,) * 8, H=h,
                                 category="irregular"))
    for n in ("fixed", "1024x8"):
        cases.append(PrefillCase(name=f"H32-{n}-softplus", seqlens=shapes[n], H=32,
                                 gate="softplus", category="irregular"))
    return cases


def shape_case(name: str) -> PrefillCase | None:
    """A packed benchmark case from its name, ``H<heads>-<part>[+<part>...]`` with each part
    ``<len>`` or ``<count>x<len>`` and lengths in tokens or with a K suffix (x 1024), e.g.
    ``H16-4096+4x1K`` or ``H24-3K+8x1K``; None when the name is not of that form. For shapes
    the case list does not hold (cost-model checks of the segmented prefill)."""
    m = re.fullmatch(r"H(\d+)-(.+)", name)
    if m is None:
        return None
    lens: list[int] = []
    for part in m.group(2).split("+"):
        p = re.fullmatch(r"(?:(\d+)x)?(\d+)(K?)", part)
        if p is None:
            return None
        count = int(p.group(1) or 1)
        length = int(p.group(2)) * (1024 if p.group(3) else 1)
        lens += [length] * count
    if int(m.group(1)) < 1 or not lens:
        return None
    return PrefillCase(name=name, seqlens=tuple(lens), H=int(m.group(1)), category="irregular")


def decode_bench_cases() -> list[DecodeCase]:
    """The decode cases of TARGETS.md: one token per sequence, fp32 pool, cold L2."""
    return [DecodeCase(name=f"H{h}-B{b}", batch=b, H=h)
            for h in (32, 96) for b in (1, 8, 32, 128, 512)]
