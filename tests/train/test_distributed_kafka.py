"""Acceptance: a small policy trained end-to-end over a real Kafka broker, every service its own
process (orchestrator, two sub-agent workers, reward service, learner), driven by
``podium train --bus kafka://`` 's driver. Latency / lower bound of the trained versions, measured
on the same evaluation sessions (same tasks, same seeds, argmax actions), is below the
starting version's."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.train.distributed import DistributedConfig, train_distributed
from podium.train.policy import MODEL_NAME

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def test_training_over_kafka_with_service_processes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    config = DistributedConfig(
        bus=f"kafka://{kafka_bootstrap}?heartbeat_interval_ms=250&session_timeout_ms=6000",
        run_dir=tmp_path / "run",
        workers=2,
        sizes=(4, 8),
        curriculum=(8,),
        iterations=6,
        sessions_per_iteration=32,
        eval_tasks=12,
        eval_seeds=3,
        eval_every=3,
        learning_rate=1e-3,
        timeout_s=90.0,
    )
    lines: list[str] = []
    result = await train_distributed(config, lambda phase, f: lines.append(f"{phase} {f}"))

    evaluated = result.evaluated()
    start, later = evaluated[0], evaluated[1:]
    print(f"run: {result.wall_s:.1f}s; per-worker results {result.results_per_worker}")
    for v in result.versions:
        print(
            f"v{v.version}: eval latency/bound {v.eval_ratio} (completion {v.eval_completion}, "
            f"{v.eval_sessions} sessions), training latency/bound {v.train_ratio} "
            f"({v.train_sessions} sessions)"
        )
    # Every version was trained by the learner process and served by the orchestrator process.
    assert [v.version for v in result.versions] == list(range(config.iterations + 1))
    # (A batch may straddle a hot swap, so count them in total.)
    assert sum(v.train_sessions for v in result.versions) == (
        config.iterations * config.sessions_per_iteration
    )
    assert [v.version for v in evaluated] == [0, 3, 6]
    assert all(v.eval_sessions == config.eval_tasks * config.eval_seeds for v in evaluated)
    # The policy learned: every later evaluated version beats the starting point.
    assert start.eval_ratio is not None
    for v in later:
        assert v.eval_ratio is not None and v.eval_ratio < start.eval_ratio, (start, v)
    # What the learner published is on disk, one file per version.
    versions_dir = config.run_dir / "artifacts" / MODEL_NAME
    assert sorted(int(p.name) for p in versions_dir.iterdir()) == list(range(config.iterations + 1))
    # Sub-agent work was spread over both worker processes.
    assert len(result.results_per_worker) == 2, result.results_per_worker
    assert min(result.results_per_worker.values()) > 0
    # Every process stopped cleanly on SIGTERM.
    assert result.exit_codes == {
        "orchestrator": 0,
        "reward": 0,
        "learner": 0,
        "worker-1": 0,
        "worker-2": 0,
    }, {
        name: (config.run_dir / "logs" / f"{name}.log").read_text()[-1500:]
        for name in result.exit_codes
    }
    for name in ("orchestrator", "reward", "learner", "worker-1", "worker-2"):
        log = (config.run_dir / "logs" / f"{name}.log").read_text()
        assert "stop signal received; stopping gracefully" in log, name
    assert (config.run_dir / "summary.json").is_file()
