"""Task intake: a TaskSubmitted is consumed only once its session's trajectory is published.

``podium.tasks.v1`` is read through a per-partition :class:`~podium.bus.TransactionalMember`
(one transactional id per tasks partition, claimed before the partition's offset is read, so
a replica that takes a partition over fences the previous owner first). Sessions run for
minutes and many at once, so a partition's consumed position cannot follow each record:

* :class:`PartitionTrack` keeps, per owned partition, the records whose sessions are in flight;
  the committed offset is the *watermark*: the offset after the highest record below which
  every session has ended;
* when a session ends, :meth:`TaskIntake.complete` publishes its Trajectory and its
  ``SessionDone`` ledger entry (:mod:`orchestrator_svc.ledger`) in ONE transaction of that
  partition, committing the watermark (or no offset, ``commit([])``, when it did not move).

So a crash (kill -9) leaves every unfinished session's TaskSubmitted uncommitted: the next
owner re-runs it from its seed (a fresh run id makes the old run's sub-agent results stale),
and skips the redelivered TaskSubmitted of every session the ledger says has ended. A fenced
or revoked owner can never commit, hence never publishes a trajectory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator_svc.ledger import LEDGER, parse_done
from podium import codec, topics
from podium.bus import Bus, read_committed
from podium.bus.base import TP, Headers, Record, TransactionFencedError
from podium.bus.consumer import consume_span, dead_letter_headers, encode_record
from podium.errors import BusError, DecodeError, PodiumError
from podium.v1 import orchestrator_pb2, task_pb2

_log = logging.getLogger(__name__)

MAX_FETCH = 16
"""TaskSubmitted records fetched at once (each may start a session)."""


@dataclass(frozen=True)
class Output:
    """One record to publish in a partition's transaction."""

    topic: str
    value: bytes
    key: str
    headers: Headers = ()


class PartitionLost(PodiumError):
    """The tasks partition of a session is not this replica's any more (revoked or fenced):
    nothing may be published for it here, its next owner re-runs the session."""


class PartitionTrack:
    """The records of one tasks partition whose sessions are in flight, in offset order."""

    def __init__(self) -> None:
        self._records: OrderedDict[int, Record] = OrderedDict()
        self._done: set[int] = set()

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, offset: int) -> bool:
        return offset in self._records

    def add(self, record: Record) -> None:
        """Track ``record`` (fetched in offset order, so appending keeps the order)."""
        self._records[record.offset] = record

    def finish(self, offset: int) -> None:
        """Mark the session of ``offset`` ended (its outputs are being committed)."""
        if offset in self._records:
            self._done.add(offset)

    def watermark(self) -> Record | None:
        """The highest record below which every tracked record is finished (None: the first
        tracked one is still in flight): committing it commits the watermark."""
        last = None
        for offset, record in self._records.items():
            if offset not in self._done:
                break
            last = record
        return last

    def release(self, upto: Record) -> None:
        """Forget the records up to ``upto`` once their offsets are committed."""
        while self._records:
            offset = next(iter(self._records))
            if offset > upto.offset:
                break
            del self._records[offset]
            self._done.discard(offset)

    def records(self) -> list[Record]:
        """The tracked records, in offset order."""
        return list(self._records.values())


class SessionRunner(Protocol):
    """What the intake needs of the app that runs the sessions."""

    def free_slots(self) -> int:
        """How many more sessions may start now."""
        ...

    async def slot_freed(self, timeout_s: float) -> None:
        """Return when a slot frees up, or after ``timeout_s``."""
        ...

    def is_running(self, session_id: str) -> bool:
        """Whether this replica runs ``session_id`` now."""
        ...

    async def start_session(self, submitted: task_pb2.TaskSubmitted, record: Record) -> None:
        """Start running ``submitted`` (it calls :meth:`TaskIntake.complete` when it ends)."""
        ...

    async def cancel_sessions(self, partitions: frozenset[TP]) -> None:
        """Cancel, without publishing, the sessions whose TaskSubmitted is in ``partitions``."""
        ...


def ledger_output(done: orchestrator_pb2.SessionDone) -> Output:
    """The ledger record of ``done`` (key: session id, so compaction keeps the last), a codec
    envelope like every record, with a stable event id."""
    _, data, headers = encode_record(
        done,
        producer=done.producer,
        key=done.session_id,
        event_id=f"session-done:{done.group_id}:{done.session_id}",
    )
    return Output(LEDGER, data, done.session_id, headers)


class TaskIntake:
    """Consumes TaskSubmitted for a :class:`SessionRunner`; a :class:`~podium.service.Worker`."""

    def __init__(
        self,
        bus: Bus,
        runner: SessionRunner,
        *,
        deployment: str,
        instance: str,
        retry_backoff_max_s: float = 5.0,
    ) -> None:
        """``deployment`` is ``PODIUM_GROUP_ID``: the group is ``<deployment>.tasks`` and the
        transactional ids ``<deployment>.tasks.<topic>.<partition>``, the same on every replica
        (so the next owner of a partition fences the previous one)."""
        self.bus = bus
        self.runner = runner
        self.deployment = deployment
        self.instance = instance
        self.retry_backoff_max_s = retry_backoff_max_s
        self._group_id = f"{deployment}.tasks"
        self.member = bus.transactional_member(
            [topics.TASKS], self._group_id, self._group_id, client_id=instance
        )
        self.member.on_rebalance(assigned=self._assigned, revoked=self._revoked)
        self.tracks: dict[TP, PartitionTrack] = {}
        """Sessions in flight per owned tasks partition."""
        self.finished: dict[str, orchestrator_pb2.SessionDone] = {}
        """Ledger entries of sessions of owned partitions (read on take-over, then added)."""
        self._locks: dict[TP, asyncio.Lock] = {}
        self._stopping = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._started = False
        self.skipped = 0
        """Redelivered or duplicate TaskSubmitted events skipped (session ended or running)."""

    @property
    def group_id(self) -> str:
        return self._group_id

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Join the tasks group (the ledger is read as partitions are assigned)."""
        await self.member.start()
        self._started = True

    async def run(self) -> None:
        """Fetch and admit TaskSubmitted events until :meth:`stop`; transient broker errors
        are retried with backoff (a broker stall must not become a crash loop)."""
        self._idle.clear()
        delay = 0.1
        try:
            while not self._stopping.is_set():
                try:
                    await self._step()
                    delay = 0.1
                except BusError as exc:
                    if not exc.retriable:
                        raise
                    _log.warning("%s: %s; retrying in %.1fs", self._group_id, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.retry_backoff_max_s)
        finally:
            self._idle.set()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop admitting new TaskSubmitted events; the member stays in the group so running
        sessions can still commit (:meth:`close` leaves it)."""
        self._stopping.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)

    async def close(self) -> None:
        """Leave the group: sessions still running are cancelled (``revoked``) and their
        TaskSubmitted stays uncommitted for the next owner."""
        self._stopping.set()
        if self._started:
            self._started = False
            await self.member.stop()

    # ------------------------------------------------------------------ rebalance

    async def _assigned(self, tps: frozenset[TP]) -> None:
        """Read the ledger for ``tps`` (their previous owner is fenced, so what it committed
        is all there is) before their offsets are read."""
        again = frozenset(tp for tp in tps if tp in self.tracks)
        if again:
            # Re-claimed after a failure of unknown outcome: start these partitions over.
            await self._drop(again, rewind=True)
        partitions = {p for _, p in tps}
        delay = 0.1
        while True:
            try:
                records = await read_committed(self.bus, LEDGER)
                break
            except BusError as exc:
                _log.warning("%s: reading the ledger: %s; retrying", self._group_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_backoff_max_s)
        for record in records:
            done = parse_done(record, self.deployment)
            if done is not None and done.tasks_partition in partitions:
                self.finished[done.session_id] = done
        for tp in tps:
            self.tracks[tp] = PartitionTrack()
            self._locks.setdefault(tp, asyncio.Lock())
        _log.info(
            "%s: assigned %s (%d ended sessions in the ledger)",
            self.instance,
            sorted(tps),
            len(self.finished),
        )

    async def _revoked(self, tps: frozenset[TP]) -> None:
        """Cancel the sessions of ``tps`` without publishing: their next owner re-runs them."""
        await self._drop(tps)
        _log.info("%s: revoked %s", self.instance, sorted(tps))

    async def _drop(self, tps: frozenset[TP], *, rewind: bool = False) -> None:
        """Forget ``tps``: cancel their sessions and their ledger entries; ``rewind``: fetch
        their records in flight again (a partition kept but re-claimed)."""
        again = [r for tp in tps for r in self.tracks.get(tp, PartitionTrack()).records()]
        for tp in tps:
            self.tracks.pop(tp, None)
        partitions = {p for _, p in tps}
        for sid in [s for s, d in self.finished.items() if d.tasks_partition in partitions]:
            del self.finished[sid]
        await self.runner.cancel_sessions(tps)
        if rewind and again:
            with contextlib.suppress(BusError):
                await self.member.rewind(again)

    # ------------------------------------------------------------------ intake

    async def _step(self) -> None:
        """One fetch, at most as many records as there are free session slots."""
        free = self.runner.free_slots()
        if free <= 0:
            await self.runner.slot_freed(0.5)
            return
        records = await self.member.fetch(max_records=min(free, MAX_FETCH), timeout_s=0.2)
        for record in records:
            await self._admit(record)

    async def _admit(self, record: Record) -> None:
        """Start the session of ``record``, or end the record at once (skipped or poison)."""
        tp = (record.topic, record.partition)
        track = self.tracks.get(tp)
        if track is None or tp not in self.member.assignment():
            return  # revoked while the batch was in hand: the next owner has it
        track.add(record)
        try:
            envelope = codec.decode_envelope(record.value)
            submitted = codec.unpack_as(envelope, task_pb2.TaskSubmitted)
            if not submitted.session_id:
                raise DecodeError("TaskSubmitted has no session_id")
        except DecodeError as exc:
            # Poison: dead-lettered with the reason, in the transaction that moves past it.
            await self.complete(record, [self.dead_letter(record, exc)])
            return
        sid = submitted.session_id
        if sid in self.finished or self.runner.is_running(sid):
            self.skipped += 1
            _log.info(
                "session %s ended or running already: skipping TaskSubmitted @%d",
                sid,
                record.offset,
            )
            # Re-announcing the ledger entry lets the replica that took a retried SubmitTask
            # end that stream too; a running session announces itself when it ends.
            done = self.finished.get(sid)
            await self.complete(record, [ledger_output(done)] if done is not None else [])
            return
        # In the submitter's trace: the session task copies this context, so everything the
        # session publishes joins it (one trace per session).
        with consume_span(envelope, record, self._group_id):
            await self.runner.start_session(submitted, record)

    def dead_letter(self, record: Record, exc: BaseException) -> Output:
        """``record`` as a dead letter with the reason (:func:`dead_letter_headers`)."""
        headers = record.headers + dead_letter_headers(
            record.topic,
            record.partition,
            record.offset,
            exc,
            group_id=self._group_id,
            producer=self.instance,
        )
        return Output(
            topics.dead_letter(record.topic),
            record.value or b"",
            (record.key or b"").decode(errors="replace"),
            headers,
        )

    # ------------------------------------------------------------------ commit

    async def complete(
        self,
        record: Record,
        outputs: Sequence[Output],
        done: orchestrator_pb2.SessionDone | None = None,
    ) -> None:
        """Publish ``outputs`` (and ``done``'s ledger entry) in one transaction of ``record``'s
        partition, committing the partition's watermark.

        Retries transient broker errors while the partition is owned; raises
        :class:`PartitionLost` once it is not (revoked or fenced: nothing was published).
        """
        tp = (record.topic, record.partition)
        outs = [*outputs, *([ledger_output(done)] if done is not None else [])]
        lock = self._locks.setdefault(tp, asyncio.Lock())
        delay = 0.1
        async with lock:
            while True:
                track = self.tracks.get(tp)
                if track is None or record.offset not in track:
                    raise PartitionLost(f"tasks partition {tp} is not owned here any more")
                track.finish(record.offset)
                try:
                    upto = await self._commit(tp, outs, track.watermark())
                except TransactionFencedError as exc:
                    _log.warning(
                        "%s: fenced on %s (%s): a newer owner runs its sessions",
                        self.instance,
                        tp,
                        exc,
                    )
                    await self._drop(frozenset({tp}))
                    raise PartitionLost(str(exc)) from exc
                except BusError as exc:
                    _log.warning(
                        "%s: committing on %s: %s; retrying in %.1fs", self.instance, tp, exc, delay
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.retry_backoff_max_s)
                    continue
                if upto is not None:
                    track.release(upto)
                if done is not None:
                    self.finished[done.session_id] = done
                return

    async def _commit(
        self, tp: TP, outputs: Sequence[Output], upto: Record | None
    ) -> Record | None:
        """One transaction: ``outputs``, then the offset after ``upto`` (None: outputs only)."""
        txn = await self.member.begin(tp)
        try:
            for out in outputs:
                await txn.publish(out.topic, out.value, key=out.key, headers=out.headers)
            await txn.commit([upto] if upto is not None else [])
        except BaseException:
            await txn.abort()
            raise
        return upto
