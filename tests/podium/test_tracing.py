"""One trace id survives gRPC -> bus headers -> consumer, on the in-process bus and on Kafka."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from svc_helpers import LOGIN_TASK, warm_up

from podium.bus import Bus, InProcBus, KafkaBus
from podium.telemetry import (
    context_from_headers,
    extract_trace_context,
    inject_trace_context,
    kafka_headers,
    setup_tracing,
)
from podium.v1 import session_service_pb2 as ss


async def _check_one_trace(
    bus: Bus, stack_factory: Callable[..., Any], group: str, *, probe: bool
) -> None:
    exporter = InMemorySpanExporter()
    providers = {
        "orchestrator": setup_tracing("orchestrator_svc", exporter),
        "subagent": setup_tracing("subagent_svc", exporter),
    }
    ide = setup_tracing("ide-plugin", exporter).get_tracer("ide")
    async with stack_factory(bus, group=group, providers=providers) as stack:
        if probe:
            await warm_up(stack)
        exporter.clear()
        with ide.start_as_current_span("submit from IDE", kind=SpanKind.CLIENT) as root:
            reply = await stack.stub.SubmitTask(
                ss.SubmitTaskRequest(task_spec_text=LOGIN_TASK, seed=3), timeout=10
            )
        # Streamed outside the client span: the session's trace does not depend on it.
        events = [
            e
            async for e in stack.stub.StreamSession(
                ss.StreamSessionRequest(session_id=reply.session_id), timeout=60
            )
        ]
        assert events[-1].result.state == ss.SESSION_STATE_SUCCEEDED
    trace_id = root.get_span_context().trace_id
    spans = exporter.get_finished_spans()

    # The standard instrumentation's SERVER span: named by the full method, with the
    # semantic-convention attributes (service and method apart).
    server = [s for s in spans if s.name == "/podium.v1.SessionService/SubmitTask"]
    assert len(server) == 1
    assert server[0].kind == SpanKind.SERVER
    assert server[0].attributes["rpc.system"] == "grpc"
    assert server[0].attributes["rpc.service"] == "podium.v1.SessionService"
    assert server[0].attributes["rpc.method"] == "SubmitTask"
    assert server[0].context.trace_id == trace_id
    assert server[0].parent is not None
    assert server[0].parent.span_id == root.get_span_context().span_id  # via gRPC metadata
    assert server[0].resource.attributes["service.name"] == "orchestrator_svc"

    session = [
        s
        for s in spans
        if s.name == "session" and s.attributes.get("podium.session_id") == reply.session_id
    ]
    assert len(session) == 1 and session[0].context.trace_id == trace_id  # via TASKS headers

    executed = [
        s
        for s in spans
        if s.name.startswith("execute ")
        and s.attributes.get("podium.session_id") == reply.session_id
    ]
    assert len(executed) == events[-1].result.executions
    for span in executed:  # via SUBTASKS_ASSIGNED headers, in the sub-agent's consumer
        assert span.context.trace_id == trace_id
        assert span.resource.attributes["service.name"] == "subagent_svc"


async def test_one_trace_inproc(inproc_bus: InProcBus, stack_factory: Callable[..., Any]) -> None:
    await _check_one_trace(inproc_bus, stack_factory, "trace", probe=False)


@pytest.mark.kafka
async def test_one_trace_kafka(
    kafka_bootstrap: str,
    kafka_config: Callable[..., Any],
    unique: Callable[[str], str],
    stack_factory: Callable[..., Any],
) -> None:
    # Fresh groups start at the end of the shared topics, so other runs' history is skipped.
    bus = KafkaBus(kafka_config(kafka_bootstrap, auto_offset_reset="latest"))
    await bus.start()
    try:
        await _check_one_trace(bus, stack_factory, unique("trace"), probe=True)
    finally:
        await bus.stop()


def test_carrier_round_trips_through_kafka_headers() -> None:
    exporter = InMemorySpanExporter()
    tracer = setup_tracing("t", exporter).get_tracer("t")
    with tracer.start_as_current_span("producer") as span:
        headers = kafka_headers()
        carrier = inject_trace_context()
    assert dict(headers)["traceparent"].decode() == carrier["traceparent"]
    ctx = context_from_headers([*headers, ("traceparent-junk", b"\xff")])
    parent = trace.get_current_span(ctx).get_span_context()
    assert parent.trace_id == span.get_span_context().trace_id
    assert parent.span_id == span.get_span_context().span_id
    # Undecodable or missing headers lose the link but never fail the record.
    lost = trace.get_current_span(context_from_headers([("traceparent", b"\xff\xfe")]))
    assert not lost.get_span_context().is_valid
    assert not trace.get_current_span(extract_trace_context({})).get_span_context().is_valid
    assert inject_trace_context() == {}  # no active span outside
