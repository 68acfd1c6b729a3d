#!/usr/bin/env bash
# The Context-1 benchmark corpus: documentation a Debian machine installs offline, fetched
# without root and without installing anything system-wide.
#
#   scripts/docs-corpus.sh          # fetch once (idempotent), print the docs roots, one a line
#   scripts/docs-corpus.sh --path   # print the roots only if already fetched (exit 3 if not)
#
# Typical use:  podium context index --docs $(scripts/docs-corpus.sh) --out /tmp/ctx-index
#
# Packages: python3.11-doc (the Python 3.11 documentation's reST sources, under
# usr/share/doc/python3.11/html/_sources) and manpages + manpages-dev (sections 1-8 of the
# Linux man pages, gzip'd troff, under usr/share/man). `apt-get download` fetches the .deb
# files as an ordinary user (the machine's apt sources and lists decide the versions) and
# `dpkg-deb -x` unpacks them into
#   ${PODIUM_CACHE:-~/.cache/podium}/corpus/<key>/root
# where <key> hashes the package list, so changing the list fetches afresh. A lock keeps two
# runs (parallel CI jobs) from fetching the same corpus twice.
set -euo pipefail
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"
PACKAGES=(python3.11-doc manpages manpages-dev)
KEY="$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-12)"
DEST="$CACHE/corpus/$KEY"
ROOTS=("$DEST/root/usr/share/doc/python3.11/html/_sources" "$DEST/root/usr/share/man")

log() { echo "docs-corpus: $*" >&2; }

print_roots() { printf '%s\n' "${ROOTS[@]}"; }

fetch() {
  [[ -f "$DEST/.complete" ]] && return 0
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || {
    log "needs apt-get and dpkg-deb (a Debian or Ubuntu machine)"; exit 2; }
  mkdir -p "$CACHE/corpus"
  exec 9>"$DEST.lock"
  flock 9
  if [[ ! -f "$DEST/.complete" ]]; then
    local t0; t0=$(date +%s)
    rm -rf "$DEST"
    mkdir -p "$DEST/debs" "$DEST/root"
    log "downloading ${PACKAGES[*]}"
    (cd "$DEST/debs" && apt-get download -q "${PACKAGES[@]}" >&2) || {
      log "apt-get download failed (run 'apt-get update' as root if the package lists are empty)"
      exit 1; }
    for deb in "$DEST"/debs/*.deb; do dpkg-deb -x "$deb" "$DEST/root"; done
    for root in "${ROOTS[@]}"; do
      [[ -d "$root" ]] || { log "$root missing after unpacking"; exit 1; }
    done
    touch "$DEST/.complete"
    log "unpacked in $(( $(date +%s) - t0 )) s into $DEST/root"
  fi
  flock -u 9
}

case "${1:-}" in
  "") fetch; print_roots ;;
  --path) [[ -f "$DEST/.complete" ]] || exit 3; print_roots ;;
  *) echo "usage: $0 [--path]" >&2; exit 2 ;;
esac
