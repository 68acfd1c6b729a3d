"""``podium bench cycle`` end to end at CI scale, as a user runs it (a process): a secured KRaft
broker of its own, every service a process, the frozen and the continuous run on the same
sessions, the drift in the middle of each load, aimed at the agent the initial policy prefers
(``--drift-target preferred``).

What could fail and is asserted: every submitted session finished exactly once in both runs;
the JSON has the documented shape with every window populated; the drift was aimed, and the
aimed scenario is the one the runs used; the drift is visible (the
frozen policy's latency/bound after the drift is above before it); the continuous run's
controller proposed at least one of the learner's candidates; the report is written; progress
lines were shown. The acceptance figures need a long run (docs/cycle.md), not this one.

Gated like the other Kafka suites: skipped by hand without ``$PODIUM_KAFKA_BOOTSTRAP``, a
failure under ``CI=true`` (the ``kafka_bootstrap`` fixture); the broker used is the bench's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podium.envs.swarm.drift import load_drift

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
DURATION_S, DRIFT_AT_S, WINDOW_S, RATE = 45.0, 22.5, 9.0, 3.0


def test_bench_cycle_end_to_end(kafka_bootstrap: str, tmp_path: Path) -> None:
    del kafka_bootstrap  # only the gate: the bench starts a broker of its own
    out, report = tmp_path / "cycle.json", tmp_path / "report"
    podium = Path(sys.executable).with_name("podium")
    args = [str(podium), "bench", "cycle", "--work-dir", str(tmp_path / "work")]
    args += ["--duration-s", str(DURATION_S), "--drift-at-s", str(DRIFT_AT_S)]
    args += ["--window-s", str(WINDOW_S), "--rate", str(RATE), "--replicas", "1"]
    args += ["--cycle-s", "8", "--learner-batch", "12", "--explore-share", "0.5"]
    args += ["--drain-s", "60", "--drift-target", "preferred"]
    args += ["--json", str(out), "--report", str(report)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_KAFKA")}
    proc = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False
    )
    logs = "\n".join(
        f"--- {p}\n{p.read_text(errors='replace')[-2500:]}"
        for p in sorted((tmp_path / "work").glob("*/logs/*.log"))
    )
    assert proc.returncode == 0, f"{proc.stderr[-4000:]}\n{logs}"
    assert "[frozen] t=" in proc.stderr and "[continuous] t=" in proc.stderr, proc.stderr

    result = json.loads(out.read_text())
    assert set(result) == {"config", "windows", "runs", "verdicts"}
    # The drift (slow-specialist: backend's api work) was aimed at the agent the initial policy
    # ran api work on most before it, and that scenario is the one every service ran.
    (aimed,) = result["config"]["drift_aimed"]
    assert aimed.startswith("backend/api -> "), aimed
    target = aimed.split(" -> ")[1].split("/")[0]
    scenario = load_drift(result["config"]["drift"])
    assert scenario.name == "slow-specialist@preferred"
    assert [(c.agent, c.kind) for c in scenario.changes] == [(target, "api")]
    assert f"drift aimed at the preferred agent: {aimed}" in proc.stderr
    planned = round(DURATION_S * RATE)
    for name in ("frozen", "continuous"):
        run = result["runs"][name]
        assert run["submitted"] == planned, (name, run)
        assert run["finished"] == planned, (name, run, logs)
        assert run["run_twice"] == 0, (name, run)
        failed = {n: c for n, c in run["exit_codes"].items() if c not in (0, -15)}
        assert not failed, (name, failed, _logs_of(tmp_path / "work" / name, failed))
    windows = result["windows"]
    assert len(windows) == round(DURATION_S / WINDOW_S)
    for w in windows:
        for key in ("frozen", "continuous", "cpls", "cpls_online", "frozen_store"):
            assert w[key]["sessions"] > 0 and w[key]["mean"] >= 1.0, (key, w)
    verdicts = result["verdicts"]
    levels = verdicts["levels"]
    assert verdicts["drift_visible"] is True, levels
    assert levels["frozen_post"] > levels["frozen_pre"], levels
    assert set(verdicts) >= {
        "continuous_recovered",
        "continuous_at_or_below_rules",
        "frozen_fails",
        "frozen_store_fails",
        "accepted",
    }
    continuous = result["runs"]["continuous"]
    assert continuous["controller_proposed"] >= 1, continuous["transitions"]
    assert result["runs"]["frozen"]["controller_proposed"] == 0
    assert (report / "report.html").is_file() and (report / "latency.png").is_file()
    # One broker serves both runs: the continuous run's stores must not start from the frozen
    # run's trajectories (the orchestrators' warm start is off in the bench).
    for orch in sorted((tmp_path / "work" / "continuous" / "logs").glob("orch-*.log")):
        assert "agent stats warmed from" not in orch.read_text(errors="replace"), orch


def _logs_of(run_dir: Path, processes: dict[str, int]) -> str:
    """The ends of the logs of ``processes`` in one run (what a failing exit code needs)."""
    return "\n".join(
        f"--- {p}\n{p.read_text(errors='replace')[-6000:]}"
        for p in sorted((run_dir / "logs").glob("*.log"))
        if p.stem in processes
    )
