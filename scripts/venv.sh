#!/usr/bin/env bash
# Creates (once) and prints the path of this clone's Python environment.
#
# Two layers, so that every checkout runs its own code and PyTorch is downloaded once:
#   * a shared DEPENDENCY environment, cached outside the clone (~/.cache/podium/deps-<key>),
#     keyed by the Python version and the dependency lists. It never holds the project itself:
#     an editable install there would point every other clone at whichever clone ran setup
#     last (and break them all once that clone is deleted).
#   * a thin per-clone environment, <clone>/.venv (git-ignored), made of this clone's
#     interpreter, a .pth that puts the shared dependencies on the path, a .pth that puts THIS
#     clone's source tree on the path, and the console scripts (podium, pytest, mypy, ...)
#     re-pointed at this interpreter. It is rebuilt in about a second whenever the key or the
#     clone's location changes.
# Two clones may set up at once: building the shared layer is serialised by a lock.
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
DEPS="$CACHE/deps-$KEY"
mkdir -p "$CACHE"
if [[ ! -f "$DEPS/.complete" ]]; then
  exec 9>"$DEPS.lock"
  flock 9
  if [[ ! -f "$DEPS/.complete" ]]; then
    rm -rf "$DEPS"
    echo "podium: creating the dependency environment $DEPS (first run downloads PyTorch; later runs and other clones reuse it)" >&2
    "$PY" -m venv "$DEPS"
    "$DEPS/bin/pip" install -q --upgrade pip >&2
    printf '%s\n' "$REQS" > "$CACHE/requirements-$KEY.txt"
    "$DEPS/bin/pip" install -q -r "$CACHE/requirements-$KEY.txt" >&2
    touch "$DEPS/.complete"
  fi
  flock -u 9
fi

VENV="$ROOT/.venv"
STAMP="$KEY $ROOT"
if [[ "$(cat "$VENV/.podium-stamp" 2>/dev/null)" != "$STAMP" ]]; then
  rm -rf "$VENV"
  "$DEPS/bin/python" -m venv --without-pip "$VENV"
  "$VENV/bin/python" - "$DEPS" "$ROOT" "$VENV" <<'PY'
import os, pathlib, sys, sysconfig, tomllib

deps, root, venv = (pathlib.Path(p) for p in sys.argv[1:])
site = pathlib.Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
deps_site = pathlib.Path(
    sysconfig.get_paths(vars={"base": str(deps), "platbase": str(deps)})["purelib"]
)
# addsitedir (not a bare path) so the shared layer's own .pth files are honoured too. The
# clone's source comes first: its packages win over anything of the same name.
(site / "_podium_0_source.pth").write_text(f"{root}\n")
(site / "_podium_1_deps.pth").write_text(f"import site; site.addsitedir({str(deps_site)!r})\n")
python = venv / "bin" / "python"
shebang = f"#!{python}\n"
for tool in sorted((deps / "bin").iterdir()):
    name = tool.name
    if name.startswith(("python", "pip", "activate", "Activate")) or not tool.is_file():
        continue
    target = venv / "bin" / name
    head = tool.read_bytes()[:2]
    if head == b"#!":
        # A console script: same entry point, run by this clone's interpreter.
        lines = tool.read_text().splitlines(keepends=True)
        target.write_text(shebang + "".join(lines[1:]))
        target.chmod(0o755)
    else:
        target.symlink_to(tool)  # a native binary (ruff): interpreter-independent
scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
for name, entry in scripts.items():
    module, func = entry.split(":")
    target = venv / "bin" / name
    # The guard matters: multiprocessing's spawn start method re-imports the main script in
    # every child (as __mp_main__), which would otherwise run the whole command again there.
    target.write_text(
        f"{shebang}import sys\nfrom {module} import {func}\n"
        f"if __name__ == '__main__':\n    sys.exit({func}())\n"
    )
    target.chmod(0o755)
PY
  echo "$STAMP" > "$VENV/.podium-stamp"
fi
echo "$VENV"
