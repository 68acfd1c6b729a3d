"""Helpers of the tests of ``bench/`` scripts: the scripts are files, not a package, so a test
loads one by path as a module and calls its ``main``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
"""The repository."""
V8 = ROOT / "bench" / "policies" / "misadvertised-v8" / "policy.safetensors"
"""The committed pool-agnostic policy the issue-14 benches start from."""
MISADVERTISED = ROOT / "podium" / "data" / "pools" / "misadvertised.yaml"
"""The shipped pool whose agents are not what they advertise."""


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (run once per call: each test gets fresh module state)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
