"""Acceptance: ``podium train --bus kafka://`` runs the same job as the embedded default —
reward_svc and learner_svc each their own process against a real Kafka broker — and, with the
same settings and seed, reaches exactly the same policy: the held-out table of both runs is
identical, every trajectory was trained once, and both processes stop cleanly on SIGTERM."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka_helpers import kafka_url
from test_job import small_config

from learner_svc.checkpoint import load_checkpoint
from podium_app.train.job import train

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def test_same_job_over_kafka_with_service_processes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    bus = kafka_url(kafka_bootstrap, heartbeat_interval_ms=250, session_timeout_ms=6000)
    over_kafka = await train(small_config(tmp_path / "kafka", bus=bus, iterations=3))
    embedded = await train(small_config(tmp_path / "embedded", iterations=3))

    logs = tmp_path / "kafka" / "logs"
    assert over_kafka.exit_codes == {"reward_svc": 0, "learner_svc": 0}, {
        name: (logs / f"{name}.log").read_text()[-1500:] for name in ("reward_svc", "learner_svc")
    }
    for name in ("reward_svc", "learner_svc"):
        assert "stop signal received" in (logs / f"{name}.log").read_text(), name
    ckpt = load_checkpoint(tmp_path / "kafka" / "learner")
    assert ckpt is not None
    assert ckpt.state.trained == len(set(ckpt.state.ledger)) == 3 * 4
    assert ckpt.state.policy_version == 3
    # The same sessions, the same updates, the same versions: the same table.
    assert over_kafka.best_version == embedded.best_version
    assert over_kafka.summary["summary"] == embedded.summary["summary"]
    assert [h.val_ratio for h in over_kafka.history] == [h.val_ratio for h in embedded.history]


async def test_sampling_ahead_over_kafka_trains_every_session_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """With the learner its own process, iterations that do not validate sample the next
    iteration's sessions while it updates (``max_policy_lag`` 1, the default): the learner
    accepts those one-version-behind trajectories over the broker, trains every session once
    and drops none."""
    bus = kafka_url(kafka_bootstrap, heartbeat_interval_ms=250, session_timeout_ms=6000)
    config = small_config(tmp_path / "ahead", bus=bus, iterations=4, eval_every=4)
    assert config.max_policy_lag == 1
    result = await train(config)
    logs = tmp_path / "ahead" / "logs"
    assert result.exit_codes == {"reward_svc": 0, "learner_svc": 0}, {
        name: (logs / f"{name}.log").read_text()[-1500:] for name in ("reward_svc", "learner_svc")
    }
    ckpt = load_checkpoint(tmp_path / "ahead" / "learner")
    assert ckpt is not None
    assert ckpt.state.policy_version == 4
    assert ckpt.state.trained == len(set(ckpt.state.ledger)) == 4 * 4
    assert ckpt.state.skipped_off_policy == ckpt.state.dropped_stale == 0
    assert [h.iteration for h in result.history] == [0, 1, 2, 3, 4]
