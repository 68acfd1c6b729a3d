#!/usr/bin/env bash
# Sets up everything (cached venv, generated code is committed) and runs a podium command.
# With no arguments it runs the main job on the embedded default (in-process bus, local policy).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/venv.sh")"
if (($# == 0)); then
  set -- train
fi
exec "$VENV/bin/podium" "$@"
