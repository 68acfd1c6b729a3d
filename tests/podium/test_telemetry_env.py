"""The standard OTEL_* variables win over the code's defaults; log lines carry the trace."""

from __future__ import annotations

import io
import logging

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from podium.config import HealthConfig, from_env
from podium.errors import ConfigError
from podium.telemetry import (
    TraceLogFormatter,
    service_resource,
    setup_tracing,
    span_exporter_from_env,
)


def test_service_name_and_resource_attributes_from_the_environment_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert service_resource("reward_svc").attributes["service.name"] == "reward_svc"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "reward-blue")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=dev,team=rl")
    attributes = setup_tracing("reward_svc", InMemorySpanExporter()).resource.attributes
    assert attributes["service.name"] == "reward-blue"
    assert attributes["deployment.environment"] == "dev" and attributes["team"] == "rl"


def test_exporter_follows_the_standard_variables() -> None:
    assert span_exporter_from_env({}) is None  # nothing asked: nothing exported
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    assert isinstance(span_exporter_from_env(endpoint), OTLPSpanExporter)  # installed now
    traces_only = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}
    assert isinstance(span_exporter_from_env(traces_only), OTLPSpanExporter)
    assert span_exporter_from_env({**endpoint, "OTEL_TRACES_EXPORTER": "none"}) is None
    console = span_exporter_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(console, ConsoleSpanExporter)
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER='zipkin' is invalid"):
        span_exporter_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_metrics_port_setting_is_checked() -> None:
    assert from_env(HealthConfig, {}).metrics_port == 0
    assert from_env(HealthConfig, {"PODIUM_METRICS_PORT": "9464"}).metrics_port == 9464
    with pytest.raises(ConfigError, match="PODIUM_METRICS_PORT='70000' is invalid"):
        from_env(HealthConfig, {"PODIUM_METRICS_PORT": "70000"})


def test_log_lines_inside_a_span_carry_its_ids() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TraceLogFormatter("%(levelname)s %(message)s"))
    log = logging.getLogger("test.telemetry.formatter")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("outside")
        tracer = setup_tracing("t", InMemorySpanExporter()).get_tracer("t")
        with tracer.start_as_current_span("work") as span:
            log.warning("inside")
    finally:
        log.removeHandler(handler)
    outside, inside = stream.getvalue().splitlines()
    assert outside == "WARNING outside"
    ctx = span.get_span_context()
    assert inside == f"WARNING inside trace_id={ctx.trace_id:032x} span_id={ctx.span_id:016x}"
