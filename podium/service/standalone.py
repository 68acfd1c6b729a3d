"""The app lifecycle and the standalone process runner (``python -m <svc>``).

A service is an *app*: an object built from ``(config, bus)`` with ``start()`` and ``stop()``.
The same app runs two ways:

* **embedded** — several apps as asyncio tasks in one process on the in-process bus
  (``podium demo``, ``podium train``, tests): the caller owns the bus and calls
  ``start()`` / ``stop()`` itself;
* **standalone** — ``python -m <svc>``: :func:`run_standalone` connects the bus named by the
  config, starts the app behind a ``grpc.health.v1`` server on ``PODIUM_HEALTH_PORT`` and a
  Prometheus endpoint on ``PODIUM_METRICS_PORT`` (:mod:`podium.metrics`), and on
  SIGTERM/SIGINT stops it gracefully (health NOT_SERVING, stop consuming, finish and commit the
  batch in hand, flush and close producers) and exits 0.

Logs are one line per event on stderr, stamped with the trace and span ids of the span they
were emitted in (:class:`podium.telemetry.TraceLogFormatter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from opentelemetry.sdk.trace import TracerProvider

from podium.bus import connect
from podium.bus.base import Bus
from podium.config import HealthConfig, ServiceConfig, from_env, log_level
from podium.errors import ConfigError, PodiumError
from podium.metrics import MetricsServer, setup_metrics
from podium.service.health import HealthServer
from podium.telemetry import TraceLogFormatter, setup_tracing

# The logger keeps the package's name: operators (and tests) grep for "podium.service".
_log = logging.getLogger("podium.service")

EXIT_OK = 0
"""Clean exit, including a graceful stop on SIGTERM."""
EXIT_CONFIG = 2
"""The configuration is missing or invalid (the message names the variable)."""
EXIT_FAILED = 1
"""The service failed while running."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that stop a standalone service gracefully."""

HEALTH_GRACE_S = 1.0
"""How long the health server may answer probes in flight when the process exits."""


class App(Protocol):
    """A service's lifecycle, as seen by whoever runs it."""

    name: str
    """Service name, e.g. ``"subagent_svc"``."""

    async def start(self) -> None:
        """Start consuming / serving; returns once the app is ready."""
        ...

    async def stop(self) -> None:
        """Stop gracefully: no new work, finish and commit work in hand, flush publishes."""
        ...

    async def wait(self) -> None:
        """Return when the app ends by itself; raise if it failed (e.g. a consumer crashed)."""
        ...


C = TypeVar("C", bound=ServiceConfig)


def default_instance_name(service: str) -> str:
    """``<service>/<host>-<pid>``: unique per process, readable in broker and trace UIs."""
    return f"{service}/{socket.gethostname()}-{os.getpid()}"


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The line of a log record (:class:`TraceLogFormatter` appends the trace and span ids)."""


def setup_logging(level: str = "INFO") -> None:
    """One-line-per-event logs on stderr (where container runtimes collect them), each line
    emitted inside a span ending in ``trace_id=<32 hex> span_id=<16 hex>``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TraceLogFormatter(LOG_FORMAT))
    logging.basicConfig(level=log_level(level), handlers=[handler])


def ports_of(app: App, environ: Mapping[str, str] | None = None) -> HealthConfig:
    """The health and metrics ports for ``app``: its config's settings, else
    ``PODIUM_HEALTH_PORT`` / ``PODIUM_METRICS_PORT`` themselves.

    Apps whose config extends :class:`~podium.config.ServiceConfig` already read the variables;
    any other app (its own config class) gets the same variables through ``podium.config``, so
    the settings mean the same for every service. Raises :class:`ConfigError` naming them.
    """
    config = getattr(app, "config", None)
    if isinstance(config, HealthConfig):
        return config
    return from_env(HealthConfig, environ)


def health_port_of(app: App, environ: Mapping[str, str] | None = None) -> int:
    """The health port for ``app`` (:func:`ports_of`)."""
    return ports_of(app, environ).health_port


def start_metrics(process_name: str, port: int) -> MetricsServer:
    """The process's meter provider (named ``process_name``, :func:`podium.metrics.setup_metrics`)
    served on ``port`` (0 = a free port); the caller stops it. ``OSError`` if it is taken."""
    server = MetricsServer(port, registry=setup_metrics(process_name))
    server.start()
    _log.info("%s: Prometheus metrics on port %d", process_name, server.port)
    return server


async def serve(
    app: App,
    bus: Bus,
    *,
    stop_signals: tuple[int, ...] = STOP_SIGNALS,
    health_port: int | None = None,
    metrics_port: int | None = None,
) -> None:
    """Run ``app`` on ``bus`` until a stop signal (or until it ends), then stop both gracefully.

    With ``health_port`` (0 = a free port), a ``grpc.health.v1`` server answers there for
    ``""`` and ``app.name``: NOT_SERVING while starting, SERVING once ``app.start()`` has
    returned, NOT_SERVING again as soon as the stop begins. It is bound before the bus
    connects, so a taken port fails the process before it joins any consumer group.
    With ``metrics_port`` (0 or None = none), the process's metrics are served there for
    Prometheus from before the bus connects until the app has stopped.
    The bus is stopped after the app has committed its batch, because stopping the bus is what
    flushes and closes the producer.
    """
    metrics = start_metrics(app.name, metrics_port) if metrics_port else None
    health = HealthServer(health_port, services=(app.name,)) if health_port is not None else None
    try:
        if health is not None:
            port = await health.start()
            _log.info("%s: grpc.health.v1 on port %d", app.name, port)
        try:
            await _serve_on_bus(app, bus, health, stop_signals)
        finally:
            if health is not None:
                await health.stop(HEALTH_GRACE_S)
    finally:
        if metrics is not None:
            metrics.stop()
    _log.info("%s: stopped", app.name)


async def _serve_on_bus(
    app: App, bus: Bus, health: HealthServer | None, stop_signals: tuple[int, ...]
) -> None:
    """Start the bus and the app, wait for a signal or the app's end, stop the app and the bus."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in stop_signals:
        loop.add_signal_handler(sig, stop.set)
    await bus.start()
    try:
        await app.start()
        if health is not None:
            await health.set_serving(True)
        _log.info("%s: started", app.name)
        ended = asyncio.create_task(app.wait(), name=f"{app.name}.wait")
        stopping = asyncio.create_task(stop.wait(), name=f"{app.name}.signal")
        done, _ = await asyncio.wait({ended, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stopping in done:
            _log.info("%s: stop signal received; stopping gracefully", app.name)
        stopping.cancel()
        if health is not None:
            # Before the stop itself: probes see the drain start, not just the exit.
            await health.set_serving(False)
        try:
            await app.stop()
        finally:
            if ended.done():
                ended.result()  # re-raise a crash of the app itself
            else:
                ended.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ended
    finally:
        await bus.stop()
        for sig in stop_signals:
            loop.remove_signal_handler(sig)


def run_standalone(name: str, load: Callable[[], tuple[App, Bus]]) -> int:
    """The body of ``python -m <svc>``: build from the environment, serve, map errors to codes.

    ``load`` reads the config (and calls :func:`setup_logging` with its level) and builds the
    app and its bus; a :class:`ConfigError` there (or in ``PODIUM_HEALTH_PORT``) is printed as
    one line naming the variable and exits 2 before anything connects. The app is served with
    its health server and its metrics endpoint on the ports :func:`ports_of` gives.
    """
    try:
        app, bus = load()
        ports = ports_of(app)
    except ConfigError as exc:
        print(f"{name}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        asyncio.run(serve(app, bus, health_port=ports.health_port, metrics_port=ports.metrics_port))
    except PodiumError as exc:
        _log.error("%s: %s", name, exc)
        return EXIT_FAILED
    return EXIT_OK


def standalone_loader(
    name: str,
    config_cls: type[C],
    build: Callable[[C, Bus, TracerProvider], App],
) -> Callable[[], tuple[App, Bus]]:
    """The usual ``load`` of :func:`run_standalone`, for a service whose config is a dataclass.

    It reads ``config_cls`` from the environment (one :class:`ConfigError` naming every bad
    variable), sets up logging at the config's ``log_level`` and the process-wide tracer
    provider named ``name``, connects the bus named by ``bus_url``, then calls
    ``build(config, bus, tracer_provider)``.
    """

    def load() -> tuple[App, Bus]:
        config = from_env(config_cls)
        setup_logging(config.log_level)
        provider = setup_tracing(name, set_global=True)
        bus = connect(config.bus_url)
        return build(config, bus, provider), bus

    return load
