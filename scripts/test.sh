#!/usr/bin/env bash
# Every test on a fresh machine: GoogleTest from apt if missing, a virtual environment with
# pinned Python packages (cmake included), a CMake build of the library, kernels (when nvcc
# exists), extension and tests, then CTest (the GoogleTest suites and the pytest suite; GPU
# tests skip without a GPU). Arguments are passed on to the CMake configure step, e.g.
# -DKDAKIT_ENABLE_CUDA=OFF for a CPU-only build.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if ! dpkg -s libgtest-dev >/dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q libgtest-dev
fi

kdakit_venv .venv-test scripts/requirements-test.txt

build_dir="${KDAKIT_BUILD_DIR:-build-test}"
"$venv_bin/cmake" -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DKDAKIT_BUILD_TESTS=ON \
  -DKDAKIT_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$py" -DPython_EXECUTABLE="$py" "$@"
"$venv_bin/cmake" --build "$build_dir" -j"$(nproc)"
"$venv_bin/ctest" --test-dir "$build_dir" --output-on-failure -j"$(nproc)"
