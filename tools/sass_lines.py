#!/usr/bin/env python3
"""Per-source-line and per-phase profile of one kernel, from its SASS and (optionally) Nsight
Compute's per-instruction counters.

The kernel is compiled here to a cubin with the library's flags plus -lineinfo, its SASS listed
with line info (nvdisasm -gi; Triton's wheel ships an nvdisasm), and every instruction attributed
to the outermost line of FILE it was inlined at. With an ncu source export of the same code
(on the GPU machine: ncu -k regex:NAME --set full --import-source yes -o rep ...; then
ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv) the rows are matched
instruction for instruction (the opcodes are checked) and the executed instructions, warp-state
samples, stall reasons and shared-memory wavefronts are summed per phase and per line.

Usage:
  sass_lines.py SASS FILE BOUNDS NAMES [--csv SRC.csv] [--top N]
    SASS    nvdisasm -gi listing of a cubin holding the kernel alone
    FILE    the source file whose lines count (a suffix, e.g. prep/kernel.cuh)
    BOUNDS  ascending first lines of the phases after the first, comma-separated
    NAMES   one name per phase (len(BOUNDS) + 1), comma-separated
Session 22 (docs/design/20261129-prefill.md) used it on the prep kernel.
"""

import argparse
import collections
import csv
import re
import sys

INSN = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def sass_lines(path, file_suffix):
    """(opcode, line) per instruction, line the outermost FILE line it was inlined at."""
    pat = re.compile(re.escape(file_suffix) + r'", line (\d+)')
    out, cur = [], None
    for text in open(path):
        if "//## File" in text:
            found = pat.findall(text)
            cur = int(found[-1]) if found else cur
            continue
        m = INSN.match(text)
        if m:
            out.append((m.group(3), cur))
    return out


def phase_of(line, bounds, names):
    if line is None:
        return names[0]
    for b, n in zip(bounds, names):
        if line < b:
            return n
    return names[-1]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass")
    ap.add_argument("file")
    ap.add_argument("bounds")
    ap.add_argument("names")
    ap.add_argument("--csv")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    bounds = [int(x) for x in a.bounds.split(",")]
    names = a.names.split(",")
    if len(names) != len(bounds) + 1:
        raise SystemExit("NAMES must have one more entry than BOUNDS")
    insns = sass_lines(a.sass, a.file)
    static = collections.defaultdict(collections.Counter)
    for op, line in insns:
        static[phase_of(line, bounds, names)][op.split(".")[0]] += 1
    if not a.csv:
        for n in names:
            c = static[n]
            print(f"{n:10s} {sum(c.values()):6d}  " + " ".join(f"{o}:{k}" for o, k in c.most_common(8)))
        print("total", len(insns))
        return
    rows = list(csv.reader(open(a.csv)))
    header, data = rows[1], rows[2:]  # row 0 names the kernel
    col = {h: i for i, h in enumerate(header)}
    if len(data) != len(insns):
        raise SystemExit(f"{len(data)} profiled instructions against {len(insns)} in the listing: not the same code")
    for (op, _), r in zip(insns, data):
        src = r[col["Source"]].split()
        got = src[1] if src[0].startswith("@") else src[0]
        if got != op:
            raise SystemExit(f"opcode mismatch at {r[col['Address']]}: {got} against {op}")
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda r, k: float(r[col[k]] or 0)
    per_phase = collections.defaultdict(collections.Counter)
    per_line = collections.defaultdict(collections.Counter)
    for (_, line), r in zip(insns, data):
        for acc in (per_phase[phase_of(line, bounds, names)], per_line[line]):
            acc["inst"] += num(r, "Instructions Executed")
            acc["samples"] += num(r, "Warp Stall Sampling (All Samples)")
            acc["wf"] += num(r, "L1 Wavefronts Shared")
            acc["wf_excess"] += num(r, "L1 Wavefronts Shared Excessive")
            for s in stalls:
                acc[s] += num(r, s)
    total = sum(p["samples"] for p in per_phase.values()) or 1.0
    inst = sum(p["inst"] for p in per_phase.values())
    print(f"executed {inst / 1e6:.1f}M warp instructions, {total:.0f} samples")
    for n in names:
        p = per_phase[n]
        top = sorted(((p[s], s) for s in stalls), reverse=True)[:4]
        print(f"{n:10s} inst {p['inst'] / 1e6:7.1f}M  samples {100 * p['samples'] / total:5.1f}%  "
              f"shared wavefronts {p['wf'] / 1e6:5.1f}M (excess {p['wf_excess'] / 1e6:4.1f}M)  "
              + " ".join(f"{s[6:]} {100 * v / total:.1f}" for v, s in top))
    print(f"top {a.top} lines by samples:")
    for line, p in sorted(per_line.items(), key=lambda kv: -kv[1]["samples"])[: a.top]:
        top = sorted(((p[s], s) for s in stalls), reverse=True)[:3]
        print(f"  {line}: samples {100 * p['samples'] / total:5.1f}%  inst {p['inst'] / 1e6:6.1f}M  "
              f"excess wavefronts {p['wf_excess'] / 1e6:4.2f}M  " + " ".join(f"{s[6:]} {100 * v / total:.2f}" for v, s in top))


if __name__ == "__main__":
    main(sys.argv[1:])
