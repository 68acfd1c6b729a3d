# Shared by the scripts that run a local server in the background (scripts/v2server.sh,
# scripts/chroma.sh): sourced, never run. The caller defines log().

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
