#!/usr/bin/env bash
# One device run for the decode kernels (docs/design/20261130-decode-fast.md): every variant
# against the float64 reference (gtest, pytest), compute-sanitizer memcheck and racecheck on a few
# small cases of the fast kernels, then the decode benchmark with every variant beside FLA.
# Run from the repository root over a build staged by scripts/gpu_stage.sh (.carry/gpu.tar.xz);
# FLA is used when .carry/peers/fla-*.tar.xz is there (as scripts/gpu_suite.sh does).
# Logs and decode.json go to $OUT; the summary and the benchmark's compact table are printed last.
# Usage: [KDAKIT_STAGE_DIR=.carry/NAME] tests/cpp/decode/run_on_gpu.sh [--no-tests] [--no-bench] [extra args for the benchmark]
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-/tmp/kdakit-decode}"
mkdir -p "$out"
run_tests=1 run_bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) run_tests=0 ;;
    --no-bench) run_bench=0 ;;
    *) break ;;
  esac
  shift
done
# KDAKIT_STAGE_DIR: a stage of another name (scripts/gpu_stage.sh's KDAKIT_STAGE_NAME), e.g. a
# branch build carried beside main's
stage="${KDAKIT_STAGE_DIR:-.carry/gpu}"
[ -d "$stage" ] || tar -xJf "$stage.tar.xz" -C .carry
for f in .carry/peers/fla-*.tar.xz; do
  [ -f "$f" ] && mkdir -p /tmp/peers && tar -xJf "$f" -C /tmp/peers
done
export PYTHONPATH="$PWD/$stage/python:/tmp/peers:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 FLA_FLASH_KDA=0
bin="$stage/bin/kdakit_decode_tests"
summary="$out/summary.txt"
: >"$summary"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$summary"

if [ "$run_tests" = 1 ]; then
  SECONDS=0
  timeout 330 "$bin" --gtest_brief=1 >"$out/gtest_decode.log" 2>&1
  echo "gtest decode rc=$? ${SECONDS}s $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/gtest_decode.log" | tr -s ' ' | tr '\n' ' ')" |
    tee -a "$summary"
  grep -E '^\[  FAILED  \]' "$out/gtest_decode.log" | head -20 | tee -a "$summary"
  SECONDS=0
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/python/test_gpu_decode.py >"$out/pytest_decode.log" 2>&1
  echo "pytest decode rc=$? ${SECONDS}s $(tail -1 "$out/pytest_decode.log")" | tee -a "$summary"
  grep -E '^FAILED' "$out/pytest_decode.log" | head -10 | tee -a "$summary"
  # NOTE: test names are <case>__<variant> with '@' and '+' written '_' (decode_test.cpp).
  memcheck_filter='*/padding_rows__direct16:*/padding_rows__direct32_pdl:*/padding_rows__staged_pdl_pf'
  memcheck_filter+=':*/packed_int64_cu__direct32:*/gva_h2_hv10_bf16_padding__staged64_pdl_pf'
  memcheck_filter+=':*/head_dim_64_bf16_gva_padding__direct16:*/staged_packed_token_loop_bf16__staged_pdl'
  memcheck_filter+=':Variants/DecodeKernelGraph.*/direct32_pdl:Variants/DecodeKernelGraph.*/staged64_pdl_pf'
  memcheck_filter+=':*/padding_rows__staged64x2_pdl:*/gva_h2_hv10_bf16_padding__staged64x2_pdl'
  memcheck_filter+=':*/gva_h2_hv10_bf16_padding__staged64x2_pdl_pfn'
  memcheck_filter+=':*/x2_waves_padding__staged64x2_pdl:*/x2_waves_bf16_padding__staged64x2_pdl'
  memcheck_filter+=':*/x2_waves_padding__direct32_pdl'
  SECONDS=0
  timeout 180 compute-sanitizer --tool memcheck --leak-check no "$bin" --gtest_filter="$memcheck_filter" \
    >"$out/memcheck_decode.log" 2>&1
  echo "memcheck decode rc=$? ${SECONDS}s $(grep -E 'ERROR SUMMARY' "$out/memcheck_decode.log" | tail -1)" |
    tee -a "$summary"
  SECONDS=0
  timeout 120 compute-sanitizer --tool racecheck "$bin" \
    --gtest_filter='*/padding_rows__staged_pdl_pf:*/padding_rows__staged64:*/padding_rows__direct32:*/padding_rows__staged64x2_pdl_pfn' \
    >"$out/racecheck_decode.log" 2>&1
  echo "racecheck decode rc=$? ${SECONDS}s $(grep -E 'RACECHECK SUMMARY' "$out/racecheck_decode.log" | tail -1)" |
    tee -a "$summary"
fi

if [ "$run_bench" = 1 ]; then
  SECONDS=0
  timeout 420 python3 -m kdakit.bench.decode --variants all --kinds decode,spec --repeats 10 \
    --json "$out/decode.json" "$@" >"$out/bench_decode.log" 2>&1
  echo "bench decode rc=$? ${SECONDS}s" | tee -a "$summary"
  sed -n '/^compact/,$p' "$out/bench_decode.log"
  grep -E 'not timed|geometric' "$out/bench_decode.log"
fi
echo "=== summary"
cat "$summary"
