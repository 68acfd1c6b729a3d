"""Human review of sensitive subtasks: the gate, its events, and the gRPC ReviewService.

A subtask marked ``sensitive`` (e.g. a database write) does not start when the policy first
starts it: the session *holds* it (:meth:`podium.envs.swarm.state.SwarmState.hold`) and asks
the :class:`ReviewGate` for a human decision. The rest of the session goes on meanwhile: other
ready subtasks keep being scheduled, and the session only waits (wall clock, never simulated
time) when nothing else can be done. Approved, the subtask is runnable again and the policy
starts it; rejected or expired (the default at ``PODIUM_REVIEW_DEADLINE_S``), it never runs
and neither do its dependents: the session ends, not completed, once nothing else can run.

Every replica sees every review through ``podium.reviews.v1`` (``ReviewEvent`` envelopes, key:
review id):

* the owning replica publishes ``requested`` (a ``PendingReview``) when it holds a subtask;
* ``Approve`` / ``Reject`` on *any* replica's ReviewService publish ``decided`` (a
  ``ReviewRecord``); the owner publishes ``decided`` EXPIRED at the deadline;
* every replica follows the topic (:meth:`ReviewGate.on_event`; the history is read once at
  start, so a new replica lists what is already pending). The **first** ``decided`` of a review
  on the topic wins (one key, one partition: one order for all replicas); the owner applies
  it. A caller whose decision was not first gets ``FAILED_PRECONDITION`` naming the verdict
  that was: Approve/Reject wait until their own event is read back before answering.

A pending review whose deadline has passed, or that a later run of the same session and
subtask superseded (the session was taken over by another replica), is not listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
import grpc.aio

from podium import codec, topics
from podium.bus.base import Record
from podium.bus.consumer import EventPublisher
from podium.errors import BusError, DecodeError, PodiumError
from podium.service.auth import principal
from podium.service.rich_status import abort_bad_request
from podium.v1 import envelope_pb2, review_pb2, trajectory_pb2

_log = logging.getLogger(__name__)

APPROVED = trajectory_pb2.REVIEW_VERDICT_APPROVED
REJECTED = trajectory_pb2.REVIEW_VERDICT_REJECTED
EXPIRED = trajectory_pb2.REVIEW_VERDICT_EXPIRED

DEADLINE_REVIEWER = "deadline"
"""``ReviewRecord.reviewer`` of a review nobody decided in time."""
SESSION_END_REVIEWER = "orchestrator"
"""``ReviewRecord.reviewer`` of a review whose session ended before any decision."""

SERVICE_NAME = review_pb2.DESCRIPTOR.services_by_name["ReviewService"].full_name
"""``podium.v1.ReviewService``."""


class ReviewNotFound(PodiumError):
    """No pending review has this id (never requested, or forgotten)."""


class ReviewDecided(PodiumError):
    """The review was decided already; the message names the earlier verdict."""


def verdict_name(verdict: int) -> str:
    """``approved``, ``rejected`` or ``expired``."""
    return (
        trajectory_pb2.ReviewVerdict.Name(trajectory_pb2.ReviewVerdict.ValueType(verdict))
        .removeprefix("REVIEW_VERDICT_")
        .lower()
    )


def review_id_for(session_id: str, run_id: str, subtask_id: str) -> str:
    """The review id of a subtask of one run of a session (unique per run and subtask)."""
    return f"{session_id}.{run_id}.{subtask_id}"


@dataclass(frozen=True)
class ReviewSettings:
    """How the gate of one replica behaves."""

    instance: str
    """This replica (recorded in ``PendingReview.instance``; the owner of its holds)."""
    deadline_s: float = 3600.0
    """Seconds a held subtask waits for a decision before it expires (rejected)."""
    decide_timeout_s: float = 10.0
    """How long a decision waits to read itself back from the topic (UNAVAILABLE after)."""
    publish_timeout_s: float = 30.0
    """How long publishing a review event retries transient broker errors."""
    keep_decided: int = 100_000
    """Decided reviews remembered (to answer a late decision with the earlier verdict); also
    the most pending ones kept (a replica that died holding some never decides them)."""


@dataclass
class _Decided:
    record: trajectory_pb2.ReviewRecord
    event_id: str


class ReviewGate:
    """One replica's view of every review and the holds it owns (see the module docstring)."""

    def __init__(self, publisher: EventPublisher, settings: ReviewSettings) -> None:
        self.publisher = publisher
        self.settings = settings
        self.pending: OrderedDict[str, review_pb2.PendingReview] = OrderedDict()
        """Reviews waiting for a decision, on any replica, in request order."""
        self.decided: OrderedDict[str, _Decided] = OrderedDict()
        """The first decision of each review read from the topic (bounded, oldest dropped)."""
        self._latest: dict[tuple[str, str], str] = {}
        """(session id, subtask id) -> its latest review id: a newer run supersedes older."""
        self._local: dict[str, asyncio.Future[trajectory_pb2.ReviewRecord]] = {}
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Condition()

    # ----------------------------------------------------------------- owner side

    async def request(
        self, pending: review_pb2.PendingReview
    ) -> asyncio.Future[trajectory_pb2.ReviewRecord]:
        """Announce a hold owned here; the future resolves with its decision (the first on
        the topic, or EXPIRED at the deadline). Raises BusError if it cannot be announced."""
        now = datetime.now(UTC)
        pending.instance = self.settings.instance
        pending.requested_at.FromDatetime(now)
        pending.deadline.FromDatetime(now + timedelta(seconds=self.settings.deadline_s))
        rid = pending.review_id
        future: asyncio.Future[trajectory_pb2.ReviewRecord] = (
            asyncio.get_running_loop().create_future()
        )
        self._local[rid] = future
        try:
            await self._publish(review_pb2.ReviewEvent(requested=pending), rid, f"requested:{rid}")
        except BaseException:
            self._local.pop(rid, None)
            raise
        self._apply_requested(pending)  # listed here at once, before the follower reads it
        self._timers[rid] = asyncio.create_task(self._expire(pending), name=f"review {rid}")
        return future

    async def _expire(self, pending: review_pb2.PendingReview) -> None:
        """At the deadline, publish EXPIRED (unless decided); should the topic not deliver
        it back in time, resolve the hold here anyway: a hold never outlives its deadline by
        more than ``decide_timeout_s``."""
        rid = pending.review_id
        await asyncio.sleep(self.settings.deadline_s)
        if rid in self.decided:
            return
        record = _record(pending, EXPIRED, DEADLINE_REVIEWER, (
            f"no decision within {self.settings.deadline_s:g}s: rejected by default"
        ))  # fmt: skip
        with contextlib.suppress(BusError, ReviewDecided, TimeoutError):
            await self._decide_record(record)
        future = self._local.pop(rid, None)
        if future is not None and not future.done():
            _log.warning("review %s: expiry not read back from the topic; expired here", rid)
            future.set_result(record)

    async def abandon(
        self, review_ids: Iterable[str], reason: str
    ) -> list[trajectory_pb2.ReviewRecord]:
        """End holds whose session ended before a decision: each is decided EXPIRED by
        ``orchestrator`` (so no replica lists it any more); returns the records."""
        records = []
        for rid in review_ids:
            pending = self.pending.get(rid)
            timer = self._timers.pop(rid, None)
            if timer is not None:
                timer.cancel()
            self._local.pop(rid, None)
            if pending is None:
                continue
            record = _record(pending, EXPIRED, SESSION_END_REVIEWER, reason)
            with contextlib.suppress(BusError, ReviewDecided, TimeoutError):
                record = await self._decide_record(record)
            records.append(record)
        return records

    async def close(self) -> None:
        """Cancel the deadline timers (the process stops; its sessions are re-run)."""
        timers, self._timers = list(self._timers.values()), {}
        for t in timers:
            t.cancel()
        for t in timers:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    # ----------------------------------------------------------------- any replica

    def list_pending(self, session_id: str = "") -> list[review_pb2.PendingReview]:
        """Reviews waiting now (deadline not passed), oldest first; ``session_id`` filters."""
        now = datetime.now(UTC)
        return [
            p
            for p in self.pending.values()
            if (not session_id or p.session_id == session_id) and p.deadline.ToDatetime(UTC) > now
        ]

    async def decide(
        self, review_id: str, verdict: int, reviewer: str, reason: str
    ) -> trajectory_pb2.ReviewRecord:
        """Approve or reject ``review_id`` as ``reviewer``; the record as decided. Raises
        ReviewNotFound, ReviewDecided (naming the earlier verdict), BusError or TimeoutError."""
        earlier = self.decided.get(review_id)
        if earlier is not None:
            raise ReviewDecided(_already(earlier.record))
        pending = self.pending.get(review_id)
        if pending is None:
            raise ReviewNotFound(f"no pending review {review_id!r}")
        return await self._decide_record(_record(pending, verdict, reviewer, reason))

    async def _decide_record(
        self, record: trajectory_pb2.ReviewRecord
    ) -> trajectory_pb2.ReviewRecord:
        """Publish ``record`` and wait until the topic says whether it was the first."""
        rid = record.review_id
        record.decided_at.FromDatetime(datetime.now(UTC))
        record.wait_s = max(
            0.0, (record.decided_at.ToDatetime(UTC) - record.requested_at.ToDatetime(UTC)).total_seconds()
        )  # fmt: skip
        event_id = f"decided:{rid}:{uuid.uuid4().hex}"
        await self._publish(review_pb2.ReviewEvent(decided=record), rid, event_id)
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: rid in self.decided),
                self.settings.decide_timeout_s,
            )
        winner = self.decided[rid]
        if winner.event_id != event_id:
            raise ReviewDecided(_already(winner.record))
        return winner.record

    async def _publish(self, event: review_pb2.ReviewEvent, key: str, event_id: str) -> None:
        """Publish, retrying transient broker errors for up to ``publish_timeout_s`` (a broker
        stall delays a hold or a decision rather than failing it; the event id stays the same,
        so a retry after an unconfirmed send is deduplicated)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.publish_timeout_s
        delay = 0.1
        while True:
            try:
                await self.publisher.publish(
                    topics.REVIEWS, event, key=key, idempotency_key=event_id, event_id=event_id
                )
                return
            except BusError as exc:
                if not exc.retriable or loop.time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # ----------------------------------------------------------------- the follower

    def load(self, records: Iterable[Record]) -> None:
        """Apply the topic's history (read once at start, before following it live)."""
        for record in records:
            try:
                envelope, event = codec.decode_event(record.value, review_pb2.ReviewEvent)
            except DecodeError as exc:
                _log.warning("reviews %s@%d unreadable: %s", record.partition, record.offset, exc)
                continue
            self._apply(envelope, event)

    async def on_event(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        """The follower's handler: apply one ReviewEvent read live."""
        self._apply(envelope, codec.unpack_as(envelope, review_pb2.ReviewEvent))
        async with self._changed:
            self._changed.notify_all()

    def _apply(self, envelope: envelope_pb2.Envelope, event: review_pb2.ReviewEvent) -> None:
        kind = event.WhichOneof("event")
        if kind == "requested":
            self._apply_requested(event.requested)
        elif kind == "decided":
            self._apply_decided(event.decided, envelope.event_id)

    def _apply_requested(self, pending: review_pb2.PendingReview) -> None:
        rid = pending.review_id
        if not rid or rid in self.decided or rid in self.pending:
            return
        key = (pending.session_id, pending.subtask_id)
        older = self._latest.get(key)
        if older is not None and older != rid:
            self.pending.pop(older, None)  # a later run of the session holds it now
        self._latest[key] = rid
        self.pending[rid] = pending
        while len(self.pending) > self.settings.keep_decided:
            self.pending.popitem(last=False)

    def _apply_decided(self, record: trajectory_pb2.ReviewRecord, event_id: str) -> None:
        rid = record.review_id
        if not rid or rid in self.decided:
            return  # the first decision on the topic wins
        self.decided[rid] = _Decided(record, event_id)
        while len(self.decided) > self.settings.keep_decided:
            self.decided.popitem(last=False)
        pending = self.pending.pop(rid, None)
        if (
            pending is not None
            and self._latest.get((pending.session_id, pending.subtask_id)) == rid
        ):
            del self._latest[(pending.session_id, pending.subtask_id)]
        timer = self._timers.pop(rid, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        future = self._local.pop(rid, None)
        if future is not None and not future.done():
            future.set_result(record)


def _record(
    pending: review_pb2.PendingReview, verdict: int, reviewer: str, reason: str
) -> trajectory_pb2.ReviewRecord:
    """The decision record of ``pending`` (times filled in when it is published)."""
    record = trajectory_pb2.ReviewRecord(
        review_id=pending.review_id,
        subtask_id=pending.subtask_id,
        verdict=trajectory_pb2.ReviewVerdict.ValueType(verdict),
        reviewer=reviewer,
        reason=reason,
        session_id=pending.session_id,
        agent=pending.agent,
    )
    record.requested_at.CopyFrom(pending.requested_at)
    return record


def _already(record: trajectory_pb2.ReviewRecord) -> str:
    return (
        f"review {record.review_id!r} was already {verdict_name(record.verdict)} by "
        f"{record.reviewer!r}" + (f" ({record.reason})" if record.reason else "")
    )


# --------------------------------------------------------------------------- gRPC


class ReviewServicer:
    """ReviewService over this replica's :class:`ReviewGate`; the reviewer is the caller's
    authenticated principal (see :mod:`podium.service.auth`)."""

    def __init__(self, gate: ReviewGate) -> None:
        self.gate = gate

    async def ListPending(
        self, request: review_pb2.ListPendingRequest, context: grpc.aio.ServicerContext
    ) -> review_pb2.ListPendingResponse:
        return review_pb2.ListPendingResponse(reviews=self.gate.list_pending(request.session_id))

    async def Approve(
        self, request: review_pb2.ApproveRequest, context: grpc.aio.ServicerContext
    ) -> review_pb2.ApproveResponse:
        record = await self._decide(context, request.review_id, APPROVED, request.reason)
        return review_pb2.ApproveResponse(review=record)

    async def Reject(
        self, request: review_pb2.RejectRequest, context: grpc.aio.ServicerContext
    ) -> review_pb2.RejectResponse:
        if not request.reason.strip():
            await abort_bad_request(
                context, "reason is required to reject", [("reason", "required to reject")]
            )
        record = await self._decide(context, request.review_id, REJECTED, request.reason)
        return review_pb2.RejectResponse(review=record)

    async def _decide(
        self, context: grpc.aio.ServicerContext, review_id: str, verdict: int, reason: str
    ) -> trajectory_pb2.ReviewRecord:
        if not review_id:
            await abort_bad_request(context, "review_id is empty", [("review_id", "empty")])
        reviewer = principal(context) or f"grpc:{context.peer()}"
        try:
            return await self.gate.decide(review_id, verdict, reviewer, reason[:2000])
        except ReviewNotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except ReviewDecided as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except (BusError, TimeoutError) as exc:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"decision not confirmed by the event bus: {exc}"
            )
        raise AssertionError("unreachable: abort raises")


__all__ = [
    "APPROVED",
    "DEADLINE_REVIEWER",
    "EXPIRED",
    "REJECTED",
    "SERVICE_NAME",
    "SESSION_END_REVIEWER",
    "ReviewDecided",
    "ReviewGate",
    "ReviewNotFound",
    "ReviewServicer",
    "ReviewSettings",
    "review_id_for",
    "verdict_name",
]
