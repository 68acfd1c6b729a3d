"""The running side of a service, written once: workers run as tasks, one graceful stop.

Every service app consumes one or more topics with :class:`~podium.bus.consumer.EventConsumer`
(or a :class:`~podium.bus.Transformer`, or a learning loop: any :class:`Worker`).
What used to be copied into each app — start the consumers in order, run each in a task, stop
them within the shutdown timeout, surface a crashed consumer from ``wait()`` — lives in
:class:`ServiceShell`; an app builds its consumers, hands them to the shell and delegates its
lifecycle to it. An app that must stop in phases (the orchestrator stops intake, drains its
sessions, then stops the rest) calls :meth:`ServiceShell.stop` once per phase with one
:class:`Deadline`, so the whole stop stays bounded by the shutdown timeout rather than by a
sum of per-phase waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Protocol, TypeVar

from podium.errors import ConfigError

_log = logging.getLogger(__name__)

COMMIT_FLOOR_S = 1.0
"""Least time a consumer is given to commit the batch in hand, even past the deadline: a stop
that has run out of time still lets a finished batch be committed rather than redelivered."""


class Worker(Protocol):
    """What a service runs in a task: an :class:`~podium.bus.EventConsumer`, a
    :class:`~podium.bus.Transformer`, a learning loop. ``stop`` asks it to finish the batch in
    hand within ``timeout_s`` and end ``run``."""

    @property
    def group_id(self) -> str:
        """Its consumer group (names its task)."""
        ...

    async def start(self) -> None: ...

    async def run(self) -> object: ...

    async def stop(self, timeout_s: float = 30.0) -> None: ...


W = TypeVar("W", bound=Worker)


@dataclass(frozen=True, slots=True)
class Deadline:
    """One point in event-loop time that every phase of a stop counts down to."""

    at: float
    """Loop time (``loop.time()``) of the deadline."""

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """The deadline ``seconds`` from now (call inside the event loop)."""
        return cls(asyncio.get_running_loop().time() + seconds)

    def left(self, floor: float = COMMIT_FLOOR_S) -> float:
        """Seconds until the deadline, but at least ``floor`` (0 for a phase that may be cut)."""
        return max(self.at - asyncio.get_running_loop().time(), floor)


class ServiceShell:
    """The consumers of one service, each run in its own task, with one graceful stop.

    Usage, in an app built from ``(config, bus)``::

        self.shell = ServiceShell(SERVICE, shutdown_timeout_s=config.shutdown_timeout_s)
        self.consumer = self.shell.add(EventConsumer(bus, [topic], group, self._handle, ...))

        async def start(self) -> None: await self.shell.start()
        async def stop(self) -> None: await self.shell.stop()
        async def wait(self) -> None: await self.shell.wait()
    """

    def __init__(self, name: str, *, shutdown_timeout_s: float) -> None:
        """``name`` prefixes the task names (visible in asyncio debug output and logs)."""
        if shutdown_timeout_s <= 0:
            raise ConfigError(f"{name}: shutdown_timeout_s must be > 0, got {shutdown_timeout_s}")
        self.name = name
        self.shutdown_timeout_s = shutdown_timeout_s
        self.consumers: list[Worker] = []
        """Every consumer added, in start order."""
        self._tasks: dict[Worker, asyncio.Task[object]] = {}
        self._stopped: set[Worker] = set()

    def add(self, consumer: W) -> W:
        """Register ``consumer`` (started in the order added); returns it for assignment."""
        if self._tasks:
            raise ConfigError(f"{self.name}: consumers must be added before start()")
        self.consumers.append(consumer)
        return consumer

    @property
    def tasks(self) -> list[asyncio.Task[object]]:
        """The running (or finished) ``consumer.run()`` tasks, in start order."""
        return list(self._tasks.values())

    def deadline(self) -> Deadline:
        """A deadline ``shutdown_timeout_s`` from now: the budget of one whole stop."""
        return Deadline.after(self.shutdown_timeout_s)

    async def start(self) -> None:
        """Start each consumer (create topics, join its group) and run it in a task.

        In the order added, each joined before the next starts: an app adds the consumers
        that must be live first (e.g. the orchestrator's results before its intake) first.
        """
        for consumer in self.consumers:
            await consumer.start()
            self._tasks[consumer] = asyncio.create_task(
                consumer.run(), name=f"{self.name}.{consumer.group_id}"
            )

    async def stop(self, *consumers: Worker, deadline: Deadline | None = None) -> None:
        """Stop ``consumers`` (default: every one not stopped yet) together, gracefully.

        Each stops fetching, finishes and commits the batch in hand and leaves its group, by
        ``deadline`` (default: ``shutdown_timeout_s`` from now). A consumer whose batch is
        still running after that is cancelled: the batch stays uncommitted and is redelivered
        to the group's next member, never lost, and no task outlives the app.
        """
        if deadline is None:
            deadline = self.deadline()
        chosen = [c for c in (consumers or self.consumers) if c not in self._stopped]
        self._stopped.update(chosen)
        await asyncio.gather(*(c.stop(timeout_s=deadline.left()) for c in chosen))
        tasks = [self._tasks[c] for c in chosen if c in self._tasks]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=deadline.left())
        for task in pending:
            _log.warning("%s: abandoning %s past the shutdown deadline", self.name, task.get_name())
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait(self) -> None:
        """Return when every consumer task has ended; raise the first consumer crash at once.

        A consumer ends by itself only after :meth:`stop` or on an error it cannot dead-letter,
        so a raise here is what tells the process runner that the service has failed.
        """
        tasks = self.tasks
        if not tasks:
            return
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            # A task cancelled by stop() is an abandoned batch, not a failure of the service.
            if not task.cancelled():
                task.result()
