"""reward_svc as a :class:`podium.service.App`: the lifecycle ``python -m reward_svc`` runs.

The app picks its loop from the bus URL:

* ``kafka://`` — :class:`~reward_svc.kafka_loop.KafkaRewardService`, exactly-once with Kafka
  transactions. The loop needs a transactional producer of its own (one per replica, fenced by
  ``transactional_id``), so it does not publish through the shared bus; the bus connects first
  (an unreachable broker fails fast with a :class:`~podium.errors.BusError`, exit 1, not a
  traceback) and creates the topics the loop reads and writes.
* anything else — :class:`~reward_svc.bus_loop.BusRewardService` on the bus, effectively-once.

Either way a stop request lets the batch in hand finish (commit its transaction) within
``shutdown_timeout_s``; a batch cut off after that stays uncommitted and is scored again by
the next owner, so nothing is lost or counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka.errors import KafkaError

from podium import topics
from podium.bus.base import Bus, TopicSpec
from podium.bus.kafka import KafkaConfig
from podium.errors import BusError
from podium.rewards import RewardConfig
from reward_svc.bus_loop import BusRewardService
from reward_svc.config import ServiceConfig
from reward_svc.kafka_loop import KafkaRewardService

_log = logging.getLogger("reward_svc")

SERVICE = "reward_svc"
"""Service name (logs, the default instance prefix)."""


class RewardApp:
    """Trajectories in, scored trajectories out, on a started ``bus``."""

    name = SERVICE

    def __init__(self, config: ServiceConfig, reward: RewardConfig, bus: Bus) -> None:
        self.config = config
        self.reward = reward
        self.bus = bus
        self.kafka_loop: KafkaRewardService | None = None
        """The exactly-once loop, on a Kafka bus URL."""
        self.bus_loop: BusRewardService | None = None
        """The generic-bus loop, otherwise."""
        if config.is_kafka:
            self.kafka_loop = KafkaRewardService(config, reward, create_topics=False)
        else:
            self.bus_loop = BusRewardService(bus, config, reward)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Create the topics, start the loop, and return once it consumes (or raise why not)."""
        cfg = self.config
        if self.bus_loop is not None:
            await self.bus_loop.start()
            self._task = asyncio.create_task(self.bus_loop.run(), name=f"{SERVICE}.bus_loop")
            return
        assert self.kafka_loop is not None
        replicas = KafkaConfig.from_url(cfg.bus_url).replication_factor
        await self.bus.create_topics(
            [
                TopicSpec(name, cfg.partitions, replicas)
                for name in (cfg.in_topic, cfg.out_topic, topics.dead_letter(cfg.in_topic))
            ]
        )
        self._task = asyncio.create_task(self._run_kafka(), name=f"{SERVICE}.kafka_loop")
        ready = asyncio.create_task(self.kafka_loop.ready.wait())
        try:
            await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if self._task.done():
            self._task.result()  # a failure to start: raise it here, before "started" is logged

    async def _run_kafka(self) -> None:
        """The Kafka loop, its client errors turned into :class:`BusError` (a clean exit 1)."""
        assert self.kafka_loop is not None
        try:
            await self.kafka_loop.run()
        except (KafkaError, OSError) as exc:
            raise BusError(
                f"kafka loop failed: {type(exc).__name__}: {exc}",
                retriable=bool(getattr(exc, "retriable", False)),
            ) from exc
        if self.kafka_loop.fenced:
            # Two live replicas share PODIUM_REWARD_TRANSACTIONAL_ID: a deployment error that
            # must be visible (non-zero exit), not a quiet stop.
            raise BusError(
                f"fenced: another reward_svc instance took over transactional id "
                f"{self.config.transactional_id!r} (PODIUM_REWARD_TRANSACTIONAL_ID must be "
                "unique per replica)",
                retriable=False,
            )

    async def stop(self) -> None:
        """Stop consuming; let the batch in hand commit, up to ``shutdown_timeout_s``."""
        timeout = self.config.shutdown_timeout_s
        if self.bus_loop is not None:
            await self.bus_loop.stop(timeout_s=timeout)
        elif self.kafka_loop is not None:
            self.kafka_loop.request_stop()
        task = self._task
        if task is None or task.done():
            return
        _, pending = await asyncio.wait({task}, timeout=timeout)
        if pending:
            # Cut off mid-batch: the open transaction is never committed (the broker aborts it
            # when this transactional id starts again, or on its timeout), so nothing is lost.
            _log.warning("%s: batch did not finish within %.1fs; abandoning it", SERVICE, timeout)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, BusError):
                await task

    async def wait(self) -> None:
        """Return when the loop ends by itself; raise if it failed."""
        if self._task is not None:
            await self._task
