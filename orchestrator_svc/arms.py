"""Rollout arms: every replica applies the rollout state and routes each session by it.

The rollout controller (learner_svc in ``rollout`` mode, the one fenced writer) keeps the
rollout state on the compacted topic :data:`~podium.topics.ROLLOUT` under the key ``state``.
Each orchestrator replica runs a :class:`RolloutFollower` in a consumer group of its own
(``<group>.rollout.<instance>``):

* :meth:`RolloutFollower.start` first reads the whole topic as it is now (compaction keeps
  the last state), so it returns *caught up*: the app starts it before task intake and gRPC,
  and the first session routes by the current state, never by an empty one;
* :meth:`RolloutFollower.run` then follows the topic live, so a state change (a promotion, a
  rollback) reaches new sessions within the propagation delay it measures
  (:attr:`RolloutFollower.propagation_ms`).

A state is applied only when its ``seq`` is higher than the applied one and its
``writer_epoch`` is at least the highest epoch applied: a zombie controller's late write (an
older generation) or a replayed older state never moves routing back. Transitions and
checkpoints on the same topic are the controller's and are skipped; an unreadable record is
logged and skipped (routing stays where it was, which is the safe side).

A session's arm is chosen once, when it starts (:func:`podium.rollout.route`, a stable hash
of its session id, so every replica agrees), and kept to its end: a rollback sends *new*
sessions to the previous version at once while sessions in flight finish on theirs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from podium import codec, topics
from podium.bus import Bus, read_committed
from podium.bus.base import Record
from podium.bus.follower import TopicFollower
from podium.errors import DecodeError
from podium.rollout.routing import Route, route
from podium.v1 import rollout_pb2, trajectory_pb2

_log = logging.getLogger(__name__)

STATE_KEY = b"state"
"""Key of the rollout state on :data:`~podium.topics.ROLLOUT` (transitions and the
controller's checkpoint have keys of their own)."""


def parse_state(record: Record) -> rollout_pb2.RolloutState | None:
    """The rollout state in ``record``, or None: another key (a transition, the checkpoint),
    a tombstone, or an unreadable value (logged: never fatal, routing stays as it was)."""
    if record.key != STATE_KEY or record.value is None:
        return None
    try:
        _, state = codec.decode_event(record.value, rollout_pb2.RolloutState)
    except DecodeError as exc:
        _log.warning(
            "rollout %s[%d]@%d unreadable, skipped: %s",
            record.topic,
            record.partition,
            record.offset,
            exc,
        )
        return None
    return state


def supersedes(
    new: rollout_pb2.RolloutState, current: rollout_pb2.RolloutState | None, epoch: int
) -> bool:
    """Whether ``new`` replaces ``current``: a higher seq, from a writer generation at least
    ``epoch`` (the highest applied). Anything else is a replay or a fenced writer's."""
    if new.writer_epoch < epoch:
        return False
    return current is None or new.seq > current.seq


def effective_route(
    chosen: Route, live: str, available: Callable[[str], bool], cold_start: str
) -> Route:
    """``chosen`` if its version can run here, else the live version (else ``cold_start``) in
    the live role, with a warning: a version the state names but this replica has not loaded
    (yet) must not stop the session, and the arm must say what actually decided."""
    if available(chosen.version):
        return chosen
    fallback = live if live and available(live) else cold_start
    _log.warning(
        "rollout seq %d routes bucket %d to %s, which is not loaded here; %s decides instead",
        chosen.seq,
        chosen.bucket,
        chosen.label,
        fallback,
    )
    return replace(chosen, version=fallback, role=trajectory_pb2.ARM_ROLE_LIVE)


class RolloutFollower(TopicFollower):
    """Follows the rollout state (a :class:`~podium.service.Worker`); see the module doc."""

    def __init__(
        self,
        bus: Bus,
        group_id: str,
        *,
        topic: str = topics.ROLLOUT,
        cold_start: str = "rules:cpls",
        on_state: Callable[[rollout_pb2.RolloutState], None] | None = None,
    ) -> None:
        """``group_id``: this replica's own group (``<group>.rollout.<instance>``); ``topic``:
        the rollout topic (``PODIUM_ROLLOUT_TOPIC``); ``cold_start``: the version routed to before any state exists; ``on_state`` is called
        with each applied state (e.g. to keep the versions it names loaded)."""
        super().__init__(bus, [topic], group_id)
        self.topic = topic
        self.cold_start = cold_start
        self.on_state = on_state
        self.state: rollout_pb2.RolloutState | None = None
        """The applied state (None before any: routing is the cold start)."""
        self.epoch = 0
        """Highest writer epoch applied."""
        self.propagation_ms: list[float] = []
        """Per state applied while following (after :meth:`start`'s catch-up, whose states may
        be hours old): wall milliseconds from its ``changed_at`` to its application here, the
        state's propagation delay to this replica (the last 10,000)."""
        self.ignored = 0
        """States read and not applied (older seq or epoch)."""
        self._caught_up = False

    def caught_up(self) -> bool:
        """Whether the topic has been read to its end as it was at :meth:`start`."""
        return self._caught_up

    def route(self, session_id: str) -> Route:
        """The arm of ``session_id`` under the applied state (the same on every replica that
        applied the same state)."""
        return route(session_id, self.state, cold_start=self.cold_start)

    def apply(self, state: rollout_pb2.RolloutState) -> bool:
        """Apply ``state`` if it supersedes the applied one (:func:`supersedes`); whether it
        did. Records its propagation delay."""
        if not supersedes(state, self.state, self.epoch):
            self.ignored += 1
            replay = state.writer_epoch >= self.epoch
            # History re-read (the group reading again what start() read: compaction keeps
            # older states until it runs) is routine; only a fenced writer's state is news.
            _log.log(
                logging.DEBUG if replay else logging.WARNING,
                "rollout state seq %d (epoch %d) ignored: applied seq %d, epoch %d",
                state.seq,
                state.writer_epoch,
                self.state.seq if self.state is not None else 0,
                self.epoch,
            )
            return False
        self.state = state
        self.epoch = max(self.epoch, state.writer_epoch)
        if self._caught_up and state.HasField("changed_at"):
            changed_ms = state.changed_at.ToMilliseconds()
            self.propagation_ms.append(time.time() * 1000.0 - changed_ms)
            del self.propagation_ms[:-10_000]
        if self.on_state is not None:
            self.on_state(state)
        _log.info(
            "rollout state seq %d: live %s, candidate %s, stage %s %d%% (%s)",
            state.seq,
            state.live_version,
            state.candidate_version or "-",
            rollout_pb2.RolloutStage.Name(state.stage),
            state.canary_percent,
            state.reason or "no reason given",
        )
        return True

    def _apply_records(self, records: list[Record]) -> None:
        for record in records:
            state = parse_state(record)
            if state is not None:
                self.apply(state)

    async def start(self) -> None:
        """Read the topic to its end (the current state), then join this replica's group."""
        self._apply_records(await read_committed(self.bus, self.topic))
        self._caught_up = True
        await super().start()

    async def handle(self, records: list[Record]) -> None:
        # Committed only to spare a restarted replica the replay: start() reads all anyway.
        self._apply_records(records)
