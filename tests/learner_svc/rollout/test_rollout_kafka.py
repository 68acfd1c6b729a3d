"""The rollout controller as a process (``python -m learner_svc``, rollout mode) on real Kafka:
kill -9 mid-stage resumes from the checkpoint without counting a session twice (its statistics
store of the sub-agents included) or promoting twice; a second controller fences the first
(never two writers of one seq)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from kafka_helpers import kafka_test_config, kafka_url
from rollout_helpers import K, Traffic, app, settings, until

from learner_svc.rollout.config import ControllerSettings
from learner_svc.rollout.controller import NotWriter
from learner_svc.rollout.evidence import STATE_KEY, load_registry
from podium import codec
from podium.bus import KafkaBus, read_committed
from podium.observed import AgentStats
from podium.rollout import pause
from podium.v1 import rollout_pb2, rollout_pb2_grpc

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
IDLE = rollout_pb2.ROLLOUT_STAGE_IDLE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Controller:
    """One ``python -m learner_svc`` rollout controller process and its RolloutService."""

    def __init__(self, bootstrap: str, s: ControllerSettings, log: Path) -> None:
        self.port = free_port()
        env = os.environ | {
            "PODIUM_BUS": kafka_url(bootstrap, session_timeout_ms=6000, heartbeat_interval_ms=250),
            "PODIUM_LEARNER_MODE": "rollout",
            "PODIUM_ROLLOUT_GROUP": s.group_id,
            "PODIUM_ROLLOUT_TOPIC": s.topic,
            "PODIUM_ROLLOUT_IN_TOPIC": s.in_topic,
            "PODIUM_ROLLOUT_TRAJECTORIES_TOPIC": s.trajectories_topic,
            "PODIUM_ROLLOUT_POLICY_TOPIC": s.policy_topic,
            "PODIUM_ROLLOUT_COLD_START": s.cold_start,
            "PODIUM_ROLLOUT_STAGE_MIN_S": "0",
            "PODIUM_ROLLOUT_STAGE_MIN_SESSIONS": str(s.stage_min_sessions),
            "PODIUM_ROLLOUT_GUARDRAIL_MIN_SESSIONS": str(s.guardrail_min_sessions),
            "PODIUM_ROLLOUT_TICK_S": "0.1",
            "PODIUM_ROLLOUT_GRPC_HOST": "127.0.0.1",
            "PODIUM_ROLLOUT_GRPC_PORT": str(self.port),
            "PYTHONPATH": str(ROOT),
        }
        env.pop("PODIUM_GRPC_TOKENS", None)
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "learner_svc"],
            cwd=ROOT,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )

    async def rpc(self, method: str, request: object) -> object:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            return await getattr(stub, method)(request, timeout=10)

    async def status(self) -> rollout_pb2.GetStatusResponse:
        reply = await self.rpc("GetStatus", rollout_pb2.GetStatusRequest(transitions=50))
        assert isinstance(reply, rollout_pb2.GetStatusResponse)
        return reply

    async def writer(self, timeout_s: float = 90.0) -> rollout_pb2.GetStatusResponse:
        """Wait until this process is the writer (its last transition claims it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                st = await self.status()
                if st.state.writer and await self.command_ok():
                    return st
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.3)
        raise AssertionError(f"never became the writer: {self.log.read_text()[-3000:]}")

    async def command_ok(self) -> bool:
        """Whether a harmless command reaches the writer (pause then resume)."""
        try:
            await self.rpc("Pause", rollout_pb2.PauseRequest())
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.FAILED_PRECONDITION  # already paused
        await self.rpc("Resume", rollout_pb2.ResumeRequest())
        return True

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
async def admin(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    bus = KafkaBus(kafka_test_config(kafka_bootstrap))
    await bus.start()
    try:
        yield bus
    finally:
        await bus.stop()


@pytest.fixture
def processes() -> Iterator[list[Controller]]:
    procs: list[Controller] = []
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


def command(reason: str = "test") -> rollout_pb2.RolloutCommand:
    return rollout_pb2.RolloutCommand(reason=reason)


def check_single_writer(records: list[object]) -> None:
    """States were written in strictly increasing seq order (one partition): no seq was
    written twice, by one writer or two."""
    seqs = [
        codec.decode_event(r.value, rollout_pb2.RolloutState)[1].seq  # type: ignore[attr-defined]
        for r in records
        if r.key == STATE_KEY.encode()  # type: ignore[attr-defined]
    ]
    assert seqs == sorted(set(seqs)), f"state seqs written out of order or twice: {seqs}"


async def test_kill_9_mid_stage_resumes_without_double_counting(
    kafka_bootstrap: str,
    admin: KafkaBus,
    unique: Callable[[str], str],
    tmp_path: Path,
    processes: list[Controller],
) -> None:
    s = settings(unique, cold_start="rules:sequential", stage_min_sessions=60)
    traffic = Traffic(admin, s)
    first = Controller(kafka_bootstrap, s, tmp_path / "first.log")
    processes.append(first)
    await first.writer()
    await first.rpc("Pause", rollout_pb2.PauseRequest(command=command()))
    await first.rpc("Propose", rollout_pb2.ProposeRequest(version="rules:cpls"))
    for _ in range(4):  # offline -> shadow -> 1% -> 5% -> 20%, by hand
        await first.rpc("Promote", rollout_pb2.PromoteRequest(command=command()))
    await first.rpc("Resume", rollout_pb2.ResumeRequest(command=command()))
    state = (await first.status()).state
    assert state.canary_percent == 20
    sent = await traffic.publish(state, 100)

    async def counted(c: Controller) -> int:
        return sum((await c.status()).arm_sessions.values())

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while await counted(first) == 0:  # kill it while it is absorbing
        assert loop.time() < deadline
        await asyncio.sleep(0.05)
    first.kill()
    sent += await traffic.publish(state, 100)
    second = Controller(kafka_bootstrap, s, tmp_path / "second.log")
    processes.append(second)
    status = await second.writer()
    assert status.state.writer_epoch > state.writer_epoch
    deadline = loop.time() + 60
    while await counted(second) < 200:
        assert loop.time() < deadline, (await second.status()).arm_sessions
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    after = await second.status()
    assert sum(after.arm_sessions.values()) == 200, "every session counted exactly once"
    canary = after.arm_sessions.get("canary:rules:cpls", 0)
    assert after.evidence.figures["stage_sessions"] == canary
    once = AgentStats()  # every execution of every session, recorded exactly once
    for sc in sent:
        once.record_trajectory(sc.trajectory)
    assert after.evidence.figures["agent_stats_executions"] == once.version > 0
    # On to the promotion; it happens once however the traffic goes on.
    while (await second.status()).state.live_version != "rules:cpls":
        assert traffic.sent < 3000
        await traffic.publish((await second.status()).state, 100)
        await asyncio.sleep(0.5)
    await traffic.publish((await second.status()).state, 50)
    await asyncio.sleep(1.0)
    records = await read_committed(admin, s.topic)
    registry = load_registry(records)
    promoted = [t for t in registry.transitions if t.kind == K.TRANSITION_KIND_PROMOTED]
    assert len(promoted) == 1
    check_single_writer(records)


async def test_a_second_controller_fences_the_first(
    kafka_bootstrap: str,
    admin: KafkaBus,
    unique: Callable[[str], str],
    tmp_path: Path,
    processes: list[Controller],
) -> None:
    s = settings(unique)
    traffic = Traffic(admin, s)
    first = Controller(kafka_bootstrap, s, tmp_path / "first.log")
    processes.append(first)
    claimed = await first.writer()
    await traffic.publish(claimed.state, 30)

    # The writer freezes (a zombie that still believes it holds every partition) with
    # traffic in flight; a second controller starts, takes every partition once the zombie's
    # session times out, claims the transactional ids (fencing the zombie's producers) and
    # writes the next epoch.
    first.kill(signal.SIGSTOP)
    await traffic.publish(claimed.state, 30)
    b_bus = KafkaBus(kafka_test_config(kafka_bootstrap, session_timeout_ms=6000))
    await b_bus.start()
    second = app(s, b_bus, "second")
    await second.start()
    try:
        c = second.controller
        await until(lambda: c.writer, 60, "the second controller to take over")
        assert c.state is not None and c.state.writer == "rollout-test-second"
        assert c.state.writer_epoch == claimed.state.writer_epoch + 1
        await traffic.publish(c.state, 30)
        first.proc.send_signal(signal.SIGCONT)  # the zombie wakes up: it must not write
        # It rejoins: while the two share the input partitions, neither writes.
        await until(lambda: not c.writer, 60, "the second to share the partitions")
        with pytest.raises(NotWriter):
            await c.command("pause", lambda st, now: pause(st, "", "operator:test", now))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while True:  # the woken zombie refuses commands: it is not the writer
            try:
                await first.rpc("Pause", rollout_pb2.PauseRequest(command=command()))
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
                break
            raise AssertionError("the woken zombie accepted a command")
        assert loop.time() < deadline
        first.kill()
        await until(lambda: c.writer, 60, "the second to hold everything again")
        await c.command("pause", lambda st, now: pause(st, "after", "operator:test", now))
        await until(
            lambda: sum(c.evidence.arm_sessions.values()) >= 90, 60, "every session absorbed"
        )
        await asyncio.sleep(1.0)
        assert sum(c.evidence.arm_sessions.values()) == 90, "each session counted once"
    finally:
        await second.stop()
        await b_bus.stop()
    records = await read_committed(admin, s.topic)
    check_single_writer(records)
    registry = load_registry(records)
    writers = [t.state.writer for t in registry.transitions]
    first_name = claimed.state.writer
    last_first = max(i for i, w in enumerate(writers) if w == first_name)
    assert all(w == "rollout-test-second" for w in writers[last_first + 1 :])
    assert registry.state is not None and registry.state.paused
