"""``grpc.health.v1`` on ``PODIUM_HEALTH_PORT`` of real service processes on a real broker.

Each service runs as ``python -m <svc>`` against Kafka, and a real gRPC health client on
loopback asks what a Kubernetes ``grpc:`` probe asks: SERVING once the service has started,
NOT_SERVING as soon as SIGTERM begins the graceful stop, then exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kafka_helpers import bus_env, kafka_url

ROOT = Path(__file__).resolve().parents[3]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

START_TIMEOUT_S = 90.0
"""Interpreter start, imports and joining the consumer groups, on a busy 2-core host."""
SHUTDOWN_TIMEOUT_S = 10.0
"""PODIUM_SHUTDOWN_TIMEOUT_S of every process."""
EXIT_TIMEOUT_S = SHUTDOWN_TIMEOUT_S + 20.0
"""Allowed for a graceful stop: the shutdown timeout, leaving groups, closing producers."""

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """One ``python -m <module>`` process with its stderr collected as it is written."""

    def __init__(self, module: str, environ: Mapping[str, str]) -> None:
        self.module = module
        self.environ = dict(environ)
        self.health_port = int(environ["PODIUM_HEALTH_PORT"])
        self.log = bytearray()
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            env=self.environ,
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        # Read the log as it is written: a full pipe would block the service's event loop.
        self._reader = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self.log += chunk

    def text(self) -> str:
        return self.log.decode(errors="replace")

    async def terminate(self) -> int:
        """SIGTERM, then the exit status (killed after :data:`EXIT_TIMEOUT_S`)."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), EXIT_TIMEOUT_S)
        finally:
            await self.close()

    async def close(self) -> None:
        """Kill if still running; collect the rest of the log."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


@pytest.fixture
def service_env(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> Callable[..., dict[str, str]]:
    """``service_env(**extra)``: a process environment on the test broker with its own
    health port, its own consumer groups and nothing inherited from the caller's PODIUM_*."""
    url = kafka_url(
        kafka_bootstrap,
        auto_offset_reset="latest",
        heartbeat_interval_ms=250,
        session_timeout_ms=6000,
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")}

    def make(**extra: str) -> dict[str, str]:
        return {
            **base,
            "PYTHONPATH": str(ROOT),
            **bus_env(url),
            "PODIUM_SHUTDOWN_TIMEOUT_S": str(SHUTDOWN_TIMEOUT_S),
            "PODIUM_GROUP_ID": unique("health").replace(".", "-"),
            "PODIUM_HEALTH_PORT": str(free_port()),
            **extra,
        }

    return make


@contextlib.asynccontextmanager
async def health_stub(port: int) -> AsyncIterator[health_pb2_grpc.HealthStub]:
    """A real gRPC health client on loopback."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield health_pb2_grpc.HealthStub(channel)


async def wait_serving(stub: health_pb2_grpc.HealthStub, service: str, proc: Service) -> None:
    """Wait (Watch) until ``service`` reports SERVING; fail with the log if the process dies."""
    watch = stub.Watch(
        health_pb2.HealthCheckRequest(service=service),
        timeout=START_TIMEOUT_S,
        wait_for_ready=True,  # the port opens only once the interpreter has got that far
    )
    try:
        while (await watch.read()).status != SERVING:
            pass
    except grpc.aio.AioRpcError as exc:
        raise AssertionError(f"{proc.module} never SERVING ({exc.code()}):\n{proc.text()}") from exc
    finally:
        watch.cancel()


async def test_subagent_process_serves_health_and_drains_on_sigterm(
    service_env: Callable[..., dict[str, str]],
) -> None:
    worker = Service("subagent_svc", service_env(PODIUM_INSTANCE="health-worker"))
    await worker.start()
    try:
        async with health_stub(worker.health_port) as stub:
            await wait_serving(stub, "subagent_svc", worker)
            whole = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert whole.status == SERVING  # a k8s grpc probe names no service

            watch = stub.Watch(health_pb2.HealthCheckRequest(service="subagent_svc"), timeout=60)
            assert (await watch.read()).status == SERVING
            assert worker.proc is not None
            worker.proc.send_signal(signal.SIGTERM)
            # The drain is announced over the wire before the process goes away.
            assert (await watch.read()).status == NOT_SERVING
        status = await worker.terminate()
    finally:
        await worker.close()
    log = worker.text()
    assert status == 0, log
    assert f"grpc.health.v1 on port {worker.health_port}" in log
    assert "Traceback" not in log


async def test_every_other_service_serves_health_on_its_health_port(
    service_env: Callable[..., dict[str, str]], unique: Callable[[str], str]
) -> None:
    api_port = free_port()
    run = unique("health").replace(".", "-")
    services = {
        "orchestrator_svc": Service(
            "orchestrator_svc",
            service_env(PODIUM_GRPC_HOST="127.0.0.1", PODIUM_GRPC_PORT=str(api_port)),
        ),
        "learner_svc": Service("learner_svc", service_env()),
        # reward_svc has its own config class; PODIUM_HEALTH_PORT means the same for it.
        "reward_svc": Service(
            "reward_svc",
            service_env(
                PODIUM_REWARD_GROUP=f"{run}-reward",
                PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX=f"{run}-reward",
            ),
        ),
    }
    try:
        for service in services.values():
            await service.start()
        for name, service in services.items():
            async with health_stub(service.health_port) as stub:
                await wait_serving(stub, name, service)
                whole = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert whole.status == SERVING, name
        # The orchestrator keeps health on its API port as well.
        async with health_stub(api_port) as stub:
            await wait_serving(stub, "podium.v1.SessionService", services["orchestrator_svc"])
        statuses = await asyncio.gather(*(s.terminate() for s in services.values()))
    finally:
        for service in services.values():
            await service.close()
    for (name, service), status in zip(services.items(), statuses, strict=True):
        assert status == 0, f"{name}:\n{service.text()}"
        assert f"grpc.health.v1 on port {service.health_port}" in service.text(), name
