"""The bus layer's spans and trace context: a span per event only in a sampled trace (or to
start one), the caller's context carried as it is in an unsampled one, and the carrier caches
exact (same answer as the propagator, baggage and another propagator honoured).

Issue 17: the producer and consumer spans of unsampled traces were most of the bus layer's
cost per event (``podium bench bus``); these tests hold what tracing must still give.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiokafka.structs import ConsumerRecord
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import DefaultGetter, DefaultSetter, TextMapPropagator
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

import podium.bus.consumer as bus_consumer
from podium import telemetry
from podium.bus import EventConsumer, EventPublisher, InProcBus, Record
from podium.bus.kafka import _record
from podium.v1 import envelope_pb2, task_pb2

_GETTER, _SETTER = DefaultGetter(), DefaultSetter()
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The bus's tracer replaced by one of an SDK provider (default sampler: parent-based,
    always on) whose finished spans are kept here."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(bus_consumer, "_tracer", provider.get_tracer("podium.bus"))
    yield exporter
    provider.shutdown()


def caller(sampled: bool) -> NonRecordingSpan:
    """The span a service publishes in (a session, a consumed event's span)."""
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=flags))


async def _round_trip(sampled: bool) -> tuple[str, list[SpanContext]]:
    """Publish one event inside :func:`caller` and consume it: the envelope's traceparent and
    the span context current in the handler."""
    bus = InProcBus()
    await bus.start()
    seen: list[SpanContext] = []

    async def handler(env: envelope_pb2.Envelope, record: Record) -> None:
        seen.append(trace.get_current_span().get_span_context())

    try:
        with trace.use_span(caller(sampled)):
            sent = await EventPublisher(bus, producer_name="t").publish(
                "trace.t", task_pb2.TaskSubmitted(session_id="s"), key="s"
            )
        consumer = EventConsumer(bus, ["trace.t"], "g", handler, producer_name="t")
        await consumer.start()
        try:
            while not seen:
                await consumer.run_once()
        finally:
            await consumer.stop()
    finally:
        await bus.stop()
    return sent.envelope.trace_context["traceparent"], seen


async def test_an_unsampled_trace_gets_no_bus_span_and_keeps_the_callers_context(
    spans: InMemorySpanExporter,
) -> None:
    traceparent, seen = await _round_trip(sampled=False)
    # The event carries the caller's own span context (no per-event span in between)...
    assert traceparent == f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-00"
    # ...and the handler runs in it: the session is still one trace, unsampled.
    assert [(s.trace_id, s.span_id, s.trace_flags.sampled) for s in seen] == [
        (TRACE_ID, SPAN_ID, False)
    ]
    assert spans.get_finished_spans() == ()


async def test_a_sampled_trace_gets_a_producer_and_a_consumer_span_per_event(
    spans: InMemorySpanExporter,
) -> None:
    traceparent, seen = await _round_trip(sampled=True)
    by_kind: dict[SpanKind, ReadableSpan] = {s.kind: s for s in spans.get_finished_spans()}
    assert set(by_kind) == {SpanKind.PRODUCER, SpanKind.CONSUMER}
    producer, consumer = by_kind[SpanKind.PRODUCER], by_kind[SpanKind.CONSUMER]
    assert producer.name == "trace.t publish" and consumer.name == "trace.t process"
    assert producer.parent is not None and producer.parent.span_id == SPAN_ID
    assert traceparent == f"00-{TRACE_ID:032x}-{producer.context.span_id:016x}-01"
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id
    assert consumer.context.trace_id == TRACE_ID
    assert consumer.attributes is not None and consumer.attributes["messaging.system"] == "kafka"
    assert [s.span_id for s in seen] == [consumer.context.span_id]  # the handler's span


async def test_publishing_outside_any_trace_starts_one(spans: InMemorySpanExporter) -> None:
    bus = InProcBus()
    await bus.start()
    try:
        sent = await EventPublisher(bus, producer_name="t").publish(
            "trace.root", task_pb2.TaskSubmitted(session_id="s"), key="s"
        )
    finally:
        await bus.stop()
    (producer,) = spans.get_finished_spans()
    assert producer.kind == SpanKind.PRODUCER and producer.parent is None
    assert sent.envelope.trace_context["traceparent"] == (
        f"00-{producer.context.trace_id:032x}-{producer.context.span_id:016x}-"
        f"{int(producer.context.trace_flags):02x}"
    )


def test_the_carrier_cache_answers_as_the_propagator_does() -> None:
    outer = trace.set_span_in_context(caller(sampled=True))
    with_baggage = baggage.set_baggage("tenant", "acme", outer)
    for ctx in (outer, with_baggage, outer):  # the second ``outer`` is answered by the cache
        expected: dict[str, str] = {}
        propagate.inject(expected, context=ctx)
        assert telemetry.inject_trace_context(ctx) == expected
        assert dict(telemetry.kafka_headers(ctx)) == {k: v.encode() for k, v in expected.items()}
    assert telemetry.inject_trace_context(with_baggage)["baggage"] == "tenant=acme"
    # Each answer is the caller's own: changing it does not change the cache.
    telemetry.inject_trace_context(outer)["traceparent"] = "spoiled"
    assert telemetry.inject_trace_context(outer)["traceparent"].endswith("-01")
    assert telemetry.inject_trace_context(otel_context.Context()) == {}


def test_extraction_is_cached_only_for_the_default_propagator() -> None:
    value = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
    first = telemetry.extract_trace_context({"traceparent": value})
    again = telemetry.context_from_traceparent(value)
    for ctx in (first, again):
        parent = trace.get_current_span(ctx).get_span_context()
        assert (parent.trace_id, parent.span_id, parent.is_remote) == (TRACE_ID, SPAN_ID, True)
    with_state = telemetry.extract_trace_context({"traceparent": value, "tracestate": "k=v"})
    assert trace.get_current_span(with_state).get_span_context().trace_state.get("k") == "v"

    class Fixed(TextMapPropagator):
        """Another propagator: whatever the carrier, the same foreign span."""

        def extract(self, carrier, context=None, getter=_GETTER):  # type: ignore[no-untyped-def]
            foreign = SpanContext(1, 2, is_remote=True, trace_flags=TraceFlags(1))
            return trace.set_span_in_context(NonRecordingSpan(foreign), context)

        def inject(self, carrier, context=None, setter=_SETTER):  # type: ignore[no-untyped-def]
            setter.set(carrier, "x-fixed", "1")

        @property
        def fields(self) -> set[str]:
            return {"x-fixed"}

    default = propagate.get_global_textmap()
    propagate.set_global_textmap(Fixed())
    try:
        ctx = telemetry.context_from_traceparent(value)
        assert trace.get_current_span(ctx).get_span_context().trace_id == 1
        assert telemetry.inject_trace_context(trace.set_span_in_context(caller(True))) == {
            "x-fixed": "1"
        }
    finally:
        propagate.set_global_textmap(default)


def test_a_consumed_header_without_value_becomes_empty_bytes() -> None:
    def consumed(headers: tuple[tuple[str, bytes | None], ...]) -> Record:
        return _record(
            ConsumerRecord("t", 0, 7, 1, 0, b"k", b"v", None, 1, 1, headers)  # type: ignore[arg-type]
        )

    kept = (("traceparent", b"00-x"), ("podium.event_id", b"e"))
    assert consumed(kept).headers == kept
    assert consumed((("a", None), ("b", b"1"))).headers == (("a", b""), ("b", b"1"))
    assert consumed(()).headers == ()
