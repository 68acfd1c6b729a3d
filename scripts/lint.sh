#!/usr/bin/env bash
# Static checks: buf lint, buf breaking, generated code is fresh, ruff check,
# ruff format --check, mypy strict.
# Expects the project's venv on PATH (scripts/test.sh puts it there).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"

# buf from the npm package @bufbuild/buf, installed once into the cache.
BUF="$CACHE/buf/node_modules/.bin/buf"
if [[ ! -x "$BUF" ]]; then
  mkdir -p "$CACHE/buf"
  (cd "$CACHE/buf" && npm install --silent --no-save --no-audit --no-fund @bufbuild/buf@1.75.0 >/dev/null)
fi
echo "lint: buf lint" >&2
(cd protos && "$BUF" lint)

# The contract may only grow: buf breaking (FILE rules, protos/buf.yaml) against
# protos/baseline.binpb, a committed buf image of the last released contract. A committed
# image rather than `--against '.git#ref=...'`: it works in any fresh or shallow clone (CI
# clones with --depth 1 have no older refs), in a source tarball and offline, and the
# baseline moves only when a release says so, in a reviewed diff (comparing with the branch
# itself would accept a break the moment it is committed). Additive changes (new fields,
# messages, RPCs) pass; a removed, renumbered or retyped field fails. At a release, refresh:
#   T=$(mktemp -d); git archive <release-ref> protos | tar -x -C "$T"
#   (cd "$T/protos" && buf build --exclude-source-info -o "$ROOT/protos/baseline.binpb")
echo "lint: buf breaking (against protos/baseline.binpb)" >&2
(cd protos && "$BUF" breaking --against baseline.binpb)

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
