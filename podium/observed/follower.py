"""Feeding an :class:`~podium.observed.store.AgentStats` from the trajectory stream.

:class:`StatsFollower` follows ``podium.trajectories.v1`` in a consumer group of its own (every
replica its own, so each replica's store sees every session of every replica) and records each
trajectory's finished executions. A record that cannot be decoded, or whose executions do not
fit its task (a poison record), is logged and skipped: the store loses one session's evidence,
the follower never stops. Only the follower's own position is at stake, so a replay (after a
restart without a committed position, or when a group is new) would count sessions twice; the
orchestrator positions the group at the end on start, and a store is a decayed average that a
few duplicated sessions move no more than a few extra sessions would.
"""

from __future__ import annotations

import logging

from podium import codec, topics
from podium.bus.base import Bus, Record
from podium.bus.follower import TopicFollower
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
    ) -> None:
        """``group_id``: this replica's own group (e.g. ``<group>.stats.<instance>``);
        ``split_overhead``: the pool's merge overhead (see
        :meth:`AgentStats.record_trajectory`; None: the default pool's)."""
        super().__init__(bus, [topic], group_id)
        self.stats = stats
        self.topic = topic
        self.split_overhead = split_overhead
        self.trajectories = 0
        """Trajectories recorded."""
        self.executions = 0
        """Executions recorded."""
        self.skipped = 0
        """Records skipped as unreadable or inconsistent (each logged)."""

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
