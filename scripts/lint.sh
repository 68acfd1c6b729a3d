#!/usr/bin/env bash
# Static checks: buf lint, buf breaking, generated code is fresh, ruff check,
# ruff format --check, mypy strict.
# Expects the project's venv on PATH (scripts/test.sh puts it there).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# buf (from npm, installed once into the cache) through scripts/contract.sh.
echo "lint: buf lint" >&2
(cd protos && bash "$ROOT/scripts/contract.sh" buf lint)

# The contract may only grow: buf breaking (FILE rules, protos/buf.yaml) against the previous
# release's contract, protos/releases/v<version>.binpb (the newest not newer than pyproject's
# version). A committed image rather than a git ref: it works in any fresh or shallow clone, a
# source tarball and offline (why, and how a release records its image: scripts/contract.sh).
# Additive changes (new fields, messages, RPCs) pass; a removed, renumbered or retyped field fails.
echo "lint: buf breaking (against the previous release)" >&2
bash scripts/contract.sh breaking

echo "lint: generated protobuf code is up to date" >&2
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cp -r podium/v1 "$TMP/before"
PYTHON=python bash scripts/gen_protos.sh 2>/dev/null
if ! diff -r -q "$TMP/before" podium/v1 -x __pycache__ >/dev/null; then
  echo "lint: podium/v1 was stale; regenerated it — commit the result of scripts/gen_protos.sh" >&2
  exit 1
fi

echo "lint: ruff check" >&2
ruff check .
echo "lint: ruff format --check" >&2
ruff format --check .
echo "lint: mypy (strict, service packages and core)" >&2
mypy
