"""OpenTelemetry for Podium: one tracer provider per service, one trace per session.

A session is one trace from the IDE's gRPC call to the last consumer span: the W3C
``traceparent`` travels in gRPC metadata (client interceptor -> :class:`TracingServerInterceptor`),
then in Kafka record headers and in the envelope's ``trace_context`` map
(:func:`kafka_headers` / :func:`context_from_record`), so a consumer in another process
continues the trace the gRPC handler started.

Providers are deliberately *not* installed globally by default: in the embedded mode
(``podium demo``, ``podium train``) the four services share one process, and each must still
report under its own ``service.name``. Propagation uses the global propagator (W3C trace
context + baggage, OpenTelemetry's default), which does not depend on any provider.

Exporters: pass one explicitly (tests pass an ``InMemorySpanExporter``); otherwise spans go to
an OTLP collector when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (needs the optional
``opentelemetry-exporter-otlp-proto-grpc`` package), and nowhere when it is not.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import SpanKind, Status, StatusCode

from podium.errors import ConfigError

OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
"""Standard OpenTelemetry variable; when set, spans are exported there over OTLP/gRPC."""

_ENVELOPE_KEYS = ("traceparent", "tracestate", "baggage")
"""Carrier keys the W3C propagators write; the only headers we copy around."""


def setup_tracing(
    service_name: str,
    exporter: SpanExporter | None = None,
    *,
    set_global: bool = False,
    environ: Mapping[str, str] | None = None,
) -> TracerProvider:
    """Create the tracer provider of one service.

    ``exporter`` given: spans are exported synchronously on end (a test can read them at once).
    Otherwise ``OTEL_EXPORTER_OTLP_ENDPOINT`` selects a batching OTLP exporter; unset means
    spans are created (so context still propagates) but not exported.
    ``set_global`` installs it as the process-wide provider (standalone services do; embedded
    ones must not, as only the first global installation wins).
    """
    env = os.environ if environ is None else environ
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif env.get(OTLP_ENDPOINT_ENV):
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(env[OTLP_ENDPOINT_ENV])))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def _otlp_exporter(endpoint: str) -> SpanExporter:
    """The OTLP/gRPC span exporter; a clear error if its optional package is absent."""
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError as exc:
        raise ConfigError(
            f"{OTLP_ENDPOINT_ENV}={endpoint!r} asks for OTLP export, but the package "
            "opentelemetry-exporter-otlp-proto-grpc is not installed; install it or unset "
            f"{OTLP_ENDPOINT_ENV}"
        ) from exc
    exporter: SpanExporter = OTLPSpanExporter(endpoint=endpoint)
    return exporter


# --- W3C carrier -------------------------------------------------------------------------


def inject_trace_context(context: Context | None = None) -> dict[str, str]:
    """The W3C carrier (``traceparent``, ``tracestate``, ``baggage``) of ``context``.

    Defaults to the current context; empty when there is no active span.
    """
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return carrier


def extract_trace_context(carrier: Mapping[str, str]) -> Context:
    """A context whose parent span is the one described by ``carrier`` (may be empty)."""
    return propagate.extract(dict(carrier))


# --- Kafka / bus headers -------------------------------------------------------------------


def kafka_headers(context: Context | None = None) -> tuple[tuple[str, bytes], ...]:
    """Trace context as Kafka record headers (UTF-8 values), ready for ``Bus.publish``."""
    return tuple((k, v.encode("utf-8")) for k, v in inject_trace_context(context).items())


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


def grpc_metadata(context: Context | None = None) -> tuple[tuple[str, str], ...]:
    """Trace context as gRPC metadata, to pass as ``metadata=`` on a client call."""
    return tuple(inject_trace_context(context).items())


def context_from_grpc_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Context:
    """Context to continue from incoming gRPC metadata (binary ``-bin`` entries are ignored)."""
    carrier = {
        k.lower(): v for k, v in (metadata or ()) if isinstance(v, str) and k in _ENVELOPE_KEYS
    }
    return extract_trace_context(carrier)


def _with_trace_metadata(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    """A copy of ``details`` whose metadata also carries the current trace context."""
    metadata = grpc.aio.Metadata()
    for key, value in details.metadata or ():
        if key not in _ENVELOPE_KEYS:  # the current context replaces a stale one
            metadata.add(key, value)
    for key, value in grpc_metadata():
        metadata.add(key, value)
    return grpc.aio.ClientCallDetails(
        details.method,
        details.timeout,
        metadata,
        details.credentials,
        details.wait_for_ready,
    )


class TracingUnaryUnaryClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Adds the caller's trace context to every unary call's metadata."""

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        return await continuation(_with_trace_metadata(client_call_details), request)


class TracingUnaryStreamClientInterceptor(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds the caller's trace context to every server-streaming call's metadata."""

    async def intercept_unary_stream(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        return await continuation(_with_trace_metadata(client_call_details), request)


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """Interceptors for ``grpc.aio.insecure_channel(..., interceptors=...)``."""
    return [TracingUnaryUnaryClientInterceptor(), TracingUnaryStreamClientInterceptor()]


class TracingServerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Runs every RPC handler inside a SERVER span that continues the caller's trace.

    ``grpc.aio`` interceptors return a handler rather than run it, so the span is opened by
    wrapping the handler's behaviour: the span is then current while the servicer runs, and
    everything it publishes carries the same trace id.
    """

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        parent = context_from_grpc_metadata(handler_call_details.invocation_metadata)
        method = str(handler_call_details.method)
        name = method.lstrip("/")
        attributes = {"rpc.system": "grpc", "rpc.method": method}
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, name, parent, attributes),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, name, parent, attributes),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(handler.stream_unary, name, parent, attributes),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(handler.stream_stream, name, parent, attributes),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _wrap_unary(
        self,
        behaviour: Callable[[Any, Any], Any],
        name: str,
        parent: Context,
        attributes: dict[str, str],
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def wrapped(request: Any, servicer_context: Any) -> Any:
            with self._tracer.start_as_current_span(
                name, context=parent, kind=SpanKind.SERVER, attributes=attributes
            ) as span:
                try:
                    result = behaviour(request, servicer_context)
                    if inspect.isawaitable(result):
                        result = await result
                    return result
                finally:
                    _record_grpc_code(span, servicer_context)

        return wrapped

    def _wrap_stream(
        self,
        behaviour: Callable[[Any, Any], Any],
        name: str,
        parent: Context,
        attributes: dict[str, str],
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def wrapped(request: Any, servicer_context: Any) -> AsyncIterator[Any]:
            with self._tracer.start_as_current_span(
                name, context=parent, kind=SpanKind.SERVER, attributes=attributes
            ) as span:
                try:
                    result = behaviour(request, servicer_context)
                    if hasattr(result, "__aiter__"):
                        async for item in result:
                            yield item
                    elif inspect.isawaitable(result):  # handler that uses context.write()
                        await result
                    else:
                        for item in result:
                            yield item
                finally:
                    _record_grpc_code(span, servicer_context)

        return wrapped


def _record_grpc_code(span: trace.Span, servicer_context: Any) -> None:
    """Copy the RPC's status code onto the span; non-OK codes mark the span as an error."""
    code = None
    try:
        code = servicer_context.code()
    except (AttributeError, RuntimeError):
        return
    if isinstance(code, grpc.StatusCode):
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code is not grpc.StatusCode.OK:
            span.set_status(Status(StatusCode.ERROR, code.name))


def current_trace_id() -> int:
    """Trace id of the current span (0 when none): handy for logs and tests."""
    return int(trace.get_current_span().get_span_context().trace_id)


def attach(context: Context) -> object:
    """Make ``context`` current; pass the token to :func:`detach` (thin re-export)."""
    return otel_context.attach(context)


def detach(token: object) -> None:
    """Undo :func:`attach`."""
    otel_context.detach(token)  # type: ignore[arg-type]
