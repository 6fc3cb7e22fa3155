#!/usr/bin/env bash
# Here (no GPU needed): build everything for the GPU machine, whose Python is 3.12, and stage the
# test executables and the extension into .carry/gpu.tar.xz (git-ignored), to be sent with
# the device tool's `carry` together with scripts/gpu_suite.sh, which unpacks it. Usage: scripts/gpu_stage.sh [python3.12 venv dir]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv312}"
build="${KDAKIT_GPU_BUILD_DIR:-build-gpu312}"
"$venv/bin/cmake" -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKDAKIT_BUILD_TESTS=ON \
  -DKDAKIT_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$PWD/$venv/bin/python" \
  -DPython_EXECUTABLE="$PWD/$venv/bin/python" >/dev/null
# KDAKIT_STAGE_TARGETS (space-separated cmake targets, e.g. "kdakit_decode_tests _kdakit"): build
# and stage only those, for a branch build beside main's; KDAKIT_STAGE_NAME (default gpu): stage
# into .carry/$name and .carry/$name.tar.xz, so that one device call can carry both and unpack
# the branch's next to main's (tar -xJf .carry/NAME.tar.xz -C .carry).
name="${KDAKIT_STAGE_NAME:-gpu}"
targets="${KDAKIT_STAGE_TARGETS:-}"
if [ -n "$targets" ]; then
  # shellcheck disable=SC2086  # one word per target
  "$venv/bin/cmake" --build "$build" -j"$(nproc)" --target $targets
else
  "$venv/bin/cmake" --build "$build" -j"$(nproc)"
fi
stage=".carry/$name"
rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/python"
wanted() { [ -z "$targets" ] || case " $targets " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
find "$build/tests" -type f -executable \( -name '*test*' -o -name prefill_prep_timing \) -print |
  while read -r f; do if wanted "$(basename "$f")"; then cp "$f" "$stage/bin/"; fi; done
# the example program (examples/serving_step.cpp) runs like a test: exit 0 is a pass
if [ -x "$build/examples/serving_step" ] && wanted serving_step; then cp "$build/examples/serving_step" "$stage/bin/"; fi
if wanted _kdakit; then
  cp -r python/kdakit "$stage/python/"
  find "$build" -name '_kdakit*.so' -exec cp {} "$stage/python/kdakit/" \;
fi
# NOTE: every test executable carries all the kernels (~17 MB of fatbin each); stripped and
# xz-compressed the stage is ~9 MB, under the device tool's 64 MiB limit.
find "$stage" -type f \( -path "$stage/bin/*" -o -name '_kdakit*.so' \) -exec strip {} +
tar -C .carry -cf - "$name" | xz -T"$(nproc)" -6 >"$stage.tar.xz"
ls -la "$stage.tar.xz"
