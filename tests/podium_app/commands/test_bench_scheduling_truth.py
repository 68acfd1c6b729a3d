"""``podium bench scheduling --true-pool`` / pools with ``true:`` / ``--policies
...,cpls-online,planner`` end to end through ``podium_app.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from podium.envs.swarm.spec import default_pool_path, read_document
from podium_app.cli import main

POOLS = default_pool_path().parent
TASK = POOLS.parent / "tasks" / "layered-5.yaml"


def _bench(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)
    rc = main(["bench", "scheduling", "--tasks", str(TASK), "--json", str(out), *args])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def _truth_file(tmp_path: Path) -> Path:
    """The misadvertised pool's truth as a pool file of its own (no true:)."""
    doc = read_document(POOLS / "misadvertised.yaml")
    for agent in doc["agents"]:
        for kind, fix in agent.pop(True, agent.pop("true", {})).items():
            agent["kinds"][kind] = {**agent["kinds"][kind], **fix}
    path = tmp_path / "truth.yaml"
    path.write_text(yaml.safe_dump({**doc, "name": "the-truth"}), encoding="utf-8")
    return path


def test_true_pool_flag_and_inline_truth_give_the_same_sessions(tmp_path: Path) -> None:
    common = ("--policies", "cpls,planner", "--episodes", "2", "--seed", "1")
    rc, inline = _bench(tmp_path, "--pool", str(POOLS / "misadvertised.yaml"), *common)
    assert rc == 0
    assert inline["config"]["true_pool"] == "misadvertised"
    assert inline["config"]["policies"] == ["sequential", "cpls", "planner"]
    assert "warmup" not in inline["config"]  # no policy reads a store
    truth = _truth_file(tmp_path)
    rc, apart = _bench(
        tmp_path, "--pool", str(default_pool_path()), "--true-pool", str(truth), *common
    )
    assert rc == 0 and apart["config"]["true_pool"] == str(truth)
    assert apart["tasks"] == inline["tasks"] and apart["summary"] == inline["summary"]
    rc, told = _bench(tmp_path, "--episodes", "2", "--seed", "1", "--policies", "cpls")
    assert rc == 0 and set(told["config"]) == {"episodes", "seed", "pool", "policies"}


def test_cpls_online_gets_a_warmed_store(tmp_path: Path) -> None:
    args = ("--pool", str(POOLS / "misadvertised.yaml"), "--episodes", "2", "--warmup", "3")
    rc, data = _bench(tmp_path, *args, "--policies", "cpls,cpls-online")
    assert rc == 0 and data["config"]["warmup"] == 3
    lat = {p: v["latency_mean"] for p, v in data["summary"].items()}
    assert lat["cpls-online"] < lat["cpls"], lat


def test_true_pool_with_other_agents_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = read_document(default_pool_path())
    doc["agents"][1]["name"] = "backend-2"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc), encoding="utf-8")
    rc, _ = _bench(tmp_path, "--true-pool", str(bad), "--episodes", "1")
    assert rc == 2
    err = capsys.readouterr().err
    assert f"--true-pool {bad}" in err
    assert "missing agents ['backend']" in err and "extra agents ['backend-2']" in err
    both = ("--pool", str(POOLS / "misadvertised.yaml"), "--true-pool", str(default_pool_path()))
    assert _bench(tmp_path, *both, "--episodes", "1")[0] == 2
    assert "give the truth one way" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "scheduling", "--warmup", "-1"])
    assert "must be >= 0" in capsys.readouterr().err
