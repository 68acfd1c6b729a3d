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
background=() # process groups started here (the Go build, the pytest processes beside the rest)
servers=""    # set once the broker and the inference server are being started
finish() {
  local group
  for group in "${background[@]}"; do kill -- "-$group" 2>/dev/null || true; done
  if [[ -n $servers ]]; then cleanup; fi
  rm -rf "$RUN_TMP"
}
trap finish EXIT INT TERM

# The Go tools (scripts/go-tools.sh: kustomize and the Go worker, then Jaeger) build in the
# background while the Python environment is made and the static checks run: minutes on a
# fresh machine, nothing on a warm cache. pytest waits for the first part; only the local
# deployment test, run last, waits for Jaeger.
GO_TOOLS="$RUN_TMP/go-tools"
mkdir -p "$GO_TOOLS"
setsid bash scripts/go-tools.sh "$GO_TOOLS" 2>"$GO_TOOLS/log" &
go_tools=$!
background+=("$go_tools")
# go_tools_ready PART: wait until that part of the build has ended; its exit status.
go_tools_ready() {
  while [[ ! -s "$GO_TOOLS/$1.rc" ]]; do
    if ! kill -0 "$go_tools" 2>/dev/null && [[ ! -s "$GO_TOOLS/$1.rc" ]]; then
      echo "test: the Go tools' build ended before its $1 part (scripts/go-tools.sh)" >&2
      cat "$GO_TOOLS/log" >&2
      return 1
    fi
    sleep 1
  done
  if [[ $(cat "$GO_TOOLS/$1.rc") != 0 ]]; then
    cat "$GO_TOOLS/log" >&2
    echo "test: building the Go tools failed (scripts/go-tools.sh, its log above)" >&2
    return 1
  fi
}

# A system tool the tests use as an independent client: protoc (decode events). Kafka's own
# console consumer (read topics) comes with the broker's jars (scripts/kafka.sh fetch).
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
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
# The local deployment's own V2 server (it publishes the orchestrator's real model name, as the
# served-policy tests of the rest do, so the two must not share a server's repository).
DEPLOYMENT_V2_STATE="$(mktemp -d /tmp/podium-v2.XXXXXX)"
cleanup() {
  bash scripts/v2server.sh stop >&2 || true
  PODIUM_V2_STATE="$DEPLOYMENT_V2_STATE" bash scripts/v2server.sh stop >&2 || true
  bash scripts/kafka.sh stop --dir "$KAFKA_DIR" >&2 || true
  rm -rf "$KAFKA_DIR" "$PODIUM_V2_STATE" "$PODIUM_V2_REPOSITORY" "$DEPLOYMENT_V2_STATE"
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

go_tools_ready base || exit 1
export PATH="$PATH:$CACHE/go-bin" # kustomize
echo "test: Go tools ready (kustomize, the Go worker; Jaeger for the local deployment test)" >&2

# The system suites (tests/faults, tests/rollout, the drift cycle) and the self-contained tests
# (on brokers, buses and V2 servers of their own: crash-safe sessions with the services as
# processes, a resumed training run, in-process session and training tests, then the local
# deployment) run in two more pytest processes beside the rest: the system suites spend most
# of their time waiting out faults, timeouts and process starts, and one process beside the
# rest left about a third of two cores idle. The local deployment test runs last in its group,
# in a pytest of its own, once Jaeger is built, on a V2 server of its own. Each process gets its
# own --basetemp (pytest prunes old numbered temp dirs, which would race). With arguments,
# exactly those run in one process, as given (after the whole Go build).
SYSTEM_SUITES=(tests/faults tests/rollout tests/podium_app/test_cycle_kafka.py)
SELF_CONTAINED=(tests/orchestrator_svc/test_sessions_kafka.py
  tests/podium_app/train/test_train_resume_kafka.py tests/orchestrator_svc/test_sessions_crash_safe.py
  tests/podium_app/train/test_job.py tests/podium_app/commands/test_bench_context.py)
LOCAL_DEPLOYMENT=tests/k8s/test_local_deployment.py
jaeger_ready() {
  go_tools_ready jaeger && export "$(grep '^PODIUM_JAEGER=' "$GO_TOOLS/jaeger.env")"
}
set +e
if (($# == 0)); then
  set -m # each pytest below in a process group of its own, so finish() can end all of it
  python -m pytest "${SYSTEM_SUITES[@]}" --basetemp="$RUN_TMP/system" --durations=15 \
    >"$RUN_TMP/system.log" 2>&1 &
  system=$!
  (
    python -m pytest "${SELF_CONTAINED[@]}" --basetemp="$RUN_TMP/contained" --durations=5
    contained_rc=$?
    jaeger_ready || exit 1
    export PODIUM_V2_STATE="$DEPLOYMENT_V2_STATE"
    mkdir -p "$DEPLOYMENT_V2_STATE/models"
    v2_env="$(bash scripts/v2server.sh start "$DEPLOYMENT_V2_STATE/models")" || exit 1
    eval "$v2_env"
    export PODIUM_V2_GRPC PODIUM_V2_HTTP PODIUM_V2_REPOSITORY
    python -m pytest "$LOCAL_DEPLOYMENT" --basetemp="$RUN_TMP/deployment" --durations=5
    deployment_rc=$?
    exit $((contained_rc != 0 ? contained_rc : deployment_rc))
  ) >"$RUN_TMP/contained.log" 2>&1 &
  contained=$!
  background+=("$system" "$contained")
  set +m
  python -m pytest --basetemp="$RUN_TMP/main" --durations=40 \
    $(printf -- '--ignore=%s ' "${SYSTEM_SUITES[@]}" "${SELF_CONTAINED[@]}" "$LOCAL_DEPLOYMENT")
  main_rc=$?
  wait "$system"
  system_rc=$?
  wait "$contained"
  contained_rc=$?
  background=() # all ended: nothing for finish() to signal
  echo "test: ---- the system suites (${SYSTEM_SUITES[*]}), run beside the rest ----"
  cat "$RUN_TMP/system.log"
  echo "test: ---- the self-contained tests (${SELF_CONTAINED[*]} $LOCAL_DEPLOYMENT), run beside the rest ----"
  cat "$RUN_TMP/contained.log"
  echo "test: pytest exit $main_rc (the rest), $system_rc (the system suites)," \
    "$contained_rc (the self-contained tests)" >&2
  rc=$((main_rc != 0 ? main_rc : system_rc != 0 ? system_rc : contained_rc))
else
  jaeger_ready || exit 1
  python -m pytest "$@"
  rc=$?
fi
set -e
echo "test: finished in $(( $(date +%s) - START )) s (pytest exit $rc)" >&2
exit $rc
