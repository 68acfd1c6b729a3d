"""What every Podium service shares: the app lifecycle and the standalone process runner.

A service is an *app*: an object built from ``(config, bus)`` with ``start()`` and ``stop()``.
The same app runs two ways:

* **embedded** — several apps as asyncio tasks in one process on the in-process bus
  (``podium demo``, ``podium train``, tests): the caller owns the bus and calls
  ``start()`` / ``stop()`` itself;
* **standalone** — ``python -m <svc>``: :func:`run_standalone` connects the bus named by the
  config, starts the app, and on SIGTERM/SIGINT stops it gracefully (stop consuming, finish
  and commit the batch in hand, flush and close producers) and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Protocol

from podium.bus.base import Bus
from podium.config import log_level
from podium.errors import ConfigError, PodiumError

_log = logging.getLogger(__name__)

EXIT_OK = 0
"""Clean exit, including a graceful stop on SIGTERM."""
EXIT_CONFIG = 2
"""The configuration is missing or invalid (the message names the variable)."""
EXIT_FAILED = 1
"""The service failed while running."""


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


def default_instance_name(service: str) -> str:
    """``<service>/<host>-<pid>``: unique per process, readable in broker and trace UIs."""
    return f"{service}/{socket.gethostname()}-{os.getpid()}"


def setup_logging(level: str = "INFO") -> None:
    """One-line-per-event logs on stderr (where container runtimes collect them)."""
    logging.basicConfig(
        level=log_level(level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


async def serve(
    app: App, bus: Bus, *, stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
) -> None:
    """Run ``app`` on ``bus`` until a stop signal, then stop both gracefully.

    The bus is stopped last, after the app has committed its batch, because stopping the bus
    is what flushes and closes the producer.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in stop_signals:
        loop.add_signal_handler(sig, stop.set)
    await bus.start()
    try:
        await app.start()
        _log.info("%s: started", app.name)
        ended = asyncio.create_task(app.wait(), name=f"{app.name}.wait")
        stopping = asyncio.create_task(stop.wait(), name=f"{app.name}.signal")
        done, _ = await asyncio.wait({ended, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stopping in done:
            _log.info("%s: stop signal received; stopping gracefully", app.name)
        stopping.cancel()
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
    _log.info("%s: stopped", app.name)


def run_standalone(name: str, load: Callable[[], tuple[App, Bus]]) -> int:
    """The body of ``python -m <svc>``: build from the environment, serve, map errors to codes.

    ``load`` reads the config (and calls :func:`setup_logging` with its level) and builds the
    app and its bus; a :class:`ConfigError` there is printed as one line naming the variable
    and exits 2 before anything connects.
    """
    try:
        app, bus = load()
    except ConfigError as exc:
        print(f"{name}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        asyncio.run(serve(app, bus))
    except PodiumError as exc:
        _log.error("%s: %s", name, exc)
        return EXIT_FAILED
    return EXIT_OK
