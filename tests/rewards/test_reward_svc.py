"""reward_svc without a broker: env config, the transform, and the loop on the in-process bus."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podium import codec, topics
from podium.bus import InProcBus
from podium.bus.consumer import DLQ_SOURCE_OFFSET
from podium.errors import ConfigError, DecodeError
from podium.rewards import InvalidTrajectoryError, default_config, score
from podium.rewards.events import score_record
from podium.rewards.examples import EXAMPLES, clean
from podium.v1 import reward_pb2
from reward_svc.bus_loop import BusRewardService
from reward_svc.config import from_env

ROOT = Path(__file__).parents[2]


def test_from_env_requires_the_bus_and_names_it() -> None:
    with pytest.raises(ConfigError, match=r"^PODIUM_BUS: not set"):
        from_env({})
    with pytest.raises(ConfigError, match=r"^PODIUM_BUS: expected"):
        from_env({"PODIUM_BUS": "redis://x"})


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("PODIUM_REWARD_MAX_BATCH", "0"),
        ("PODIUM_REWARD_MAX_BATCH", "many"),
        ("PODIUM_REWARD_PROGRESS", "-1"),
        ("PODIUM_REWARD_CONFIG", "/nonexistent/reward.yaml"),
        ("PODIUM_REWARD_GROUP", " "),
    ],
)
def test_from_env_bad_values_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{var}:"):
        from_env({"PODIUM_BUS": "kafka://127.0.0.1:9092", var: value})


def test_from_env_defaults_use_the_topic_constants() -> None:
    cfg = from_env({"PODIUM_BUS": "inproc://"})
    assert (cfg.in_topic, cfg.out_topic) == (topics.TRAJECTORIES, topics.SCORED_TRAJECTORIES)
    assert not cfg.is_kafka
    assert (
        from_env({"PODIUM_BUS": "kafka://h:1", "PODIUM_REWARD_PROGRESS": "5"}).fixed_progress == 5
    )


def test_service_fails_fast_naming_the_missing_variable() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PODIUM_BUS"}
    proc = subprocess.run(
        [sys.executable, "-m", "reward_svc"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "PODIUM_BUS" in proc.stderr and "Traceback" not in proc.stderr


def test_transform_scores_at_the_policy_versions_progress_with_a_stable_event_id() -> None:
    traj = clean()
    traj.policy_version = "orchestrator:400"
    env, data = codec.encode_event(traj, producer="test", key=traj.session_id)
    cfg = default_config()
    a = score_record(data, cfg, producer="t")
    b = score_record(data, cfg, producer="t")
    assert a.event_id == b.event_id != env.event_id
    out_env, scored = codec.decode_event(a.value, reward_pb2.ScoredTrajectory)
    assert out_env.event_id == a.event_id and out_env.key == traj.session_id
    assert scored.schedule_step == 400
    assert scored.total == pytest.approx(score(traj, cfg, 400).total)
    assert scored.total != pytest.approx(score(traj, cfg, 0).total)  # efficiency annealed
    fixed = score_record(data, cfg, producer="t", fixed_progress=0)
    assert codec.decode_event(fixed.value, reward_pb2.ScoredTrajectory)[1].schedule_step == 0


def test_transform_rejects_poison_with_non_retriable_errors() -> None:
    with pytest.raises(DecodeError):
        score_record(b"\x01nope", default_config(), producer="t")
    _, wrong_type = codec.encode_event(reward_pb2.Feedback(session_id="s"), producer="t")
    with pytest.raises(DecodeError, match=r"expected podium\.v1\.Trajectory"):
        score_record(wrong_type, default_config(), producer="t")
    bad = clean()
    bad.executions[0].end_time = -5.0
    _, data = codec.encode_event(bad, producer="t")
    with pytest.raises(InvalidTrajectoryError) as info:
        score_record(data, default_config(), producer="t")
    assert not info.value.retriable


async def test_bus_loop_scores_every_trajectory_and_dead_letters_poison() -> None:
    bus = InProcBus()
    await bus.start()
    try:
        cfg = from_env({"PODIUM_BUS": "inproc://", "PODIUM_REWARD_MAX_BATCH": "4"})
        svc = BusRewardService(bus, cfg, default_config())
        run = asyncio.create_task(svc.run())
        sent = []
        for i, build in enumerate(EXAMPLES.values()):
            traj = build()
            traj.trajectory_id = traj.session_id = f"t{i}"
            sent.append(traj.trajectory_id)
            await bus.publish(
                cfg.in_topic, codec.encode_event(traj, producer="test")[1], key=traj.session_id
            )
        await bus.publish(cfg.in_topic, b"poison", key="p")
        sub = bus.subscriber([cfg.out_topic], "reader")
        dlq = bus.subscriber([topics.dead_letter(cfg.in_topic)], "dlq-reader")
        await sub.start()
        await dlq.start()
        got: list[str] = []
        dead = []
        for _ in range(100):
            got += [
                codec.decode_event(r.value, reward_pb2.ScoredTrajectory)[1].trajectory.trajectory_id
                for r in await sub.fetch(timeout_s=0.05)
            ]
            dead += await dlq.fetch(timeout_s=0.05)
            if len(got) >= len(sent) and dead:
                break
        await svc.stop()
        await run
        assert sorted(got) == sorted(sent)
        assert len(dead) == 1 and dead[0].value == b"poison"
        assert dead[0].header(DLQ_SOURCE_OFFSET) is not None
    finally:
        await bus.stop()
