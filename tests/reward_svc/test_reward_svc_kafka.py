"""reward_svc on a real Kafka broker: exactly-once across a kill -9 in the middle of a batch.

The service runs as a separate process (``python -m reward_svc``). It is killed with SIGKILL
while a transaction is open, restarted, and stopped with SIGTERM; a read_committed reader must
then see every trajectory scored exactly once, and the poison records on the dead-letter topic.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kafka_helpers import client_kwargs, kafka_url

from podium import codec, topics
from podium.bus.consumer import DLQ_ERROR, DLQ_ERROR_TYPE, DLQ_SOURCE_OFFSET, DLQ_SOURCE_TOPIC
from podium.rewards import default_config
from podium.rewards.examples import EXAMPLES
from podium.v1 import reward_pb2

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
ROOT = Path(__file__).parents[2]
N = 60
BATCH = 10


async def _read_all(bootstrap: str, topic: str, isolation: str) -> list[object]:
    """Every record of ``topic`` visible at ``isolation`` (no group, from the beginning)."""
    consumer = AIOKafkaConsumer(
        **client_kwargs(bootstrap), isolation_level=isolation, enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            await consumer._client.force_metadata_update()  # topic may be brand new
            parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)  # read_committed: the last stable offset
        out: list[object] = []
        for _ in range(200):
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()


def _start_service(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "reward_svc"], cwd=ROOT, env=env, stdout=fh, stderr=fh
        )


@pytest.fixture
async def service_env(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> AsyncIterator[dict[str, str]]:
    names = {"in": unique("reward.in"), "out": unique("reward.out")}
    admin = AIOKafkaAdminClient(**client_kwargs(kafka_bootstrap))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(names["in"], 3, 1)])
    finally:
        await admin.close()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        # Short session timeout: after the kill, the dead member leaves the group quickly.
        "PODIUM_BUS": kafka_url(
            kafka_bootstrap, session_timeout_ms=6000, heartbeat_interval_ms=500
        ),
        "PODIUM_REWARD_IN_TOPIC": names["in"],
        "PODIUM_REWARD_OUT_TOPIC": names["out"],
        "PODIUM_REWARD_GROUP": unique("reward.group"),
        "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX": unique("reward.txn"),
        "PODIUM_REWARD_MAX_BATCH": str(BATCH),
        "PODIUM_REWARD_POLL_MS": "200",
    }
    yield env


async def test_exactly_once_across_a_kill_mid_batch(
    kafka_bootstrap: str, service_env: dict[str, str], tmp_path: Path
) -> None:
    in_topic = service_env["PODIUM_REWARD_IN_TOPIC"]
    out_topic = service_env["PODIUM_REWARD_OUT_TOPIC"]
    builders = list(EXAMPLES.values())
    sent: dict[str, str] = {}  # trajectory id -> expected reward_version
    producer = AIOKafkaProducer(
        **client_kwargs(kafka_bootstrap), enable_idempotence=True, acks="all"
    )
    await producer.start()
    try:
        for i in range(N):
            traj = builders[i % len(builders)]()
            traj.trajectory_id = traj.session_id = f"traj-{i:03d}"
            _, data = codec.encode_event(traj, producer="test", key=traj.session_id)
            await producer.send_and_wait(in_topic, data, key=traj.session_id.encode())
            sent[traj.trajectory_id] = default_config().version
            if i == N // 2:  # poison: not an envelope at all, and an unscorable trajectory
                await producer.send_and_wait(in_topic, b"\x00garbage", key=b"poison")
                bad = builders[0]()
                bad.trajectory_id = "cyclic"
                bad.task.subtasks[0].deps.append("t")
                _, data = codec.encode_event(bad, producer="test", key="cyclic")
                await producer.send_and_wait(in_topic, data, key=b"cyclic")
    finally:
        await producer.stop()

    log = tmp_path / "reward_svc.log"
    slow = {**service_env, "PODIUM_REWARD_RECORD_DELAY_MS": "60"}  # a batch takes ≥ 0.6 s
    proc = _start_service(slow, log)
    killed_mid_batch = False
    try:
        for _ in range(300):  # ≤ 60 s
            await asyncio.sleep(0.05)
            assert proc.poll() is None, log.read_text()
            seen = len(await _read_all(kafka_bootstrap, out_topic, "read_uncommitted"))
            # At least one batch committed and the next one half written: kill inside it.
            if seen >= BATCH + 3 and seen % BATCH not in (0, 1, 2):
                proc.send_signal(signal.SIGKILL)
                killed_mid_batch = True
                break
        assert killed_mid_batch, log.read_text()
        proc.wait(timeout=10)
        committed_before = len(await _read_all(kafka_bootstrap, out_topic, "read_committed"))
        assert 0 < committed_before < N

        proc = _start_service(service_env, log)
        for _ in range(300):  # ≤ 90 s
            await asyncio.sleep(0.3)
            assert proc.poll() is None, log.read_text()
            if len(await _read_all(kafka_bootstrap, out_topic, "read_committed")) >= N:
                break
        await asyncio.sleep(1.0)  # anything extra (a duplicate) would show up now
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    committed = await _read_all(kafka_bootstrap, out_topic, "read_committed")
    everything = await _read_all(kafka_bootstrap, out_topic, "read_uncommitted")
    ids: Counter[str] = Counter()
    event_ids: Counter[str] = Counter()
    for rec in committed:
        env, scored = codec.decode_event(rec.value, reward_pb2.ScoredTrajectory)  # type: ignore[attr-defined]
        ids[scored.trajectory.trajectory_id] += 1
        event_ids[env.event_id] += 1
        assert scored.reward_version == sent[scored.trajectory.trajectory_id]
        assert set(scored.penalties) >= {"fake_parallelism", "avoidance"}
        assert scored.total == pytest.approx(
            sum(scored.components.values()) - sum(scored.penalties.values())
        )
    assert len(committed) == N
    assert set(ids) == set(sent) and max(ids.values()) == 1
    assert max(event_ids.values()) == 1
    # The killed transaction's records are in the log, aborted: the crash really hit mid-batch.
    assert len(everything) > N

    dead = await _read_all(kafka_bootstrap, topics.dead_letter(in_topic), "read_committed")
    assert len(dead) == 2
    for rec in dead:
        headers = dict(rec.headers)  # type: ignore[attr-defined]
        assert headers[DLQ_SOURCE_TOPIC].decode() == in_topic
        assert int(headers[DLQ_SOURCE_OFFSET]) >= 0
    assert {dict(r.headers)[DLQ_ERROR_TYPE] for r in dead} == {  # type: ignore[attr-defined]
        b"DecodeError",
        b"InvalidTrajectoryError",
    }
    errors = b" | ".join(dict(r.headers)[DLQ_ERROR] for r in dead)  # type: ignore[attr-defined]
    assert b"dependency cycle" in errors and b"malformed protobuf" in errors
