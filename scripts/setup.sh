#!/usr/bin/env bash
# Install ror_annotate into ./.venv with every extra: review (label-studio-sdk), steer (torch,
# transformers) and dev (pytest and the reference libraries the tests compare against).
#
# torch is pinned and installed first, in the build that fits the machine (ROR_TORCH):
#   auto (default)  cuda when `nvidia-smi -L` lists a GPU, else cpu
#   cpu             the CPU-only build (about 0.75 GB installed instead of several GB of CUDA
#                   libraries): from the sources pip is already configured with when they serve it
#                   (a local wheel folder, a mirror), else from the PyTorch CPU wheel index
#                   (ROR_TORCH_CPU_INDEX). macOS wheels are CPU builds already.
#   cuda            the default build of the package index (CUDA on Linux)
#   skip            no torch: the core package needs none; the steer extra is left out
# Other settings: PYTHON (the interpreter for the venv, 3.10 or newer; default python3).
# The core package alone needs no torch:  pip install -e .
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
TORCH_CPU_INDEX="${ROR_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

# A clear message instead of a resolver error several minutes later.
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "error: $PYTHON not found; ror_annotate needs Python 3.10 or newer (set PYTHON=/path/to/python3.x)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "error: ror_annotate needs Python 3.10 or newer; $PYTHON is $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')." \
    "Install a newer Python and run again with PYTHON=/path/to/python3.x" >&2
  exit 1
fi

torch_mode="${ROR_TORCH:-auto}"
case "$torch_mode" in
  auto)
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
      torch_mode=cuda
    else
      torch_mode=cpu
    fi ;;
  cpu|cuda|skip) ;;
  *) echo "error: ROR_TORCH=$torch_mode: use auto, cpu, cuda or skip" >&2; exit 1 ;;
esac

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_install() { .venv/bin/python -m pip install --quiet "$@"; }
pip_install --upgrade pip

case "$torch_mode" in
  cpu)
    if [ "$(uname -s)" = Darwin ]; then
      pip_install "torch==$TORCH_VERSION"
    elif pip_install "torch==$TORCH_VERSION+cpu" 2>/dev/null; then
      : # pip's configured sources (local wheels, a mirror) serve the CPU build: no other index needed
    else
      echo "torch: CPU build from $TORCH_CPU_INDEX"
      if ! pip_install "torch==$TORCH_VERSION+cpu" --extra-index-url "$TORCH_CPU_INDEX"; then
        echo "error: the PyTorch CPU build (torch==$TORCH_VERSION+cpu) could not be installed from $TORCH_CPU_INDEX" \
          "(unreachable, or no wheel for this Python). Run again with ROR_TORCH=skip (no torch: everything but" \
          "probe/steer), ROR_TORCH=cuda (the default PyPI build), or ROR_TORCH_CPU_INDEX=<a reachable mirror>" >&2
        exit 1
      fi
    fi ;;
  cuda) pip_install "torch==$TORCH_VERSION" ;;
esac
if [ "$torch_mode" = skip ]; then
  pip_install -e '.[review,dev]'
else
  pip_install -e '.[review,steer,dev]'
fi
echo "ror_annotate installed in $(pwd)/.venv (torch: $torch_mode)  next: .venv/bin/ror run  (the main job on the embedded sample)"
