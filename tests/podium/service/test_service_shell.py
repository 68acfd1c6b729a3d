"""The library's service shell on the in-process bus, and its health server over real gRPC.

:class:`podium.service.ServiceShell` runs an app's consumers as tasks and stops them within one
deadline; :func:`podium.service.serve` puts a ``grpc.health.v1`` server in front of any app:
NOT_SERVING while it starts, SERVING once ``start()`` returned, NOT_SERVING as soon as the stop
begins. Health is checked with a real gRPC client over loopback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
from collections.abc import AsyncIterator, Callable

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from podium import codec
from podium.bus import Bus, EventConsumer, EventPublisher, InProcBus, Record
from podium.config import ServiceConfig
from podium.errors import ConfigError, DecodeError
from podium.service import HealthServer, ServiceShell, health_port_of, serve
from podium.service.shell import COMMIT_FLOOR_S
from podium.v1 import envelope_pb2, task_pb2

Names = Callable[[str], str]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def submitted(session: str, seed: int = 0) -> task_pb2.TaskSubmitted:
    """A small event to consume."""
    return task_pb2.TaskSubmitted(session_id=session, submitted_by="tests", seed=seed)


class Recorder:
    """A handler that records the sessions it saw and can be made to block."""

    def __init__(self, *, block: bool = False) -> None:
        self.seen: list[str] = []
        self.entered = asyncio.Event()
        self.block = block

    async def __call__(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        self.entered.set()
        if self.block:
            await asyncio.Event().wait()  # never set: a batch that outlives any deadline
        self.seen.append(codec.unpack_as(envelope, task_pb2.TaskSubmitted).session_id)


async def eventually(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``cond()`` holds."""
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def read_uncommitted(bus: Bus, topic: str, group: str) -> list[Record]:
    """What a new member of ``group`` gets on ``topic`` (the records never committed)."""
    member = bus.subscriber([topic], group)
    await member.start()
    try:
        return await member.fetch(100, 0.5)
    finally:
        await member.stop()


# --------------------------------------------------------------------------- ServiceShell


async def test_shell_runs_each_consumer_in_order_and_stops_with_commit(
    inproc_bus: InProcBus, unique: Names
) -> None:
    first, second, group = unique("first"), unique("second"), unique("g")
    seen_first, seen_second = Recorder(), Recorder()
    shell = ServiceShell("svc", shutdown_timeout_s=5.0)
    for topic, handler in ((first, seen_first), (second, seen_second)):
        shell.add(
            EventConsumer(inproc_bus, [topic], f"{group}.{topic}", handler, producer_name="t")
        )
    await shell.start()
    assert [t.get_name() for t in shell.tasks] == [f"svc.{group}.{first}", f"svc.{group}.{second}"]
    publisher = EventPublisher(inproc_bus, producer_name="t")
    await publisher.publish(first, submitted("a"), key="a")
    await publisher.publish(second, submitted("b"), key="b")
    await eventually(lambda: seen_first.seen == ["a"] and seen_second.seen == ["b"])

    await shell.stop()
    assert all(t.done() and not t.cancelled() for t in shell.tasks)
    await shell.wait()  # ended cleanly: nothing to raise
    # Handled records were committed: the group's next member gets nothing again.
    assert await read_uncommitted(inproc_bus, first, f"{group}.{first}") == []


async def test_shell_stops_in_phases_under_one_deadline(
    inproc_bus: InProcBus, unique: Names
) -> None:
    intake, results = unique("intake"), unique("results")
    shell = ServiceShell("svc", shutdown_timeout_s=5.0)
    results_consumer = shell.add(
        EventConsumer(inproc_bus, [results], unique("g"), Recorder(), producer_name="t")
    )
    intake_consumer = shell.add(
        EventConsumer(inproc_bus, [intake], unique("g"), Recorder(), producer_name="t")
    )
    await shell.start()
    deadline = shell.deadline()
    await shell.stop(intake_consumer, deadline=deadline)
    intake_task, results_task = shell.tasks[1], shell.tasks[0]
    assert intake_task.done() and not results_task.done()  # results keep flowing meanwhile
    await shell.stop(deadline=deadline)  # the rest
    assert results_task.done()
    assert results_consumer in shell.consumers


async def test_wait_raises_a_consumer_crash(inproc_bus: InProcBus, unique: Names) -> None:
    topic = unique("poison")
    await inproc_bus.publish(topic, b"\x08not an envelope", key="k")
    shell = ServiceShell("svc", shutdown_timeout_s=5.0)
    # dlq=False: a poison record stops the consumer with its error instead of dead-lettering.
    shell.add(
        EventConsumer(inproc_bus, [topic], unique("g"), Recorder(), producer_name="t", dlq=False)
    )
    await shell.start()
    with pytest.raises(DecodeError):
        await asyncio.wait_for(shell.wait(), 10)
    await shell.stop()


async def test_a_batch_past_the_deadline_is_abandoned_uncommitted(
    inproc_bus: InProcBus, unique: Names
) -> None:
    topic, group = unique("stuck"), unique("g")
    handler = Recorder(block=True)
    shell = ServiceShell("svc", shutdown_timeout_s=0.2)
    shell.add(EventConsumer(inproc_bus, [topic], group, handler, producer_name="t"))
    await shell.start()
    await EventPublisher(inproc_bus, producer_name="t").publish(topic, submitted("s"), key="s")
    await asyncio.wait_for(handler.entered.wait(), 10)

    loop = asyncio.get_running_loop()
    began = loop.time()
    await shell.stop()
    # Bounded: the timeout, with the commit floor per phase (consumer stop, task wait).
    assert loop.time() - began < 2 * COMMIT_FLOOR_S + 1.0
    assert shell.tasks[0].cancelled()
    await shell.wait()  # an abandoned batch is not a crash of the service
    # Never committed, so never lost: the group's next member gets the record again.
    assert len(await read_uncommitted(inproc_bus, topic, group)) == 1


async def test_consumers_cannot_be_added_after_start_or_with_a_bad_timeout(
    inproc_bus: InProcBus, unique: Names
) -> None:
    with pytest.raises(ConfigError, match="shutdown_timeout_s"):
        ServiceShell("svc", shutdown_timeout_s=0)
    shell = ServiceShell("svc", shutdown_timeout_s=5.0)
    shell.add(EventConsumer(inproc_bus, [unique("t")], unique("g"), Recorder(), producer_name="t"))
    await shell.start()
    try:
        late = EventConsumer(inproc_bus, [unique("t")], unique("g"), Recorder(), producer_name="t")
        with pytest.raises(ConfigError, match="before start"):
            shell.add(late)
    finally:
        await shell.stop()


# --------------------------------------------------------------------------- health


class ShellApp:
    """A minimal app on the shell whose stop waits to be released (to observe the drain)."""

    name = "shell_app"

    def __init__(self, bus: Bus, topic: str, group: str) -> None:
        self.shell = ServiceShell(self.name, shutdown_timeout_s=5.0)
        self.shell.add(EventConsumer(bus, [topic], group, Recorder(), producer_name="t"))
        self.stopping = asyncio.Event()
        self.release = asyncio.Event()

    async def start(self) -> None:
        await self.shell.start()

    async def stop(self) -> None:
        self.stopping.set()
        await self.release.wait()
        await self.shell.stop()

    async def wait(self) -> None:
        await self.shell.wait()


@pytest.fixture
async def health_channel() -> AsyncIterator[Callable[[int], grpc.aio.Channel]]:
    """``open(port)``: a loopback channel to a health server, closed after the test."""
    channels: list[grpc.aio.Channel] = []

    def open_channel(port: int) -> grpc.aio.Channel:
        channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        return channels[-1]

    yield open_channel
    for channel in channels:
        await channel.close()


async def logged_health_port(caplog: pytest.LogCaptureFixture) -> int:
    """The port :func:`serve` logged for its health server (it was given 0: any free port)."""
    pattern = re.compile(r"grpc\.health\.v1 on port (\d+)")
    async with asyncio.timeout(10):
        while True:
            for record in caplog.records:
                match = pattern.search(record.getMessage())
                if match:
                    return int(match.group(1))
            await asyncio.sleep(0.02)


async def test_serve_reports_serving_then_not_serving_while_stopping(
    unique: Names,
    caplog: pytest.LogCaptureFixture,
    health_channel: Callable[[int], grpc.aio.Channel],
) -> None:
    caplog.set_level(logging.INFO, logger="podium.service")
    bus = InProcBus()  # serve() starts and stops the bus itself
    app = ShellApp(bus, unique("t"), unique("g"))
    served = asyncio.create_task(
        serve(app, bus, stop_signals=(signal.SIGUSR1,), health_port=0), name="serve"
    )
    try:
        stub = health_pb2_grpc.HealthStub(health_channel(await logged_health_port(caplog)))
        request = health_pb2.HealthCheckRequest(service=app.name)
        # Watch streams every status change: NOT_SERVING while starting (if it is quick enough
        # to see it), then SERVING once start() returned.
        watch = stub.Watch(request, timeout=20)
        statuses = [(await watch.read()).status]
        while statuses[-1] != SERVING:
            statuses.append((await watch.read()).status)
        assert set(statuses) <= {NOT_SERVING, SERVING}
        whole = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert whole.status == SERVING  # what a probe without a service name asks
        os.kill(os.getpid(), signal.SIGUSR1)
        assert (await watch.read()).status == NOT_SERVING
        # NOT_SERVING came while the app was still stopping, not only as it exited.
        await asyncio.wait_for(app.stopping.wait(), 5)
        assert not served.done()
        assert (await stub.Check(request, timeout=5)).status == NOT_SERVING
        app.release.set()
        await asyncio.wait_for(served, 20)
    finally:
        app.release.set()
        if not served.done():
            served.cancel()
    assert all(t.done() for t in app.shell.tasks)


async def test_health_server_refuses_a_port_another_process_holds() -> None:
    first = HealthServer(0)
    port = await first.start()
    try:
        with pytest.raises(ConfigError, match=rf"PODIUM_HEALTH_PORT={port}: cannot serve"):
            await HealthServer(port).start()
    finally:
        await first.stop()


class _Named:
    """An app without a ``config`` attribute (as reward_svc's own config class would be)."""

    name = "bare"

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def wait(self) -> None: ...


class _Configured(_Named):
    def __init__(self, config: ServiceConfig) -> None:
        self.config = config


def test_health_port_comes_from_the_app_config_else_the_environment() -> None:
    app = _Configured(ServiceConfig(bus_url="embedded", health_port=8081))
    assert health_port_of(app, {"PODIUM_HEALTH_PORT": "9"}) == 8081
    assert health_port_of(_Named(), {"PODIUM_HEALTH_PORT": "8082"}) == 8082
    assert health_port_of(_Named(), {}) == 0  # default: a free port
    with pytest.raises(ConfigError, match=r"PODIUM_HEALTH_PORT='http' is invalid"):
        health_port_of(_Named(), {"PODIUM_HEALTH_PORT": "http"})
