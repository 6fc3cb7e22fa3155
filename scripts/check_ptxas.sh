#!/usr/bin/env bash
# Fails when a CUDA kernel spills registers to local memory (STYLE.md: the build fails on
# spills). The CUDA objects of the library are rebuilt in BUILD_DIR (default build-test, as
# configured by scripts/test.sh) and the ptxas output is searched for the spill warnings that
# -Xptxas=--warn-on-spills (set in src/CMakeLists.txt) prints.
#   usage: scripts/check_ptxas.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir="${1:-build-test}"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  echo "check_ptxas: $build_dir is not a configured build directory (run scripts/test.sh first)" >&2
  exit 2
fi
if ! grep -q "^KDAKIT_ENABLE_CUDA:BOOL=ON" "$build_dir/CMakeCache.txt" ||
   ! grep -q "^CMAKE_CUDA_COMPILER:" "$build_dir/CMakeCache.txt"; then
  echo "check_ptxas: $build_dir has no CUDA build; nothing to check" >&2
  exit 2
fi
cmake_bin="cmake"
[ -x .venv-test/bin/cmake ] && cmake_bin=".venv-test/bin/cmake"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$cmake_bin" --build "$build_dir" --target kdakit --clean-first -j"$(nproc)" >"$log" 2>&1 || {
  cat "$log" >&2
  exit 1
}
if grep -E "ptxas.*(spill|[Ll]ocal memory)" "$log"; then
  echo "check_ptxas: register spills found (above)" >&2
  exit 1
fi
echo "check_ptxas: no register spills in $(grep -c 'Building CUDA' "$log") CUDA objects"
