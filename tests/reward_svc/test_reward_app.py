"""reward_svc through the shared service lifecycle (:mod:`podium.service`).

Embedded on the in-process bus as an :class:`~podium.service.App`; as ``python -m reward_svc``:
configuration errors exit 2 naming the variable, an unreachable broker exits 1 with the reason,
SIGTERM in the middle of a transaction lets that batch commit and exits 0, and a replica
fenced by another with the same transactional id exits 1 naming the setting.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kafka_helpers import client_kwargs, kafka_url
from test_reward_svc_kafka import _read_all, _start_service

from podium import codec
from podium.bus import InProcBus
from podium.rewards import default_config
from podium.rewards.examples import EXAMPLES
from podium.v1 import reward_pb2
from reward_svc.app import RewardApp
from reward_svc.config import RewardServiceConfig

ROOT = Path(__file__).parents[2]


async def test_app_scores_on_the_inproc_bus_and_stops_cleanly() -> None:
    bus = InProcBus()
    await bus.start()
    try:
        cfg = RewardServiceConfig(bus_url="inproc://", max_batch=3)
        app = RewardApp(cfg, default_config(), bus)
        reader = bus.subscriber([cfg.out_topic], "reader")
        await reader.start()
        await app.start()
        waiting = asyncio.create_task(app.wait())
        sent = set()
        for i, build in enumerate(EXAMPLES.values()):
            traj = build()
            traj.trajectory_id = traj.session_id = f"app-{i}"
            sent.add(traj.trajectory_id)
            await bus.publish(
                cfg.in_topic, codec.encode_event(traj, producer="test")[1], key=traj.session_id
            )
        got: set[str] = set()
        for _ in range(100):
            for r in await reader.fetch(timeout_s=0.05):
                got.add(
                    codec.decode_event(r.value, reward_pb2.ScoredTrajectory)[
                        1
                    ].trajectory.trajectory_id
                )
            if got >= sent:
                break
        assert got == sent
        assert not waiting.done()  # it runs until told to stop
        await app.stop()
        await asyncio.wait_for(waiting, 5)  # wait() returns without error after a stop
        await app.stop()  # stopping twice is harmless
        assert app.transformer.stats.transformed == len(sent)
        await reader.stop()
    finally:
        await bus.stop()


def _run_module(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")}
    return subprocess.run(
        [sys.executable, "-m", "reward_svc"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("var", "value", "fragment"),
    [
        ("PODIUM_LOG_LEVEL", "LOUD", "'LOUD' is invalid: expected one of DEBUG"),
        ("PODIUM_SHUTDOWN_TIMEOUT_S", "0", "'0' is invalid: expected a number > 0"),
        ("PODIUM_SHUTDOWN_TIMEOUT_S", "soon", "'soon' is invalid: expected a number"),
        ("PODIUM_REWARD_CONFIG", "BAD_YAML", "invalid YAML"),
    ],
)
def test_config_errors_exit_2_naming_the_variable(
    tmp_path: Path, var: str, value: str, fragment: str
) -> None:
    if value == "BAD_YAML":
        bad = tmp_path / "reward.yaml"
        bad.write_text("weights: [unclosed\n")
        value = str(bad)
    proc = _run_module({"PODIUM_BUS": "kafka://127.0.0.1:1", var: value})
    assert proc.returncode == 2, proc.stderr
    assert re.search(rf"^reward_svc: configuration error: .*\b{var}\b", proc.stderr, re.M)
    assert fragment in proc.stderr and "Traceback" not in proc.stderr


def test_unreachable_broker_exits_1_with_the_reason() -> None:
    # Port 1 on loopback refuses at once: the bus fails to connect before the loop starts.
    proc = _run_module({"PODIUM_BUS": "kafka://127.0.0.1:1"})
    assert proc.returncode == 1, proc.stderr
    assert "kafka connect to 127.0.0.1:1 failed" in proc.stderr
    assert "Traceback" not in proc.stderr


N = 30
BATCH = 10


@pytest.fixture
async def loaded_env(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> AsyncIterator[dict[str, str]]:
    """Service settings on fresh topics whose input already holds N trajectories."""
    in_topic, out_topic = unique("app.in"), unique("app.out")
    admin = AIOKafkaAdminClient(**client_kwargs(kafka_bootstrap))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(in_topic, 1, 1)])  # one partition: ordered batches
    finally:
        await admin.close()
    producer = AIOKafkaProducer(**client_kwargs(kafka_bootstrap), acks="all")
    await producer.start()
    try:
        builders = list(EXAMPLES.values())
        for i in range(N):
            traj = builders[i % len(builders)]()
            traj.trajectory_id = traj.session_id = f"app-{i:03d}"
            _, data = codec.encode_event(traj, producer="test", key=traj.session_id)
            await producer.send_and_wait(in_topic, data, key=traj.session_id.encode())
    finally:
        await producer.stop()
    yield {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PODIUM_BUS": kafka_url(
            kafka_bootstrap, session_timeout_ms=6000, heartbeat_interval_ms=500
        ),
        "PODIUM_REWARD_IN_TOPIC": in_topic,
        "PODIUM_REWARD_OUT_TOPIC": out_topic,
        "PODIUM_REWARD_GROUP": unique("app.group"),
        "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX": unique("app.txn"),
        "PODIUM_REWARD_MAX_BATCH": str(BATCH),
        "PODIUM_REWARD_POLL_MS": "200",
    }


@pytest.mark.kafka
@pytest.mark.slow
async def test_sigterm_mid_transaction_commits_the_batch_and_exits_0(
    kafka_bootstrap: str, loaded_env: dict[str, str], tmp_path: Path
) -> None:
    out_topic = loaded_env["PODIUM_REWARD_OUT_TOPIC"]
    log = tmp_path / "reward_svc.log"
    # 80 ms a record: a batch of 10 holds its transaction open for 0.8 s.
    proc = _start_service({**loaded_env, "PODIUM_REWARD_RECORD_DELAY_MS": "80"}, log)
    try:
        seen = 0
        for _ in range(600):  # ≤ 30 s
            await asyncio.sleep(0.05)
            assert proc.poll() is None, log.read_text()
            seen = len(await _read_all(kafka_bootstrap, out_topic, "read_uncommitted"))
            if 0 < seen % BATCH <= BATCH // 2:  # a transaction is open, half written
                break
        assert seen % BATCH > 0, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "stop signal received; stopping gracefully" in text and "Traceback" not in text
    committed = await _read_all(kafka_bootstrap, out_topic, "read_committed")
    everything = await _read_all(kafka_bootstrap, out_topic, "read_uncommitted")
    # The open batch was finished and committed, not aborted; then consumption stopped.
    assert len(committed) == len(everything) > seen
    assert len(committed) % BATCH == 0 and len(committed) < N
    ids = [
        codec.decode_event(r.value, reward_pb2.ScoredTrajectory)[1].trajectory.trajectory_id  # type: ignore[attr-defined]
        for r in committed
    ]
    # One input partition: the batches are the input's first records, each scored once.
    assert sorted(ids) == [f"app-{i:03d}" for i in range(len(committed))]


@pytest.mark.kafka
@pytest.mark.slow
async def test_a_replica_fenced_on_every_partition_exits_1_naming_the_prefix(
    kafka_bootstrap: str, loaded_env: dict[str, str], unique: Callable[[str], str], tmp_path: Path
) -> None:
    """Another group on the same topic with the same transactional id prefix (a deployment
    error) takes the partition ids over: the first replica loses every partition to it, and
    stops saying so instead of idling."""
    out_topic = loaded_env["PODIUM_REWARD_OUT_TOPIC"]
    slow = {**loaded_env, "PODIUM_REWARD_RECORD_DELAY_MS": "150"}
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    first = _start_service(slow, log_a)
    second: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(600):  # wait until the first replica is inside a transaction
            await asyncio.sleep(0.05)
            assert first.poll() is None, log_a.read_text()
            if await _read_all(kafka_bootstrap, out_topic, "read_uncommitted"):
                break
        # Same prefix, other group: its claim of the partition's id bumps the epoch.
        second = _start_service({**slow, "PODIUM_REWARD_GROUP": unique("app.other")}, log_b)
        assert first.wait(timeout=60) == 1, log_a.read_text()
        text = log_a.read_text()
        assert "ERROR podium.service: reward_svc: fenced: newer owners took over every" in text
        assert "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX must be the same" in text
        # A clean exit, not an uncaught exception out of ``python -m``. (aiokafka may still log
        # an internal future of the fenced batch as "never retrieved": library noise.)
        assert 'File "<frozen runpy>"' not in text
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0, log_b.read_text()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
