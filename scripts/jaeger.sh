#!/usr/bin/env bash
# Installs Jaeger (v2: an OpenTelemetry Collector distribution with Jaeger's storage and query
# API), the trace backend `podium deploy local` runs in place of the dev overlay's Jaeger image
# (docs/operations.md, "The local deployment"), idempotently, and prints where it is:
#   PODIUM_JAEGER=<the binary>
#
# Built once per version from the Go module proxy (github.com/jaegertracing/jaeger, the same
# module the jaegertracing/jaeger image is built from) into ${PODIUM_CACHE:-~/.cache/podium}/go-bin,
# as scripts/test.sh installs kustomize; the binary's name carries the version, so changing
# JAEGER_VERSION below builds the new one and removes the old.
#
# Exit status: 0 installed (or already there); 3 go is missing; anything else: a build failure.
set -euo pipefail
JAEGER_VERSION=v1.76.0
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"
binary="$CACHE/go-bin/jaeger-$JAEGER_VERSION"

if [[ ! -x "$binary" ]]; then
  command -v go >/dev/null 2>&1 || { echo "jaeger install: go is not installed" >&2; exit 3; }
  echo "jaeger install: building Jaeger $JAEGER_VERSION into $binary (a few minutes, once)" >&2
  work="$(mktemp -d "${TMPDIR:-/tmp}/jaeger-build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  # Built inside Jaeger's own module, as its release is: `go install ...@version` refuses a
  # module whose go.mod has replace directives (Jaeger pins sarama so), and as a dependency of
  # another module the replace would be ignored. The module is fetched (checksum-verified)
  # into the module cache, and its go.sum pins every dependency.
  dir="$(cd "$work" && go mod download -json "github.com/jaegertracing/jaeger@$JAEGER_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d $dir ]] || { echo "jaeger install: the module did not download" >&2; exit 1; }
  (cd "$dir" && go build -mod=readonly -trimpath -ldflags="-s -w" -o "$work/bin/jaeger" \
    ./cmd/jaeger >&2)
  mkdir -p "$CACHE/go-bin"
  mv -f "$work/bin/jaeger" "$binary"
  # Builds of other versions are left behind by the version in the name; keep only this one.
  find "$CACHE/go-bin" -maxdepth 1 -name 'jaeger-v*' ! -name "$(basename "$binary")" -delete
fi
# The stable name is what `podium deploy local` looks for by default.
ln -sfn "$(basename "$binary")" "$CACHE/go-bin/jaeger"
echo "PODIUM_JAEGER=$binary"
