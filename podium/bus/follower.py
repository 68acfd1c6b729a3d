"""Following a topic in a consumer group of one's own: the loop several services share.

A follower is a :class:`~podium.service.Worker` that reads one or more topics in a group no
one else uses (every replica its own), hands each fetched batch to :meth:`TopicFollower.handle`
and commits it. Only the follower's own position is at stake, so a broker error is logged and
retried with backoff, never fatal, and a replay after a restart or an error is harmless: a
handler must be idempotent (apply the newest state, end a finished stream again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from podium.bus.base import Bus, Record
from podium.errors import BusError

_log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.1
"""First wait after a broker error; doubled per error in a row."""
RETRY_MAX_S = 5.0
"""Longest wait between retries."""


class TopicFollower:
    """Follows ``topics`` in ``group_id`` until stopped; subclasses implement :meth:`handle`."""

    def __init__(self, bus: Bus, topics: Sequence[str], group_id: str) -> None:
        self.bus = bus
        self._group_id = group_id
        self._subscriber = bus.subscriber(list(topics), group_id)
        self._stopping = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def group_id(self) -> str:
        return self._group_id

    async def handle(self, records: list[Record]) -> None:
        """Act on one fetched batch (committed after this returns)."""
        raise NotImplementedError

    async def start(self) -> None:
        """Join the group (subclasses may read what they need first)."""
        await self._subscriber.start()

    async def run(self) -> None:
        """Follow until :meth:`stop`; a broker error is logged and retried, never fatal."""
        self._idle.clear()
        try:
            await self._follow()
        finally:
            self._idle.set()

    async def _follow(self) -> None:
        delay = RETRY_FIRST_S
        while not self._stopping.is_set():
            try:
                records = await self._subscriber.fetch(timeout_s=0.2)
                await self.handle(records)
                if records:
                    await self._subscriber.commit(records)
                delay = RETRY_FIRST_S
            except BusError as exc:
                _log.warning("%s: %s; retrying in %.1fs", self._group_id, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop following (the batch in hand is finished first) and leave the group."""
        self._stopping.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        with contextlib.suppress(BusError):
            await self._subscriber.stop()
