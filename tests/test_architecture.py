"""The house stays the right way up: three floors, one learning loop, short functions.

* the library ``podium/`` imports no service and no top floor, and names none in a string
  (no ``importlib`` by name);
* a service imports no other service and not the top floor;
* aiokafka is spoken only in the bus layer;
* the PPO update exists once per algorithm (generic in ``podium/rl``, swarm in learner_svc);
* no function in the services or the top floor is longer than 80 lines;
* the tests mirror the package tree (system-wide suites such as ``tests/faults`` aside).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("orchestrator_svc", "subagent_svc", "reward_svc", "learner_svc")
TOP_FLOOR = "podium_app"
LIBRARY = "podium"
MAX_FUNCTION_LINES = 80


def _modules(package: str) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        if "v1" in path.relative_to(ROOT).parts[:2]:
            continue  # generated protobuf code
        yield path, ast.parse(path.read_text(), filename=str(path))


def _imported(tree: ast.Module) -> set[str]:
    """Top-level package names a module imports (statements and ``import_module("...")``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value).split(".")[0])
    return names


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (free prose may name anything)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    out.add(id(stmt.value))
    return out


def test_library_imports_and_names_no_service() -> None:
    upper = {*SERVICES, TOP_FLOOR}
    for path, tree in _modules(LIBRARY):
        assert not _imported(tree) & upper, f"{path} imports {_imported(tree) & upper}"
        prose = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in prose:
                    continue
                named = {name for name in upper if f"{name}." in node.value}
                assert not named, f"{path}:{node.lineno} names {named} in a string"


@pytest.mark.parametrize("service", SERVICES)
def test_services_import_no_other_service_nor_the_top_floor(service: str) -> None:
    others = {*SERVICES, TOP_FLOOR} - {service}
    for path, tree in _modules(service):
        assert not _imported(tree) & others, f"{path} imports {_imported(tree) & others}"


def test_aiokafka_is_spoken_only_in_the_bus_layer() -> None:
    for package in (LIBRARY, TOP_FLOOR, *SERVICES):
        for path, tree in _modules(package):
            if path.is_relative_to(ROOT / "podium" / "bus"):
                continue
            assert "aiokafka" not in _imported(tree), path


def test_the_ppo_update_exists_once_per_algorithm() -> None:
    found = [
        (path.relative_to(ROOT).as_posix(), node.name)
        for package in (LIBRARY, TOP_FLOOR, *SERVICES)
        for path, tree in _modules(package)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "ppo_update"
    ]
    assert sorted(found) == [
        ("learner_svc/algorithms/swarm.py", "ppo_update"),
        ("podium/rl/update.py", "ppo_update"),
    ]


def test_no_long_functions_in_services_and_top_floor() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)"
        for package in (*SERVICES, TOP_FLOOR)
        for path, tree in _modules(package)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert not long, "functions over 80 lines: " + "; ".join(long)


SYSTEM_SUITES = ("faults", "rollout")
"""Test suites of the whole system (every service as a process), which mirror no one package."""


def test_tests_mirror_the_package_tree() -> None:
    for directory in sorted(p for p in (ROOT / "tests").rglob("*") if p.is_dir()):
        rel = directory.relative_to(ROOT / "tests")
        if "__pycache__" in rel.parts or rel.parts[0] in SYSTEM_SUITES:
            continue
        if "fixtures" in rel.parts:  # test data beside the tests it serves (documents, specs)
            continue
        assert (ROOT / rel).is_dir(), f"tests/{rel} mirrors no directory of the tree"


def test_test_module_basenames_are_unique() -> None:
    """pytest imports test modules by basename (rootdir-relative, no packages): two files of
    one name make the whole collection fail with an import-mismatch error."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {n: p for n, p in seen.items() if len(p) > 1} == {}
