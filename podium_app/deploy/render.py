"""Render a kustomize overlay into its Kubernetes objects, optionally with extra patches.

``kustomize`` is the one scripts/test.sh installs (``${PODIUM_CACHE:-~/.cache/podium}/go-bin``)
or the first on ``PATH``. Extra patches (``--patch FILE``, test-only settings) are applied the
way an operator would: a throw-away kustomization whose only resource is the overlay and whose
``patches`` are the files, so the overlay itself is rendered unchanged underneath.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from podium.errors import ConfigError, PodiumError

ROOT = Path(__file__).resolve().parents[2]
"""The checkout (``k8s/overlays/<name>`` is resolved against it)."""


def kustomize_binary() -> Path:
    """The kustomize executable, or a :class:`ConfigError` saying how to install it."""
    cache = Path(os.environ.get("PODIUM_CACHE", Path.home() / ".cache" / "podium"))
    found = shutil.which("kustomize")
    path = Path(found) if found else cache / "go-bin" / "kustomize"
    if not path.exists():
        raise ConfigError(
            f"kustomize not found on PATH nor at {path}: scripts/test.sh installs it "
            "(go install sigs.k8s.io/kustomize/kustomize/v5@v5.7.1)"
        )
    return path


def overlay_dir(overlay: str) -> Path:
    """``dev`` -> ``k8s/overlays/dev``; a path to a kustomization directory is taken as is."""
    candidate = Path(overlay)
    if not candidate.is_dir():
        candidate = ROOT / "k8s" / "overlays" / overlay
    if not (candidate / "kustomization.yaml").is_file():
        raise ConfigError(f"overlay {overlay!r}: no kustomization.yaml in {candidate}")
    return candidate.resolve()


def render(overlay: str, patches: Sequence[Path] = ()) -> list[dict[str, Any]]:
    """The objects ``kustomize build`` renders for ``overlay`` with ``patches`` on top."""
    source = overlay_dir(overlay)
    for patch in patches:
        if not patch.is_file():
            raise ConfigError(f"--patch {patch}: no such file")
    if not patches:
        return _build(source)
    with tempfile.TemporaryDirectory(prefix="podium-overlay-") as tmp:
        root = Path(tmp)
        names = []
        for i, patch in enumerate(patches):
            name = f"patch-{i}-{patch.name}"
            shutil.copyfile(patch, root / name)
            names.append({"path": name})
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(source, root)],
            "patches": names,
        }
        (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return _build(root)


def _build(directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(kustomize_binary()), "build", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise PodiumError(f"kustomize build {directory} failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if isinstance(doc, dict)]


__all__ = ["ROOT", "kustomize_binary", "overlay_dir", "render"]
