#!/usr/bin/env bash
# Builds the Go external worker (tools/go-worker: a worker for `runner: external` agents written
# without Podium's Python code, on the contract of docs/subagent-contract.md) idempotently, and
# prints where it is:
#   PODIUM_GO_WORKER=<the binary>
#
# Its protobuf code is generated from protos/ at build time (protoc-gen-go, built from the Go
# module proxy at the google.golang.org/protobuf version tools/go-worker/go.mod pins, run by buf
# through scripts/contract.sh), so the worker always speaks the contract of this checkout. The
# binary lands in ${PODIUM_CACHE:-~/.cache/podium}/go-bin under a name carrying a digest of
# its inputs (the worker's sources, go.mod, go.sum, protos/ and this script), as scripts/jaeger.sh names
# Jaeger by version: a change to any of them builds anew and removes the old binary. The
# worker's own Go tests run before the binary is installed.
#
# Exit status: 0 installed (or already there); 3 go is missing; anything else: a build failure.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"
SRC="$ROOT/tools/go-worker"

inputs() {
  (cd "$ROOT" && find tools/go-worker -maxdepth 1 -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \)
   find protos/podium -name '*.proto'; echo scripts/go-worker.sh) | LC_ALL=C sort
}
key="$(cd "$ROOT" && inputs | xargs sha256sum | sha256sum | cut -c1-16)"
binary="$CACHE/go-bin/podium-go-worker-$key"

if [[ ! -x "$binary" ]]; then
  command -v go >/dev/null 2>&1 || { echo "go-worker: go is not installed" >&2; exit 3; }
  echo "go-worker: building $binary (about a minute on a cold module cache, once)" >&2
  protobuf_version="$(sed -n 's/^[[:space:]]*google\.golang\.org\/protobuf \(v[^ ]*\).*/\1/p' "$SRC/go.mod" | head -n1)"
  [[ -n $protobuf_version ]] || { echo "go-worker: go.mod pins no google.golang.org/protobuf" >&2; exit 1; }
  plugin_dir="$CACHE/go-bin/protoc-gen-go-$protobuf_version"
  if [[ ! -x "$plugin_dir/protoc-gen-go" ]]; then
    GOBIN="$plugin_dir" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$protobuf_version" >&2
  fi
  work="$(mktemp -d "${TMPDIR:-/tmp}/go-worker-build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/src"
  cp "$SRC"/*.go "$SRC/go.mod" "$SRC/go.sum" "$work/src/"
  # Every podium.v1 file into one Go package (podium/goworker/pb), as the worker imports it.
  cat > "$work/buf.gen.yaml" <<YAML
version: v2
managed:
  enabled: true
  override:
    - file_option: go_package
      value: podium/goworker/pb;podiumpb
plugins:
  - local: $plugin_dir/protoc-gen-go
    out: .
    opt: module=podium/goworker
YAML
  (cd "$ROOT/protos" && bash "$ROOT/scripts/contract.sh" buf generate \
    --template "$work/buf.gen.yaml" -o "$work/src" >&2)
  (cd "$work/src" && go vet ./... >&2 && go test -count=1 ./... >&2 &&
    go build -mod=readonly -trimpath -ldflags="-s -w" -o "$work/podium-go-worker" . >&2)
  mkdir -p "$CACHE/go-bin"
  mv -f "$work/podium-go-worker" "$binary"
  # Builds of other inputs are left behind by the digest in the name; keep only this one.
  find "$CACHE/go-bin" -maxdepth 1 -name 'podium-go-worker-*' ! -name "$(basename "$binary")" -delete
fi
ln -sfn "$(basename "$binary")" "$CACHE/go-bin/podium-go-worker"
echo "PODIUM_GO_WORKER=$binary"
