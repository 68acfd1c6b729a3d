"""OpenTelemetry for Podium: one tracer provider per service, one trace per session.

A session is one trace from the IDE's gRPC call to the last consumer span: the W3C
``traceparent`` travels in gRPC metadata (the standard ``opentelemetry-instrumentation-grpc``
interceptors: :func:`client_interceptors` on the caller, :func:`server_interceptor` on the
server, whose SERVER span carries the semantic-convention ``rpc.system``, ``rpc.service``
and ``rpc.method``), then in Kafka record headers and in the envelope's ``trace_context`` map
(:func:`kafka_headers` / :func:`context_from_record`), so a consumer in another process
continues the trace the gRPC handler started.

Providers are deliberately *not* installed globally by default: in the embedded mode
(``podium demo``, ``podium train``) the four services share one process, and each must still
report under its own ``service.name``. Propagation uses the global propagator (W3C trace
context + baggage, OpenTelemetry's default), which does not depend on any provider.

The standard ``OTEL_*`` variables win over what the code says (:func:`service_resource`,
:func:`span_exporter_from_env`): ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` over the
service's own name, ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``) over the default
(OTLP/gRPC when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is
set, else nothing exported), and the OTLP exporter, sampler and batch processor read their own
variables (``OTEL_EXPORTER_OTLP_*``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``) as the SDK
documents. Tests pass an exporter explicitly (an ``InMemorySpanExporter``).

Log lines carry the trace: :class:`TraceLogFormatter` adds ``trace_id`` and ``span_id`` to
every record emitted inside a span (the standalone services' logging uses it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.instrumentation.grpc import filters as grpc_filters
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from podium.errors import ConfigError

OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
"""Standard OpenTelemetry variable: the OTLP collector of every signal."""
OTLP_TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
"""Standard OpenTelemetry variable: the OTLP collector of traces (wins over the one above)."""
TRACES_EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
"""Standard OpenTelemetry variable: ``otlp``, ``console`` or ``none``."""

TRACES_EXPORTERS = ("otlp", "console", "none")
"""The values of ``OTEL_TRACES_EXPORTER`` understood here (one exporter per process)."""

_ENVELOPE_KEYS = ("traceparent", "tracestate", "baggage")
"""Carrier keys the W3C propagators write; the only headers we copy around."""


def service_resource(service_name: str) -> Resource:
    """The OpenTelemetry resource of a process named ``service_name`` by the code.

    ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` are merged *over* the code's name
    (``Resource.create`` alone merges them under it), so an operator can rename a service
    or tag a deployment without a code change, as the OpenTelemetry specification says.
    """
    return Resource.create({SERVICE_NAME: service_name}).merge(OTELResourceDetector().detect())


def span_exporter_from_env(environ: Mapping[str, str] | None = None) -> SpanExporter | None:
    """The span exporter the standard variables ask for, or None (spans not exported).

    ``OTEL_TRACES_EXPORTER`` decides when set; unset, spans go over OTLP/gRPC when an OTLP
    endpoint variable is set and nowhere otherwise (a service without a collector must not
    retry ``localhost:4317`` forever). The OTLP exporter reads its own ``OTEL_EXPORTER_OTLP_*``
    variables (endpoint, headers, TLS, timeout). Raises :class:`ConfigError` naming the
    variable for a value not in :data:`TRACES_EXPORTERS`.
    """
    env = os.environ if environ is None else environ
    wanted = env.get(TRACES_EXPORTER_ENV, "").strip().lower()
    if not wanted:
        has_endpoint = env.get(OTLP_TRACES_ENDPOINT_ENV) or env.get(OTLP_ENDPOINT_ENV)
        wanted = "otlp" if has_endpoint else "none"
    if wanted == "none":
        return None
    if wanted == "console":
        return ConsoleSpanExporter()
    if wanted == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter: SpanExporter = OTLPSpanExporter()
        return exporter
    raise ConfigError(
        f"{TRACES_EXPORTER_ENV}={env[TRACES_EXPORTER_ENV]!r} is invalid: expected one of "
        f"{', '.join(TRACES_EXPORTERS)}"
    )


def setup_tracing(
    service_name: str,
    exporter: SpanExporter | None = None,
    *,
    set_global: bool = False,
) -> TracerProvider:
    """Create the tracer provider of one service.

    ``exporter`` given: spans are exported synchronously on end (a test can read them at once).
    Otherwise :func:`span_exporter_from_env` chooses, behind a batching processor; none means
    spans are created (so context still propagates) but not exported. The resource is
    :func:`service_resource` (``OTEL_SERVICE_NAME`` wins over ``service_name``).
    ``set_global`` installs it as the process-wide provider (standalone services do; embedded
    ones must not, as only the first global installation wins).
    """
    provider = TracerProvider(resource=service_resource(service_name))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        configured = span_exporter_from_env()
        if configured is not None:
            provider.add_span_processor(BatchSpanProcessor(configured))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


# --- W3C carrier -------------------------------------------------------------------------

_CACHE_LIMIT = 1024
"""Entries of each carrier cache before it is emptied (bounded memory: a cached context holds
its span; a miss only costs the propagator's own work)."""

_carriers: dict[int, tuple[Context, dict[str, str], tuple[tuple[str, bytes], ...]]] = {}
"""``id(context)`` -> the context itself (held, so its id stays its own), its carrier and the
carrier as Kafka headers."""
_carriers_textmap: list[object] = [None]
"""The global propagator the cached carriers were made by (another one empties the cache)."""
_contexts: dict[str, Context] = {}
"""``traceparent`` value -> the context the propagator extracts from it alone."""
_textmap_checked: list[object] = [None, False]
"""[the global propagator last looked at, whether it is W3C trace context + baggage only]."""


def _w3c_only() -> bool:
    """Whether the global propagator is OpenTelemetry's default, W3C trace context (then W3C
    baggage) and nothing else: then the context extracted from a lone ``traceparent`` depends
    on nothing else and may be cached by it. Another propagator (``OTEL_PROPAGATORS=b3``...)
    is always asked itself."""
    textmap = propagate.get_global_textmap()
    if _textmap_checked[0] is not textmap:
        # In this order: trace context first starts the extracted context afresh, so it does
        # not depend on the current one.
        kinds = [type(p) for p in getattr(textmap, "_propagators", [textmap])]
        default = kinds in (
            [TraceContextTextMapPropagator, W3CBaggagePropagator],
            [TraceContextTextMapPropagator],
        )
        _textmap_checked[:] = [textmap, default]
    return bool(_textmap_checked[1])


def _cached_carrier(
    context: Context | None,
) -> tuple[Context, dict[str, str], tuple[tuple[str, bytes], ...]]:
    """The carrier of ``context`` (default: the current one) and its Kafka headers, from the
    cache, filled by the global propagator on a miss.

    Every event a session publishes is published in the same context (contexts are immutable:
    a new span or baggage is a new context), and asking the propagator for its carrier cost
    more than the rest of the envelope; so the propagator's answer is kept per context object,
    and each publish after the first is a dictionary lookup.
    """
    ctx = otel_context.get_current() if context is None else context
    textmap = propagate.get_global_textmap()
    if _carriers_textmap[0] is not textmap:
        _carriers.clear()
        _carriers_textmap[0] = textmap
    found = _carriers.get(id(ctx))
    if found is None or found[0] is not ctx:
        carrier: dict[str, str] = {}
        textmap.inject(carrier, context=ctx)
        found = (ctx, carrier, tuple((k, v.encode("utf-8")) for k, v in carrier.items()))
        if len(_carriers) >= _CACHE_LIMIT:
            _carriers.clear()
        _carriers[id(ctx)] = found
    return found


def inject_trace_context(context: Context | None = None) -> dict[str, str]:
    """The W3C carrier (``traceparent``, ``tracestate``, ``baggage``) of ``context``.

    Defaults to the current context; empty when there is no active span.
    """
    return dict(_cached_carrier(context)[1])


def trace_carrier_and_headers(
    context: Context | None = None,
) -> tuple[Mapping[str, str], tuple[tuple[str, bytes], ...]]:
    """The W3C carrier of ``context`` (default: the current one) and the same as Kafka record
    headers, for a publish: both read-only (shared by every event of the context)."""
    _, carrier, headers = _cached_carrier(context)
    return carrier, headers


def extract_trace_context(carrier: Mapping[str, str]) -> Context:
    """A context whose parent span is the one described by ``carrier`` (may be empty)."""
    traceparent = carrier.get("traceparent")
    if traceparent is not None and len(carrier) == 1:
        return context_from_traceparent(traceparent)
    return propagate.extract(dict(carrier))


def context_from_traceparent(traceparent: str) -> Context:
    """:func:`extract_trace_context` of a carrier holding a ``traceparent`` alone (what
    Podium's producers write without baggage or ``tracestate``).

    With the default propagator the context is extracted once per value and reused: contexts
    are immutable, and the events of one session carry the same value.
    """
    if not _w3c_only():
        return propagate.extract({"traceparent": traceparent})
    found = _contexts.get(traceparent)
    if found is None:
        found = propagate.extract({"traceparent": traceparent})
        if len(_contexts) >= _CACHE_LIMIT:
            _contexts.clear()
        _contexts[traceparent] = found
    return found


# --- Kafka / bus headers -------------------------------------------------------------------


def kafka_headers(context: Context | None = None) -> tuple[tuple[str, bytes], ...]:
    """Trace context as Kafka record headers (UTF-8 values), ready for ``Bus.publish``."""
    return trace_carrier_and_headers(context)[1]


def carrier_from_headers(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    """The W3C carrier found in Kafka record headers (the last value of a key wins).

    Undecodable values are ignored: a bad header must not fail the record, only lose the link.
    """
    carrier: dict[str, str] = {}
    for key, value in headers:
        if key in _ENVELOPE_KEYS and value is not None:
            try:
                carrier[key] = value.decode("utf-8")
            except UnicodeDecodeError:
                continue
    return carrier


def context_from_headers(headers: Iterable[tuple[str, bytes | None]]) -> Context:
    """Context to continue from Kafka record headers."""
    return extract_trace_context(carrier_from_headers(headers))


def context_from_record(
    headers: Iterable[tuple[str, bytes | None]],
    envelope_trace_context: Mapping[str, str] | None = None,
) -> Context:
    """Context to continue for a consumed event.

    Record headers win (they are what Kafka-native tooling sees and can rewrite); the
    envelope's ``trace_context`` is the fallback, because it travels with the payload even
    when a record is copied without its headers (re-scoring, dead-letter replays).
    """
    carrier = carrier_from_headers(headers)
    if "traceparent" not in carrier and envelope_trace_context:
        carrier = {k: v for k, v in envelope_trace_context.items() if k in _ENVELOPE_KEYS}
    return extract_trace_context(carrier)


# --- gRPC ----------------------------------------------------------------------------------


def client_interceptors(
    tracer_provider: trace.TracerProvider | None = None,
) -> list[grpc.aio.ClientInterceptor]:
    """The standard OpenTelemetry client interceptors, for
    ``grpc.aio.insecure_channel(..., interceptors=...)``: a CLIENT span per call and the
    caller's trace context in its metadata (``tracer_provider`` default: the global one)."""
    interceptors: list[grpc.aio.ClientInterceptor] = aio_client_interceptors(  # type: ignore[no-untyped-call]
        tracer_provider=tracer_provider
    )
    return interceptors


UNTRACED_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")
"""gRPC services whose calls get no span: probes every few seconds would bury the sessions'
traces, and the instrumentation's streaming wrapper iterates a handler's result, which
``Health/Watch`` (it writes with ``context.write()``) does not return."""


def server_interceptor(tracer_provider: trace.TracerProvider | None = None) -> Any:
    """The standard OpenTelemetry server interceptor for ``grpc.aio.server(interceptors=...)``:
    every RPC runs in a SERVER span named ``/<service>/<method>`` that continues the caller's
    trace, with ``rpc.system``, ``rpc.service``, ``rpc.method`` and ``rpc.grpc.status_code``
    as the semantic conventions name them; everything the handler publishes carries its trace.
    Calls of :data:`UNTRACED_SERVICES` pass through untouched. Put it first, so the span
    covers the other interceptors (authentication) too."""
    traced = grpc_filters.negate(
        grpc_filters.any_of(*(grpc_filters.service_name(name) for name in UNTRACED_SERVICES))
    )
    return aio_server_interceptor(tracer_provider=tracer_provider, filter_=traced)  # type: ignore[no-untyped-call]


# --- logs ----------------------------------------------------------------------------------


class TraceLogFormatter(logging.Formatter):
    """A formatter that stamps the current trace on every record emitted inside a span.

    It sets ``record.trace_id`` (32 hex digits) and ``record.span_id`` (16), empty outside a
    span, and appends `` trace_id=... span_id=...`` to the line when they are set, so a log
    line leads to its trace in the backend (and a grep for a trace id finds every service's
    lines of one session). Formatting runs in the logging call's context (the handlers of
    :func:`podium.service.setup_logging` write synchronously), so the span is the caller's.
    """

    def format(self, record: logging.LogRecord) -> str:
        ctx = trace.get_current_span().get_span_context()
        trace_id = format(ctx.trace_id, "032x") if ctx.is_valid else ""
        span_id = format(ctx.span_id, "016x") if ctx.is_valid else ""
        record.__dict__.update(trace_id=trace_id, span_id=span_id)
        line = super().format(record)
        return f"{line} trace_id={trace_id} span_id={span_id}" if ctx.is_valid else line


def current_trace_id() -> int:
    """Trace id of the current span (0 when none): handy for logs and tests."""
    return int(trace.get_current_span().get_span_context().trace_id)


def attach(context: Context) -> object:
    """Make ``context`` current; pass the token to :func:`detach` (thin re-export)."""
    return otel_context.attach(context)


def detach(token: object) -> None:
    """Undo :func:`attach`."""
    otel_context.detach(token)  # type: ignore[arg-type]
