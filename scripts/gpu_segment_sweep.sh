#!/usr/bin/env bash
# One device run for the segmented prefill's cost model (docs/design/20261201-prefill-segments.md,
# src/cuda/sm90/prefill/recurrence/launch.h: recurrence_chunk_us, choose_segments): the few-head
# benchmark rows timed with every forced segment choice KDAKIT_PREFILL_SEGMENTS=L:rows:summary_rows
# (one process per choice: the variable is read once), then with the model's own choice, whose
# configuration line (KDAKIT_PRINT_CONFIGS) is printed beside it. kdakit only (no peers): the
# table says which choice is fastest per row, to retune the model against. Run from the
# repository root over a build staged by scripts/gpu_stage.sh; logs go to $OUT.
# Usage: [KDAKIT_STAGE_DIR=.carry/NAME] scripts/gpu_segment_sweep.sh [cases] [choices]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kdakit-segments}"
mkdir -p "$out"
cases="${1:-H4-T8K,H4-T32K,H4-T128K,H4-32K+8x1K,H8-T32K,H16-T32K}"
choices="${2:-0 16:32:64 16:64:64 32:32:64 32:64:64 32:64:128 32:128:128 64:32:64 64:64:64 64:64:128 64:128:128 128:64:128}"
# KDAKIT_STAGE_DIR: a stage of another name (gpu_stage.sh's KDAKIT_STAGE_NAME), e.g. a branch build
stage="${KDAKIT_STAGE_DIR:-.carry/gpu}"
[ -d "$stage" ] || tar -xJf "$stage.tar.xz" -C .carry
export PYTHONPATH="$PWD/$stage/python:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# NOTE: three files in $out (the device tool returns at most eight): segments.tsv (one row per
# choice and case, written as each choice finishes, so a cut-off run keeps what it measured),
# sweep.log (every choice's benchmark output, appended) and model_choices.txt.
table="$out/segments.tsv"
all_logs="$out/sweep.log"
: >"$table"
: >"$all_logs"
log="$(mktemp)"
for choice in auto $choices; do
  KDAKIT_PREFILL_SEGMENTS="$choice" timeout 120 python3 -m kdakit.bench.prefill --cases "$cases" --peers none \
    --repeats 10 --cooldown 0.05 >"$log" 2>&1
  { echo "=== KDAKIT_PREFILL_SEGMENTS=$choice"; cat "$log"; } >>"$all_logs"
  # rows "<case> <label...> kdakit <ms> ms"
  awk -v c="$choice" '$1 ~ /^H[0-9]+-/ { for (i = 2; i < NF; ++i) if ($i == "kdakit") { print c "\t" $1 "\t" $(i + 1); break } }' \
    "$log" >>"$table"
done
rm -f "$log"
# The model's choice per case (one call each, configuration lines on stderr).
for case in ${cases//,/ }; do
  line=$(KDAKIT_PRINT_CONFIGS=1 timeout 60 python3 -m kdakit.bench.prefill --cases "$case" --peers none --repeats 1 \
    2>&1 | grep -m1 'recurrence value_rows')
  echo "model $case: ${line#kdakit prefill: }"
done | tee "$out/model_choices.txt"
echo "=== ms per case (rows) and forced choice (columns); 'auto' is the model's choice"
python3 - "$table" <<'PY'
import collections, sys
ms = collections.defaultdict(dict)
order = []
for line in open(sys.argv[1]):
    choice, case, t = line.rstrip("\n").split("\t")
    if choice not in order:
        order.append(choice)
    ms[case][choice] = t
print("| case | " + " | ".join(order) + " | best |")
print("|---|" + "---|" * (len(order) + 1))
for case, row in ms.items():
    vals = {c: float(v) for c, v in row.items() if v not in ("None", "")}
    best = min(vals, key=vals.get) if vals else "-"
    print(f"| {case} | " + " | ".join(row.get(c, "-") for c in order) + f" | {best} |")
PY
