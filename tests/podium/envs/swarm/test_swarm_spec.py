"""Task and pool spec parsing: every error names the problem and the subtask or field."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from podium.envs.swarm.generator import library_tasks
from podium.envs.swarm.spec import (
    check_task_against_pool,
    default_pool,
    default_tasks,
    default_tasks_dir,
    find_cycle,
    load_pool,
    load_task,
    load_tasks,
    parse_pool,
    parse_task,
    task_to_dict,
)
from podium.envs.swarm.trajectory import task_from_proto, task_to_proto
from podium.errors import SpecError

ISSUE_TASK: dict[str, Any] = {
    "name": "login-system",
    "max_parallel": 3,
    "subtasks": [
        {"id": "form", "kind": "ui", "work": 3.0, "deps": []},
        {"id": "hash", "kind": "security", "work": 5.0, "deps": [], "splittable": True},
        {"id": "creds", "kind": "db", "work": 4.0, "deps": ["hash"], "sensitive": True},
    ],
}
ISSUE_POOL: dict[str, Any] = {
    "max_parallel": 3,
    "main_step_cost": 0.05,
    "split_overhead": 0.15,
    "agents": [
        {"name": "ui-specialist", "kinds": {"ui": {"speed": 1.0, "success": 0.95, "noise": 0.2}}},
        {"name": "generalist", "kinds": {"*": {"speed": 0.5, "success": 0.8, "noise": 0.3}}},
    ],
}


def _task(*subtasks: dict[str, Any]) -> dict[str, Any]:
    return {"name": "t", "subtasks": list(subtasks)}


def test_issue_examples_parse() -> None:
    task = parse_task(ISSUE_TASK)
    pool = parse_pool(ISSUE_POOL)
    assert [s.id for s in task.subtasks] == ["form", "hash", "creds"]
    assert task.subtasks[1].splittable and task.subtasks[2].sensitive
    assert task.subtasks[2].deps == ("hash",)
    assert task.max_parallel == 3
    assert pool.agents[1].profile("db") == pool.agents[1].kinds["*"]
    assert pool.agents[0].profile("db") is None
    check_task_against_pool(task, pool)  # the generalist covers security and db


def test_unknown_dependency_names_subtask_and_dep() -> None:
    with pytest.raises(SpecError, match=r"subtask 'b' depends on unknown subtask 'zzz'") as e:
        parse_task(
            _task(
                {"id": "a", "kind": "ui", "work": 1},
                {"id": "b", "kind": "ui", "work": 1, "deps": ["zzz"]},
            )
        )
    assert e.value.field == "b"


def test_cycle_is_named_with_its_members() -> None:
    spec = _task(
        {"id": "a", "kind": "ui", "work": 1, "deps": ["c"]},
        {"id": "b", "kind": "ui", "work": 1, "deps": ["a"]},
        {"id": "c", "kind": "ui", "work": 1, "deps": ["b"]},
        {"id": "d", "kind": "ui", "work": 1},
    )
    with pytest.raises(SpecError, match="dependency cycle") as e:
        parse_task(spec)
    msg = str(e.value)
    cycle = msg.split("dependency cycle: ")[1].split(" -> ")
    assert cycle[0] == cycle[-1]
    assert set(cycle) == {"a", "b", "c"} and len(cycle) == 4
    # Each member depends on the next one in the message.
    deps = {s["id"]: s.get("deps", []) for s in spec["subtasks"]}
    assert all(cycle[i + 1] in deps[cycle[i]] for i in range(len(cycle) - 1))


def test_self_dependency() -> None:
    with pytest.raises(SpecError, match="'a' depends on itself"):
        parse_task(_task({"id": "a", "kind": "ui", "work": 1, "deps": ["a"]}))


def test_duplicate_id() -> None:
    with pytest.raises(SpecError, match="duplicate subtask id 'a'"):
        parse_task(
            _task({"id": "a", "kind": "ui", "work": 1}, {"id": "a", "kind": "db", "work": 2})
        )


@pytest.mark.parametrize("work", [0, -1.5])
def test_non_positive_work(work: float) -> None:
    with pytest.raises(SpecError, match=r"subtask 'a': work must be > 0"):
        parse_task(_task({"id": "a", "kind": "ui", "work": work}))


@pytest.mark.parametrize("work", ["3", True, None, float("nan")])
def test_non_numeric_work(work: object) -> None:
    with pytest.raises(SpecError, match=r"subtask 'a'.work must be"):
        parse_task(_task({"id": "a", "kind": "ui", "work": work}))


def test_kind_no_agent_can_do() -> None:
    pool = parse_pool(
        {
            "agents": [
                {"name": "ui-only", "kinds": {"ui": {"speed": 1}}},
                {"name": "broken", "kinds": {"db": {"speed": 1, "success": 0}}},
            ]
        }
    )
    task = parse_task(
        _task({"id": "a", "kind": "ui", "work": 1}, {"id": "store", "kind": "db", "work": 1})
    )
    with pytest.raises(
        SpecError, match=r"subtask 'store': no agent in pool 'pool' can do kind 'db'"
    ) as e:
        check_task_against_pool(task, pool)
    assert e.value.field == "store"


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({**ISSUE_TASK, "maxparallel": 2}, "task: unknown field 'maxparallel'"),
        (
            _task({"id": "a", "kind": "ui", "work": 1, "dep": []}),
            "subtask 'a': unknown field 'dep'",
        ),
    ],
)
def test_unknown_field_in_task(doc: dict[str, Any], where: str) -> None:
    with pytest.raises(SpecError, match=where):
        parse_task(doc)


def test_unknown_fields_in_pool() -> None:
    with pytest.raises(SpecError, match="pool: unknown field 'parallel'"):
        parse_pool({**ISSUE_POOL, "parallel": 2})
    bad = {"agents": [{"name": "x", "kinds": {"ui": {"speed": 1, "sucess": 0.9}}}]}
    with pytest.raises(SpecError, match=r"agent 'x'.kinds.ui: unknown field 'sucess'"):
        parse_pool(bad)


@pytest.mark.parametrize(
    ("prof", "msg"),
    [
        ({"speed": 0}, r"speed must be > 0"),
        ({"speed": 1, "success": 1.5}, r"success must be in \[0, 1\]"),
        ({"speed": 1, "noise": -0.1}, r"noise must be >= 0"),
        ({"success": 0.5}, r"missing field 'speed'"),
    ],
)
def test_pool_profile_errors(prof: dict[str, Any], msg: str) -> None:
    with pytest.raises(SpecError, match=msg):
        parse_pool({"agents": [{"name": "x", "kinds": {"ui": prof}}]})


def test_pool_duplicate_agent_and_bad_max_parallel() -> None:
    a = {"name": "x", "kinds": {"ui": {"speed": 1}}}
    with pytest.raises(SpecError, match="duplicate agent name 'x'"):
        parse_pool({"agents": [a, a]})
    with pytest.raises(SpecError, match="max_parallel must be an integer >= 1"):
        parse_pool({"max_parallel": 0, "agents": [a]})
    with pytest.raises(SpecError, match=r"task\.max_parallel must be an integer >= 1"):
        parse_task({**ISSUE_TASK, "max_parallel": 1.5})


def test_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "t.yaml"
    bad_yaml.write_text("name: x\nsubtasks: [\n  {id: a\n")
    with pytest.raises(SpecError, match=r"t\.yaml:\d+:\d+: invalid YAML"):
        load_task(bad_yaml)
    bad_json = tmp_path / "t.json"
    bad_json.write_text('{"name": "x",\n "subtasks": [}')
    with pytest.raises(SpecError, match=r"t\.json:2:\d+: invalid JSON"):
        load_task(bad_json)
    with pytest.raises(SpecError, match="no such file"):
        load_task(tmp_path / "missing.yaml")
    cyc = tmp_path / "cyc.json"
    cyc.write_text(
        '{"name": "c", "subtasks": [{"id": "a", "kind": "ui", "work": 1, "deps": ["a"]}]}'
    )
    with pytest.raises(SpecError, match=r"cyc\.json: subtask 'a' depends on itself"):
        load_task(cyc)
    with pytest.raises(SpecError, match="no task files"):
        load_tasks(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else tmp_path)


def test_find_cycle_on_deep_chain_does_not_recurse() -> None:
    deps = {f"n{i}": [f"n{i + 1}"] for i in range(20_000)}
    deps["n20000"] = []
    assert find_cycle(deps) is None
    deps["n20000"] = ["n0"]
    cycle = find_cycle(deps)
    assert cycle is not None and len(cycle) == 20_002


def test_roundtrips_dict_and_proto() -> None:
    for task in default_tasks():
        assert parse_task(task_to_dict(task)) == task
        # The proto carries no task description; everything else survives.
        assert task_from_proto(task_to_proto(task)) == replace(task, description="")


def test_shipped_library_loads_and_matches_generator() -> None:
    pool = default_pool()
    tasks = {t.name: t for t in load_tasks(default_tasks_dir(), pool)}
    assert {"login-system", "microservice-deployment"} <= set(tasks)
    sizes = sorted(len(t.subtasks) for t in tasks.values())
    assert sizes[0] <= 5 and sizes[-1] >= 60
    for generated in library_tasks():
        assert tasks[generated.name] == generated, f"{generated.name} differs from the generator"


def test_default_pool_shape() -> None:
    pool = default_pool()
    gen = [a for a in pool.agents if "*" in a.kinds]
    assert len(gen) == 1
    g = gen[0].kinds["*"]
    for a in pool.agents:
        for kind, prof in a.kinds.items():
            if kind != "*":
                # Specialists are faster than the generalist on their kinds.
                assert prof.speed > g.speed, (a.name, kind)
    assert load_pool(Path(__file__).parents[4] / "podium/data/pools/default.yaml") == pool
