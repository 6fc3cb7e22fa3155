#!/usr/bin/env bash
# The main job on a fresh machine: create a virtual environment, build and install kdakit from
# this checkout (`pip install .`), then run `python -m kdakit bench` (GPU benchmarks with a CUDA
# GPU and torch; else a small CPU case with its error against the float64 reference).
# Arguments are passed on to `python -m kdakit bench`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# --system-site-packages: an installed torch (and FLA/FlashKDA, the benchmark peers) stays visible.
kdakit_venv .venv-bench scripts/requirements-bench.txt --system-site-packages
PATH="$venv_bin:$PATH" "$py" -m pip install -q --disable-pip-version-check --no-build-isolation .
# (The repository root has no kdakit/ folder, so this imports the installed package.)
exec "$py" -m kdakit bench "$@"
