#!/usr/bin/env bash
# Creates (once) and prints the path of the project's cached virtual environment.
# The environment is keyed by the Python version and the dependency lists, so a dependency change builds a
# fresh one and an unchanged one is reused across clones. It lives outside the clone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PODIUM_CACHE:-$HOME/.cache/podium}"
PY="${PODIUM_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
# Key on the dependency lists only, so editing other parts of pyproject.toml keeps the cache.
REQS="$("$PY" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
data = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(data["dependencies"] + data["optional-dependencies"]["dev"]))
PY
)"
KEY="$(printf '%s\n%s' "$("$PY" -c 'import sys; print(sys.version)')" "$REQS" | sha256sum | cut -c1-16)"
VENV="$CACHE/venv-$KEY"
if [[ ! -f "$VENV/.complete" ]]; then
  mkdir -p "$CACHE"
  rm -rf "$VENV"
  echo "podium: creating virtual environment $VENV (first run downloads PyTorch; later runs reuse it)" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >&2
  # Install the dependencies (not the project itself) so the cache is independent of the clone.
  printf '%s\n' "$REQS" > "$CACHE/requirements-$KEY.txt"
  "$VENV/bin/pip" install -q -r "$CACHE/requirements-$KEY.txt" >&2
  touch "$VENV/.complete"
fi
# The project itself is installed editable into whichever clone asks (cheap, no downloads),
# and again when its console script no longer names the entry point pyproject.toml declares.
ENTRY="$("$PY" -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['project']['scripts']['podium'].split(':')[0])" "$ROOT/pyproject.toml")"
if ! (cd / && "$VENV/bin/python" -c "import podium, podium_app, pathlib, sys; root = pathlib.Path('$ROOT').resolve(); sys.exit(0 if all(pathlib.Path(m.__file__).resolve().is_relative_to(root) for m in (podium, podium_app)) else 1)" 2>/dev/null) \
  || ! grep -q "from $ENTRY import" "$VENV/bin/podium" 2>/dev/null; then
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT" >&2
fi
echo "$VENV"
