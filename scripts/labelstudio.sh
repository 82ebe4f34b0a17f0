#!/usr/bin/env bash
# Label Studio (open-source server) for the human review queue: install, start, stop, status.
#
#   bash scripts/labelstudio.sh install   # own venv .venv-labelstudio (its pins clash with ours)
#   bash scripts/labelstudio.sh start     # 127.0.0.1:8089, offline settings, waits for /health/
#   bash scripts/labelstudio.sh stop      # stops the process group recorded in the PID file
#   bash scripts/labelstudio.sh status    # prints UP / DOWN
#   bash scripts/labelstudio.sh env       # prints the export lines for LABEL_STUDIO_URL / _API_KEY
#
# Everything is configurable through the environment (defaults in brackets):
#   LS_VENV [.venv-labelstudio]  LS_DATA [.labelstudio]  LS_PORT [8089]
#   LS_ADMIN_EMAIL [admin@example.com]  LS_ADMIN_PASSWORD [admin-pass-123]
#   LS_ADMIN_TOKEN [0123456789abcdef0123456789abcdef01234567]  LS_START_TIMEOUT [300 s]
# The default token is a LOCAL, loopback-only development token; set your own for a shared server.
# The first start on an empty data dir runs all migrations (about 90 s); restarts take about 10 s.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LS_VERSION="1.23.2"
LS_VENV="${LS_VENV:-$ROOT/.venv-labelstudio}"
LS_DATA="${LS_DATA:-$ROOT/.labelstudio}"
LS_HOST="127.0.0.1"
LS_PORT="${LS_PORT:-8089}"
LS_ADMIN_EMAIL="${LS_ADMIN_EMAIL:-admin@example.com}"
LS_ADMIN_PASSWORD="${LS_ADMIN_PASSWORD:-admin-pass-123}"
LS_ADMIN_TOKEN="${LS_ADMIN_TOKEN:-0123456789abcdef0123456789abcdef01234567}"
LS_START_TIMEOUT="${LS_START_TIMEOUT:-300}"
URL="http://$LS_HOST:$LS_PORT"
PID_FILE="$LS_DATA/server.pid"
LOG_FILE="$LS_DATA/server.log"

health() { curl -fsS --max-time 3 "$URL/health/" 2>/dev/null | grep -q '"UP"'; }

port_busy() {
  # A busy port makes Label Studio silently move to port+1, so refuse instead.
  python3 - "$LS_HOST" "$LS_PORT" <<'EOF'
import socket, sys
s = socket.socket()
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError:
    sys.exit(0)
finally:
    s.close()
sys.exit(1)
EOF
}

cmd_install() {
  if [[ -x "$LS_VENV/bin/label-studio" ]] && "$LS_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('label-studio') != '$LS_VERSION')" 2>/dev/null; then
    echo "label-studio $LS_VERSION already installed in $LS_VENV"
    return 0
  fi
  python3 -m venv "$LS_VENV"
  "$LS_VENV/bin/pip" install --quiet "label-studio==$LS_VERSION"
  echo "installed label-studio $LS_VERSION in $LS_VENV"
}

cmd_start() {
  if health; then
    echo "Label Studio already UP at $URL"
    return 0
  fi
  if [[ ! -x "$LS_VENV/bin/label-studio" ]]; then
    echo "label-studio is not installed in $LS_VENV: run 'bash scripts/labelstudio.sh install' first" >&2
    exit 1
  fi
  if port_busy; then
    echo "port $LS_PORT on $LS_HOST is busy (and /health/ does not answer): stop that process or set LS_PORT" >&2
    exit 1
  fi
  mkdir -p "$LS_DATA"
  # Offline settings (shared/notes/label-studio.md): no version check, no Sentry, no analytics, loopback
  # only, legacy token enabled at first init so the known token works. LABEL_STUDIO_* names are set
  # explicitly because LS falls back to plain $USERNAME/$PASSWORD/$HOST/$PORT otherwise.
  (
    export LABEL_STUDIO_BASE_DATA_DIR="$LS_DATA" LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true \
      LATEST_VERSION_CHECK=false SENTRY_DSN= FRONTEND_SENTRY_DSN= COLLECT_ANALYTICS=false \
      FEATURE_FLAGS_OFFLINE=true LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK=true \
      LABEL_STUDIO_USERNAME="$LS_ADMIN_EMAIL" LABEL_STUDIO_PASSWORD="$LS_ADMIN_PASSWORD" \
      LABEL_STUDIO_USER_TOKEN="$LS_ADMIN_TOKEN" LABEL_STUDIO_HOST="$URL" LABEL_STUDIO_PORT="$LS_PORT"
    exec setsid "$LS_VENV/bin/label-studio" start --no-browser --internal-host "$LS_HOST" --port "$LS_PORT" \
      --data-dir "$LS_DATA" --username "$LS_ADMIN_EMAIL" --password "$LS_ADMIN_PASSWORD" \
      --user-token "$LS_ADMIN_TOKEN" --enable-legacy-api-token
  ) >"$LOG_FILE" 2>&1 &
  echo $! >"$PID_FILE"
  local waited=0
  until health; do
    if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
      echo "Label Studio exited during start; last lines of $LOG_FILE:" >&2
      tail -n 20 "$LOG_FILE" >&2
      exit 1
    fi
    if (( waited >= LS_START_TIMEOUT )); then
      echo "Label Studio did not answer $URL/health/ within $LS_START_TIMEOUT s; see $LOG_FILE" >&2
      exit 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
  echo "Label Studio UP at $URL after ${waited} s (pid $(cat "$PID_FILE"), log $LOG_FILE)"
  cmd_env
}

cmd_stop() {
  if [[ -f "$PID_FILE" ]]; then
    local pid
    pid="$(cat "$PID_FILE")"
    # setsid made the server its own process group leader: stop the group (server + workers).
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$PID_FILE"
    echo "Label Studio stopped (pid $pid)"
  else
    echo "no PID file at $PID_FILE: nothing to stop"
  fi
}

cmd_status() { if health; then echo "UP $URL"; else echo "DOWN $URL"; exit 1; fi; }

cmd_env() {
  echo "export LABEL_STUDIO_URL=$URL"
  echo "export LABEL_STUDIO_API_KEY=$LS_ADMIN_TOKEN"
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) echo "usage: bash scripts/labelstudio.sh {install|start|stop|status|env}" >&2; exit 64 ;;
esac
