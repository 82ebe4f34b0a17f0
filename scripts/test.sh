#!/usr/bin/env bash
# Install everything and run the whole test suite, including the integration tests against a real
# Label Studio server (installed into its own venv and started on 127.0.0.1, stopped afterwards).
# CI keeps Label Studio's SQLite backend (LS_DB=sqlite, the default).
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
bash scripts/labelstudio.sh install
# The viewer's browser tests open the built site in Debian's Chromium: install it where apt can (root or
# sudo); elsewhere those tests are skipped with the reason (ROR_REQUIRE_BROWSER=1 makes that an error).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium; } || echo "note: could not install chromium; the browser tests will be skipped" >&2
fi
# The stop trap is set BEFORE start, so a start that fails or is interrupted half-way (server process
# already spawned, /health/ not answering yet) never leaves a server behind.
trap 'bash scripts/labelstudio.sh stop || true' EXIT
bash scripts/labelstudio.sh start
eval "$(bash scripts/labelstudio.sh env)"
export ROR_REQUIRE_LABEL_STUDIO=1   # integration tests fail, not skip, when the server is missing
.venv/bin/python -m pytest "$@"
