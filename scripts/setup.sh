#!/usr/bin/env bash
# Install ror_annotate into ./.venv with every extra: review (label-studio-sdk), steer (torch,
# transformers) and dev (pytest and the reference libraries the tests compare against).
# torch is pinned to 2.13.0 and installed first: an unpinned torch pulls a multi-GB CUDA build.
# The core package alone needs no torch:  pip install -e .
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e '.[review,steer,dev]'
echo "ror_annotate installed in $(pwd)/.venv  (try: .venv/bin/ror --help)"
