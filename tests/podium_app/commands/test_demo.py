"""``podium demo``: one task through the four services, quickly, with every service reporting."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from podium.envs.swarm.spec import default_tasks_dir
from podium.v1 import session_service_pb2 as ss
from podium_app.commands.demo import run_demo

ROOT = Path(__file__).resolve().parents[3]


async def test_demo_runs_the_whole_flow() -> None:
    text = (default_tasks_dir() / "login-system.yaml").read_text()
    report = await run_demo(text, seed=7, workers=2)
    assert report.completed
    assert report.result is not None and report.trajectory is not None
    assert report.result.state == ss.SESSION_STATE_SUCCEEDED
    # orchestrator: one decision line per decision in the trajectory
    assert sum(line.startswith("decision") for line in report.decisions) == len(
        report.trajectory.decisions
    )
    # sub-agents: every execution of the trajectory, spread over the two workers
    assert len(report.executions) == len(report.trajectory.executions)
    assert sum(report.workers.values()) == len(report.executions)
    assert len(report.workers) == 2
    # reward and learner: the learner received the reward service's score of this session
    assert report.scored is not None
    assert report.scored.trajectory.session_id == report.session_id
    assert set(report.scored.penalties) >= {"fake_parallelism", "fabricated_result"}
    assert report.session_id in report.learner_line


def test_podium_demo_command_is_quick_and_clear() -> None:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "podium_app.cli", "demo"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for section in ("[orchestrator_svc]", "[subagent_svc]", "[reward_svc]", "[learner_svc]"):
        assert section in out
    assert "completed 7/7 subtasks" in out
    assert elapsed < 15, f"podium demo took {elapsed:.1f}s"


def test_demo_rejects_a_bad_task_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsubtasks:\n  - {id: a, kind: ui, work: 0}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "podium_app.cli", "demo", "--task", str(bad)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "INVALID_ARGUMENT" in proc.stderr and "work must be > 0" in proc.stderr
    assert "Traceback" not in proc.stderr
