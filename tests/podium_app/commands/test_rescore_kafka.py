"""`podium reward rescore` on a real broker: a range re-scored with a new reward version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kafka_helpers import client_kwargs, kafka_url

from podium import codec
from podium.rewards import load_config, score
from podium.rewards.examples import EXAMPLES
from podium.v1 import reward_pb2, trajectory_pb2

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).parents[3]
PARL = ROOT / "podium" / "data" / "rewards" / "parl.yaml"


async def _read(bootstrap: str, topic: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        **client_kwargs(bootstrap), isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[bytes] = []
        for _ in range(100):
            if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                break
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out += [r.value for r in records]
        return out
    finally:
        await consumer.stop()


def _rescore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "podium_app.cli", "reward", "rescore", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_rescore_range_into_another_topic(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    src, out = unique("rescore.src"), unique("rescore.out")
    admin = AIOKafkaAdminClient(**client_kwargs(kafka_bootstrap))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(src, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(**client_kwargs(kafka_bootstrap), enable_idempotence=True)
    await producer.start()
    originals = []
    try:
        for i, build in enumerate([*EXAMPLES.values(), *EXAMPLES.values()][:10]):
            traj = build()
            traj.trajectory_id = f"r{i}"
            data = codec.encode_event(traj, producer="test", key=traj.trajectory_id)[1]
            originals.append(data)
            await producer.send_and_wait(src, data, key=traj.trajectory_id.encode())
    finally:
        await producer.stop()

    bus = kafka_url(kafka_bootstrap)
    proc = _rescore(
        "--bus",
        bus,
        "--topic",
        src,
        "--from-offset",
        "2",
        "--to-offset",
        "7",
        "--reward-config",
        str(PARL),
        "--out-topic",
        out,
        "--progress",
        "100",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    parl = load_config(PARL)
    assert (summary["read"], summary["scored"], summary["skipped"]) == (5, 5, [])
    assert summary["reward_version"] == parl.version

    rescored = [
        codec.decode_event(v, reward_pb2.ScoredTrajectory)[1]
        for v in await _read(kafka_bootstrap, out)
    ]
    assert sorted(s.trajectory.trajectory_id for s in rescored) == [f"r{i}" for i in range(2, 7)]
    for s in rescored:
        assert s.reward_version == parl.version and s.schedule_step == 100
        assert s.total == pytest.approx(score(s.trajectory, parl, 100).total)
        assert set(s.components) == {"parl.parallel", "parl.finish", "parl.perf"}
    # The source topic is read, never written.
    assert await _read(kafka_bootstrap, src) == originals
    assert all(codec.decode_event(v, trajectory_pb2.Trajectory) for v in originals)


def test_rescore_refuses_to_write_into_live_topics() -> None:
    proc = _rescore(
        "--bus",
        "kafka://127.0.0.1:1",
        "--from-offset",
        "0",
        "--reward-config",
        str(PARL),
        "--out-topic",
        "podium.trajectories.v1",
    )
    assert proc.returncode == 2 and "--out-topic" in proc.stderr
    proc = _rescore(
        "--bus", "inproc://", "--from-offset", "0", "--reward-config", str(PARL), "--out-topic", "x"
    )
    assert proc.returncode == 2 and "--bus" in proc.stderr
    proc = _rescore(
        "--bus",
        "kafka://127.0.0.1:1",
        "--from-offset",
        "5",
        "--to-offset",
        "2",
        "--reward-config",
        str(PARL),
        "--out-topic",
        "x",
    )
    assert proc.returncode == 2 and "--to-offset" in proc.stderr
