"""How many (16-row sub-block, key channel) pairs of each prep CTA take the per-element path.

The prep kernel (src/cuda/sm90/prefill/prep/kernel.cuh, phase 3) sums a channel's diagonal-tile
terms per element instead of through the tensor-core product when the channel's base-2 gate span
over a 16-row sub-block exceeds max_diag_span (prep/config.h: 216 with the in-kernel q/k L2 norm).
The span is the sum over the sub-block's 16 tokens of -log2(decay); for the softplus gate that is
exp(A_log[h]) * softplus(g + dt_bias[h, :]) * log2(e) per token (docs/contract.md).

This counts the pairs per CTA (one 64-token chunk of one value head) for three input
distributions, in float64 numpy on the CPU:
  benchmark    kdakit.testing.generate's (python -m kdakit.bench.prefill): g ~ N(0, 1),
               dt_bias ~ N(0, 0.5) per channel, A_log = log U(1, 8) per head;
  tool-steep   prefill_prep_timing's "softplus_steep" row: g ~ U(-4, 4), dt_bias = 0.1,
               A_log = log(1 + 7 (h + 0.5) / HV);
  tool         its plain "softplus" row: the same with A_log = 0.
Usage: python tools/prep_wide_pairs.py [--heads 32] [--tokens 8192] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np

MAX_SPAN_L2NORM = 216.0  # prep/config.h, kMaxDiagSpanNormed
LOG2E = 1.4426950408889634


def pairs_per_cta(g: np.ndarray, dt_bias: np.ndarray, a_log: np.ndarray) -> np.ndarray:
    """g [T, HV, K], dt_bias [HV, K], a_log [HV] -> wide pairs per (chunk, head) [T / 64, HV]."""
    t, hv, k = g.shape
    span_per_token = np.exp(a_log)[None, :, None] * np.logaddexp(0.0, g + dt_bias[None]) * LOG2E
    span = span_per_token.reshape(t // 16, 16, hv, k).sum(axis=1)
    wide = span > MAX_SPAN_L2NORM
    return wide.reshape(t // 64, 4, hv, k).sum(axis=(1, 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=8192, help="a multiple of 64")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    hv, t, k = args.heads, args.tokens, 128
    rng = np.random.default_rng(args.seed)
    inputs = {
        "benchmark": (rng.standard_normal((t, hv, k)), rng.normal(0.0, 0.5, (hv, k)),
                      np.log(rng.uniform(1.0, 8.0, hv))),
        "tool-steep": (rng.uniform(-4.0, 4.0, (t, hv, k)), np.full((hv, k), 0.1),
                       np.log(1.0 + 7.0 * (np.arange(hv) + 0.5) / hv)),
    }
    inputs["tool"] = (inputs["tool-steep"][0], inputs["tool-steep"][1], np.zeros(hv))
    print(f"H = {hv}, T = {t}: wide (sub-block, channel) pairs per prep CTA, of {4 * k}")
    for name, (g, dt, a) in inputs.items():
        n = pairs_per_cta(g, dt, a)
        some = n[n > 0]
        median = float(np.median(some)) if some.size else 0.0
        print(f"  {name:11s} CTAs with a wide pair {100.0 * (n > 0).mean():5.1f}%, per such CTA: "
              f"median {median:5.0f}, mean {some.mean() if some.size else 0.0:6.1f}; over all CTAs {n.mean():6.1f}")


if __name__ == "__main__":
    main()
