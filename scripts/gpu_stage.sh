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
"$venv/bin/cmake" --build "$build" -j"$(nproc)"
rm -rf .carry/gpu && mkdir -p .carry/gpu/bin .carry/gpu/python
find "$build/tests" -type f -executable \( -name '*test*' -o -name prefill_prep_timing \) -exec cp {} .carry/gpu/bin/ \;
# the example program (examples/serving_step.cpp) runs like a test: exit 0 is a pass
[ -x "$build/examples/serving_step" ] && cp "$build/examples/serving_step" .carry/gpu/bin/
cp -r python/kdakit .carry/gpu/python/
find "$build" -name '_kdakit*.so' -exec cp {} .carry/gpu/python/kdakit/ \;
# NOTE: every test executable carries all the kernels (~17 MB of fatbin each); stripped and
# xz-compressed the stage is ~9 MB, under the device tool's 64 MiB limit.
strip .carry/gpu/bin/* .carry/gpu/python/kdakit/_kdakit*.so
tar -C .carry -cf - gpu | xz -T"$(nproc)" -6 >.carry/gpu.tar.xz
ls -la .carry/gpu.tar.xz
