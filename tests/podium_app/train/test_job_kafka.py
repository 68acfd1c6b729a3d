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
