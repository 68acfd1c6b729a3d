"""Crash-safe sessions with the services as processes (``python -m orchestrator_svc``,
``python -m subagent_svc``) on a real Kafka broker of the module's own (the topic names are
fixed, so a shared broker would mix these sessions with other runs').

Each item reproduces one of issue 12's "What was seen":

* an orchestrator ``kill -9`` with 10 sessions in flight, then a restart: every session has
  exactly one trajectory (before: 10 without one, never replayed);
* a retry with the same ``client_request_id`` after the restart names the same session, and
  its stream ends with the result; still one trajectory (before: a new session), also on a
  third process that knows the ended session from the ledger only;
* two replicas, one killed mid-batch: every session completes exactly once;
* a session whose trajectory exceeds the broker's 1 MB limit still publishes one (trimmed)
  and its stream ends (before: it crashed at the end and its stream never ended).
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO

import grpc.aio
import pytest

from podium import codec, topics
from podium.bus import EventPublisher, KafkaBus, KafkaConfig
from podium.bus.base import TopicSpec
from podium.v1 import session_service_pb2 as ss
from podium.v1 import session_service_pb2_grpc, subtask_pb2, task_pb2, trajectory_pb2
from podium_app.kafka_broker import KafkaBroker, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

TASK = """
name: crash-probe
max_parallel: 3
subtasks:
  - {id: form,    kind: ui,       work: 3.0}
  - {id: hash,    kind: security, work: 5.0}
  - {id: creds,   kind: db,       work: 4.0, deps: [hash]}
  - {id: api,     kind: api,      work: 4.5, deps: [form, creds]}
  - {id: tests,   kind: test,     work: 4.0, deps: [api]}
"""
"""Five sequential-ish executions: with PODIUM_SUBAGENT_TIME_SCALE=0.3 a session takes ~5 s."""

ASSIGNMENT_PARTITIONS = 3
"""Partitions of the shared topics, and members of the sub-agent group (one per partition)."""


def _tool(name: str) -> None:
    if shutil.which(name) is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but `{name}` is not installed")
        pytest.skip(f"`{name}` is not installed")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A broker of this module's own; always torn down."""
    _tool("java")
    _tool("mvn")
    # Plaintext: this file's clients use bare host:port; SCRAM/TLS/ACLs are covered by
    # tests/podium_app/test_kafka_broker_auth.py (kafka_helpers.broker_config to switch).
    broker = KafkaBroker(tmp_path_factory.mktemp("sessions-broker"), security="plaintext")
    try:
        broker.start()
        yield broker
    finally:
        broker.stop(timeout_s=15)


class Procs:
    """Service processes of one test, each logging to a file; all SIGKILLed at the end."""

    def __init__(self, bootstrap: str, log_dir: Path) -> None:
        self.bus = (
            f"kafka://{bootstrap}?session_timeout_ms=6000&heartbeat_interval_ms=500"
            "&revoke_grace_s=3.0"
        )
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: list[IO[bytes]] = []

    def start(self, name: str, module: str, **env: str) -> None:
        log = (self.log_dir / f"{name}.log").open("ab")
        self.logs.append(log)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=os.environ
            | {"PYTHONPATH": str(ROOT), "PODIUM_BUS": self.bus, "PODIUM_LOG_LEVEL": "INFO"}
            | env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def orchestrator(self, name: str, group: str, port: int) -> None:
        self.start(
            name,
            "orchestrator_svc",
            PODIUM_GROUP_ID=group,
            PODIUM_GRPC_HOST="127.0.0.1",
            PODIUM_GRPC_PORT=str(port),
            PODIUM_SESSION_TIMEOUT_S="60",
        )

    def subagent(self, group: str, time_scale: float = 0.3) -> None:
        # One member per assignment partition: executions of different sessions overlap as
        # they would on a deployed worker pool, so the sessions a test waits for end in
        # about a third of the time (one member ran all of them one after another).
        self.start(
            "subagent",
            "subagent_svc",
            PODIUM_GROUP_ID=group,
            PODIUM_SUBAGENT_TIME_SCALE=str(time_scale),
            PODIUM_SUBAGENT_CONCURRENCY=str(ASSIGNMENT_PARTITIONS),
        )

    def kill9(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)

    def tail(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")[-4000:]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for log in self.logs:
            log.close()


@pytest.fixture
async def kafka(broker: KafkaBroker) -> AsyncIterator[KafkaBus]:
    bus = KafkaBus(KafkaConfig(broker.bootstrap, client_id="sessions-test"))
    await bus.start()
    try:
        yield bus
    finally:
        await bus.stop()


@pytest.fixture
def names() -> tuple[str, str]:
    """Groups of the orchestrators and sub-agents of one test."""
    run = uuid.uuid4().hex[:8]
    return f"orch-{run}", f"sub-{run}"


@pytest.fixture
async def procs(
    broker: KafkaBroker, kafka: KafkaBus, names: tuple[str, str], tmp_path: Path
) -> AsyncIterator[Procs]:
    """Processes started at the end of the shared topics (earlier tests' tasks are not theirs)."""
    orch, sub = names
    await kafka.create_topics(
        [
            TopicSpec(t, ASSIGNMENT_PARTITIONS)
            for t in (topics.TASKS, topics.SUBTASKS_ASSIGNED, topics.TRAJECTORIES)
        ]
    )
    await kafka.position_groups_at_end(
        {f"{orch}.tasks": [topics.TASKS], sub: [topics.SUBTASKS_ASSIGNED]}
    )
    p = Procs(broker.bootstrap, tmp_path)
    try:
        yield p
    finally:
        p.close()


async def trajectories(kafka: KafkaBus) -> list[trajectory_pb2.Trajectory]:
    """Every committed trajectory on the broker."""
    out = []
    for partition in await kafka.partitions(topics.TRAJECTORIES):
        async for chunk in kafka.read_range(topics.TRAJECTORIES, partition, 0):
            out += [codec.decode_event(r.value, trajectory_pb2.Trajectory)[1] for r in chunk]
    return out


async def counts(kafka: KafkaBus, ids: list[str]) -> dict[str, int]:
    found = collections.Counter(t.session_id for t in await trajectories(kafka))
    return {sid: found[sid] for sid in ids}


async def wait_all(kafka: KafkaBus, ids: list[str], timeout_s: float) -> dict[str, int]:
    """Trajectory counts of ``ids`` once each has one (or at the timeout)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = await counts(kafka, ids)
        if all(found.values()) or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(1.0)


async def stub(port: int) -> tuple[grpc.aio.Channel, session_service_pb2_grpc.SessionServiceStub]:
    """A client of the orchestrator on ``port``, once it serves."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    await asyncio.wait_for(channel.channel_ready(), 90)
    return channel, session_service_pb2_grpc.SessionServiceStub(channel)


async def submit(
    client: session_service_pb2_grpc.SessionServiceStub, request_id: str, seed: int
) -> str:
    request = ss.SubmitTaskRequest(task_spec_text=TASK, client_request_id=request_id, seed=seed)
    return str((await client.SubmitTask(request, timeout=30)).session_id)


async def last_event(
    client: session_service_pb2_grpc.SessionServiceStub, sid: str, timeout_s: float
) -> ss.StreamSessionResponse:
    events = [
        e
        async for e in client.StreamSession(
            ss.StreamSessionRequest(session_id=sid), timeout=timeout_s
        )
    ]
    return events[-1]


async def in_flight(kafka: KafkaBus, ids: list[str], timeout_s: float = 60.0) -> None:
    """Wait until every session of ``ids`` has sent sub-agent work out (they have started)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        started = set()
        for partition in await kafka.partitions(topics.SUBTASKS_ASSIGNED):
            async for chunk in kafka.read_range(topics.SUBTASKS_ASSIGNED, partition, 0):
                started |= {
                    codec.decode_event(r.value, subtask_pb2.SubtaskAssigned)[1].session_id
                    for r in chunk
                }
        if started >= set(ids):
            return
        await asyncio.sleep(0.5)
    raise AssertionError("not every session started")


async def test_kill9_with_sessions_in_flight_then_restart_loses_none_and_retry_is_idempotent(
    kafka: KafkaBus, procs: Procs, names: tuple[str, str]
) -> None:
    orch, sub = names
    port = free_port()
    procs.subagent(sub)
    procs.orchestrator("orch-1", orch, port)
    channel, client = await stub(port)
    ids = [await submit(client, f"crash-{orch}-{i}", seed=i + 1) for i in range(10)]
    await channel.close()
    await in_flight(kafka, ids)
    await asyncio.sleep(1.0)
    assert not any((await counts(kafka, ids)).values()), "sessions ended before the kill"
    procs.kill9("orch-1")

    procs.orchestrator("orch-2", orch, port)
    channel, client = await stub(port)
    try:
        found = await wait_all(kafka, ids, timeout_s=120)
        assert found == dict.fromkeys(ids, 1), procs.tail("orch-2")
        # The same client_request_id after the restart: the same session, ended, not re-run.
        assert await submit(client, f"crash-{orch}-3", seed=4) == ids[3]
        last = await last_event(client, ids[3], timeout_s=30)
        assert last.HasField("result") and last.result.state == ss.SESSION_STATE_SUCCEEDED
        await asyncio.sleep(2.0)
        assert await counts(kafka, ids) == dict.fromkeys(ids, 1)
    finally:
        await channel.close()
    # Once more on a third process, which knows the ended sessions from the ledger only.
    procs.kill9("orch-2")
    procs.orchestrator("orch-3", orch, port)
    channel, client = await stub(port)
    try:
        assert await submit(client, f"crash-{orch}-5", seed=6) == ids[5]
        last = await last_event(client, ids[5], timeout_s=60)
        assert last.HasField("result") and last.result.state == ss.SESSION_STATE_SUCCEEDED
        await asyncio.sleep(2.0)
        assert await counts(kafka, ids) == dict.fromkeys(ids, 1), procs.tail("orch-3")
    finally:
        await channel.close()
    assert all(t.completed for t in await trajectories(kafka) if t.session_id in ids)


async def test_two_replicas_one_killed_mid_batch_every_session_exactly_once(
    kafka: KafkaBus, procs: Procs, names: tuple[str, str]
) -> None:
    orch, sub = names
    ports = {"orch-a": free_port(), "orch-b": free_port()}
    procs.subagent(sub)
    for name, port in ports.items():
        procs.orchestrator(name, orch, port)
    clients = {name: await stub(port) for name, port in ports.items()}
    # The replicas share the tasks partitions once both have joined; give the group a moment.
    await asyncio.sleep(8.0)
    ids = [
        await submit(clients["orch-a" if i % 2 else "orch-b"][1], f"pair-{orch}-{i}", seed=i + 1)
        for i in range(12)
    ]
    await in_flight(kafka, ids)
    await asyncio.sleep(1.0)
    procs.kill9("orch-a")
    try:
        found = await wait_all(kafka, ids, timeout_s=150)
        assert found == dict.fromkeys(ids, 1), procs.tail("orch-b")
        # A session submitted to the survivor ends its stream there whoever ran it.
        last = await last_event(clients["orch-b"][1], ids[0], timeout_s=30)
        assert last.HasField("result") and last.result.state == ss.SESSION_STATE_SUCCEEDED
    finally:
        for channel, _ in clients.values():
            await channel.close()
    assert all(t.completed for t in await trajectories(kafka) if t.session_id in ids)


async def test_trajectory_over_the_broker_limit_is_trimmed_and_the_stream_ends(
    kafka: KafkaBus, procs: Procs, names: tuple[str, str]
) -> None:
    orch, sub = names
    port = free_port()
    procs.subagent(sub, time_scale=0.0)
    procs.orchestrator("orch-1", orch, port)
    channel, client = await stub(port)
    # 600 kB of task: fine as a TaskSubmitted, but the trajectory repeats every subtask's
    # spec in its execution's context, which takes it past the broker's 1 MB.
    sid = f"big-{orch}"
    task = task_pb2.TaskSpec(
        name="big",
        subtasks=[
            task_pb2.SubtaskSpec(id=f"s{i}", kind="ui", work=1.0, description="x" * 20_000)
            for i in range(30)
        ],
    )
    await EventPublisher(kafka, producer_name="test").publish(
        topics.TASKS, task_pb2.TaskSubmitted(session_id=sid, task=task, seed=1), key=sid
    )
    try:
        for _ in range(60):  # the handle exists once the owner has taken the task
            try:
                last = await last_event(client, sid, timeout_s=90)
                break
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
                await asyncio.sleep(0.5)
        assert last.HasField("result"), procs.tail("orch-1")
    finally:
        await channel.close()
    # The stream may end before the trajectory's transaction is committed (read_committed).
    for _ in range(120):
        found = [t for t in await trajectories(kafka) if t.session_id == sid]
        if found:
            break
        await asyncio.sleep(0.5)
    (traj,) = found
    assert traj.labels["trimmed"] and traj.ByteSize() < 1_000_000
