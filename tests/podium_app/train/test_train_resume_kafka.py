"""``podium train --bus kafka:// --resume``: the learner process of the resumed run restores
its checkpoint and announces the version it reached on the new run's topics, and the run
ends where the uninterrupted embedded one does (the same weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka_helpers import kafka_url
from test_train_resume import Crash, crash_after_first, tiny, weights_sha

from learner_svc.checkpoint import load_checkpoint
from podium_app.train import job
from podium_app.train.job import train

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def test_a_kafka_run_resumes_with_its_learner_process(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = kafka_url(kafka_bootstrap, heartbeat_interval_ms=250, session_timeout_ms=6000)
    checkpoint = job._checkpoint
    monkeypatch.setattr(job, "_checkpoint", crash_after_first(checkpoint))
    config = tiny(tmp_path / "kafka", bus=bus)
    with pytest.raises(Crash):
        await train(config)
    monkeypatch.setattr(job, "_checkpoint", checkpoint)
    resumed = await train(config, resume_run=True)
    logs = config.run_dir / "logs"
    assert resumed.exit_codes == {"reward_svc": 0, "learner_svc": 0}, {
        name: (logs / f"{name}.log").read_text()[-1500:] for name in ("reward_svc", "learner_svc")
    }
    assert "restored" in (logs / "learner_svc.log").read_text()
    ckpt = load_checkpoint(config.run_dir / "learner")
    assert ckpt is not None and (ckpt.state.step, ckpt.state.policy_version) == (2, 2)
    assert ckpt.state.trained == len(set(ckpt.state.ledger)) == 2 * 4
    await train(tiny(tmp_path / "embedded"))
    assert weights_sha(config.run_dir, 2) == weights_sha(tmp_path / "embedded", 2)
