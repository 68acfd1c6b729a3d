#!/usr/bin/env bash
# A real Chroma server (chromadb's own `chroma run`) for tests, benchmarks and development.
#
#   scripts/chroma.sh start [DATA_DIR]   # serve DATA_DIR (default: $STATE/db) on a free loopback
#                                        # port, wait until its heartbeat answers, print PODIUM_CHROMA_URL=
#   scripts/chroma.sh status             # print the same and exit 0 if up; exit 3 if not
#   scripts/chroma.sh stop               # SIGTERM the server's process group, then SIGKILL; always exit 0
#
# Typical use:  eval "$(scripts/chroma.sh start "$(mktemp -d)")"; export PODIUM_CHROMA_URL
#
# The server is the `chroma` command of the chromadb package in the project's environment
# (PODIUM_CHROMA_BIN overrides it), so client and server are always the same Chroma version.
# State (pid, port, data dir, log) lives in ${PODIUM_CHROMA_STATE:-/tmp/podium-chroma-$UID};
# one server per state dir.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${PODIUM_CHROMA_STATE:-/tmp/podium-chroma-$(id -u)}"
PY="${PODIUM_PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
BIN="${PODIUM_CHROMA_BIN:-$(dirname "$PY")/chroma}"
[[ -x "$BIN" ]] || BIN="$(command -v chroma || true)"
READY_TIMEOUT="${PODIUM_CHROMA_READY_TIMEOUT:-60}"

log() { echo "chroma: $*" >&2; }
# shellcheck source=scripts/server-lib.sh
source "$ROOT/scripts/server-lib.sh"

pid_alive() { [[ -f "$STATE/pid" ]] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; }

free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

probe() {
  "$PY" - "$(cat "$STATE/port")" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/v2/heartbeat", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

print_env() { echo "PODIUM_CHROMA_URL=http://127.0.0.1:$(cat "$STATE/port")"; }

stop() { stop_server "$STATE"; }

start() {
  local data="${1:-$STATE/db}"
  [[ -n "$BIN" && -x "$BIN" ]] || { log "no chroma command (install the project's environment: scripts/venv.sh)"; exit 2; }
  mkdir -p "$STATE" "$data"
  data="$(cd "$data" && pwd)"
  if pid_alive && probe; then
    if [[ "$(cat "$STATE/data_dir")" != "$data" ]]; then
      log "a server is already running from $STATE for $(cat "$STATE/data_dir"); stop it first"
      exit 2
    fi
    print_env; return 0
  fi
  stop >/dev/null 2>&1
  free_port >"$STATE/port"
  echo "$data" >"$STATE/data_dir"
  ANONYMIZED_TELEMETRY=False setsid "$BIN" run --path "$data" --host 127.0.0.1 --port "$(cat "$STATE/port")" \
    >"$STATE/server.log" 2>&1 </dev/null &
  echo $! >"$STATE/pid"
  wait_ready "$STATE" "$READY_TIMEOUT" probe || exit 1
  print_env
}

case "${1:-}" in
  start) shift; start "$@" ;;
  status) if pid_alive && probe; then print_env; else exit 3; fi ;;
  stop) stop ;;
  *) echo "usage: $0 start [DATA_DIR] | status | stop" >&2; exit 2 ;;
esac
