#!/usr/bin/env bash
# On the GPU machine: the prefill tests of one staged build and an A/B of its speed against a
# second staged build in the same call (kdakit alone, alternating rounds), a short table last.
# Stage both here first (scripts/gpu_stage.sh; the second from a worktree of main with
# KDAKIT_STAGE_NAME=main) and carry .carry/gpu.tar.xz, .carry/main.tar.xz and this script.
# Usage: scripts/gpu_ab.sh [rounds (2)] [bench cases (the rows below)]; KDAKIT_AB_NCU=1 adds a
# profile of both builds' prep kernel (below). KDAKIT_AB_ENVS="label:VAR=value,VAR=value ..."
# also times this build under each set of variables (the variants: e.g.
# "whole:KDAKIT_PREFILL_COMBINE=whole plankernel:KDAKIT_PREFILL_PLAN=kernel"), in the same
# rounds; the table then has a column per label after main's and this build's. Without a staged
# main build (.carry/main.tar.xz) the rounds time this build and its variants only.
# KDAKIT_AB_BUILDS="main gpu NAME ..." adds builds staged under other names (KDAKIT_STAGE_NAME=NAME
# KDAKIT_STAGE_TARGETS="_kdakit prefill_prep_timing" scripts/gpu_stage.sh: a kernel variant
# compiled from the same tree), each timed in the same rounds with a column of its own.
# KDAKIT_AB_PEERS=1 times the peers (FLA, FlashKDA, each when importable) beside this build's
# default on the same cases once, between the first and the second round, so that one call gives
# every variant's ratio against them (bench_peers.json).
# Logs go to $OUT/logs.tar.gz, the table to $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kdakit-ab}"
logs="$out/logs"
mkdir -p "$logs"
rounds="${1:-2}"
cases="${2:-H96-fixed,H96-mixed,H96-4096,H64-mixed,H32-fixed,H32-1024x8}"
builds=""
for v in ${KDAKIT_AB_BUILDS:-main gpu}; do
  [ -d ".carry/$v" ] || [ ! -f ".carry/$v.tar.xz" ] || tar -xJf ".carry/$v.tar.xz" -C .carry
  [ -d ".carry/$v" ] && builds+="$v "
done
b=.carry/gpu/bin
summary="$out/summary.txt"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee -a "$summary"
result() {  # name rc log
  echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$3" | tr -s ' ' | tr '\n' ' ')" | tee -a "$summary"
  grep -E '^\[  FAILED  \].*\(' "$3" | head -5 | tee -a "$summary"
}
# KDAKIT_AB_TESTS=0 leaves out the tests and the racecheck (a second invocation in the same call,
# after a first with 0 rounds ran them beside other work: the sanitizer, a peer's build)
if [ "${KDAKIT_AB_TESTS:-1}" = 1 ]; then
  for t in prefill_prep_test prefill_gpu_test prefill_pool_gpu_test prefill_recurrence_test serving_graph_test \
    api_plan_test; do
    timeout 240 "$b/$t" --gtest_brief=1 >"$logs/$t.log" 2>&1
    result "$t" $? "$logs/$t.log"
  done
  KDAKIT_PREFILL_PATH=chunked timeout 240 "$b/prefill_gpu_test" --gtest_brief=1 --gtest_filter='-*PrefillSegmentsGpu*' \
    >"$logs/prefill_gpu_test_chunked.log" 2>&1
  result "prefill_gpu_test[chunked]" $? "$logs/prefill_gpu_test_chunked.log"
  # KDAKIT_AB_RACECHECK=0 leaves out the prep kernel's racecheck (up to 150 s) when prep is unchanged
  if [ "${KDAKIT_AB_RACECHECK:-1}" = 1 ]; then
    timeout 150 compute-sanitizer --tool racecheck "$b/prefill_prep_test" >"$logs/racecheck_prep.log" 2>&1
    echo "racecheck prep rc=$? $(grep -E 'RACECHECK SUMMARY' "$logs/racecheck_prep.log")" | tee -a "$summary"
  fi
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
envs="${KDAKIT_AB_ENVS:-}"
for r in $(seq 1 "$rounds"); do
  for v in $builds; do
    # KDAKIT_AB_PREP_CASES: the prep timing's cases (substrings, comma-separated; default all, ~30 s)
    timeout 100 ".carry/$v/bin/prefill_prep_timing" 10 ${KDAKIT_AB_PREP_CASES:+"$KDAKIT_AB_PREP_CASES"} 2>&1 |
      grep PREP_TIMING | sed "s/^/$v r$r /" | tee -a "$summary"
    PYTHONPATH="$PWD/.carry/$v/python" timeout 200 python3 -m kdakit.bench.prefill --peers none --cases "$cases" \
      --repeats 10 --json "$out/bench_${v}_$r.json" >"$logs/bench_${v}_$r.log" 2>&1
    echo "bench $v r$r rc=$?" | tee -a "$summary"
  done
  for e in $envs; do
    label=${e%%:*}
    # shellcheck disable=SC2046
    env $(echo "${e#*:}" | tr ',' ' ') PYTHONPATH="$PWD/.carry/gpu/python" timeout 200 python3 -m kdakit.bench.prefill \
      --peers none --cases "$cases" --repeats 10 --json "$out/bench_${label}_$r.json" >"$logs/bench_${label}_$r.log" 2>&1
    echo "bench $label (${e#*:}) r$r rc=$?" | tee -a "$summary"
  done
  if [ "$r" = 1 ] && [ "${KDAKIT_AB_PEERS:-0}" = 1 ]; then
    PYTHONPATH="$PWD/.carry/gpu/python:${PYTHONPATH:-}" FLA_FLASH_KDA=0 timeout 420 python3 -m kdakit.bench.prefill \
      --cases "$cases" --repeats 10 --json "$out/bench_peers.json" --png "$out/bench_peers.png" \
      >"$logs/bench_peers.log" 2>&1
    echo "bench peers rc=$?" | tee -a "$summary"
  fi
done
# KDAKIT_AB_NCU=1: Nsight Compute's per-instruction counters of the prep kernel (H96 fixed, one
# launch) for both builds, as source CSVs in the logs tarball, for tools/sass_lines.py here.
if [ "${KDAKIT_AB_NCU:-0}" = 1 ]; then
  for v in $builds; do
    timeout 150 ncu -k regex:kda_prefill_prep --launch-skip 1 --launch-count 1 --set full --import-source yes \
      -o "$logs/ncu_$v" ".carry/$v/bin/prefill_prep_timing" 1 H96_fixed >"$logs/ncu_$v.log" 2>&1
    echo "ncu $v rc=$?" | tee -a "$summary"
    ncu -i "$logs/ncu_$v.ncu-rep" --page source --csv --print-source sass 2>/dev/null | xz -T4 >"$logs/src_$v.csv.xz"
    ncu -i "$logs/ncu_$v.ncu-rep" --page details --csv >"$logs/details_$v.csv" 2>&1
    rm -f "$logs/ncu_$v.ncu-rep"
  done
fi
tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$logs"
labels=$(for e in $envs; do printf '%s ' "${e%%:*}"; done)
echo "=== kdakit ms per round (${builds// / | }${labels// / | })"
AB_BUILDS="$builds" python3 - "$out" "$rounds" $labels <<'PY' | tee -a "$summary"
import json, os, sys
out, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cols = (*os.environ["AB_BUILDS"].split(), *labels)
ms = {}
for v in cols:
    for r in range(1, rounds + 1):
        try:
            rows = json.load(open(f"{out}/bench_{v}_{r}.json"))["rows"]
        except (OSError, KeyError, ValueError):
            continue
        for row in rows:
            ms.setdefault(row["case"], {}).setdefault(v, []).append(row.get("kdakit_ms"))
for case, d in ms.items():
    fmt = lambda xs: ", ".join("-" if x is None else f"{x:.4f}" for x in xs)
    print(f"{case:<24} " + " | ".join(fmt(d.get(v, [])) for v in cols))
PY
