"""One trace per session across the gRPC call, Kafka and every service, as processes.

The four services run as ``python -m <service>`` on the real broker and export their spans
over OTLP/gRPC (the standard ``OTEL_*`` variables only) to a real OTLP receiver served by
this test: a ``TraceService`` from ``opentelemetry-proto``. A session submitted inside the
test's own client span must come back as spans of every service in that span's trace: the
gRPC SERVER span (standard instrumentation: ``rpc.service`` / ``rpc.method``), Kafka producer
and consumer spans, the session, the sub-agent's execution, the reward's and the learner's
consumption. ``OTEL_SERVICE_NAME`` renames the worker, ``OTEL_RESOURCE_ATTRIBUTES`` tags every
process, the logs carry the trace id, and each process's own ``/metrics`` port shows its part.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kafka_helpers import bus_env, kafka_url
from metrics_helpers import scrape, value
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from svc_helpers import LOGIN_TASK, PROBE_TASK

from podium.telemetry import client_interceptors, setup_tracing
from podium.v1 import session_service_pb2 as ss
from podium.v1 import session_service_pb2_grpc
from podium_app.processes import SERVICES_ROOT, ServiceProcesses

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

WORKER_NAME = "podium-worker-renamed"
"""``OTEL_SERVICE_NAME`` of the sub-agent worker: its spans must carry it, not the code's."""
DEPLOYMENT = "trace-test"
"""``deployment.environment`` set through ``OTEL_RESOURCE_ATTRIBUTES`` on every process."""


@dataclass(frozen=True)
class Received:
    """One span as the receiver got it over OTLP."""

    service: str
    resource: dict[str, str]
    name: str
    trace_id: str
    kind: int
    attributes: dict[str, str]


@dataclass
class Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP/gRPC trace receiver keeping every span it is sent."""

    spans: list[Received] = field(default_factory=list)

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for rs in request.resource_spans:
            resource = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
            for scope in rs.scope_spans:
                for span in scope.spans:
                    attributes = {
                        kv.key: kv.value.string_value or str(kv.value.int_value)
                        for kv in span.attributes
                    }
                    self.spans.append(
                        Received(
                            service=resource.get("service.name", ""),
                            resource=resource,
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            kind=span.kind,
                            attributes=attributes,
                        )
                    )
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list[Received]:
        return [s for s in self.spans if s.trace_id == trace_id]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _services(run: str, grpc_port: int) -> dict[str, tuple[str, dict[str, str]]]:
    """name -> (module, its own settings); every one also gets a metrics port."""
    return {
        "orchestrator": (
            "orchestrator_svc",
            {
                "PODIUM_GROUP_ID": f"{run}-orch",
                "PODIUM_GRPC_HOST": "127.0.0.1",
                "PODIUM_GRPC_PORT": str(grpc_port),
            },
        ),
        "worker": (
            "subagent_svc",
            {
                "PODIUM_GROUP_ID": f"{run}-sub",
                "PODIUM_INSTANCE": "w1",
                "OTEL_SERVICE_NAME": WORKER_NAME,
                "PODIUM_LOG_LEVEL": "DEBUG",  # each execution is logged inside its span
            },
        ),
        "reward": (
            "reward_svc",
            {
                "PODIUM_REWARD_GROUP": f"{run}-reward",
                "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX": f"{run}-reward",
            },
        ),
        "learner": ("learner_svc", {"PODIUM_GROUP_ID": f"{run}-learner"}),
    }


async def _session(stub: session_service_pb2_grpc.SessionServiceStub, text: str, s: float) -> str:
    """Submit ``text`` and stream the session to its end; its id (fails unless succeeded)."""
    sid: str = (
        await stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=text, seed=5), timeout=10)
    ).session_id
    last = None
    async for event in stub.StreamSession(ss.StreamSessionRequest(session_id=sid), timeout=s):
        last = event
    assert last is not None and last.result.state == ss.SESSION_STATE_SUCCEEDED
    return sid


async def _until(check: Callable[[], bool], timeout_s: float, procs: ServiceProcesses) -> bool:
    for _ in range(int(timeout_s / 0.2)):
        if check():
            return True
        procs.check()
        await asyncio.sleep(0.2)
    return check()


async def test_one_trace_spans_grpc_kafka_and_every_service(
    kafka_bootstrap: str, unique: Callable[[str], str], tmp_path: Path
) -> None:
    receiver = Receiver()
    otlp = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, otlp)
    otlp_port = otlp.add_insecure_port("127.0.0.1:0")
    await otlp.start()

    run = unique("trace").replace(".", "-")
    grpc_port = free_port()
    url = kafka_url(
        kafka_bootstrap,
        auto_offset_reset="latest",
        heartbeat_interval_ms=250,
        session_timeout_ms=6000,
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PODIUM_", "OTEL_"))}
    base.update(
        PYTHONPATH=str(SERVICES_ROOT),
        **bus_env(url),
        PODIUM_SHUTDOWN_TIMEOUT_S="10",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{otlp_port}",
        OTEL_RESOURCE_ATTRIBUTES=f"deployment.environment={DEPLOYMENT}",
        OTEL_BSP_SCHEDULE_DELAY="200",
    )
    metrics_ports: dict[str, int] = {}
    procs = ServiceProcesses(tmp_path / "logs", stop_timeout_s=30)
    client_spans = InMemorySpanExporter()
    ide = setup_tracing("ide-test", client_spans)
    try:
        for name, (module, extra) in _services(run, grpc_port).items():
            metrics_ports[name] = free_port()
            env = {**base, **extra, "PODIUM_METRICS_PORT": str(metrics_ports[name])}
            await procs.start(name, sys.executable, module, env)
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{grpc_port}", interceptors=client_interceptors(ide)
        ) as channel:
            # Five processes importing torch on two loaded cores may take minutes to serve.
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="podium.v1.SessionService"),
                    timeout=180,
                    wait_for_ready=True,
                )
            except grpc.aio.AioRpcError as exc:
                procs.check()  # a service that died says so with its log
                raise AssertionError(
                    f"the orchestrator never served: {exc.code()}\n"
                    + procs.log_tail("orchestrator")
                ) from exc
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = session_service_pb2_grpc.SessionServiceStub(channel)
            for _ in range(30):  # until every group has fixed its (latest) position
                try:
                    await _session(stub, PROBE_TASK, 3)
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            else:
                pytest.fail("no probe session completed across the processes")
            with ide.get_tracer("ide").start_as_current_span(
                "submit", kind=SpanKind.CLIENT
            ) as root:
                sid = await _session(stub, LOGIN_TASK, 60)
        trace_id = format(root.get_span_context().trace_id, "032x")
        services = {"orchestrator_svc", WORKER_NAME, "reward_svc", "learner_svc"}

        rpcs = {f"/podium.v1.SessionService/{m}" for m in ("SubmitTask", "StreamSession")}

        def every_service_reported() -> bool:
            # Spans arrive as they end, in no fixed order: the StreamSession SERVER span ends
            # after the client has read the last event, and a service's CONSUMER span ends
            # after the PRODUCER span it wraps (reward_svc's after its transaction commits).
            # So wait for every span _check_spans needs, not for one span per service.
            spans = receiver.of_trace(trace_id)
            served = {s.name for s in spans if s.service == "orchestrator_svc" and s.kind == 2}
            kinds: dict[str, set[int]] = {}
            for span in spans:
                kinds.setdefault(span.service, set()).add(span.kind)
            return (
                services <= set(kinds)
                and rpcs <= served
                and all(5 in kinds[s] for s in services - {"orchestrator_svc"})
                and all(4 in kinds[s] for s in services - {"learner_svc"})
            )

        assert await _until(every_service_reported, 60, procs), (
            f"spans in trace {trace_id}: "
            f"{sorted({(s.service, s.name) for s in receiver.of_trace(trace_id)})}"
        )
        spans = receiver.of_trace(trace_id)
        _check_spans(spans, sid)
        _check_logs(procs, sid, trace_id)
        _check_metrics(metrics_ports)
    finally:
        codes = await procs.stop()
        await otlp.stop(None)
    assert set(codes.values()) == {0}, codes


def _check_spans(spans: list[Received], sid: str) -> None:
    """gRPC (standard attributes), Kafka producer/consumer spans, and each service's work."""
    by_service: dict[str, list[Received]] = {}
    for span in spans:
        by_service.setdefault(span.service, []).append(span)
        assert span.resource.get("deployment.environment") == DEPLOYMENT
    server = {s.name: s for s in by_service["orchestrator_svc"] if s.kind == 2}  # SERVER
    assert set(server) == {
        "/podium.v1.SessionService/SubmitTask",
        "/podium.v1.SessionService/StreamSession",
    }
    for method in ("SubmitTask", "StreamSession"):
        attributes = server[f"/podium.v1.SessionService/{method}"].attributes
        assert attributes["rpc.system"] == "grpc"
        assert attributes["rpc.service"] == "podium.v1.SessionService"
        assert attributes["rpc.method"] == method
    assert any(
        s.name == "session" and s.attributes.get("podium.session_id") == sid
        for s in by_service["orchestrator_svc"]
    )
    assert any(s.name.startswith("execute ") for s in by_service[WORKER_NAME])
    assert "subagent_svc" not in by_service  # OTEL_SERVICE_NAME won over the code's name
    for service, mine in by_service.items():
        kinds = {s.kind for s in mine}
        # 4 = PRODUCER, 5 = CONSUMER: every service took the trace from Kafka; all but the
        # learner (the end of the line) passed it on through Kafka.
        assert 5 in kinds or service == "orchestrator_svc", service
        assert 4 in kinds or service == "learner_svc", service
        kafka = [s for s in mine if s.kind in (4, 5)]
        assert all(s.attributes["messaging.system"] == "kafka" for s in kafka)


def _check_logs(procs: ServiceProcesses, sid: str, trace_id: str) -> None:
    """A log line of the session's work, emitted inside its spans, names the trace."""
    for name in ("worker", "learner"):
        text = (procs.log_dir / f"{name}.log").read_text(errors="replace")
        lines = [line for line in text.splitlines() if sid in line]
        assert lines, f"{name} logged nothing about {sid}"
        assert all(f"trace_id={trace_id}" in line for line in lines), lines


def _check_metrics(ports: dict[str, int]) -> None:
    """Each process's own /metrics shows its part of the session."""
    orch, worker = scrape(ports["orchestrator"]), scrape(ports["worker"])
    reward, learner = scrape(ports["reward"]), scrape(ports["learner"])
    assert value(orch, "podium_sessions_total", outcome="succeeded") >= 2  # probe + session
    assert value(orch, "podium_decisions_total") > 0
    assert value(worker, "podium_subagent_executions_total", service="subagent_svc") >= 7
    assert value(reward, "podium_reward_component_count", service="reward_svc") > 0
    assert "podium_consumer_lag" in learner
    assert value(orch, "target_info", service_name="orchestrator_svc") == 1
    assert value(worker, "target_info", service_name=WORKER_NAME) == 1
