#!/usr/bin/env bash
# Install ror_annotate with the lowest dependency versions pyproject.toml declares (.ci/min-versions.txt;
# core + dev extras, no torch, no Label Studio) into .venv-min and run the unit tests there.
#   bash scripts/test_min_versions.sh [pytest args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
rm -rf .venv-min
"$PYTHON" -m venv .venv-min
.venv-min/bin/python -m pip install --quiet --upgrade pip
.venv-min/bin/python -m pip install --quiet -c .ci/min-versions.txt -e '.[dev]'
.venv-min/bin/python -m pytest -m "not integration and not slow and not shared" -p no:cacheprovider "$@"
