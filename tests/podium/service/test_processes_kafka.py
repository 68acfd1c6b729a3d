"""The four services as separate processes on a real Kafka broker, driven over real gRPC.

``python -m orchestrator_svc``, two ``python -m subagent_svc`` workers, ``python -m reward_svc``
and ``python -m learner_svc``: health is SERVING, a task submitted over gRPC streams to its
end, the reward service's score comes back to the orchestrator, the learner receives it, and
SIGTERM stops every process with exit status 0 within the configured shutdown timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kafka_helpers import bus_env, kafka_url
from svc_helpers import LOGIN_TASK, PROBE_TASK

from podium.telemetry import client_interceptors
from podium.v1 import session_service_pb2 as ss
from podium.v1 import session_service_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]
SHUTDOWN_TIMEOUT_S = 10.0
"""PODIUM_SHUTDOWN_TIMEOUT_S of every service: how long a graceful stop may wait for work in
hand. The orchestrator may use all of it: a probe session that timed out is still running
there (its subtask was published before the workers' group fixed its latest position, so no
worker ever runs it), and a stop waits that long for running sessions before cancelling them."""
EXIT_MARGIN_S = 20.0
"""Allowed on top of that to leave groups, flush producers and exit, on a busy host."""

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def _drain(proc: asyncio.subprocess.Process, into: bytearray) -> None:
    """Append ``proc``'s stderr to ``into`` until it closes."""
    assert proc.stderr is not None
    while chunk := await proc.stderr.read(65536):
        into += chunk


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_four_services_as_processes(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    run = unique("procs").replace(".", "-")
    port = free_port()
    url = kafka_url(
        kafka_bootstrap,
        auto_offset_reset="latest",
        heartbeat_interval_ms=250,
        session_timeout_ms=6000,
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")}
    base.update(
        PYTHONPATH=str(ROOT), **bus_env(url), PODIUM_SHUTDOWN_TIMEOUT_S=str(SHUTDOWN_TIMEOUT_S)
    )
    specs = {
        "orchestrator": (
            "orchestrator_svc",
            {
                "PODIUM_GROUP_ID": f"{run}-orch",
                "PODIUM_GRPC_HOST": "127.0.0.1",
                "PODIUM_GRPC_PORT": str(port),
            },
        ),
        "worker-1": ("subagent_svc", {"PODIUM_GROUP_ID": f"{run}-sub", "PODIUM_INSTANCE": "w1"}),
        "worker-2": ("subagent_svc", {"PODIUM_GROUP_ID": f"{run}-sub", "PODIUM_INSTANCE": "w2"}),
        "reward": (
            "reward_svc",
            {
                "PODIUM_REWARD_GROUP": f"{run}-reward",
                "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX": f"{run}-reward",
            },
        ),
        "learner": ("learner_svc", {"PODIUM_GROUP_ID": f"{run}-learner"}),
    }
    procs: dict[str, asyncio.subprocess.Process] = {}
    logs: dict[str, bytearray] = {}
    readers: list[asyncio.Task[None]] = []
    try:
        for name, (module, extra) in specs.items():
            procs[name] = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                env={**base, **extra},
                cwd=ROOT,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            # Read each log as it is written: a full pipe would block the service's logging
            # (and so its event loop) until someone reads it.
            logs[name] = bytearray()
            readers.append(asyncio.create_task(_drain(procs[name], logs[name])))
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=client_interceptors()
        ) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(
                health_pb2.HealthCheckRequest(service="podium.v1.SessionService"),
                timeout=60,
                wait_for_ready=True,
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = session_service_pb2_grpc.SessionServiceStub(channel)

            async def run_session(text: str, deadline_s: float) -> tuple[str, ss.SessionResult]:
                sid = (
                    await stub.SubmitTask(
                        ss.SubmitTaskRequest(task_spec_text=text, seed=5), timeout=10
                    )
                ).session_id
                last = None
                async for event in stub.StreamSession(
                    ss.StreamSessionRequest(session_id=sid), timeout=deadline_s
                ):
                    last = event
                assert last is not None and last.HasField("result")
                return sid, last.result

            # Probe until every group has fixed its (latest) position on the shared topics.
            for _ in range(30):
                try:
                    await run_session(PROBE_TASK, deadline_s=3)
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            else:
                pytest.fail("no probe session completed across the processes")

            sid, result = await run_session(LOGIN_TASK, deadline_s=60)
            assert result.state == ss.SESSION_STATE_SUCCEEDED
            assert result.completed_subtasks == 6
            for _ in range(100):  # reward_svc -> ScoredTrajectory -> orchestrator
                got = await stub.GetSession(ss.GetSessionRequest(session_id=sid), timeout=5)
                if got.result.HasField("score"):
                    break
                await asyncio.sleep(0.1)
            assert got.result.score.trajectory.session_id == sid
            assert got.result.score.reward_version
        # Every process exits within the configured shutdown timeout plus the margin.
        sigterm_at = time.strftime("%H:%M:%S")
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        exits = {name: asyncio.create_task(proc.wait()) for name, proc in procs.items()}
        _, late = await asyncio.wait(exits.values(), timeout=SHUTDOWN_TIMEOUT_S + EXIT_MARGIN_S)
        hung = [name for name, exited in exits.items() if exited in late]
        for name in hung:
            procs[name].kill()
        await asyncio.gather(*exits.values(), *readers)
        if hung:
            pytest.fail(
                f"{', '.join(hung)} still running {SHUTDOWN_TIMEOUT_S + EXIT_MARGIN_S:g} s after "
                f"SIGTERM (sent {sigterm_at}); log of {hung[0]}: {logs[hung[0]].decode()[-6000:]}"
            )
        text = {name: log.decode() for name, log in logs.items()}
        for name, proc in procs.items():
            assert proc.returncode == 0, f"{name}: {text[name][-2000:]}"
        assert sid in text["learner"]  # the learner received this session's score
        for name in ("orchestrator", "worker-1", "worker-2", "learner"):
            assert "stop signal received; stopping gracefully" in text[name]
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                with contextlib.suppress(Exception):
                    await proc.wait()
        for reader in readers:
            reader.cancel()
