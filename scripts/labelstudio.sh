#!/usr/bin/env bash
# Label Studio (open-source server) for the human review queue: install, start, stop, status.
#
#   bash scripts/labelstudio.sh install   # own venv .venv-labelstudio (its pins clash with ours)
#   bash scripts/labelstudio.sh start     # 127.0.0.1:8089 by default, offline settings, waits for /health/
#   bash scripts/labelstudio.sh stop      # stops the process group recorded in the PID file
#   bash scripts/labelstudio.sh status    # prints UP / DOWN
#   bash scripts/labelstudio.sh env       # prints the export lines for LABEL_STUDIO_URL / _PUBLIC_URL / _API_KEY
#   bash scripts/labelstudio.sh installed # exit status 0 if label-studio is installed in LS_VENV (used by `ror review start`)
#
# Everything is configurable through the environment (defaults in brackets):
#   LS_VENV [.venv-labelstudio]  LS_DATA [.labelstudio]  LS_PORT [8089]
#   LS_HOST [127.0.0.1]   the address the server binds. Keep loopback and put a TLS reverse proxy or an
#                         SSH tunnel in front for annotators on other machines (README, "Serving
#                         annotators on other machines"); 0.0.0.0 exposes plain HTTP to the network.
#   LS_PUBLIC_URL [http://LS_HOST:LS_PORT]   the address people open (e.g. https://review.lab.org). Label
#                         Studio builds its absolute links from it; `env` exports it as
#                         LABEL_STUDIO_PUBLIC_URL, from which ror builds every link it prints.
#   LS_DB [sqlite]        or "postgresql" for a shared server (Label Studio's documentation recommends
#                         PostgreSQL over SQLite for several concurrent users). Then: POSTGRE_HOST
#                         [localhost] POSTGRE_PORT [5432] POSTGRE_NAME [labelstudio] POSTGRE_USER
#                         [labelstudio] POSTGRE_PASSWORD (required), Label Studio's own variable names.
#   LS_ADMIN_EMAIL [admin@example.com]  LS_ADMIN_PASSWORD [admin-pass-123]
#   LS_ADMIN_TOKEN [0123456789abcdef0123456789abcdef01234567]  LS_START_TIMEOUT [300 s]
# The default token and password are LOCAL development values, published here: the script refuses
# to bind anything but loopback, or to serve a public URL, while they are in use.
# The first start on an empty data dir runs all migrations (about 90 s); restarts take about 10 s.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LS_VERSION="1.23.2"
LS_VENV="${LS_VENV:-$ROOT/.venv-labelstudio}"
LS_DATA="${LS_DATA:-$ROOT/.labelstudio}"
LS_HOST="${LS_HOST:-127.0.0.1}"
LS_PORT="${LS_PORT:-8089}"
LS_DB="${LS_DB:-sqlite}"
DEFAULT_TOKEN="0123456789abcdef0123456789abcdef01234567"
DEFAULT_PASSWORD="admin-pass-123"
LS_ADMIN_EMAIL="${LS_ADMIN_EMAIL:-admin@example.com}"
LS_ADMIN_PASSWORD="${LS_ADMIN_PASSWORD:-$DEFAULT_PASSWORD}"
LS_ADMIN_TOKEN="${LS_ADMIN_TOKEN:-$DEFAULT_TOKEN}"
LS_START_TIMEOUT="${LS_START_TIMEOUT:-300}"
# ror and this script reach the server locally; a wildcard bind is reached through loopback.
case "$LS_HOST" in
  0.0.0.0) LOCAL_HOST="127.0.0.1" ;;
  "::") LOCAL_HOST="[::1]" ;;
  *:*) LOCAL_HOST="[$LS_HOST]" ;;
  *) LOCAL_HOST="$LS_HOST" ;;
esac
URL="http://$LOCAL_HOST:$LS_PORT"
LS_PUBLIC_URL="${LS_PUBLIC_URL:-$URL}"
LS_PUBLIC_URL="${LS_PUBLIC_URL%/}"
PID_FILE="$LS_DATA/server.pid"
LOG_FILE="$LS_DATA/server.log"
PY="$(command -v python3 || command -v python || true)"

need_python() {
  if [[ -z "$PY" ]]; then
    echo "scripts/labelstudio.sh needs python3 on PATH (health and port checks)" >&2
    exit 1
  fi
}

# Readiness through Python's standard library, so the machine needs no curl.
health() {
  "$PY" - "$URL/health/" 2>/dev/null <<'PYEOF'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as r:
        sys.exit(0 if json.load(r).get("status") == "UP" else 1)
except Exception:
    sys.exit(1)
PYEOF
}

port_busy() {
  # A busy port makes Label Studio silently move to port+1, so refuse instead.
  "$PY" - "$LS_HOST" "$LS_PORT" <<'PYEOF'
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
try:
    s.bind((host, port))
except OSError:
    sys.exit(0)
finally:
    s.close()
sys.exit(1)
PYEOF
}

is_loopback() { [[ "$LS_HOST" == "127.0.0.1" || "$LS_HOST" == "localhost" || "$LS_HOST" == "::1" ]]; }

check_settings() {
  if [[ ! "$LS_PUBLIC_URL" =~ ^https?://[^/]+$ ]]; then
    echo "LS_PUBLIC_URL must be http(s)://host[:port] with no path (serve Label Studio at the root of its own host name), got '$LS_PUBLIC_URL'" >&2
    exit 1
  fi
  if { ! is_loopback || [[ "$LS_PUBLIC_URL" != "$URL" ]]; } \
     && { [[ "$LS_ADMIN_TOKEN" == "$DEFAULT_TOKEN" ]] || [[ "$LS_ADMIN_PASSWORD" == "$DEFAULT_PASSWORD" ]]; }; then
    echo "LS_HOST=$LS_HOST / LS_PUBLIC_URL=$LS_PUBLIC_URL serve people on other machines, but LS_ADMIN_TOKEN or" \
      "LS_ADMIN_PASSWORD is the published development default: set your own, e.g." \
      "LS_ADMIN_TOKEN=\$(python3 -c 'import secrets; print(secrets.token_hex(20))')" >&2
    exit 1
  fi
  case "$LS_DB" in
    sqlite) ;;
    postgresql)
      if [[ -z "${POSTGRE_PASSWORD:-}" ]]; then
        echo "LS_DB=postgresql needs POSTGRE_PASSWORD (and POSTGRE_HOST / POSTGRE_PORT / POSTGRE_NAME / POSTGRE_USER unless the defaults fit)" >&2
        exit 1
      fi ;;
    *) echo "LS_DB must be sqlite or postgresql, got '$LS_DB'" >&2; exit 1 ;;
  esac
}

cmd_install() {
  if [[ -x "$LS_VENV/bin/label-studio" ]] && "$LS_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('label-studio') != '$LS_VERSION')" 2>/dev/null; then
    echo "label-studio $LS_VERSION already installed in $LS_VENV"
    return 0
  fi
  need_python
  "$PY" -m venv "$LS_VENV"
  "$LS_VENV/bin/pip" install --quiet "label-studio==$LS_VERSION"
  echo "installed label-studio $LS_VERSION in $LS_VENV"
}

cmd_start() {
  need_python
  check_settings
  if health; then
    echo "Label Studio already UP at $URL"
    return 0
  fi
  if [[ ! -x "$LS_VENV/bin/label-studio" ]]; then
    echo "label-studio is not installed in $LS_VENV: run 'bash scripts/labelstudio.sh install' first" >&2
    exit 1
  fi
  if port_busy; then
    echo "port $LS_PORT on $LS_HOST is already taken by another process (and no Label Studio answers $URL/health/):" \
      "stop that process, or choose a free port with LS_PORT=..." >&2
    exit 1
  fi
  mkdir -p "$LS_DATA"
  local db_env=(DJANGO_DB=sqlite)
  if [[ "$LS_DB" == postgresql ]]; then
    # Label Studio's own variables (label_studio/core/settings/base.py); psycopg ships with label-studio.
    db_env=(DJANGO_DB=default POSTGRE_HOST="${POSTGRE_HOST:-localhost}" POSTGRE_PORT="${POSTGRE_PORT:-5432}"
            POSTGRE_NAME="${POSTGRE_NAME:-labelstudio}" POSTGRE_USER="${POSTGRE_USER:-labelstudio}"
            POSTGRE_PASSWORD="$POSTGRE_PASSWORD")
  fi
  local https_env=()
  if [[ "$LS_PUBLIC_URL" == https://* ]]; then
    # Behind a TLS reverse proxy the browser's origin is the public one, and cookies must be Secure.
    https_env=(CSRF_TRUSTED_ORIGINS="$LS_PUBLIC_URL" SESSION_COOKIE_SECURE=1 CSRF_COOKIE_SECURE=1)
  fi
  # Offline settings (shared/notes/label-studio.md): no version check, no Sentry, no analytics, bound to
  # LS_HOST (loopback by default), legacy token enabled at first init so the known token works.
  # LABEL_STUDIO_* names are set explicitly because LS falls back to plain $USERNAME/$PASSWORD/$HOST/$PORT.
  (
    export LABEL_STUDIO_BASE_DATA_DIR="$LS_DATA" LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true \
      LATEST_VERSION_CHECK=false SENTRY_DSN= FRONTEND_SENTRY_DSN= COLLECT_ANALYTICS=false \
      FEATURE_FLAGS_OFFLINE=true LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK=true \
      LABEL_STUDIO_USERNAME="$LS_ADMIN_EMAIL" LABEL_STUDIO_PASSWORD="$LS_ADMIN_PASSWORD" \
      LABEL_STUDIO_USER_TOKEN="$LS_ADMIN_TOKEN" LABEL_STUDIO_HOST="$LS_PUBLIC_URL" LABEL_STUDIO_PORT="$LS_PORT" \
      "${db_env[@]}" ${https_env[@]+"${https_env[@]}"}
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
  echo "Label Studio UP at $URL after ${waited} s (bound to $LS_HOST, public URL $LS_PUBLIC_URL, database $LS_DB; pid $(cat "$PID_FILE"), log $LOG_FILE)"
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

cmd_installed() { [[ -x "$LS_VENV/bin/label-studio" ]]; }

cmd_status() { need_python; if health; then echo "UP $URL"; else echo "DOWN $URL"; exit 1; fi; }

cmd_env() {
  echo "export LABEL_STUDIO_URL=$URL"
  echo "export LABEL_STUDIO_PUBLIC_URL=$LS_PUBLIC_URL"
  echo "export LABEL_STUDIO_API_KEY=$LS_ADMIN_TOKEN"
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  installed) cmd_installed ;;
  *) echo "usage: bash scripts/labelstudio.sh {install|start|stop|status|env|installed}" >&2; exit 64 ;;
esac
