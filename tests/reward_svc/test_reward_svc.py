"""reward_svc without a broker: env config, the transform, and the loop on the in-process bus."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from podium import codec, topics
from podium.bus import InProcBus, is_kafka_url
from podium.bus.consumer import DLQ_SOURCE_OFFSET
from podium.config import from_env
from podium.errors import ConfigError, DecodeError
from podium.rewards import InvalidTrajectoryError, default_config, score
from podium.rewards.events import score_record
from podium.rewards.examples import EXAMPLES, clean
from podium.v1 import reward_pb2
from reward_svc.app import RewardApp, score_trajectory
from reward_svc.config import RewardServiceConfig

ROOT = Path(__file__).parents[2]


def test_from_env_requires_the_bus_and_names_it() -> None:
    with pytest.raises(ConfigError, match=r"PODIUM_BUS is required but not set"):
        from_env(RewardServiceConfig, {})
    with pytest.raises(ConfigError, match=r"PODIUM_BUS='redis://x' is invalid: expected kafka://"):
        from_env(RewardServiceConfig, {"PODIUM_BUS": "redis://x"})
    # A standalone process on an in-process bus would talk to nobody: refused, like every service.
    with pytest.raises(ConfigError, match=r"PODIUM_BUS='inproc://' is invalid"):
        from_env(RewardServiceConfig, {"PODIUM_BUS": "inproc://"})


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("PODIUM_REWARD_MAX_BATCH", "0"),
        ("PODIUM_REWARD_MAX_BATCH", "many"),
        ("PODIUM_REWARD_POLL_MS", "0"),
        ("PODIUM_REWARD_PROGRESS", "-1"),
        ("PODIUM_REWARD_PROGRESS", "nan"),
        ("PODIUM_REWARD_RECORD_DELAY_MS", "-1"),
        ("PODIUM_REWARD_CONFIG", "/nonexistent/reward.yaml"),
        ("PODIUM_LOG_LEVEL", "LOUD"),
    ],
)
def test_from_env_bad_values_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"{var}={value!r} is invalid"):
        from_env(RewardServiceConfig, {"PODIUM_BUS": "kafka://127.0.0.1:9092", var: value})


def test_from_env_defaults_use_the_topic_constants() -> None:
    cfg = from_env(RewardServiceConfig, {"PODIUM_BUS": "kafka://h:1"})
    assert (cfg.in_topic, cfg.out_topic) == (topics.TRAJECTORIES, topics.SCORED_TRAJECTORIES)
    assert (cfg.group_id, cfg.max_batch, cfg.fixed_progress) == ("reward_svc", 100, None)
    assert is_kafka_url(cfg.bus_url)
    assert not is_kafka_url(RewardServiceConfig(bus_url="inproc://").bus_url)
    assert (
        from_env(
            RewardServiceConfig, {"PODIUM_BUS": "kafka://h:1", "PODIUM_REWARD_PROGRESS": "5"}
        ).fixed_progress
        == 5
    )
    # Shared settings come from the shared variables.
    shared = from_env(
        RewardServiceConfig,
        {"PODIUM_BUS": "kafka://h:1", "PODIUM_INSTANCE": "r-7", "PODIUM_TOPIC_PARTITIONS": "6"},
    )
    assert (shared.instance, shared.producer_name, shared.topic_partitions) == ("r-7", "r-7", 6)


def test_transactional_id_prefix_is_shared_by_the_replicas_of_a_group() -> None:
    """Replicas must fence each other per partition: the default prefix is the group id, the
    same for every replica whatever its instance or host name."""
    a = RewardServiceConfig(bus_url="kafka://h:1", instance="reward-a")
    b = RewardServiceConfig(bus_url="kafka://h:1", instance="reward-b")
    assert a.transactional_id_prefix == b.transactional_id_prefix == "reward_svc"
    other_group = from_env(
        RewardServiceConfig, {"PODIUM_BUS": "kafka://h:1", "PODIUM_REWARD_GROUP": "rescore"}
    )
    assert other_group.transactional_id_prefix == "rescore"
    explicit = from_env(
        RewardServiceConfig,
        {"PODIUM_BUS": "kafka://h:1", "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX": "reward-x"},
    )
    assert explicit.transactional_id_prefix == "reward-x"


def test_the_retired_per_replica_transactional_id_is_refused_naming_its_replacement() -> None:
    with pytest.raises(ConfigError) as err:
        from_env(
            RewardServiceConfig,
            {"PODIUM_BUS": "kafka://h:1", "PODIUM_REWARD_TRANSACTIONAL_ID": "reward_svc-pod-0"},
        )
    assert "PODIUM_REWARD_TRANSACTIONAL_ID" in str(err.value)
    assert "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX" in str(err.value)


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


def test_score_trajectory_matches_score_record() -> None:
    """The service's transform and ``podium reward rescore``'s agree on ids, keys and totals."""
    traj = clean()
    traj.policy_version = "orchestrator:7"
    _, data = codec.encode_event(traj, producer="test", key=traj.session_id)
    cfg = default_config()
    out = score_trajectory(codec.decode_envelope(data), cfg, out_topic="scored")
    rec = score_record(data, cfg, producer="t")
    assert (out.topic, out.key, out.event_id) == ("scored", rec.key, rec.event_id)
    scored = codec.decode_event(rec.value, reward_pb2.ScoredTrajectory)[1]
    assert out.message == scored


async def test_inproc_loop_scores_every_trajectory_and_dead_letters_poison() -> None:
    bus = InProcBus()
    await bus.start()
    try:
        cfg = RewardServiceConfig(bus_url="inproc://", max_batch=4)
        svc = RewardApp(cfg, default_config(), bus)
        await svc.start()
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
        await svc.wait()
        assert sorted(got) == sorted(sent)
        assert svc.transformer.stats.dead_lettered == 1
        assert len(dead) == 1 and dead[0].value == b"poison"
        assert dead[0].header(DLQ_SOURCE_OFFSET) is not None
    finally:
        await bus.stop()
