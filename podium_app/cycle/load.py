"""The load of a cycle-bench run and what the driver reads back.

* :class:`Submitter`: each planned session published as a ``TaskSubmitted`` at its offset
  from the load's start (a steady rate), under the id ``<run>-<index>``;
* :class:`Tail`: the trajectories and the rollout registry followed (committed records only,
  in a throw-away consumer group), so the driver knows what finished — every trajectory
  record counted, to tell a session run twice — and every transition of the rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from podium import codec, topics
from podium.bus import KafkaBus
from podium.bus.base import Subscriber, TopicSpec
from podium.envs.swarm.trajectory import task_to_proto
from podium.errors import DecodeError
from podium.observed import AgentStats
from podium.v1 import rollout_pb2, task_pb2, trajectory_pb2
from podium_app.cycle.deploy import GREEDY_BY, SAMPLED_BY
from podium_app.cycle.measure import PlannedSession, ratio

PRODUCER = "bench-cycle"


def session_id(run: str, index: int) -> str:
    """The id of planned session ``index`` in run ``run``."""
    return f"{run}-{index:06d}"


def index_of(run: str, sid: str) -> int | None:
    """The planned index of a session id of run ``run`` (None for anyone else's)."""
    head, _, tail = sid.rpartition("-")
    return int(tail) if head == run and tail.isdigit() else None


async def create_topics(bus: KafkaBus, partitions: int = 3) -> None:
    """The data topics (the compacted registries are created by their owners)."""
    owned = (topics.ROLLOUT, topics.REVIEWS)
    await bus.create_topics([TopicSpec(t, partitions) for t in topics.ALL if t not in owned])


@dataclass
class Submitter:
    """Publishes a run's planned sessions at their offsets from ``t0`` (monotonic)."""

    bus: KafkaBus
    run: str
    plan: Sequence[PlannedSession]
    submitted: int = 0

    async def run_load(self, t0: float) -> None:
        protos = {s.task.name: task_to_proto(s.task) for s in self.plan}
        for s in self.plan:
            await asyncio.sleep(max(0.0, t0 + s.at_s - time.monotonic()))
            sid = session_id(self.run, s.index)
            event = task_pb2.TaskSubmitted(
                session_id=sid,
                task=protos[s.task.name],
                submitted_by=SAMPLED_BY if s.sampled else GREEDY_BY,
                seed=s.seed,
            )
            _, data = codec.encode_event(event, producer=PRODUCER, key=sid)
            await self.bus.publish(topics.TASKS, data, key=sid)
            self.submitted += 1


@dataclass
class Finished:
    """What the driver keeps of one finished session."""

    ratio: float
    """latency / lower bound (capped; the cap when incomplete)."""
    version: str
    """The version that decided it (``rules:cpls`` on the baseline arm of the cold start)."""
    role: str
    """Its arm's role (live, canary, baseline)."""
    completed: bool


@dataclass
class Tail:
    """Reader of the trajectories and the rollout registry of one run: a consumer group of
    its own (fresh, so it starts at the topics' beginnings; never committed), committed
    records only."""

    bus: KafkaBus
    run: str
    finished: dict[int, Finished] = field(default_factory=dict)
    """Planned index -> the session's first trajectory."""
    records: dict[int, int] = field(default_factory=dict)
    """Planned index -> trajectory records read (2+ = run twice)."""
    transitions: dict[int, rollout_pb2.RolloutTransition] = field(default_factory=dict)
    """Seq -> transition, as read."""
    state: rollout_pb2.RolloutState | None = None
    stats: AgentStats | None = None
    """When set, every trajectory read feeds it (a store of the run's sessions, as an
    orchestrator's; a trajectory the store refuses is skipped)."""
    split_overhead: float | None = None
    """The pool's advertised merge overhead, for :attr:`stats` (None: the default pool's)."""
    _subscriber: Subscriber | None = None

    async def start(self) -> None:
        """Join a fresh group on both topics (they must exist)."""
        group = f"{PRODUCER}.{self.run}.{uuid.uuid4().hex[:8]}"
        subscriber = self.bus.subscriber([topics.TRAJECTORIES, topics.ROLLOUT], group)
        await subscriber.start()
        self._subscriber = subscriber

    async def stop(self) -> None:
        if self._subscriber is not None:
            await self._subscriber.stop()
            self._subscriber = None

    async def poll(self, timeout_s: float = 0.5) -> int:
        """One fetch of what was committed since the last one; records read."""
        assert self._subscriber is not None, "Tail.start first"
        records = await self._subscriber.fetch(max_records=2000, timeout_s=timeout_s)
        for r in records:
            self._note(r.topic, r.value)
        return len(records)

    async def drain(self, timeout_s: float = 2.0) -> None:
        """Fetch until nothing more comes within ``timeout_s``."""
        while await self.poll(timeout_s):
            pass

    def _note(self, topic: str, value: bytes | None) -> None:
        if value is None:
            return
        if topic == topics.TRAJECTORIES:
            traj = codec.decode_event(value, trajectory_pb2.Trajectory)[1]
            i = index_of(self.run, traj.session_id)
            if i is None:
                return
            if self.stats is not None and i not in self.records:
                with contextlib.suppress(DecodeError):
                    self.stats.record_trajectory(traj, split_overhead=self.split_overhead)
            self.records[i] = self.records.get(i, 0) + 1
            role = trajectory_pb2.ArmRole.Name(traj.arm.role).removeprefix("ARM_ROLE_").lower()
            self.finished.setdefault(
                i,
                Finished(
                    ratio(traj.latency, traj.lower_bound, traj.completed),
                    traj.policy_version,
                    role,
                    traj.completed,
                ),
            )
            return
        msg = codec.unpack(codec.decode_envelope(value))
        if isinstance(msg, rollout_pb2.RolloutTransition):
            self.transitions.setdefault(msg.seq, msg)
        elif isinstance(msg, rollout_pb2.RolloutState) and (
            self.state is None or msg.seq >= self.state.seq
        ):
            self.state = msg


__all__ = ["Finished", "Submitter", "Tail", "create_topics", "index_of", "session_id"]
