"""Two reward_svc replicas, one paused past its session mid-transaction (issue 12: "two
replicas, one paused 16 s: 200 committed scores for 150 trajectories").

Both run as processes (``python -m reward_svc``) in one group. Replica A is stopped with
SIGSTOP while its transactions are open, long enough for the broker to give its partitions
to replica B, which scores A's unfinished batches again; then A is resumed and its stale
transaction tries to commit. Before the per-partition transactional ids A committed it too
(aiokafka's offset commit carries no group generation). Now B's claim of the partitions'
ids fenced A: a read_committed reader sees every trajectory scored exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kafka_helpers import client_kwargs, kafka_url
from test_reward_svc_kafka import _read_all, _start_service

from podium import codec
from podium.rewards.examples import EXAMPLES
from podium.v1 import reward_pb2

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
ROOT = Path(__file__).parents[2]
N = 200
SESSION_MS = 6000


async def _publish_trajectories(bootstrap: str, topic: str) -> set[str]:
    admin = AIOKafkaAdminClient(**client_kwargs(bootstrap))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 3, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(**client_kwargs(bootstrap), acks="all")
    await producer.start()
    sent = set()
    try:
        builders = list(EXAMPLES.values())
        for i in range(N):
            traj = builders[i % len(builders)]()
            traj.trajectory_id = traj.session_id = f"rep-{i:03d}"
            _, data = codec.encode_event(traj, producer="test", key=traj.session_id)
            await producer.send_and_wait(topic, data, key=traj.session_id.encode())
            sent.add(traj.trajectory_id)
    finally:
        await producer.stop()
    return sent


def _scored_ids(records: list[object]) -> Counter[str]:
    ids: Counter[str] = Counter()
    for rec in records:
        _, scored = codec.decode_event(rec.value, reward_pb2.ScoredTrajectory)  # type: ignore[attr-defined]
        ids[scored.trajectory.trajectory_id] += 1
    return ids


async def test_a_replica_paused_past_its_session_never_commits_twice(
    kafka_bootstrap: str, unique: Callable[[str], str], tmp_path: Path
) -> None:
    in_topic, out_topic = unique("rep.in"), unique("rep.out")
    sent = await _publish_trajectories(kafka_bootstrap, in_topic)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PODIUM_BUS": kafka_url(
            kafka_bootstrap, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500
        ),
        "PODIUM_REWARD_IN_TOPIC": in_topic,
        "PODIUM_REWARD_OUT_TOPIC": out_topic,
        "PODIUM_REWARD_GROUP": unique("rep.group"),
        "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX": unique("rep.txn"),
        "PODIUM_REWARD_MAX_BATCH": "5",
        "PODIUM_REWARD_POLL_MS": "200",
        # 100 ms a record: a replica is nearly always inside an open transaction.
        "PODIUM_REWARD_RECORD_DELAY_MS": "100",
    }
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = _start_service({**env, "PODIUM_INSTANCE": "rep-a"}, log_a)
    b: subprocess.Popen[bytes] | None = _start_service({**env, "PODIUM_INSTANCE": "rep-b"}, log_b)
    assert b is not None
    try:
        for _ in range(600):  # scoring has started
            await asyncio.sleep(0.1)
            assert a.poll() is None, log_a.read_text()
            if await _read_all(kafka_bootstrap, out_topic, "read_uncommitted"):
                break
        await asyncio.sleep(4)  # the group settles over both replicas; both score
        os.kill(a.pid, signal.SIGSTOP)
        await asyncio.sleep(SESSION_MS / 1000 + 6)  # A's session expires; B takes over
        os.kill(a.pid, signal.SIGCONT)  # A's stale transactions try to commit
        committed: Counter[str] = Counter()
        for _ in range(300):  # ≤ 90 s
            await asyncio.sleep(0.3)
            assert b.poll() is None, log_b.read_text()
            committed = _scored_ids(await _read_all(kafka_bootstrap, out_topic, "read_committed"))
            if set(committed) >= sent:
                break
        await asyncio.sleep(3.0)  # a late duplicate would show up now
        for proc in (a, b):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        assert b.wait(timeout=30) == 0, log_b.read_text()
        # A was fenced on the partitions it lost, or rejoined; never a crash.
        assert a.wait(timeout=30) in (0, 1), log_a.read_text()
        assert "Traceback" not in log_b.read_text()
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    committed = _scored_ids(await _read_all(kafka_bootstrap, out_topic, "read_committed"))
    assert set(committed) == sent
    twice = sorted(t for t, n in committed.items() if n > 1)
    assert not twice, f"{len(twice)} scored twice: {twice}"
