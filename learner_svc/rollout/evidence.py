"""The controller's evidence so far, and the registry records it is read from and written to.

:class:`Evidence` is everything a restarted controller needs to go on counting where the last
one stopped: the absorbed input offsets, the shadow window, the stage's guardrails, the
stage's canary sessions, sessions per arm, the review sample, a bounded set of trajectory
ids already counted, and the statistics store of the sub-agents (fed once by every
trajectory absorbed; unlike the rest it outlives rollouts: it describes the sub-agents, not
a candidate). It round-trips through :class:`~podium.v1.rollout_pb2.ControllerCheckpoint`,
which is written in the same transaction as the input offsets it covers.

:class:`Registry` is what the rollout topic says: the newest state, the recent transitions and
the checkpoint (:func:`load_registry` reads it from the topic's records).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from google.protobuf.message import Message

from podium import codec
from podium.bus.base import Record
from podium.errors import ConfigError, DecodeError, PodiumError
from podium.observed import AgentStats
from podium.rollout import (
    DEFAULT_GUARDRAILS,
    AdvantageWindow,
    GuardrailMonitor,
    RolloutSettings,
)
from podium.rollout.routing import role_name
from podium.v1 import rollout_pb2, trajectory_pb2

_log = logging.getLogger(__name__)

STATE_KEY = "state"
"""Registry key of the newest RolloutState."""
CHECKPOINT_KEY = "checkpoint"
"""Registry key of the controller's checkpoint."""
TRANSITION_PREFIX = "transition:"
"""Registry keys of transitions: ``transition:<seq, 12 digits>``."""

KEEP_COMPARED = 1000
"""Trajectory ids remembered (in the checkpoint) to drop a duplicate scored trajectory."""
KEEP_REVIEW = 1000
"""Session ids kept in the review sample (most recent)."""
KEEP_TRANSITIONS = 200
"""Recent transitions kept in memory for GetStatus."""

STAGED = rollout_pb2.ROLLOUT_STAGE_STAGED
SHADOW = rollout_pb2.ROLLOUT_STAGE_SHADOW
IDLE = rollout_pb2.ROLLOUT_STAGE_IDLE


def transition_key(seq: int) -> str:
    """The registry key of the transition that produced state ``seq``."""
    return f"{TRANSITION_PREFIX}{seq:012d}"


def tp_key(topic: str, partition: int) -> str:
    """The checkpoint's key of an input partition: ``topic:partition``."""
    return f"{topic}:{partition}"


def review_sampled(session_id: str, sample_bp: int) -> bool:
    """Whether a canary session goes to human review: a stable hash of its id, salted so the
    sample is independent of the routing buckets (which decided it is a canary at all)."""
    digest = hashlib.sha256(f"review:{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 10_000 < sample_bp


def stats_bytes(stats: AgentStats | None) -> bytes:
    """The checkpoint form of a statistics store: UTF-8 JSON of its ``to_dict()`` (empty when
    there is none)."""
    if stats is None:
        return b""
    return json.dumps(stats.to_dict(), separators=(",", ":")).encode()


def stats_from_checkpoint(
    cp: rollout_pb2.ControllerCheckpoint, store: AgentStats | None
) -> AgentStats | None:
    """The statistics store ``cp`` holds, under the settings of ``store`` (the half-life and
    prior weight configured now win; the decayed sums carry over: the prior weight is applied
    when an estimate is read, the half-life to what is recorded next). None when ``store`` is
    None (the store is off). An empty store when the checkpoint has none (an older controller
    wrote it, or the store was off) or one that cannot be read (logged: the evidence of the
    sub-agents starts over from their advertisements; the rest of the checkpoint still
    counts, and one bad field must not stop the controller)."""
    if store is None:
        return None
    empty = AgentStats(half_life=store.half_life, prior_weight=store.prior_weight)
    if not cp.agent_stats:
        return empty
    try:
        data = json.loads(cp.agent_stats.decode("utf-8"))
        if isinstance(data, dict):
            data = {**data, "half_life": store.half_life, "prior_weight": store.prior_weight}
        return AgentStats.from_dict(data)
    except (ValueError, ConfigError) as exc:  # UnicodeDecodeError, JSONDecodeError included
        _log.error(
            "rollout: the checkpoint's agent stats (seq %d) are unreadable (%s): the store "
            "starts over from the advertised profiles",
            cp.seq,
            exc,
        )
        return empty


def arm_label(arm: trajectory_pb2.Arm) -> str:
    """``<role>:<version>`` of a trajectory's arm, e.g. ``canary:7`` (the checkpoint's key,
    as :attr:`podium.rollout.Route.label` names arms)."""
    return f"{role_name(arm.role)}:{arm.policy_version}"


@dataclass
class Evidence:
    """The accumulators of the current rollout (see the module docstring). Mutable: the
    controller works on a copy (:meth:`copy`) and keeps it only once its transaction commits."""

    settings: RolloutSettings
    absorbed: dict[str, int] = field(default_factory=dict)
    shadow: AdvantageWindow | None = None
    guardrails: GuardrailMonitor | None = None
    stage_sessions: int = 0
    arm_sessions: dict[str, int] = field(default_factory=dict)
    review_queue: deque[str] = field(default_factory=lambda: deque(maxlen=KEEP_REVIEW))
    compared: deque[str] = field(default_factory=lambda: deque(maxlen=KEEP_COMPARED))
    stats: AgentStats | None = None
    """What the sub-agents were observed to do (None: the store is off)."""

    def __post_init__(self) -> None:
        self._compared_set = set(self.compared)

    @classmethod
    def fresh(cls, settings: RolloutSettings, stats: AgentStats | None = None) -> Evidence:
        """Nothing counted yet; ``stats``: an empty statistics store (None: off)."""
        return cls(settings, stats=stats)

    @classmethod
    def from_checkpoint(
        cls,
        settings: RolloutSettings,
        cp: rollout_pb2.ControllerCheckpoint,
        state: rollout_pb2.RolloutState,
        store: AgentStats | None = None,
    ) -> Evidence:
        """The evidence a checkpoint holds, for a rollout in ``state`` (the shadow window
        exists only in SHADOW, the guardrails only while STAGED); its statistics store under
        ``store``'s settings (:func:`stats_from_checkpoint`; None: the store is off)."""
        return cls(
            settings,
            absorbed=dict(cp.absorbed),
            shadow=(
                AdvantageWindow.from_checkpoint(settings.advantage, cp)
                if state.stage == SHADOW
                else None
            ),
            guardrails=(
                GuardrailMonitor(DEFAULT_GUARDRAILS, settings.guardrails, cp.guardrails)
                if state.stage == STAGED
                else None
            ),
            stage_sessions=int(cp.stage_sessions),
            arm_sessions={k: int(v) for k, v in cp.arm_sessions.items()},
            review_queue=deque(cp.review_queue, maxlen=KEEP_REVIEW),
            compared=deque(cp.compared, maxlen=KEEP_COMPARED),
            stats=stats_from_checkpoint(cp, store),
        )

    def to_checkpoint(self, state: rollout_pb2.RolloutState) -> rollout_pb2.ControllerCheckpoint:
        """The checkpoint of this evidence under ``state``."""
        cp = rollout_pb2.ControllerCheckpoint(
            seq=state.seq,
            writer_epoch=state.writer_epoch,
            stage_sessions=self.stage_sessions,
            review_queue=list(self.review_queue),
            compared=list(self.compared),
            agent_stats=stats_bytes(self.stats),
        )
        cp.absorbed.update(self.absorbed)
        cp.arm_sessions.update(self.arm_sessions)
        if self.shadow is not None:
            self.shadow.to_checkpoint(cp)
        if self.guardrails is not None:
            cp.guardrails.extend(self.guardrails.to_proto())
        return cp

    def copy(self, state: rollout_pb2.RolloutState) -> Evidence:
        """An independent copy (through the checkpoint form: the one serialisation)."""
        return Evidence.from_checkpoint(self.settings, self.to_checkpoint(state), state, self.stats)

    def seen(self, trajectory_id: str) -> bool:
        """Whether ``trajectory_id`` was counted already; remembers it if not."""
        if not trajectory_id:
            return False
        if trajectory_id in self._compared_set:
            return True
        if len(self.compared) == self.compared.maxlen:
            self._compared_set.discard(self.compared[0])
        self.compared.append(trajectory_id)
        self._compared_set.add(trajectory_id)
        return False

    def record_executions(
        self, trajectory: trajectory_pb2.Trajectory, split_overhead: float
    ) -> int | None:
        """Feed the statistics store with ``trajectory``'s finished executions (the caller
        feeds each trajectory once: :meth:`seen`); how many were recorded, 0 when the store is
        off. A trajectory whose executions do not fit its task is logged and not recorded at
        all (None): the store loses one session's evidence, the rest of the evidence still
        counts the session."""
        if self.stats is None:
            return 0
        try:
            return self.stats.record_trajectory(trajectory, split_overhead=split_overhead)
        except PodiumError as exc:  # DecodeError: nothing of it was recorded
            _log.warning(
                "rollout: trajectory %r not recorded in the agent stats: %s",
                trajectory.trajectory_id,
                exc,
            )
            return None

    def count_arm(self, arm: trajectory_pb2.Arm) -> None:
        """One more session on ``arm``."""
        label = arm_label(arm)
        self.arm_sessions[label] = self.arm_sessions.get(label, 0) + 1

    def enter(self, before: rollout_pb2.RolloutState, after: rollout_pb2.RolloutState) -> None:
        """Reset what a transition from ``before`` to ``after`` makes stale: a new rollout
        starts its arm counts; shadow starts an empty window; each stage its own guardrails
        and session count; IDLE keeps nothing but the arm counts and the review sample."""
        stage_changed = (before.stage, before.canary_percent) != (after.stage, after.canary_percent)
        if after.rollout_id != before.rollout_id and after.rollout_id:
            self.arm_sessions = {}
            self.review_queue.clear()
        if not stage_changed:
            return
        self.stage_sessions = 0
        self.shadow = AdvantageWindow(self.settings.advantage) if after.stage == SHADOW else None
        self.guardrails = (
            GuardrailMonitor(DEFAULT_GUARDRAILS, self.settings.guardrails)
            if after.stage == STAGED
            else None
        )


@dataclass
class Registry:
    """What the rollout topic holds: the newest state, recent transitions, the checkpoint."""

    state: rollout_pb2.RolloutState | None = None
    transitions: deque[rollout_pb2.RolloutTransition] = field(
        default_factory=lambda: deque(maxlen=KEEP_TRANSITIONS)
    )
    checkpoint: rollout_pb2.ControllerCheckpoint | None = None
    proposals: dict[str, float] = field(default_factory=dict)
    """Version -> when it was last proposed (unix seconds), from every transition read."""

    def record(self, transition: rollout_pb2.RolloutTransition) -> None:
        """Keep ``transition`` (and the state it produced) as the newest."""
        self.transitions.append(transition)
        self.state = transition.state
        if transition.kind == rollout_pb2.TRANSITION_KIND_CANDIDATE_PROPOSED:
            at = transition.at.ToMicroseconds() / 1e6
            self.proposals[transition.state.candidate_version] = at


_TYPES: dict[str, type[Message]] = {
    STATE_KEY: rollout_pb2.RolloutState,
    CHECKPOINT_KEY: rollout_pb2.ControllerCheckpoint,
    TRANSITION_PREFIX: rollout_pb2.RolloutTransition,
}


def _decode(record: Record) -> Message | None:
    """The message of one registry record, or None if unreadable or of no known key (logged,
    skipped: one bad record must not stop the controller from reading the rest)."""
    key = (record.key or b"").decode("utf-8", "replace")
    kind = TRANSITION_PREFIX if key.startswith(TRANSITION_PREFIX) else key
    cls = _TYPES.get(kind)
    if cls is None:
        return None
    try:
        return codec.decode_event(record.value, cls)[1]
    except DecodeError as exc:
        _log.warning(
            "rollout registry %s[%d]@%d unreadable: %s",
            record.topic,
            record.partition,
            record.offset,
            exc,
        )
        return None


def load_registry(records: Iterable[Record]) -> Registry:
    """The registry the records of the rollout topic describe (in the order written): the
    state with the highest seq (seqs only grow), transitions in seq order, and the last
    checkpoint written under the highest seq."""
    states: list[rollout_pb2.RolloutState] = []
    transitions: dict[int, rollout_pb2.RolloutTransition] = {}
    checkpoints: list[rollout_pb2.ControllerCheckpoint] = []
    for record in records:
        msg = _decode(record)
        if isinstance(msg, rollout_pb2.RolloutState):
            states.append(msg)
        elif isinstance(msg, rollout_pb2.RolloutTransition):
            transitions[msg.seq] = msg
        elif isinstance(msg, rollout_pb2.ControllerCheckpoint):
            checkpoints.append(msg)
    registry = Registry()
    for seq in sorted(transitions):
        registry.record(transitions[seq])
    for st in states:  # ties: the later record wins (it was written after)
        if registry.state is None or st.seq >= registry.state.seq:
            registry.state = st
    for cp in checkpoints:  # one seq has a checkpoint per batch absorbed: the last counts
        if registry.checkpoint is None or cp.seq >= registry.checkpoint.seq:
            registry.checkpoint = cp
    return registry


def newest_first(records: Sequence[Record], n: int) -> list[Record]:
    """The ``n`` newest of ``records`` by broker timestamp (then offset)."""
    ordered = sorted(records, key=lambda r: (r.timestamp_ms, r.offset), reverse=True)
    return ordered[:n]
