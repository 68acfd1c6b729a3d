"""A real learner process on a real Kafka broker, SIGKILLed between a checkpoint and its
commit, then restarted: every scored trajectory is trained on exactly once (counts and ids),
and the records the checkpoint held but the group never committed come back and are skipped.

Needs ``$PODIUM_KAFKA_BOOTSTRAP`` (``eval "$(scripts/kafka.sh start)"``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from rl_streaming_helpers import N_ACTIONS, OBS_DIM, behaviour_policy, publish_trajectories

from learner_svc.checkpoint import load_checkpoint
from podium import codec
from podium.bus import KafkaBus, KafkaConfig
from podium.bus.base import TopicSpec
from podium.policy.artifacts import load_weights, path_from_uri
from podium.v1 import reward_pb2

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
N_TRAJECTORIES = 48
"""Published before the first run."""
BATCH = 8
PARTITIONS = 3


def _learner(
    bootstrap: str,
    topic: str,
    policy_topic: str,
    group: str,
    tmp: Path,
    until_trained: int,
    *extra: str,
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "learner_svc.streaming",
        "--bootstrap", bootstrap, "--topic", topic, "--policy-topic", policy_topic,
        "--group", group, "--checkpoint-dir", str(tmp / "ckpt"),
        "--artifacts-dir", str(tmp / "artifacts"), "--obs-dim", str(OBS_DIM),
        "--n-actions", str(N_ACTIONS), "--batch", str(BATCH), "--max-policy-lag", "1000",
        "--until-trained", str(until_trained), *extra,
    ]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


async def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        total = 0
        for p in range(partitions):
            total += await consumer.committed(TopicPartition(topic, p)) or 0
        return total
    finally:
        await consumer.stop()


async def _policy_events(bootstrap: str, topic: str) -> list[reward_pb2.PolicyUpdated]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        batches = await consumer.getmany(timeout_ms=5000)
        return [
            codec.decode_event(r.value, reward_pb2.PolicyUpdated)[1]
            for records in batches.values()
            for r in records
        ]
    finally:
        await consumer.stop()


async def _publish(bootstrap: str, topic: str, ids: list[str], *, seed0: int = 0) -> set[int]:
    """Publish scored trajectories for ``ids``; the partitions they landed on."""
    bus = KafkaBus(KafkaConfig(bootstrap, client_id="test-producer"))
    await bus.start()
    try:
        landed = await publish_trajectories(
            bus, topic, ids, behaviour_policy(), version=0, seed0=seed0
        )
        return {m.partition for m in landed}
    finally:
        await bus.stop()


async def test_learner_killed_between_checkpoint_and_commit(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    topic, policy_topic, group = f"test.scored.{run}", f"test.policy.{run}", f"learner-{run}"
    bus = KafkaBus(KafkaConfig(kafka_bootstrap, client_id="test-admin"))
    await bus.start()
    try:
        await bus.create_topics(
            [TopicSpec(topic, partitions=PARTITIONS), TopicSpec(policy_topic, partitions=1)]
        )
    finally:
        await bus.stop()
    ids = [f"traj-{run}-{k:03d}" for k in range(N_TRAJECTORIES)]
    await _publish(kafka_bootstrap, topic, ids)

    # Run 1: SIGKILL right after the 3rd checkpoint is on disk, before its offsets are committed.
    killed = await asyncio.to_thread(
        _learner,
        kafka_bootstrap,
        topic,
        policy_topic,
        group,
        tmp_path,
        N_TRAJECTORIES,
        "--kill-after-checkpoint",
        "3",
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt is not None and ckpt.state.trained == 3 * BATCH
    in_checkpoint = sum(ckpt.state.offsets[topic].values())
    committed = await _committed(kafka_bootstrap, group, topic, PARTITIONS)
    assert committed < in_checkpoint, (committed, in_checkpoint)  # killed in the gap

    # The stream goes on while the learner is down, on every partition (whole batches, so no
    # partial one is left over). Run 2 stops once it has trained everything, and on each
    # partition the redelivered records come before the new ones, so it must have read them
    # all by then. A partition whose last records were redelivered ones could otherwise
    # still be unread when the count is reached: the learner would rightly stop without
    # them, and the skip this test is about would not be seen (a race on fetch order).
    fresh_partitions: set[int] = set()
    while fresh_partitions != set(range(PARTITIONS)):
        more = [f"traj-{run}-{k:03d}" for k in range(len(ids), len(ids) + BATCH)]
        fresh_partitions |= await _publish(kafka_bootstrap, topic, more, seed0=len(ids))
        ids += more

    # Run 2: resumes from the checkpoint and finishes the stream.
    resumed = await asyncio.to_thread(
        _learner, kafka_bootstrap, topic, policy_topic, group, tmp_path, len(ids)
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = load_checkpoint(tmp_path / "ckpt")
    assert final is not None
    state = final.state
    assert state.trained == len(ids)
    assert len(state.ledger) == len(ids) and sorted(state.ledger) == ids  # once each
    assert state.skipped_redelivered == in_checkpoint - committed > 0
    assert await _committed(kafka_bootstrap, group, topic, PARTITIONS) == len(ids)

    events = await _policy_events(kafka_bootstrap, policy_topic)
    assert sorted({e.version for e in events}) == list(range(1, len(ids) // BATCH + 1))
    for e in events:
        assert load_weights(path_from_uri(e.uri), e.sha256).metadata["version"] == str(e.version)
