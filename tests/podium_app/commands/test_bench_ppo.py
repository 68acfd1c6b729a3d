"""`podium bench ppo`: both learners run, the JSON has the documented shape, bad input is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium_app.cli import main


@pytest.mark.slow
def test_bench_writes_both_learners(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ppo.json"
    rc = main(
        [
            "bench", "ppo", "--env", "CartPole-v1", "--seeds", "2", "--compare", "sb3",
            "--steps", "2048", "--eval-every", "1024", "--eval-episodes", "3", "--json", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text())
    for learner in ("ours", "sb3"):
        figs = data[learner]
        for key in ("steps_to_solve", "final_return", "wall_s", "env_steps_per_s"):
            assert len(figs[key]) == 2, (learner, key)
        # A 2,048-step budget cannot solve CartPole; evaluations happened at 1024 and 2048.
        assert all(s is None or s <= 2048 for s in figs["steps_to_solve"])
        assert all(9.0 <= r <= 500.0 for r in figs["final_return"])
        assert all(w > 0 for w in figs["wall_s"]) and all(v > 0 for v in figs["env_steps_per_s"])
        assert [[p[0] for p in curve] for curve in figs["eval_curve"]] == [[1024, 2048]] * 2
    assert data["settings"]["sb3"]["n_epochs"] == 20
    assert "sb3" in capsys.readouterr().out  # the table names both learners


@pytest.mark.parametrize(
    ("env", "message"),
    [("Pendulum-v1", "Discrete action space"), ("NoSuchEnv-v0", "not a registered Gymnasium id")],
)
def test_bench_rejects_unsupported_env(
    env: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "ppo", "--env", env, "--threshold", "1", "--compare", "none"]) == 2
    assert message in capsys.readouterr().err
