"""The learner in stats mode: receive scored trajectories and keep running statistics.

A consumer with commit-after-processing and dedupe (:class:`podium.bus.EventConsumer`) and a
:class:`LearnerStats` accumulator, for watching a stream without training on it (``podium
demo``). Training is the learning loop's (:mod:`learner_svc.loop`, ``PODIUM_LEARNER_MODE=swarm``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from learner_svc.config import LearnerConfig
from podium import topics
from podium.bus.base import Bus, Record
from podium.bus.consumer import EventConsumer
from podium.codec import unpack_as
from podium.service import ServiceShell, default_instance_name
from podium.v1 import envelope_pb2, reward_pb2

_log = logging.getLogger(__name__)

SERVICE = "learner_svc"
"""Service name (OpenTelemetry ``service.name``, default instance prefix)."""


@dataclass
class LearnerStats:
    """Running account of what the learner received."""

    received: int = 0
    """Scored trajectories received (duplicates excluded)."""
    completed: int = 0
    """Of those, sessions that completed every subtask."""
    reward_sum: float = 0.0
    """Sum of total rewards."""
    latency_ratio_sum: float = 0.0
    """Sum of latency / lower bound (sessions with a positive bound)."""
    by_policy: dict[str, int] = field(default_factory=dict)
    """Trajectories per acting policy version (policy lag shows up here)."""
    by_reward_version: dict[str, int] = field(default_factory=dict)
    """Trajectories per reward-function version."""
    last: reward_pb2.ScoredTrajectory | None = None
    """The most recent one."""

    @property
    def mean_reward(self) -> float:
        """Mean total reward so far (0 before any)."""
        return self.reward_sum / self.received if self.received else 0.0

    def add(self, scored: reward_pb2.ScoredTrajectory) -> None:
        traj = scored.trajectory
        self.received += 1
        self.completed += traj.completed
        self.reward_sum += scored.total
        if traj.lower_bound > 0:
            self.latency_ratio_sum += traj.latency / traj.lower_bound
        self.by_policy[traj.policy_version] = self.by_policy.get(traj.policy_version, 0) + 1
        self.by_reward_version[scored.reward_version] = (
            self.by_reward_version.get(scored.reward_version, 0) + 1
        )
        self.last = scored


class LearnerApp:
    """The learner process (or embedded task)."""

    name = SERVICE

    def __init__(
        self,
        config: LearnerConfig,
        bus: Bus,
        *,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.config = config
        self.bus = bus
        self.instance = config.instance or default_instance_name(SERVICE)
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(SERVICE)
        self.stats = LearnerStats()
        self._received = asyncio.Condition()
        self.shell = ServiceShell(SERVICE, shutdown_timeout_s=config.shutdown_timeout_s)
        """Runs the consumer and stops it gracefully (:class:`podium.service.ServiceShell`)."""
        self.consumer = self.shell.add(
            EventConsumer(
                bus,
                [topics.SCORED_TRAJECTORIES],
                config.group_id,
                self._handle,
                producer_name=self.instance,
                max_batch=config.batch_max,
                partitions=config.topic_partitions,
            )
        )

    async def start(self) -> None:
        """Join the group on the scored-trajectory topic and start consuming."""
        await self.shell.start()

    async def stop(self) -> None:
        """Stop fetching, finish and commit the batch in hand, leave the group."""
        await self.shell.stop()

    async def wait(self) -> None:
        """Return when consuming has ended; raise if the consumer crashed."""
        await self.shell.wait()

    async def wait_for(self, count: int, timeout_s: float) -> None:
        """Wait until ``count`` trajectories were received (for drivers and tests)."""
        async with self._received:
            await asyncio.wait_for(
                self._received.wait_for(lambda: self.stats.received >= count), timeout_s
            )

    async def receive(self, scored: reward_pb2.ScoredTrajectory) -> None:
        """Account for one scored trajectory."""
        self.stats.add(scored)
        if self.stats.received % self.config.log_every == 0:
            _log.info(
                "%s: %d trajectories, mean reward %.3f, last %s total %.3f (%s)",
                self.instance,
                self.stats.received,
                self.stats.mean_reward,
                scored.trajectory.session_id,
                scored.total,
                scored.reward_version,
            )
        async with self._received:
            self._received.notify_all()

    async def _handle(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        scored = unpack_as(envelope, reward_pb2.ScoredTrajectory)
        with self._tracer.start_as_current_span(
            "receive scored trajectory",
            attributes={"podium.session_id": scored.trajectory.session_id},
        ):
            await self.receive(scored)
