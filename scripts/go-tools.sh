#!/usr/bin/env bash
# Builds the Go tools the tests run, each once into ${PODIUM_CACHE:-~/.cache/podium}/go-bin
# (a few minutes on a fresh machine, nothing after), and prints the line the tests need:
#   PODIUM_JAEGER=<the binary>
# One after another, so the builds share Go's module and build caches without contending.
# scripts/test.sh runs it in the background while it lints (mypy leaves a core free).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"

# kustomize renders k8s/ in the tests.
if [[ ! -x "$CACHE/go-bin/kustomize" ]]; then
  echo "go-tools: installing kustomize into $CACHE/go-bin" >&2
  (cd /tmp && GOBIN="$CACHE/go-bin" GOFLAGS=-mod=mod go install sigs.k8s.io/kustomize/kustomize/v5@v5.7.1 >&2)
fi
# The Go external worker (tools/go-worker, its protobuf code generated from protos/), built once
# per source digest, so the Kafka test that runs it does not build it.
bash "$ROOT/scripts/go-worker.sh" >/dev/null
# Jaeger, the trace backend the local deployment runs (tests/k8s/test_local_deployment.py),
# built once per version.
bash "$ROOT/scripts/jaeger.sh"
