# Shared setup of scripts/bench.sh and scripts/test.sh (sourced, not run).
# KDAKIT_PYTHON picks the interpreter (default python3); nvcc is looked for on PATH and in
# /usr/local/cuda/bin, so that the sm_90a kernels are built wherever the toolkit exists.

kdakit_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$kdakit_root"

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# kdakit_venv DIR REQUIREMENTS [extra venv args]: create the virtual environment DIR if needed
# and install the pinned packages of REQUIREMENTS, then the CUTLASS headers package (last and
# without its dependencies: only its headers are read). Sets $py and $venv_bin.
kdakit_venv() {
  local dir="$1" requirements="$2"
  shift 2
  if [ ! -x "$dir/bin/python" ]; then
    "${KDAKIT_PYTHON:-python3}" -m venv "$@" "$dir"
  fi
  venv_bin="$kdakit_root/$dir/bin"
  py="$venv_bin/python"
  "$py" -m pip install -q --disable-pip-version-check -r "$requirements"
  "$py" -m pip install -q --disable-pip-version-check --no-deps nvidia-cutlass==4.2.0.0
}
