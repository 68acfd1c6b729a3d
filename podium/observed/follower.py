"""Feeding an :class:`~podium.observed.store.AgentStats` from the trajectory stream.

:class:`StatsFollower` follows ``podium.trajectories.v1`` in a consumer group of its own (every
replica its own, so each replica's store sees every session of every replica) and records each
trajectory's finished executions. A record that cannot be decoded, or whose executions do not
fit its task (a poison record), is logged and skipped: the store loses one session's evidence,
the follower never stops. Only the follower's own position is at stake, so a replay (after a
restart without a committed position, or when a group is new) would count sessions twice; the
orchestrator positions the group at the end on start, and a store is a decayed average that a
few duplicated sessions move no more than a few extra sessions would.

A fresh store knows nothing, so :meth:`StatsFollower.start` first records the newest
``warm_records`` trajectories of each partition (oldest first, by record time): a replica
restarted after a drift plans on what the sub-agents have been doing, not on their
advertisements. A session published between that read and the group's position may be counted
twice, which the decayed average tolerates as above.
"""

from __future__ import annotations

import logging

from podium import codec, topics
from podium.bus.base import Bus, Record
from podium.bus.follower import TopicFollower
from podium.bus.read import read_tail
from podium.errors import PodiumError
from podium.observed.store import AgentStats
from podium.v1 import trajectory_pb2

_log = logging.getLogger(__name__)


class StatsFollower(TopicFollower):
    """Follows the trajectory topic into ``stats`` (a :class:`~podium.service.Worker`)."""

    def __init__(
        self,
        bus: Bus,
        group_id: str,
        stats: AgentStats,
        *,
        topic: str = topics.TRAJECTORIES,
        split_overhead: float | None = None,
        warm_records: int = 0,
    ) -> None:
        """``group_id``: this replica's own group (e.g. ``<group>.stats.<instance>``);
        ``split_overhead``: the pool's merge overhead (see
        :meth:`AgentStats.record_trajectory`; None: the default pool's); ``warm_records``:
        newest trajectories per partition recorded at :meth:`start` (0: none)."""
        super().__init__(bus, [topic], group_id)
        self.stats = stats
        self.topic = topic
        self.split_overhead = split_overhead
        self.warm_records = warm_records
        self.trajectories = 0
        """Trajectories recorded."""
        self.executions = 0
        """Executions recorded."""
        self.skipped = 0
        """Records skipped as unreadable or inconsistent (each logged)."""

    async def start(self) -> None:
        """Record the topic's newest trajectories (``warm_records`` per partition), then
        follow it."""
        if self.warm_records > 0:
            tail = await read_tail(self.bus, self.topic, self.warm_records)
            for record in sorted(tail, key=lambda r: (r.timestamp_ms, r.partition, r.offset)):
                self.apply(record)
            _log.info(
                "agent stats warmed from %d trajectories of %s", self.trajectories, self.topic
            )
        await super().start()

    async def handle(self, records: list[Record]) -> None:
        for record in records:
            self.apply(record)

    def apply(self, record: Record) -> int:
        """Record one trajectory record; the executions recorded (0 for a skipped record)."""
        try:
            _, traj = codec.decode_event(record.value, trajectory_pb2.Trajectory)
            n = self.stats.record_trajectory(traj, split_overhead=self.split_overhead)
        except PodiumError as exc:  # DecodeError included
            self.skipped += 1
            _log.warning(
                "%s[%d]@%d skipped (agent stats unchanged): %s",
                record.topic,
                record.partition,
                record.offset,
                exc,
            )
            return 0
        self.trajectories += 1
        self.executions += n
        return n


__all__ = ["StatsFollower"]
