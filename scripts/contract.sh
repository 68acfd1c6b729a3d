#!/usr/bin/env bash
# The protobuf contract across releases: buf, the released contracts, the breaking check.
#
#   scripts/contract.sh buf ARGS...        run buf (installed once into ${PODIUM_CACHE:-~/.cache/podium}/buf
#                                          from npm, @bufbuild/buf at the version below)
#   scripts/contract.sh previous           print the image of the previous release: the newest
#                                          protos/releases/v<version>.binpb not newer than the project
#   scripts/contract.sh breaking           buf breaking of protos/ against `previous` (scripts/lint.sh runs it)
#   scripts/contract.sh release [VERSION]  at a release: write protos/releases/v<VERSION>.binpb, a buf image
#                                          of protos/ as it is (VERSION defaults to pyproject.toml's);
#                                          never overwrites one (a released contract does not change)
#
# Why committed images and not `--against '.git#tag=v0.1.0'`: this repository has no tags (the
# release is the version in pyproject.toml), CI clones with --depth 1 (no older refs), and a source
# tarball has no .git at all. A release's image is a few kilobytes, is reviewed in the diff that
# makes the release, and works offline in any checkout. Comparing with the merge base instead
# would accept a break once it is merged; comparing with the previous release never does.
#
# PODIUM_PROTOS (default protos/) and PODIUM_PROTO_RELEASES (default protos/releases) let the tests
# run these steps on copies.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"
BUF_VERSION="1.75.0"
PROTOS="${PODIUM_PROTOS:-$ROOT/protos}"
RELEASES="${PODIUM_PROTO_RELEASES:-$ROOT/protos/releases}"
PY="${PYTHON:-python3}"

log() { echo "contract: $*" >&2; }

buf() {
  local bin="$CACHE/buf/node_modules/.bin/buf"
  if [[ ! -x "$bin" ]]; then
    mkdir -p "$CACHE/buf"
    # Serialised: scripts/test.sh lints while it builds the Go worker, and both may install.
    (
      flock 9
      if [[ ! -x "$bin" ]]; then
        cd "$CACHE/buf" && npm install --silent --no-save --no-audit --no-fund "@bufbuild/buf@$BUF_VERSION" >/dev/null
      fi
    ) 9>"$CACHE/buf.lock"
  fi
  "$bin" "$@"
}

project_version() {
  "$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$ROOT/pyproject.toml"
}

# Is version $1 <= version $2 (dotted numbers, as sort -V orders them)?
version_le() { [[ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" == "$1" ]]; }

previous() {
  local project newest="" v
  project="$(project_version)"
  shopt -s nullglob
  for image in "$RELEASES"/v*.binpb; do
    v="$(basename "$image" .binpb)"; v="${v#v}"
    if ! version_le "$v" "$project"; then
      log "$image is newer than the project's version $project (pyproject.toml): a release image is made at its release"
      exit 1
    fi
    if [[ -z "$newest" ]] || version_le "$newest" "$v"; then newest="$v"; fi
  done
  if [[ -z "$newest" ]]; then
    log "no released contract in $RELEASES: make the first with scripts/contract.sh release"
    exit 1
  fi
  echo "$RELEASES/v$newest.binpb"
}

breaking() {
  local against
  against="$(previous)"
  log "buf breaking: $PROTOS against $(basename "$against") (the previous release)"
  (cd "$PROTOS" && buf breaking --against "$against")
}

release() {
  local version="${1:-$(project_version)}" out
  [[ "$version" =~ ^[0-9]+(\.[0-9]+)*$ ]] || { log "VERSION must be dotted numbers, got '$version'"; exit 2; }
  out="$RELEASES/v$version.binpb"
  if [[ -e "$out" ]]; then
    log "$out exists: the contract of release $version is already recorded and never changes"
    exit 1
  fi
  mkdir -p "$RELEASES"
  # No source info: the image holds the contract (names, numbers, types), not comments or spans.
  (cd "$PROTOS" && buf build --exclude-source-info -o "$out")
  log "wrote $out (commit it with the release)"
  echo "$out"
}

case "${1:-}" in
  buf) shift; buf "$@" ;;
  previous) previous ;;
  breaking) breaking ;;
  release) shift; release "$@" ;;
  *) echo "usage: $0 buf ARGS... | previous | breaking | release [VERSION]" >&2; exit 2 ;;
esac
