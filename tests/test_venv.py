"""Each checkout runs its own code (scripts/venv.sh).

The dependency environment is shared by every clone (it holds PyTorch, built once); the project
itself must come from the clone that runs. Two clones set up at the same time, each must import
its own source, and deleting one must leave the other working.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _clone(into: Path, name: str) -> Path:
    """A clone of this repository with the working tree's venv.sh and a marker module."""
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(into)], check=True)
    shutil.copy(ROOT / "scripts" / "venv.sh", into / "scripts" / "venv.sh")
    shutil.copy(ROOT / "pyproject.toml", into / "pyproject.toml")
    (into / "podium" / "_clone_marker.py").write_text(f"NAME = {name!r}\n")
    return into


def _which_clone(venv: Path) -> str:
    """(marker name, podium package dir, podium_app dir) as this environment's python sees them."""
    code = (
        "import podium, podium_app, podium._clone_marker as m; "
        "print(m.NAME, podium.__file__, podium_app.__file__)"
    )
    # From / so that the current directory cannot put a clone on the path.
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.timeout(600)
def test_two_clones_set_up_at_once_each_run_their_own_code(tmp_path: Path) -> None:
    clones = {name: _clone(tmp_path / name, name) for name in ("alpha", "beta")}
    setups = {
        name: subprocess.Popen(
            ["bash", "scripts/venv.sh"],
            cwd=clone,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, clone in clones.items()
    }
    venvs: dict[str, Path] = {}
    for name, proc in setups.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        venvs[name] = Path(out.strip().splitlines()[-1])
        assert venvs[name] == clones[name] / ".venv"

    for name, clone in clones.items():
        seen = _which_clone(venvs[name])
        marker, podium_file, app_file = seen.split()
        assert marker == name
        assert Path(podium_file).is_relative_to(clone)
        assert Path(app_file).is_relative_to(clone)
        # The console script runs this clone's CLI too.
        help_text = subprocess.run(
            [str(venvs[name] / "bin" / "podium"), "--help"],
            cwd="/",
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "train" in help_text

    # The console script is import-safe: a spawned child (the orchestrator's spec parser
    # workers use the spawn start method) re-imports it as __mp_main__ and must not rerun the
    # command. The demo parses its task in such a worker.
    demo = subprocess.run(
        [str(venvs["beta"] / "bin" / "podium"), "demo"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "received 1 scored trajectory" in demo.stdout

    # The shared layer holds no project install that could point anywhere.
    pth = next(venvs["alpha"].glob("lib/python*/site-packages/_podium_1_deps.pth")).read_text()
    deps_site = Path(pth.split("addsitedir(")[1].split(")")[0].strip("'\""))
    deps_python = deps_site.parents[2] / "bin" / "python"
    assert deps_python.exists(), deps_python
    probe = subprocess.run(
        [str(deps_python), "-c", "import podium"], cwd="/", capture_output=True, text=True
    )
    assert probe.returncode != 0, "the shared dependency environment must not import podium"

    shutil.rmtree(clones["alpha"])
    assert _which_clone(venvs["beta"]).split()[0] == "beta"
