"""The deployed learner — the learning loop with the swarm algorithm, configured from the
environment as ``python -m learner_svc`` is — as a real process on a real Kafka broker,
SIGKILLed between a checkpoint and its commit, then restarted: every scored trajectory is
trained on exactly once (counts and ids), and the records the checkpoint held but the group
never committed come back and are skipped.

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
import torch
from aiokafka import AIOKafkaConsumer, TopicPartition
from kafka_helpers import client_kwargs, config_for, kafka_url

from learner_svc.algorithms.swarm import swarm_layout
from learner_svc.checkpoint import load_checkpoint
from podium import codec
from podium.bus import KafkaBus
from podium.bus.base import TopicSpec
from podium.bus.consumer import EventPublisher
from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.envs.swarm.trajectory import SAMPLED
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import load_weights, path_from_uri
from podium.policy.rollout import Job, run_episodes
from podium.policy.signing import ensure_key_pair
from podium.policy.swarm import MODEL_NAME, save_policy
from podium.v1 import reward_pb2

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
N_TRAJECTORIES = 24
"""Published before the first run."""
BATCH = 4
MAX_SUBTASKS = 16


def _learner(
    bootstrap: str, group: str, tmp: Path, init: Path, until_trained: int, *kill: str
) -> subprocess.CompletedProcess[str]:
    run = group.removeprefix("crash-learner-")
    env = os.environ | {
        "PODIUM_LEARNER_IN_TOPIC": f"test.scored.{run}",
        "PODIUM_LEARNER_POLICY_TOPIC": f"test.policy.{run}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
        "PODIUM_BUS": kafka_url(bootstrap, session_timeout_ms=6000, heartbeat_interval_ms=250),
        "PODIUM_LEARNER_MODE": "swarm",
        "PODIUM_GROUP_ID": group,
        "PODIUM_LEARNER_CHECKPOINT_DIR": str(tmp / "ckpt"),
        "PODIUM_LEARNER_ARTIFACTS": str(tmp / "artifacts"),
        "PODIUM_POLICY_SIGNING_KEY": str(ensure_key_pair(tmp / "keys").private_path),
        "PODIUM_LEARNER_INIT": str(init),
        "PODIUM_LEARNER_BATCH": str(BATCH),
        "PODIUM_LEARNER_MAX_LAG": "1000",
        "PODIUM_LEARNER_MAX_SUBTASKS": str(MAX_SUBTASKS),
    }
    cmd = [sys.executable, str(HERE / "learner_until.py"), str(until_trained), *kill]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


async def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset on each partition of the scored topic."""
    bus = KafkaBus(config_for(bootstrap, client_id="test-admin"))
    await bus.start()
    try:
        partitions = await bus.partitions(topic)
    finally:
        await bus.stop()
    consumer = AIOKafkaConsumer(
        **client_kwargs(bootstrap), group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        out = {}
        for p in partitions:
            out[p] = await consumer.committed(TopicPartition(topic, p)) or 0
        return out
    finally:
        await consumer.stop()


async def _own_policy_events(
    bootstrap: str, topic: str, artifacts: Path
) -> list[reward_pb2.PolicyUpdated]:
    """This run's announcements."""
    consumer = AIOKafkaConsumer(
        topic,
        **client_kwargs(bootstrap),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        out = []
        while batches := await consumer.getmany(timeout_ms=3000):
            for records in batches.values():
                for r in records:
                    event = codec.decode_event(r.value, reward_pb2.PolicyUpdated)[1]
                    if event.uri.startswith(artifacts.as_uri()):
                        out.append(event)
        return out
    finally:
        await consumer.stop()


def _scored(agent: SwarmAgent, ids: list[str], seed0: int) -> list[reward_pb2.ScoredTrajectory]:
    """On-policy samples of version 0 on small generated tasks, as reward_svc would emit them."""
    tasks = generate_suite(6, seed=5, sizes=(4, 8))
    env = SwarmEnv(
        tasks, default_pool(), EnvConfig(max_subtasks=MAX_SUBTASKS, invalid_action="raise")
    )
    _, trajs = run_episodes(
        [env],
        [Job(tasks[i % len(tasks)], seed0 + i) for i in range(len(ids))],
        agent=agent,
        generator=torch.Generator().manual_seed(seed0),
        policy_version=0,
        with_trajectories=True,
    )
    out = []
    for tid, traj in zip(ids, trajs, strict=True):
        traj.trajectory_id = traj.session_id = tid
        traj.labels["actions"] = SAMPLED
        out.append(reward_pb2.ScoredTrajectory(trajectory=traj, total=0.25, reward_version="t"))
    return out


async def _publish(
    bootstrap: str, topic: str, scored: list[reward_pb2.ScoredTrajectory]
) -> set[int]:
    """Publish; the partitions the records landed on."""
    bus = KafkaBus(config_for(bootstrap, client_id="test-producer"))
    await bus.start()
    try:
        pub = EventPublisher(bus, producer_name="test-reward")
        landed = set()
        for s in scored:
            meta = await pub.publish(topic, s, key=s.trajectory.session_id)
            landed.add(meta.metadata.partition)
        return landed
    finally:
        await bus.stop()


async def test_swarm_learner_killed_between_checkpoint_and_commit(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    group = f"crash-learner-{run}"
    scored_topic, policy_topic = f"test.scored.{run}", f"test.policy.{run}"
    bus = KafkaBus(config_for(kafka_bootstrap, client_id="test-admin"))
    await bus.start()
    try:
        await bus.create_topics(
            [TopicSpec(scored_topic, partitions=3), TopicSpec(policy_topic, partitions=1)]
        )
    finally:
        await bus.stop()
    layout = swarm_layout(default_pool(), MAX_SUBTASKS)
    torch.manual_seed(11)
    agent = SwarmAgent(layout)
    init = save_policy(agent.net, tmp_path / "init", 0, tuple(layout.agents)).path
    ids = [f"traj-{run}-{k:03d}" for k in range(N_TRAJECTORIES)]
    await _publish(kafka_bootstrap, scored_topic, _scored(agent, ids, 0))

    # Run 1: SIGKILL right after the 3rd checkpoint is on disk, before its offsets are committed.
    killed = await asyncio.to_thread(
        _learner, kafka_bootstrap, group, tmp_path, init, N_TRAJECTORIES, "3"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt is not None and ckpt.state.trained == 3 * BATCH
    in_checkpoint = ckpt.state.offsets[scored_topic]
    committed = await _committed(kafka_bootstrap, group, scored_topic)
    # Killed in the gap: records in the checkpoint that the group never committed.
    gap = sum(max(o - committed[p], 0) for p, o in in_checkpoint.items())
    assert gap > 0, (committed, in_checkpoint)

    # The stream goes on while the learner is down, on every partition (whole batches, so no
    # partial one is left over; see the generic loop's test for why every partition).
    fresh: set[int] = set()
    while len(fresh) < 3:
        more = [f"traj-{run}-{k:03d}" for k in range(len(ids), len(ids) + BATCH)]
        fresh |= await _publish(kafka_bootstrap, scored_topic, _scored(agent, more, len(ids)))
        ids += more

    # Run 2: resumes from the checkpoint and finishes the stream.
    resumed = await asyncio.to_thread(_learner, kafka_bootstrap, group, tmp_path, init, len(ids))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = load_checkpoint(tmp_path / "ckpt")
    assert final is not None
    state = final.state
    assert state.trained == len(ids)
    assert len(state.ledger) == len(ids) and sorted(state.ledger) == ids  # once each
    assert state.skipped_redelivered == gap
    final_committed = await _committed(kafka_bootstrap, group, scored_topic)
    assert {p: final_committed[p] for p in state.offsets[scored_topic]} == (
        state.offsets[scored_topic]
    )
    events = await _own_policy_events(kafka_bootstrap, policy_topic, tmp_path / "artifacts")
    assert {e.model_name for e in events} == {MODEL_NAME}
    assert sorted({e.version for e in events}) == list(range(0, len(ids) // BATCH + 1))
    for e in events:
        assert load_weights(path_from_uri(e.uri), e.sha256).metadata["step"] == str(e.version)
