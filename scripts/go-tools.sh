#!/usr/bin/env bash
# go-tools.sh STATE: builds the Go tools the tests run, each once into
# ${PODIUM_CACHE:-~/.cache/podium}/go-bin (minutes on a fresh machine, nothing after), one after
# another, so the builds share Go's module and build caches without contending for them:
# kustomize and the Go worker (the tests' own), then Jaeger. As each part ends it writes its
# exit status to STATE/base.rc and STATE/jaeger.rc, and Jaeger's line (PODIUM_JAEGER=<the
# binary>) to STATE/jaeger.env, so a caller that starts it in the background can wait for
# each part alone.
# scripts/test.sh runs it in the background while it makes the environment and lints, and runs
# the tests that need only the first part before Jaeger (the longest build) is done.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"
STATE="${1:?usage: go-tools.sh STATE, a directory for the exit status of each part}"

base() {
  set -e
  # kustomize renders k8s/ in the tests.
  if [[ ! -x "$CACHE/go-bin/kustomize" ]]; then
    echo "go-tools: installing kustomize into $CACHE/go-bin" >&2
    (cd /tmp && GOBIN="$CACHE/go-bin" GOFLAGS=-mod=mod go install sigs.k8s.io/kustomize/kustomize/v5@v5.7.1 >&2)
  fi
  # The Go external worker (tools/go-worker, its protobuf code generated from protos/), built
  # once per source digest, so the Kafka test that runs it does not build it.
  bash "$ROOT/scripts/go-worker.sh" >/dev/null
}

# Each part in a subshell, so `set -e` ends the part, not the script, and both statuses are told.
(base)
base_rc=$?
echo "$base_rc" >"$STATE/base.rc"
# Jaeger, the trace backend the local deployment runs (tests/k8s/test_local_deployment.py),
# built once per version.
bash "$ROOT/scripts/jaeger.sh" >"$STATE/jaeger.env"
jaeger_rc=$?
echo "$jaeger_rc" >"$STATE/jaeger.rc"
exit $((base_rc != 0 ? base_rc : jaeger_rc))
