"""One learning cycle through a running local deployment, as a client sees it: no operator.

1. **Cold start**: done by the deployment itself, the ``bootstrap`` Job (k8s/base/bootstrap.yaml,
   :mod:`podium_app.bootstrap`), run to completion by :func:`podium_app.deploy.run.deploy_local`:
   a behaviour clone published with the learner's settings and key and made live through
   RolloutService. :func:`live_version` reads which version it made live, :func:`wait_served`
   waits until the V2 server serves it (the orchestrator loaded it through the repository API).
2. **Sessions** (:func:`run_sessions`): submitted through SessionService over TLS with an
   ordinary client's token (``user``, not ``trainer``), each streamed to its result; the
   orchestrators' exploration share (``PODIUM_EXPLORE_SHARE``) samples some of them, and the
   learner trains on those. Rounds go on until
3. **a new version** (:func:`wait_published`): a ``PolicyUpdated`` above the live one on the
   policy topic, signed by the deployment's key, and (:func:`wait_served`) the V2 server
   reporting that version of the model ready.
4. **A traced session** (:func:`traced_session`, when the deployment runs a trace backend):
   one more session submitted inside a client span of this tool's own (exported to the local
   Jaeger too), then its trace read back from Jaeger's query API (:func:`wait_trace`) until
   every service on a session's path has reported into it.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio
from opentelemetry.trace import SpanKind

from podium import topics
from podium.bus import KafkaBus, KafkaConfig
from podium.codec import decode_event
from podium.errors import PodiumError
from podium.policy.signing import TrustedKeys
from podium.policy.swarm import MODEL_NAME
from podium.service.auth import client_channel
from podium.telemetry import client_interceptors, setup_tracing
from podium.v1 import (
    reward_pb2,
    rollout_pb2,
    rollout_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
)
from podium_app.deploy.plan import Plan

SESSION_TASK = Path(__file__).resolve().parents[2] / "podium" / "data" / "tasks" / "layered-5.yaml"
"""The task every cycle session runs (a shipped one, small)."""
CLIENT = "user"
"""The principal the cycle's sessions are submitted as: an ordinary client (plugin role), not
``trainer``; only the exploration share samples its sessions."""
TRACED_PRINCIPAL = "trainer"
"""The traced session's principal: sampled for training, so it reaches the learner for sure."""
TRACING_CLIENT = "podium-deploy"
"""The ``service.name`` of this tool's own client span (the root of the traced session)."""
SESSION_WORKLOADS = ("orchestrator", "subagent", "reward", "learner")
"""The workloads whose spans a session's trace holds: gRPC into the orchestrator, then Kafka
through the sub-agents, the reward and the learner's training loop (a consumer span per
scored trajectory). Not the rollout service: it is not on a session's path."""
SETTLE_S = 6.0
"""How long to wait, once every service has reported, for what the services' batch span
processors still hold (they export every 5 s: ``OTEL_BSP_SCHEDULE_DELAY``'s default)."""


@dataclass(frozen=True)
class SpanView:
    """One span as Jaeger's query API returns it."""

    service: str
    name: str
    kind: str
    """``server``, ``client``, ``producer``, ``consumer``, ``internal`` (Jaeger's ``span.kind``)."""
    tags: Mapping[str, str]
    """Its attributes, values as text."""


@dataclass(frozen=True)
class TraceView:
    """One trace as Jaeger's query API returns it."""

    trace_id: str
    spans: tuple[SpanView, ...]

    @property
    def services(self) -> set[str]:
        return {s.service for s in self.spans}


@dataclass(frozen=True)
class CycleResult:
    bootstrap_version: int
    """The learned version live after the cold-start Job."""
    sessions: int
    """Sessions submitted (in rounds, until the learner published)."""
    published: int
    """The version the learner announced after the sessions."""
    seconds: Mapping[str, float]
    """Time of each step."""
    trace: TraceView | None = None
    """The traced session's trace as the local Jaeger holds it (None: no trace backend)."""


def _channel(
    plan: Plan, address: str, principal: str, interceptors: Sequence[Any] = ()
) -> grpc.aio.Channel:
    token = plan.operator.tokens[principal].read_text().strip()
    return client_channel(
        address, token=token, ca_file=plan.operator.grpc_ca, interceptors=interceptors
    )


async def live_version(plan: Plan, address: str, timeout_s: float) -> str:
    """The version the rollout serves now (RolloutService, with the operator's token)."""
    async with _channel(plan, address, "operator") as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status = await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=10)
                return str(status.state.live_version)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


async def run_sessions(
    plan: Plan,
    address: str,
    count: int,
    timeout_s: float,
    principal: str = CLIENT,
    interceptors: Sequence[Any] = (),
) -> list[str]:
    """``count`` sessions submitted as ``principal``, each streamed to its result; their
    outcomes."""
    task = await asyncio.to_thread(SESSION_TASK.read_text)
    async with _channel(plan, address, principal, interceptors) as channel:
        stub = session_service_pb2_grpc.SessionServiceStub(channel)  # type: ignore[no-untyped-call]

        async def one(i: int) -> str:
            request = session_service_pb2.SubmitTaskRequest(
                task_spec_text=task, client_request_id=f"deploy-{uuid.uuid4()}", seed=1000 + i
            )
            submitted = await stub.SubmitTask(request, timeout=30)
            stream = stub.StreamSession(
                session_service_pb2.StreamSessionRequest(session_id=submitted.session_id),
                timeout=timeout_s,
            )
            result = None
            # Read to the stream's end (the result is its last event), not just to the result:
            # the call's CLIENT span ends with the iteration, here, rather than whenever the
            # abandoned iterator is collected, which may be after the tracer provider is shut
            # down (the span is then dropped: "Processor is already shutdown").
            async for event in stream:
                if event.HasField("result"):
                    result = str(event.result)
            if result is None:
                raise PodiumError(f"session {submitted.session_id} ended without a result")
            return result

        return await asyncio.gather(*(one(i) for i in range(count)))


async def wait_published(
    admin: KafkaConfig, above: int, trusted: TrustedKeys, timeout_s: float
) -> int:
    """The first version above ``above`` announced on the policy topic and signed by a key of
    ``trusted`` (another deployment sharing the broker is ignored)."""
    bus = KafkaBus(admin)
    await bus.start()
    group = f"podium-deploy.{uuid.uuid4().hex[:8]}"
    sub = bus.subscriber([topics.POLICY_UPDATES], group)
    await sub.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for record in await sub.fetch(timeout_s=1.0):
                _, event = decode_event(record.value, reward_pb2.PolicyUpdated)
                if event.model_name == MODEL_NAME and event.version > above:
                    trusted.verify(event)
                    return int(event.version)
    finally:
        await sub.stop()
        await bus.stop()
    raise PodiumError(f"no version above {above} was announced within {timeout_s:.0f}s")


async def wait_served(grpc_address: str, version: int, timeout_s: float) -> None:
    """Until the V2 server reports the model ready and ``version`` among the versions it
    serves (its metadata)."""
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(grpc_address)
    deadline = time.monotonic() + timeout_s
    last = ""
    try:
        while time.monotonic() < deadline:
            try:
                # MLServer knows a model by name (its metadata lists the version it serves);
                # Triton answers both ways: the name's readiness plus the metadata fits both.
                if await client.is_model_ready(MODEL_NAME):
                    versions = list((await client.get_model_metadata(MODEL_NAME)).versions)
                    if str(version) in versions:
                        return
                    last = f"serving versions {versions}"
                else:
                    last = "not ready"
            except InferenceServerException as exc:
                last = str(exc)  # not loaded yet: the server says it does not know it
            await asyncio.sleep(0.5)
    finally:
        await client.close()
    raise PodiumError(f"the V2 server never reported {MODEL_NAME} v{version} ready: {last}")


def session_services(plan: Plan) -> set[str]:
    """The ``service.name`` of each workload of :data:`SESSION_WORKLOADS` in the plan: its
    ``OTEL_SERVICE_NAME``, else the workload's name."""
    return {
        c.env.get("OTEL_SERVICE_NAME") or c.container.workload
        for c in plan.containers
        if c.container.workload in SESSION_WORKLOADS
    }


async def traced_session(plan: Plan, address: str, timeout_s: float) -> TraceView:
    """One session as :data:`TRACED_PRINCIPAL` inside a client span of
    :data:`TRACING_CLIENT` (exported to the local Jaeger; the standard gRPC client
    instrumentation sends its ``traceparent``); its trace as Jaeger holds it."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter(endpoint=f"http://{plan.trace_otlp}", insecure=True)
    provider = setup_tracing(TRACING_CLIENT, exporter)
    try:
        with provider.get_tracer(TRACING_CLIENT).start_as_current_span(
            "traced session", kind=SpanKind.CLIENT
        ) as root:
            await run_sessions(
                plan,
                address,
                1,
                timeout_s,
                TRACED_PRINCIPAL,
                client_interceptors(provider),
            )
    finally:
        provider.shutdown()
    trace_id = format(root.get_span_context().trace_id, "032x")
    return await wait_trace(plan.trace_query, trace_id, session_services(plan), timeout_s)


async def wait_trace(
    query: str, trace_id: str, services: set[str], timeout_s: float, settle_s: float = SETTLE_S
) -> TraceView:
    """The trace from Jaeger's query API at ``query`` once every one of ``services`` has
    reported into it (then ``settle_s`` more for the spans still batched); raises naming the
    services seen when they have not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = await asyncio.to_thread(fetch_trace, query, trace_id)
        if view is not None and services <= view.services:
            await asyncio.sleep(settle_s)
            return await asyncio.to_thread(fetch_trace, query, trace_id) or view
        if time.monotonic() > deadline:
            seen = sorted(view.services) if view else []
            raise PodiumError(
                f"trace {trace_id} in Jaeger ({query}): spans from {seen}, never from every "
                f"one of {sorted(services)} within {timeout_s:.0f}s"
            )
        await asyncio.sleep(1.0)


def fetch_trace(query: str, trace_id: str) -> TraceView | None:
    """``GET /api/traces/<id>`` of Jaeger's query API; None while Jaeger has no such trace."""
    try:
        with urllib.request.urlopen(f"http://{query}/api/traces/{trace_id}", timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise PodiumError(f"Jaeger query API at {query}: {exc}") from exc
    return parse_trace(trace_id, body)


def parse_trace(trace_id: str, body: Mapping[str, Any]) -> TraceView | None:
    """A Jaeger query API answer (``{"data": [{"spans": [...], "processes": {...}}]}``) as a
    :class:`TraceView`; None when it holds no trace."""
    data = body.get("data") or []
    if not data:
        return None
    found = data[0]
    names = {k: str(v.get("serviceName", "")) for k, v in found.get("processes", {}).items()}
    spans = []
    for span in found.get("spans", []):
        tags = {str(t["key"]): str(t.get("value", "")) for t in span.get("tags", [])}
        spans.append(
            SpanView(
                names.get(span.get("processID", ""), ""),
                str(span.get("operationName", "")),
                tags.get("span.kind", "internal"),
                tags,
            )
        )
    return TraceView(trace_id, tuple(spans))


__all__ = [
    "CLIENT",
    "SESSION_WORKLOADS",
    "TRACED_PRINCIPAL",
    "TRACING_CLIENT",
    "CycleResult",
    "SpanView",
    "TraceView",
    "fetch_trace",
    "live_version",
    "parse_trace",
    "run_sessions",
    "session_services",
    "traced_session",
    "wait_published",
    "wait_served",
    "wait_trace",
]
