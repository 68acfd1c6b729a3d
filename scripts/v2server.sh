#!/usr/bin/env bash
# A real KServe-V2 inference server (MLServer + Podium's onnxruntime adapter) serving a Triton
# model repository on CPU machines, for tests, benchmarks and development.
#
#   scripts/v2server.sh install              # build the cached venv (idempotent; also done by start)
#   scripts/v2server.sh start [REPOSITORY]   # serve REPOSITORY (default: $PODIUM_V2_REPOSITORY, else
#                                            # triton_models/) on free loopback ports, wait until ready,
#                                            # print PODIUM_V2_GRPC=, PODIUM_V2_HTTP=, PODIUM_V2_REPOSITORY=
#   scripts/v2server.sh status               # print the same and exit 0 if up; exit 3 if not
#   scripts/v2server.sh stop                 # SIGTERM the server's process group, then SIGKILL; always exit 0
#
# Typical use:  eval "$(scripts/v2server.sh start "$(mktemp -d)")"; export PODIUM_V2_GRPC PODIUM_V2_REPOSITORY
#
# The server runs with explicit model control, like Triton's --model-control-mode=explicit: nothing
# is loaded at start; clients load and unload models with the repository API (RepositoryModelLoad /
# RepositoryModelUnload, i.e. tritonclient's load_model / unload_model).
#
# MLServer pins its own dependencies, so it lives in its own venv outside the clone, keyed by the
# Python version and scripts/v2server-requirements.txt:
#   ${PODIUM_CACHE:-~/.cache/podium}/mlserver-<key>
# State (pid, ports, log) lives in ${PODIUM_V2_STATE:-/tmp/podium-v2-$UID}; one server per state dir.
# PODIUM_V2_METRICS=1 also serves Prometheus metrics (port in $PODIUM_V2_STATE/metrics_port).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"
STATE="${PODIUM_V2_STATE:-/tmp/podium-v2-$(id -u)}"
PY="${PODIUM_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
REQS="$ROOT/scripts/v2server-requirements.txt"
KEY="$(printf '%s\n%s' "$("$PY" -c 'import sys; print(sys.version)')" "$(cat "$REQS")" | sha256sum | cut -c1-16)"
VENV="$CACHE/mlserver-$KEY"
READY_TIMEOUT="${PODIUM_V2_READY_TIMEOUT:-90}"

log() { echo "v2server: $*" >&2; }
# shellcheck source=scripts/server-lib.sh
source "$ROOT/scripts/server-lib.sh"

install() {
  [[ -f "$VENV/.complete" ]] && return 0
  mkdir -p "$CACHE"
  # Two starts at once (parallel CI jobs) must not build the same venv twice.
  exec 9>"$VENV.lock"
  flock 9
  if [[ ! -f "$VENV/.complete" ]]; then
    local t0; t0=$(date +%s)
    log "creating $VENV (first run only: downloads MLServer and onnxruntime)"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip >&2
    "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQS" >&2
    touch "$VENV/.complete"
    log "installed in $(( $(date +%s) - t0 )) s"
  fi
  flock -u 9
}

pid_alive() { [[ -f "$STATE/pid" ]] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; }

free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Ready means: HTTP /v2/health/ready answers 200 AND gRPC ServerReady says ready.
probe() {
  PYTHONPATH="" "$VENV/bin/python" - "$(cat "$STATE/http_port")" "$(cat "$STATE/grpc_port")" <<'PY'
import sys, urllib.request
import grpc
from mlserver.grpc import dataplane_pb2 as pb, dataplane_pb2_grpc as rpc
http, port = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
        assert r.status == 200
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        ok = rpc.GRPCInferenceServiceStub(ch).ServerReady(pb.ServerReadyRequest(), timeout=2).ready
    sys.exit(0 if ok else 1)
except Exception:
    sys.exit(1)
PY
}

print_env() {
  echo "PODIUM_V2_GRPC=127.0.0.1:$(cat "$STATE/grpc_port")"
  echo "PODIUM_V2_HTTP=127.0.0.1:$(cat "$STATE/http_port")"
  echo "PODIUM_V2_REPOSITORY=$(cat "$STATE/repository")"
}

stop() { stop_server "$STATE"; }

start() {
  local repo="${1:-${PODIUM_V2_REPOSITORY:-$ROOT/triton_models}}"
  [[ -d "$repo" ]] || { log "model repository $repo is not a directory"; exit 2; }
  repo="$(cd "$repo" && pwd)"
  install
  mkdir -p "$STATE"
  if pid_alive && probe; then
    if [[ "$(cat "$STATE/repository")" != "$repo" ]]; then
      log "a server is already running from $STATE for $(cat "$STATE/repository"); stop it first"
      exit 2
    fi
    print_env; return 0
  fi
  stop >/dev/null 2>&1
  free_port >"$STATE/grpc_port"; free_port >"$STATE/http_port"; free_port >"$STATE/metrics_port"
  echo "$repo" >"$STATE/repository"
  # Prometheus metrics (a third port and a per-request interceptor) only when asked for.
  local METRICS_ENDPOINT=""
  [[ "${PODIUM_V2_METRICS:-0}" == 1 ]] && METRICS_ENDPOINT=/metrics
  # parallel_workers=0: inference runs in the server process; separate worker processes would add
  # an IPC hop to every decision and need more cores than these machines have.
  env PYTHONPATH="$ROOT" \
    MLSERVER_HOST=127.0.0.1 \
    MLSERVER_GRPC_PORT="$(cat "$STATE/grpc_port")" \
    MLSERVER_HTTP_PORT="$(cat "$STATE/http_port")" \
    MLSERVER_METRICS_PORT="$(cat "$STATE/metrics_port")" \
    MLSERVER_PARALLEL_WORKERS=0 \
    MLSERVER_DEBUG=false \
    MLSERVER_METRICS_ENDPOINT="$METRICS_ENDPOINT" \
    MLSERVER_LOAD_MODELS_AT_STARTUP=false \
    MLSERVER_MODEL_REPOSITORY_IMPLEMENTATION=podium.serving.mlserver_onnx.TritonModelRepository \
    setsid "$VENV/bin/mlserver" start "$repo" >"$STATE/server.log" 2>&1 </dev/null &
  echo $! >"$STATE/pid"
  wait_ready "$STATE" "$READY_TIMEOUT" probe || exit 1
  print_env
}

case "${1:-}" in
  install) install; echo "$VENV" ;;
  start) shift; start "$@" ;;
  status) if pid_alive && probe; then print_env; else exit 3; fi ;;
  stop) stop ;;
  *) echo "usage: $0 install | start [REPOSITORY] | status | stop" >&2; exit 2 ;;
esac
