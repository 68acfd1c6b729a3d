"""Helpers of the service tests: the services running embedded on one bus, gRPC on loopback.

(A module with a unique name rather than conftest.py, so test modules can import it.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc.aio
from opentelemetry.sdk.trace import TracerProvider

from learner_svc import LearnerApp, LearnerConfig
from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from podium.bus import Bus
from podium.telemetry import client_interceptors
from podium.v1 import session_service_pb2_grpc
from subagent_svc import SubagentApp, SubagentConfig

SUBMIT_DEADLINE_S = 30.0
"""A test client's deadline for SubmitTask: the spec is parsed in a parser process that the
first call of a fresh server spawns, which takes seconds on a machine busy with the rest of CI
(a 5 s deadline expired there before the server could answer). Never what a test measures."""

LOGIN_TASK = """
name: login-system
max_parallel: 3
subtasks:
  - {id: form,    kind: ui,       work: 3.0}
  - {id: hash,    kind: security, work: 5.0, splittable: true}
  - {id: creds,   kind: db,       work: 4.0, deps: [hash]}
  - {id: session, kind: state,    work: 3.5}
  - {id: api,     kind: api,      work: 4.5, deps: [form, creds, session]}
  - {id: tests,   kind: test,     work: 6.0, deps: [api], splittable: true}
"""
"""A small task with dependencies, a split and a generalist-only kind."""


@dataclass
class Stack:
    """Orchestrator + sub-agent workers (+ optional learner) on one bus."""

    bus: Bus
    orchestrator: OrchestratorApp
    subagents: list[SubagentApp]
    learner: LearnerApp | None
    channel: grpc.aio.Channel
    stub: session_service_pb2_grpc.SessionServiceStub
    extra: dict[str, Any] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def run_stack(
    bus: Bus,
    *,
    group: str = "t",
    workers: int = 1,
    learner: bool = False,
    time_scale: float = 0.0,
    session_timeout_s: float = 30.0,
    providers: dict[str, TracerProvider] | None = None,
    pool_spec: str = "",
) -> AsyncIterator[Stack]:
    """Start the services on ``bus`` (already started), yield, stop them all; ``pool_spec``:
    the pool file the orchestrator and the workers share (default: the packaged pool)."""
    providers = providers or {}
    orch = OrchestratorApp(
        OrchestratorConfig(
            bus_url="embedded",
            group_id=f"{group}.orchestrator",
            grpc_host="127.0.0.1",
            grpc_port=0,
            # Off by default (PODIUM_GRPC_REFLECTION); on here, so clients can list and
            # describe the service as grpcurl would (test_generated_client.py).
            grpc_reflection=True,
            session_timeout_s=session_timeout_s,
            shutdown_timeout_s=10.0,
            pool_spec=pool_spec,
        ),
        bus,
        tracer_provider=providers.get("orchestrator"),
    )
    subs = [
        SubagentApp(
            SubagentConfig(
                bus_url="embedded",
                group_id=f"{group}.subagent",
                instance=f"worker-{i}",
                time_scale=time_scale,
                shutdown_timeout_s=10.0,
                pool_spec=pool_spec,
            ),
            bus,
            tracer_provider=providers.get("subagent"),
        )
        for i in range(workers)
    ]
    lrn = (
        LearnerApp(LearnerConfig(bus_url="embedded", group_id=f"{group}.learner"), bus)
        if learner
        else None
    )
    started: list[Any] = []
    try:
        for app in [*subs, *([lrn] if lrn else []), orch]:
            await app.start()
            started.append(app)
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{orch.grpc_port}", interceptors=client_interceptors()
        ) as channel:
            yield Stack(
                bus, orch, subs, lrn, channel, session_service_pb2_grpc.SessionServiceStub(channel)
            )
    finally:
        for app in reversed(started):
            await app.stop()


PROBE_TASK = "name: probe\nsubtasks:\n  - {id: a, kind: test, work: 0.1}\n"
"""A one-subtask task used to check the whole path is live."""


async def warm_up(stack: Stack, *, attempts: int = 30) -> None:
    """Run probe sessions until one completes.

    Groups that start at the *latest* offset (Kafka tests sharing a broker skip other runs'
    history that way) only fix their position on their first fetch; a probe that completes
    proves every consumer on the path has done so.
    """
    from podium.v1 import session_service_pb2 as ss

    for _ in range(attempts):
        sid = (
            await stack.stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=PROBE_TASK), timeout=10)
        ).session_id
        handle = stack.orchestrator.session(sid)
        assert handle is not None
        for _ in range(20):
            if handle.finished:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("no probe session completed: the services are not connected")
