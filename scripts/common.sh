# Shared setup of scripts/bench.sh and scripts/test.sh (sourced, not run).
# KDAKIT_PYTHON picks the interpreter (default python3); nvcc is looked for on PATH and in
# /usr/local/cuda/bin, so that the sm_90a kernels are built wherever the toolkit exists.

kdakit_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$kdakit_root"

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# kdakit_venv DIR [extra venv args]: create DIR if needed; sets $py to its interpreter.
kdakit_venv() {
  local dir="$1"
  shift
  if [ ! -x "$dir/bin/python" ]; then
    "${KDAKIT_PYTHON:-python3}" -m venv "$@" "$dir"
  fi
  py="$kdakit_root/$dir/bin/python"
  "$py" -m pip install -q --disable-pip-version-check nvidia-cutlass==4.2.0.0 --no-deps
}
