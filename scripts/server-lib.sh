# Shared by the scripts that run a local server in the background (scripts/v2server.sh,
# scripts/chroma.sh): sourced, never run. The caller defines log(), which names the server.

# stop_server STATE_DIR: stop the server whose pid is in STATE_DIR/pid, if it runs. It was
# started in a session of its own (setsid), so its pid is also its process group id and the
# whole group goes: SIGTERM, up to 10 s to exit, then SIGKILL. Removes the pid file.
stop_server() {
  local state="$1"
  if [[ -f "$state/pid" ]]; then
    local pid; pid="$(cat "$state/pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      if kill -0 "$pid" 2>/dev/null; then
        log "pid $pid ignored SIGTERM for 10 s; sending SIGKILL"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      fi
    fi
    rm -f "$state/pid"
    log "stopped"
  fi
  return 0
}

# wait_ready STATE TIMEOUT PROBE [ARG...]: wait until the command PROBE ARG... exits 0, for the
# server started in the background whose pid is in STATE/pid and whose output goes to
# STATE/server.log. Fails (exit 1, after log()'s name for the server, the log's path and its last
# lines) when the process exits first - its pid file is removed - or after TIMEOUT seconds - the
# server is stopped, so a half-started one is never left behind.
wait_ready() {
  local state="$1" timeout="$2"; shift 2
  local pid; pid="$(cat "$state/pid")"
  local deadline=$(( $(date +%s) + timeout ))
  until "$@"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "server (pid $pid) exited during start-up; last lines of $state/server.log:"
      tail -n 30 "$state/server.log" >&2
      rm -f "$state/pid"; return 1
    fi
    if (( $(date +%s) > deadline )); then
      log "server (pid $pid) not ready after ${timeout} s; last lines of $state/server.log:"
      tail -n 30 "$state/server.log" >&2
      stop_server "$state"; return 1
    fi
    sleep 0.2
  done
  log "ready (log: $state/server.log)"
}
