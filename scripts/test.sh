#!/usr/bin/env bash
# The test command (README, .ci/run): set up the cached environment, start the real services the
# tests need (an Apache Kafka broker in KRaft mode), run the static checks and pytest, and stop
# everything it started whatever happens. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
START=$(date +%s)
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"
RUN_TMP="$(mktemp -d /tmp/podium-test.XXXXXX)"
background=() # process groups started here (setsid), ended with everything else
servers=""    # set once the broker and the inference server are being started
finish() {
  local group
  for group in "${background[@]}"; do kill -- "-$group" 2>/dev/null || true; done
  if [[ -n $servers ]]; then cleanup; fi
  rm -rf "$RUN_TMP"
}
trap finish EXIT INT TERM

# The Go tools (scripts/go-tools.sh: kustomize, the Go worker, Jaeger) build in the background
# while the Python environment is made and the static checks run: minutes on a fresh machine.
setsid bash scripts/go-tools.sh >"$RUN_TMP/go-tools.env" 2>"$RUN_TMP/go-tools.log" &
go_tools=$!
background+=("$go_tools")

# System tools the tests use as independent clients: protoc (decode events) and kcat (read topics).
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v kcat >/dev/null 2>&1 || need+=(kcat)
if ((${#need[@]})); then
  echo "test: installing ${need[*]}" >&2
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq "${need[@]}" >&2
fi

VENV="$(bash scripts/venv.sh)"
export PATH="$VENV/bin:$PATH"

bash scripts/lint.sh

# The strict manifest checker (tools/k8s-check, Go) and Strimzi's CRD schemas, built once per
# source hash and Strimzi version into the cache (tests/k8s/test_k8s_strict.py). Here, not in
# the background: it runs Maven, as the broker's start does, and one Maven at a time shares
# the local repository safely.
bash tools/k8s-check/install.sh >/dev/null

# Each run gets its own broker directory, so a developer's broker is left alone.
KAFKA_DIR="$(mktemp -d /tmp/podium-kafka.XXXXXX)"
# A real KServe-V2 inference server (MLServer in its own cached venv) serving a fresh
# Triton-layout model repository.
export PODIUM_V2_STATE="$(mktemp -d /tmp/podium-v2.XXXXXX)"
export PODIUM_V2_REPOSITORY="$(mktemp -d /tmp/podium-v2repo.XXXXXX)"
cleanup() {
  bash scripts/v2server.sh stop >&2 || true
  bash scripts/kafka.sh stop --dir "$KAFKA_DIR" >&2 || true
  rm -rf "$KAFKA_DIR" "$PODIUM_V2_STATE" "$PODIUM_V2_REPOSITORY"
}
servers=1
# The broker serves clients only over TLS with SCRAM-SHA-512 and ACLs: start prints a kafka://
# URL for its admin principal (PODIUM_KAFKA_BOOTSTRAP) and the password
# (PODIUM_KAFKA_SASL_PASSWORD); each service's own credentials are in $KAFKA_DIR/credentials/.
set -a
eval "$(bash scripts/kafka.sh start --dir "$KAFKA_DIR")"
set +a
echo "test: Kafka at $PODIUM_KAFKA_BOOTSTRAP" >&2
eval "$(bash scripts/v2server.sh start "$PODIUM_V2_REPOSITORY")"
export PODIUM_V2_GRPC PODIUM_V2_HTTP PODIUM_V2_REPOSITORY
echo "test: KServe-V2 server at $PODIUM_V2_GRPC (gRPC)" >&2

if ! wait "$go_tools"; then
  cat "$RUN_TMP/go-tools.log" >&2
  echo "test: building the Go tools failed (scripts/go-tools.sh, its log above)" >&2
  exit 1
fi
background=()
cat "$RUN_TMP/go-tools.log" >&2 # what was built (nothing on a warm cache)
export PATH="$PATH:$CACHE/go-bin" # kustomize
export "$(grep '^PODIUM_JAEGER=' "$RUN_TMP/go-tools.env")"
echo "test: Go tools ready (kustomize, the Go worker, Jaeger)" >&2

# The system suites (tests/faults, tests/rollout, the drift cycle) run their own brokers and
# service processes and spend most of their time waiting out faults and timeouts, so the whole
# run puts them in a second pytest process beside the rest: the run takes about as long as its longer half. Each
# process gets its own --basetemp (pytest prunes old numbered temp dirs, which would race).
# With arguments, exactly those run in one process, as given.
system_pid=""
trap '[[ -n $system_pid ]] && kill "$system_pid" 2>/dev/null; finish' EXIT INT TERM
SYSTEM_SUITES=(tests/faults tests/rollout tests/podium_app/test_cycle_kafka.py
  tests/k8s/test_local_deployment.py tests/podium_app/train/test_train_resume_kafka.py)
set +e
if (($# == 0)); then
  python -m pytest "${SYSTEM_SUITES[@]}" --basetemp="$RUN_TMP/system" --durations=15 \
    >"$RUN_TMP/system.log" 2>&1 &
  system_pid=$!
  python -m pytest --basetemp="$RUN_TMP/main" --durations=40 \
    $(printf -- '--ignore=%s ' "${SYSTEM_SUITES[@]}")
  main_rc=$?
  wait "$system_pid"
  system_rc=$?
  system_pid=""
  echo "test: ---- the system suites (${SYSTEM_SUITES[*]}), run beside the rest ----"
  cat "$RUN_TMP/system.log"
  echo "test: pytest exit $main_rc (the rest), $system_rc (the system suites)" >&2
  rc=$((main_rc != 0 ? main_rc : system_rc))
else
  python -m pytest "$@"
  rc=$?
fi
set -e
echo "test: finished in $(( $(date +%s) - START )) s (pytest exit $rc)" >&2
exit $rc
