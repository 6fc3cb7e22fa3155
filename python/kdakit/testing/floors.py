"""The two floors of a prefill case: the fewest bytes any implementation must move through device
memory and the FLOPs of the chunked math, each over the H200 ceiling measured for TARGETS.md
(device-to-device copy 4.27 TB/s counting reads and writes; bf16 matrix product 8192^3 681
TFLOP/s). The larger of the two times is the floor; a benchmark row's time over it is its gap.

Bytes: q and k (H heads) and v and g (HV heads) read once at their dtype, beta read once, o written
once, the initial state read (when the case has one) and the final state written (N x HV x K x V at
the state dtype). FLOPs, per sequence and value head, per chunk of C' <= 64 tokens (its real
length): L and M (2 C'^2 K each), W and U0 (2 C'^2 K and 2 C'^2 V), the unit-triangular inverse
(2/3 C'^3), W S0 and Qt S0 (2 C' K V each), M U (2 C'^2 V) and the state update Kh^T U (2 C' K V).
docs/design/20261129-prefill.md, "Floors and prediction per case", tabulates both for every case
of TARGETS.md (the tests check these functions against it).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cases import PrefillCase

__all__ = ["COPY_CEILING_TBPS", "MATMUL_CEILING_TFLOPS", "PrefillFloors", "prefill_floors"]

COPY_CEILING_TBPS = 4.27  # H200 device-to-device copy, read + write (TARGETS.md)
MATMUL_CEILING_TFLOPS = 681.0  # H200 bf16 matrix product, 8192^3 (TARGETS.md)
CHUNK = 64

_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class PrefillFloors:
    bytes: float
    flops: float

    @property
    def bytes_ms(self) -> float:
        return self.bytes / (COPY_CEILING_TBPS * 1e12) * 1e3

    @property
    def flops_ms(self) -> float:
        return self.flops / (MATMUL_CEILING_TFLOPS * 1e12) * 1e3

    @property
    def ms(self) -> float:
        """The floor: the larger of the two times."""
        return max(self.bytes_ms, self.flops_ms)


def _chunk_flops(c: int, k: int, v: int) -> float:
    return (2 * c * c * k) * 3 + 2 * c * c * v * 2 + 2 * c**3 / 3 + 2 * c * k * v * 3


def prefill_floors(case: PrefillCase) -> PrefillFloors:
    """Bytes and FLOPs of one prefill call of ``case`` (final state always written)."""
    h, hv, k, v = case.H, case.num_v_heads, case.K, case.V
    tokens = case.total_tokens
    x = _BYTES[case.dtype]
    s = _BYTES[case.state_dtype]
    moved = tokens * (h * k * 2 * x + hv * k * x + hv * v * x * 2 + hv * x)  # q, k, g, v, o, beta
    states = case.N * hv * k * v * s
    moved += states * (2 if case.initial_state else 1)
    flops = 0.0
    for n in case.seqlens:
        full, rest = divmod(n, CHUNK)
        flops += full * _chunk_flops(CHUNK, k, v) + (_chunk_flops(rest, k, v) if rest else 0.0)
    return PrefillFloors(float(moved), flops * hv)
