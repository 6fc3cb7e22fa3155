#!/usr/bin/env bash
# On the GPU machine, over a build staged by scripts/gpu_stage.sh: every C++ and Python test,
# compute-sanitizer memcheck on small cases, then the benchmarks. Peers are used when present:
# FLA from a source tarball or wheels in .carry/peers (put on PYTHONPATH; pure Python, e.g. the
# fla-core wheel), FlashKDA if importable. Logs and results go to $OUT; a short table is printed
# last.
# Usage: scripts/gpu_suite.sh [--no-tests] [--no-bench] [--prefill-only] [--skip TEST_BINARY]...
# [extra args for the prefill bench]. --prefill-only runs the prefill tests (prep, recurrence, default
# path, segments, pool, 64-row CTAs, sanitizers, the prep timing) and the prefill benchmark alone. --skip leaves out one test binary (e.g. kdakit_decode_tests, whose ~540 variant
# cases tests/cpp/decode/run_on_gpu.sh runs) to fit a device call's time limit. --quick runs every
# test binary once on the default path, memcheck and racecheck on PrefillPlanByPrepGpu, then the
# prefill benchmark alone (no per-kernel breakdown): one device call's worth when the
# variant passes are not what changed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kdakit-gpu}"
mkdir -p "$out/logs"
run_tests=1 run_bench=1 prefill_only=0 quick=0 skip=" "
while [ $# -gt 0 ]; do
  case "$1" in
    --prefill-only) prefill_only=1 ;;
    --quick) quick=1 ;;
    --no-tests) run_tests=0 ;;
    --no-bench) run_bench=0 ;;
    --skip) skip+="$2 "; shift ;;
    *) break ;;
  esac
  shift
done
stage=.carry/gpu
if [ -f .carry/gpu.tar.xz ] && [ ! -d "$stage" ]; then
  tar -xJf .carry/gpu.tar.xz -C .carry
fi
export PYTHONPATH="$PWD/$stage/python:/tmp/peers:/tmp/site:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 FLA_FLASH_KDA=0
for f in .carry/peers/fla-*.tar.xz; do
  [ -f "$f" ] && mkdir -p /tmp/peers && tar -xJf "$f" -C /tmp/peers
done
for f in .carry/peers/*.whl; do
  [ -f "$f" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$f"
done
summary="$out/logs/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$summary"

if [ "$run_tests" = 1 ]; then
  for t in "$stage"/bin/*; do
    name=$(basename "$t")
    case "$name" in *test*|serving_step) ;; *) continue ;; esac  # tools (prefill_prep_timing) are not tests
    if [ "$prefill_only" = 1 ]; then
      case "$name" in prefill_gpu_test|prefill_pool_gpu_test|prefill_prep_test|prefill_recurrence_test) ;; *) continue ;; esac
    fi
    case "$skip" in *" $name "*) echo "gtest $name skipped (--skip)" | tee -a "$summary"; continue ;; esac
    timeout 300 "$t" --gtest_brief=1 >"$out/logs/$name.log" 2>&1
    echo "gtest $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/logs/$name.log" | tr -s ' ' | tr '\n' ' ')" | tee -a "$summary"
    grep -E '^\[  FAILED  \].*\(' "$out/logs/$name.log" | head -5
  done
  if [ "$quick" = 0 ]; then
  # The fused kernel on every case, with one and with two consumer warpgroups (the dispatcher
  # takes it only for batches of short sequences).
  for c in $([ "$prefill_only" = 1 ] || echo 1 2); do
    KDAKIT_PREFILL_PATH=fused KDAKIT_FUSED_CONSUMERS=$c timeout 300 "$stage/bin/prefill_gpu_test" --gtest_brief=1 \
      --gtest_filter='-*PrefillSegmentsGpu*' >"$out/logs/prefill_gpu_test_fused_c$c.log" 2>&1
    echo "gtest prefill_gpu_test[fused c$c] rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/logs/prefill_gpu_test_fused_c$c.log" | tr -s ' ' | tr '\n' ' ')" | tee -a "$summary"
    grep -E 'rel_l2 [0-9.e-]+ over' "$out/logs/prefill_gpu_test_fused_c$c.log" | head -3
  done
  # The 16-token-tile kernel on every case (the dispatcher takes it for batches of short
  # sequences), then its sanitizer runs.
  KDAKIT_PREFILL_PATH=tile16 timeout 300 "$stage/bin/prefill_gpu_test" --gtest_brief=1 \
    --gtest_filter='-*PrefillSegmentsGpu*' >"$out/logs/prefill_gpu_test_tile16.log" 2>&1
  echo "gtest prefill_gpu_test[tile16] rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/logs/prefill_gpu_test_tile16.log" | tr -s ' ' | tr '\n' ' ')" | tee -a "$summary"
  for tool in memcheck racecheck; do
    KDAKIT_PREFILL_PATH=tile16 timeout 180 compute-sanitizer --tool $tool "$stage/bin/prefill_gpu_test" \
      --gtest_filter='*Tile16*:*many_short*:*strided_views_aligned*' >"$out/logs/${tool}_tile16.log" 2>&1
    echo "$tool tile16 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/logs/${tool}_tile16.log" | tr '\n' ' ')" | tee -a "$summary"
  done
  # The pool cases (in place, read a / write b) on the tile kernel, the fused kernel with one
  # and two consumer warpgroups and the token-serial kernel (the dispatcher takes the two-kernel
  # path for the long ones and the tile kernel for the short ones).
  for v in $([ "$prefill_only" = 1 ] && echo tile16:0 || echo tile16:0 fused:1 fused:2 token_serial:0); do
    path=${v%%:*} c=${v##*:}
    KDAKIT_PREFILL_PATH=$path KDAKIT_FUSED_CONSUMERS=$c timeout 300 "$stage/bin/prefill_pool_gpu_test" \
      --gtest_brief=1 >"$out/logs/prefill_pool_gpu_test_${path}_c$c.log" 2>&1
    echo "gtest prefill_pool_gpu_test[$path c$c] rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/logs/prefill_pool_gpu_test_${path}_c$c.log" | tr -s ' ' | tr '\n' ' ')" | tee -a "$summary"
  done
  fi
  # Segmented prefill (few heads, long sequences) forced onto every case of the two-kernel
  # path: segments of 2 chunks, of 3 with 32-row recurrence CTAs and 64-row summaries, of 1 with
  # 128-row CTAs (every chunk its own segment). The long-sequence cases (PrefillSegmentsGpu) run
  # in the default pass above under the cost model's choice.
  for sg in $([ "$quick" = 1 ] || echo 2 3:32:64 1:128:128); do
    for t in prefill_gpu_test prefill_pool_gpu_test; do
      log="$out/logs/${t}_segments_${sg//:/_}.log"
      KDAKIT_PREFILL_PATH=chunked KDAKIT_PREFILL_SEGMENTS=$sg timeout 300 "$stage/bin/$t" --gtest_brief=1 \
        --gtest_filter='-*PrefillSegmentsGpu*' >"$log" 2>&1
      echo "gtest $t[segments $sg] rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$log" | tr -s ' ' | tr '\n' ' ')" | tee -a "$summary"
      grep -E '^\[  FAILED  \].*\(' "$log" | head -3
    done
  done
  grep -h "o vs whole" "$out/logs/prefill_gpu_test.log" | tee -a "$summary"
  # The prep kernel writing a fixed batch's or a packed single sequence's plan (the default; the
  # segments-of-2 pass above runs it on every two-kernel case) with segments of 2 chunks under the
  # sanitizers; --quick: PrefillPlanByPrepGpu alone, whose cases force their own segments.
  sanitized='*long_packed_softplus*:*long_fixed_gva*:*PrefillPlanByPrepGpu*'
  [ "$quick" = 1 ] && sanitized='*PrefillPlanByPrepGpu*'
  for tool in memcheck racecheck; do
    KDAKIT_PREFILL_PATH=chunked KDAKIT_PREFILL_SEGMENTS=2 timeout 180 compute-sanitizer --tool $tool \
      "$stage/bin/prefill_gpu_test" --gtest_filter="$sanitized" \
      >"$out/logs/${tool}_segments2_plan_by_prep.log" 2>&1
    echo "$tool segments 2, plan by prep rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/logs/${tool}_segments2_plan_by_prep.log" | tr '\n' ' ')" | tee -a "$summary"
  done
  if [ "$quick" = 0 ]; then
  # 64-row recurrence CTAs (the wgmma kernel with one warpgroup) forced on every two-kernel
  # case, whole sequences (the cost model picks 128 rows for most of them), then the sanitizers
  # on the 128-row wgmma kernel.
  for t in prefill_gpu_test prefill_pool_gpu_test; do
    log="$out/logs/${t}_rows64.log"
    KDAKIT_PREFILL_PATH=chunked KDAKIT_PREFILL_SEGMENTS=0:64 timeout 300 "$stage/bin/$t" \
      --gtest_brief=1 --gtest_filter='-*PrefillSegmentsGpu*' >"$log" 2>&1
    echo "gtest $t[whole sequences, 64-row CTAs] rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$log" | tr -s ' ' | tr '\n' ' ')" | tee -a "$summary"
    grep -E '^\[  FAILED  \].*\(' "$log" | head -3
  done
  # The bf16 chunk block (Kh hi + lo, the hi + lo wgmma recurrence) on every two-kernel case: the
  # default takes fp16 for L2-normed q and k on 64- and 128-row CTAs (dispatch.cu, f16_block).
  for t in prefill_gpu_test prefill_pool_gpu_test; do
    log="$out/logs/${t}_bf16_block.log"
    KDAKIT_PREFILL_PATH=chunked KDAKIT_PREFILL_SEGMENTS=0:128 KDAKIT_PREFILL_BLOCK=bf16 timeout 300 "$stage/bin/$t" \
      --gtest_brief=1 --gtest_filter='-*PrefillSegmentsGpu*' >"$log" 2>&1
    echo "gtest $t[whole sequences, 128-row CTAs, bf16 block] rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$log" | tr -s ' ' | tr '\n' ' ')" | tee -a "$summary"
    grep -E '^\[  FAILED  \].*\(' "$log" | head -3
  done
  for tool in memcheck racecheck synccheck; do
    KDAKIT_PREFILL_PATH=chunked KDAKIT_PREFILL_SEGMENTS=0:128 timeout 180 compute-sanitizer --tool $tool \
      "$stage/bin/prefill_gpu_test" --gtest_filter='*long_packed_softplus*:*many_short*:*strided*' \
      >"$out/logs/${tool}_wgmma.log" 2>&1
    echo "$tool wgmma recurrence rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/logs/${tool}_wgmma.log" | tr '\n' ' ')" | tee -a "$summary"
  done
  # the mma.sync kernel with its stage refills (whole sequences on 32-row CTAs; segments of 2
  # chunks never refill a stage)
  KDAKIT_PREFILL_PATH=chunked KDAKIT_PREFILL_SEGMENTS=0:32 timeout 180 compute-sanitizer --tool racecheck \
    "$stage/bin/prefill_gpu_test" --gtest_filter='*long_packed_softplus*:*strided*' >"$out/logs/racecheck_rows32.log" 2>&1
  echo "racecheck mma.sync recurrence (32 rows) rc=$? $(grep -E 'RACECHECK SUMMARY' "$out/logs/racecheck_rows32.log" | tr '\n' ' ')" | tee -a "$summary"
  timeout 120 compute-sanitizer --tool racecheck "$stage/bin/prefill_prep_test" \
    --gtest_filter='*FixedLowerBoundOddLength:*ManyShortSequences:*SteepSoftplusHeads' >"$out/logs/racecheck_prep.log" 2>&1
  echo "racecheck prep rc=$? $(grep -E 'RACECHECK SUMMARY' "$out/logs/racecheck_prep.log")" | tee -a "$summary"
  timeout 120 "$stage/bin/prefill_prep_timing" 10 2>&1 | grep PREP_TIMING | tee -a "$summary"
  for tool in memcheck racecheck; do
    KDAKIT_PREFILL_PATH=chunked KDAKIT_PREFILL_SEGMENTS=2 timeout 180 compute-sanitizer --tool $tool \
      "$stage/bin/prefill_gpu_test" --gtest_filter='*long_packed_softplus*:*many_short*:*long_fixed_gva*' \
      >"$out/logs/${tool}_segments.log" 2>&1
    echo "$tool segments rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/logs/${tool}_segments.log" | tr '\n' ' ')" | tee -a "$summary"
  done
  if [ "$prefill_only" = 0 ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/python >"$out/logs/pytest.log" 2>&1
  echo "pytest rc=$? $(tail -1 "$out/logs/pytest.log")" | tee -a "$summary"
  grep -E '^FAILED' "$out/logs/pytest.log" | head -5
  timeout 120 compute-sanitizer --tool memcheck --leak-check no "$stage/bin/prefill_gpu_test" \
    --gtest_filter='*many_short*:*tail_past_cu*:*pool_in_place*' >"$out/logs/memcheck_prefill.log" 2>&1
  echo "memcheck prefill rc=$? $(grep -E 'ERROR SUMMARY' "$out/logs/memcheck_prefill.log")" | tee -a "$summary"
  timeout 120 compute-sanitizer --tool memcheck --leak-check no "$stage/bin/prefill_pool_gpu_test" \
    --gtest_filter='*write_elsewhere*:*dense_float32*' >"$out/logs/memcheck_prefill_pool.log" 2>&1
  echo "memcheck prefill pool rc=$? $(grep -E 'ERROR SUMMARY' "$out/logs/memcheck_prefill_pool.log")" | tee -a "$summary"
  for tool in memcheck racecheck synccheck; do
    KDAKIT_PREFILL_PATH=fused timeout 180 compute-sanitizer --tool $tool "$stage/bin/prefill_gpu_test" \
      --gtest_filter='*long_packed_softplus*:*many_short*:*strided*' >"$out/logs/${tool}_fused.log" 2>&1
    echo "$tool fused rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/logs/${tool}_fused.log" | tr '\n' ' ')" | tee -a "$summary"
  done
  timeout 120 compute-sanitizer --tool memcheck --leak-check no "$stage/bin/kdakit_decode_tests" \
    --gtest_filter='*padding*:*spec*' >"$out/logs/memcheck_decode.log" 2>&1
  echo "memcheck decode rc=$? $(grep -E 'ERROR SUMMARY' "$out/logs/memcheck_decode.log")" | tee -a "$summary"
  fi
  fi
fi

if [ "$run_bench" = 1 ]; then
  # FLA caches its Triton autotuning results on disk (FLA_CACHE_RESULTS, default on): the
  # *.autotune.json files of an earlier run (a few KB; the compiled kernels are too big to
  # bring back) spare the new shapes' autotuning, up to a minute each.
  if [ -f .carry/triton-autotune.tar.gz ]; then
    mkdir -p "$HOME/.triton" && tar -xzf .carry/triton-autotune.tar.gz -C "$HOME/.triton"
  fi
  timeout "${KDAKIT_BENCH_TIMEOUT:-3000}" python3 -m kdakit.bench.prefill --json "$out/prefill.json" --png "$out/prefill.png" "$@" \
    >"$out/logs/bench_prefill.log" 2>&1
  echo "bench prefill rc=$?" | tee -a "$summary"
  # device time per kernel of one call (prep, summary and recurrence passes, combine, plan)
  if [ "$quick" = 0 ]; then
  python3 -m kdakit.bench.prefill --kernels --cases H4-T32K,H16-T32K,H96-fixed,H96-1024x8 \
    >"$out/logs/bench_prefill_kernels.log" 2>&1
  echo "bench prefill kernels rc=$?" | tee -a "$summary"
  fi
  if [ "$prefill_only" = 0 ] && [ "$quick" = 0 ]; then
  python3 -m kdakit.bench.prefill --pool --json "$out/prefill_pool.json" \
    >"$out/logs/bench_prefill_pool.log" 2>&1
  echo "bench prefill pool rc=$?" | tee -a "$summary"
  python3 -m kdakit.bench.prefill --plan-compare --json "$out/plan_compare.json" \
    >"$out/logs/bench_plan_compare.log" 2>&1
  echo "bench plan-compare rc=$?" | tee -a "$summary"
  python3 -m kdakit.bench.decode --json "$out/decode.json" >"$out/logs/bench_decode.log" 2>&1
  echo "bench decode rc=$?" | tee -a "$summary"
  fi
fi
tar -C "$out" -czf "$out/logs.tar.gz" logs
# NOTE: the device tool returns at most 8 files: the logs travel as the one tarball above.
cp "$summary" "$out/summary.txt"
# FLA's autotuning results, to carry into a later run as .carry/triton-autotune.tar.gz.
if [ -d "$HOME/.triton/cache" ]; then
  (cd "$HOME/.triton" && find cache -name '*.autotune.json' | tar -czf "$out/triton-autotune.tar.gz" -T -)
fi
echo "=== prefill"; tail -30 "$out/logs/bench_prefill.log" 2>/dev/null
echo "=== prefill from a pool"; tail -12 "$out/logs/bench_prefill_pool.log" 2>/dev/null
echo "=== plan once vs per call"; tail -8 "$out/logs/bench_plan_compare.log" 2>/dev/null
echo "=== decode"; tail -30 "$out/logs/bench_decode.log" 2>/dev/null
echo "=== summary"; cat "$summary"
rm -rf "$out/logs"
