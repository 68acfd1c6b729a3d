"""The swarm CLI commands end to end through ``podium_app.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.spec import task_to_dict
from podium_app.cli import main


def test_bench_scheduling_writes_the_documented_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps the table to the terminal width
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for i, shape in enumerate(["fanout", "layered"]):
        (tasks / f"{shape}.json").write_text(
            json.dumps(task_to_dict(generate_task(shape, 8, i, name=shape)))
        )
    out = tmp_path / "out.json"
    rc = main(
        [
            "bench",
            "scheduling",
            "--tasks",
            str(tasks),
            "--policies",
            "greedy,cpls",
            "--episodes",
            "3",
            "--seed",
            "4",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "fanout" in printed and "cpls" in printed and "mean ratio to bound" in printed
    data = json.loads(out.read_text())
    assert [t["name"] for t in data["tasks"]] == ["fanout", "layered"]
    for t in data["tasks"]:
        assert set(t["policies"]) == {"sequential", "greedy", "cpls"}  # sequential always runs
        assert t["policies"]["sequential"]["reduction_vs_sequential"] == 0.0
    assert set(data["summary"]) == {"sequential", "greedy", "cpls"}
    again = tmp_path / "again.json"
    main(
        [
            "bench",
            "scheduling",
            "--tasks",
            str(tasks),
            "--policies",
            "greedy,cpls",
            "--episodes",
            "3",
            "--seed",
            "4",
            "--json",
            str(again),
        ]
    )
    assert json.loads(again.read_text()) == data  # seeded: reproducible


def test_bench_scheduling_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nsubtasks:\n  - {id: a, kind: ui, work: 1, deps: [nope]}\n")
    assert main(["bench", "scheduling", "--tasks", str(bad), "--episodes", "1"]) == 2
    assert "subtask 'a' depends on unknown subtask 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "scheduling", "--policies", "heft"])
    assert "unknown policy 'heft'" in capsys.readouterr().err


def test_spec_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("name: g\nsubtasks:\n  - {id: a, kind: ui, work: 2}\n")
    assert main(["spec", "check", str(good)]) == 0
    assert "task 'g', 1 subtasks, lower bound" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"name": "b", "subtasks": [{"id": "a", "kind": "quantum", "work": 1}], "extra": 1}'
    )
    assert main(["spec", "check", str(good), str(bad)]) == 2
    assert "unknown field 'extra'" in capsys.readouterr().err
    pool = tmp_path / "pool.yaml"
    pool.write_text("agents:\n  - {name: ui, kinds: {ui: {speed: 1}}}\n")
    assert main(["spec", "check", "--pool", str(pool), str(good)]) == 0
    db = tmp_path / "db.yaml"
    db.write_text("name: d\nsubtasks:\n  - {id: store, kind: db, work: 2}\n")
    assert main(["spec", "check", "--pool", str(pool), str(db)]) == 2
    assert "subtask 'store': no agent in pool 'pool' can do kind 'db'" in capsys.readouterr().err


def test_bench_env_reports_steps_per_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "speed.json"
    rc = main(["bench", "env", "--seconds", "0.3", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["steps"] > 0 and data["task_sizes"] == [30]
    assert rc == (0 if data["meets_target"] else 1)
    assert "steps/s" in capsys.readouterr().out
