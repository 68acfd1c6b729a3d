"""The session ledger: one ``SessionDone`` per finished session on a compacted topic.

Written by the owner of a session's tasks partition in the same transaction as the session's
Trajectory and the offset commit of its TaskSubmitted (:mod:`orchestrator_svc.intake`), so the
ledger says "done" exactly when the trajectory exists. It is read twice:

* whole, on partition take-over (:func:`podium.bus.read_committed`): which sessions of the new partitions
  already ended, so a redelivered TaskSubmitted of a finished session is skipped;
* followed live by every replica (:class:`LedgerFollower`, a group of its own per replica,
  starting at the end): a replica that accepted a SubmitTask but does not own the session's
  partition ends that session's stream with the result the owner recorded.

Values are ``SessionDone`` messages in codec envelopes, like every record on a Podium topic
(so every reader, the fault suite's auditor included, decodes them the one way); the ledger is
state keyed by session id and stays small (no trajectory in it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from podium import codec, topics
from podium.bus import Bus
from podium.bus.base import Record
from podium.bus.follower import TopicFollower
from podium.errors import DecodeError
from podium.v1 import orchestrator_pb2

_log = logging.getLogger(__name__)

LEDGER = topics.ORCHESTRATOR_SESSIONS
"""The ledger topic."""

OnDone = Callable[[orchestrator_pb2.SessionDone], Awaitable[None]]
"""Called with each ledger entry a follower reads."""


def parse_done(record: Record, group_id: str) -> orchestrator_pb2.SessionDone | None:
    """The ledger entry of ``record`` if it belongs to this deployment (``group_id``), else
    None (another deployment's, or unreadable: logged, never fatal, the ledger is advisory
    for the entries it cannot read and authoritative only for those it can)."""
    try:
        _, done = codec.decode_event(record.value, orchestrator_pb2.SessionDone)
    except DecodeError as exc:
        _log.warning(
            "ledger %s[%d]@%d unreadable: %s", record.topic, record.partition, record.offset, exc
        )
        return None
    if not done.session_id or done.group_id != group_id:
        return None
    return done


class LedgerFollower(TopicFollower):
    """Reads the ledger live in a group of its own and calls ``on_done`` per entry.

    A :class:`~podium.service.Worker`. Every replica has one (``<group>.ledger.<instance>``);
    on Kafka the app positions the group at the end before starting, so history is not
    replayed (what a replica needs of history it reads on take-over with :func:`podium.bus.read_committed`).
    """

    def __init__(self, bus: Bus, group_id: str, deployment: str, on_done: OnDone) -> None:
        """``deployment`` is the ``PODIUM_GROUP_ID`` whose entries count (see :func:`parse_done`)."""
        super().__init__(bus, [LEDGER], group_id)
        self.deployment = deployment
        self.on_done = on_done

    async def handle(self, records: list[Record]) -> None:
        for record in records:
            done = parse_done(record, self.deployment)
            if done is not None:
                await self.on_done(done)
