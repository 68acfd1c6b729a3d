#!/usr/bin/env bash
# Static checks: generated code is fresh, buf lint, ruff check, ruff format --check, mypy strict.
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
