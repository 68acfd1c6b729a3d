"""reward_svc on the generic bus (the in-process bus of ``podium demo`` and unit tests).

The :class:`~podium.bus.base.Bus` contract is at-least-once, not transactional, so this path
is *effectively* once: :class:`~podium.bus.EventConsumer` de-duplicates redelivered inputs by
event id, commits only after the scored record is published, and dead-letters poison; scored
events carry a deterministic event id (input id + reward version) so a redelivery that slips
past a restart is recognised downstream. Kafka deployments use :mod:`reward_svc.kafka_loop`,
which is exactly-once.
"""

from __future__ import annotations

import logging

from podium.bus import Bus, EventConsumer, Record
from podium.bus.consumer import EVENT_ID_HEADER, EVENT_TYPE_HEADER
from podium.rewards import RewardConfig
from podium.rewards.events import score_record
from podium.v1 import envelope_pb2
from reward_svc.config import ServiceConfig

_log = logging.getLogger("reward_svc")


class BusRewardService:
    """Scores every trajectory on ``config.in_topic`` of a started ``bus``."""

    def __init__(self, bus: Bus, config: ServiceConfig, reward: RewardConfig) -> None:
        self.bus = bus
        self.config = config
        self.reward = reward
        self.scored = 0
        self.consumer = EventConsumer(
            bus,
            [config.in_topic],
            config.group_id,
            self._handle,
            producer_name=config.producer_name,
            max_batch=config.max_batch,
            partitions=config.partitions,
        )

    async def _handle(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        del envelope  # score_record decodes the bytes itself, through the codec
        out = score_record(
            record.value,
            self.reward,
            producer=self.config.producer_name,
            fixed_progress=self.config.fixed_progress,
        )
        await self.bus.publish(
            self.config.out_topic,
            out.value,
            key=out.key,
            headers=(
                (EVENT_ID_HEADER, out.event_id.encode()),
                (EVENT_TYPE_HEADER, b"podium.v1.ScoredTrajectory"),
            ),
        )
        self.scored += 1

    async def start(self) -> None:
        """Create the topics and join the group (:meth:`run` does it too if not done yet)."""
        await self.consumer.start()

    async def run(self) -> None:
        """Consume until :meth:`stop`."""
        _log.info(
            "reward_svc: consuming %s on the bus, reward %s",
            self.config.in_topic,
            self.reward.version,
        )
        await self.consumer.run()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the batch in hand, commit it and stop (abandoning it uncommitted, hence
        redelivered, if that takes longer than ``timeout_s``)."""
        await self.consumer.stop(timeout_s=timeout_s)
