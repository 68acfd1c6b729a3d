"""`podium reward explain` and the shipped example trajectories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from podium.codec import message_from_json
from podium.rewards import DETECTORS, default_config, score
from podium.rewards.examples import EXAMPLES
from podium.v1 import trajectory_pb2
from podium_app.cli import main

ROOT = Path(__file__).parents[3]
TRAJ = ROOT / "podium" / "data" / "trajectories"


def test_shipped_examples_match_their_builders() -> None:
    assert sorted(p.stem for p in TRAJ.glob("*.json")) == sorted(EXAMPLES)
    for name, build in EXAMPLES.items():
        shipped = message_from_json((TRAJ / f"{name}.json").read_text(), trajectory_pb2.Trajectory)
        assert shipped == build(), f"{name}.json is stale: run python -m podium.rewards.examples"


def test_there_is_a_clean_example_and_one_per_hack() -> None:
    assert {"clean", *DETECTORS} <= set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_explain_prints_exactly_the_breakdown(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reward", "explain", str(TRAJ / f"{name}.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"total", "components", "penalties", "credit", "reward_version"}
    expected = score(EXAMPLES[name](), default_config(), 0.0)
    assert out["total"] == pytest.approx(expected.total)
    assert out["penalties"] == pytest.approx(dict(expected.penalties))
    assert out["reward_version"] == default_config().version
    if name in DETECTORS:
        assert out["penalties"][name] > 0
        assert any(c["reason"].startswith(f"{name}:") for c in out["credit"])


def test_explain_config_and_progress_change_the_weights(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(TRAJ / "clean.json")
    cfg = str(ROOT / "podium" / "data" / "rewards" / "multi_objective.yaml")
    assert main(["reward", "explain", path, "--config", cfg]) == 0
    early = json.loads(capsys.readouterr().out)
    assert main(["reward", "explain", path, "--config", cfg, "--progress", "1000"]) == 0
    late = json.loads(capsys.readouterr().out)
    assert early["reward_version"] == late["reward_version"] != default_config().version
    assert late["components"]["multi_objective.efficiency"] == pytest.approx(
        early["components"]["multi_objective.efficiency"] * 0.05 / 0.3
    )


def test_explain_bad_input_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text('{"trajectory_id": "x", "latencyy": 3}')
    cycle = tmp_path / "c.json"
    cycle.write_text(
        json.dumps({"task": {"subtasks": [{"id": "a", "deps": ["b"]}, {"id": "b", "deps": ["a"]}]}})
    )
    badcfg = tmp_path / "r.yaml"
    badcfg.write_text("detectors: {avoidance: {wieght: 1}}\n")
    cases = [
        ([str(bad)], "latencyy"),
        ([str(cycle)], "dependency cycle"),
        ([str(tmp_path / "missing.json")], "cannot read"),
        ([str(TRAJ / "clean.json"), "--config", str(badcfg)], "detectors.avoidance.wieght"),
        ([str(TRAJ / "clean.json"), "--progress", "-3"], "--progress"),
    ]
    for args, needle in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "podium_app.cli", "reward", "explain", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stdout == ""
