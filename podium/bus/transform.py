"""Consume-transform-produce, exactly once: the bus layer's one transactional loop.

:class:`Transformer` reads the events of some topics as a member of a consumer group, turns
each into zero or more output events with an ``async transform(envelope, record)`` function
and publishes them. Each partition's share of a fetched batch is one transaction of a
:class:`~podium.bus.base.TransactionalMember` (transactional id ``prefix.topic.partition``,
claimed by the partition's owner before it reads the partition's offset):

1. fetch a batch (records of committed transactions only);
2. per input partition of the batch, begin that partition's transaction;
3. per record: decode its envelope with the codec (the only place bytes become messages);
   skip an event id already committed (de-duplication, for upstream retries); call
   ``transform`` inside the producer's trace; publish every output as a codec envelope with
   the trace context, event id and event type in headers (as
   :class:`~podium.bus.EventPublisher` does). A record that cannot be decoded, whose
   transform fails with a non-retriable error, or whose transform failed with retriable
   errors ``max_attempts`` times, goes unchanged to its topic's dead-letter topic
   (:func:`~podium.bus.consumer.publish_dead_letter`, with the error and the attempts)
   inside the same transaction, and the partition moves on: poison never stops a service;
4. commit the partition's transaction with the offset after its records: outputs, dead
   letters and the consumed position become visible together.

Any failure before the commit (a broker error, a retriable transform error, a partition
revoked mid-batch) aborts the transaction and rewinds to the batch start; after a capped
exponential backoff the batch is processed again: never skipped, never half visible. A crash
has the same effect, because nothing of an open transaction is visible and the next owner
ends it when it claims the partition. A partition whose transactional id was claimed by a
newer owner (this member was a zombie: paused past its session, say) is fenced: its batch is
dropped uncommitted (the new owner processes it) and the other partitions go on; only when
every partition is lost does :meth:`Transformer.run` stop and raise
:class:`~podium.bus.base.TransactionFencedError`.

Over :class:`~podium.bus.KafkaBus` this is Kafka's exactly-once (transactions,
``send_offsets_to_transaction``, read_committed); over :class:`~podium.bus.InProcBus` its
twin gives the same visibility, so what is tested in process behaves the same on a broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from google.protobuf.message import Message

from podium import codec, topics
from podium.bus.base import (
    TP,
    Bus,
    Headers,
    PartitionTransaction,
    Record,
    TopicSpec,
    TransactionFencedError,
)
from podium.bus.consumer import (
    DEFAULT_MAX_ATTEMPTS,
    RecentKeys,
    consume_span,
    encode_record,
    is_retriable,
    publish_dead_letter,
    publish_span,
)
from podium.errors import BusError, ConfigError, DecodeError
from podium.metrics import lag_by_topic, record_consumer_lag, record_dead_letters
from podium.v1 import envelope_pb2

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Output:
    """One event a transform produces."""

    topic: str
    """Where it goes."""
    message: Message
    """The payload (a Podium event type; the codec wraps it in an envelope)."""
    key: str
    """Partitioning key, e.g. the session id, so one session's events stay in order."""
    event_id: str | None = None
    """A stable id derived from the input, so that processing the same input again yields
    the same event (recognised downstream); None = a fresh id."""
    idempotency_key: str = ""
    """Names the business operation (see :func:`podium.codec.encode_event`)."""
    occurred_at: datetime | None = None
    """When the event happened (default: now)."""


Transform = Callable[[envelope_pb2.Envelope, Record], Awaitable[Sequence[Output]]]
"""``async def transform(envelope, record) -> [Output, ...]``; raise to reject the record:
a retriable error retries the batch (up to ``max_attempts`` times for one record, then it is
dead-lettered), any other dead-letters the record."""


@dataclass
class TransformStats:
    """What a :class:`Transformer` committed, for logs, metrics and tests."""

    fetched: int = 0
    """Records fetched (a batch fetched again after an abort counts again)."""
    transactions: int = 0
    """Committed transactions."""
    aborted: int = 0
    """Transactions aborted (their batch processed again)."""
    transformed: int = 0
    """Input events whose outputs were committed."""
    produced: int = 0
    """Output events committed."""
    dead_lettered: int = 0
    """Poison records committed to a dead-letter topic."""
    duplicates: int = 0
    """Input events skipped because their event id was already committed."""
    dropped: int = 0
    """Partition batches dropped uncommitted because a newer owner had taken their partition
    over (this member was fenced on it); the new owner processes them."""


@dataclass
class _Tally:
    """What the open transaction did; counted into the stats once it commits."""

    ids: list[str] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    transformed: int = 0
    produced: int = 0
    dead_lettered: int = 0
    duplicates: int = 0


class Transformer:
    """Runs ``transform`` over every event of ``topics``, exactly once, as a member of
    ``group_id`` writing under ``transactional_id_prefix`` (see the module docstring).

    ``await start()`` (create topics, claim the transactional id, join the group), then
    ``await run()`` in a task; ``await stop()`` lets the batch in hand commit and ends it.
    ``run_once()`` processes one batch, for step-by-step control.
    """

    def __init__(
        self,
        bus: Bus,
        topics: Sequence[str],
        group_id: str,
        transform: Transform,
        *,
        transactional_id_prefix: str,
        producer_name: str,
        output_topics: Sequence[str] = (),
        max_batch: int = 100,
        poll_timeout_s: float = 0.5,
        partitions: int = 3,
        create_topics: bool = True,
        retry_backoff_s: float = 0.5,
        retry_backoff_max_s: float = 5.0,
        dedupe_capacity: int = 100_000,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        client_id: str = "",
        on_committed: Callable[[Sequence[Output]], None] | None = None,
    ) -> None:
        """
        Args:
            bus: a started bus.
            topics: topics to consume.
            group_id: consumer group; members of one group share the partitions.
            transform: turns one event into its outputs.
            transactional_id_prefix: the same for every member of the group (and stable across
                restarts), different from other groups reading the same topics: partition
                (topic, p) is written under ``prefix.topic.p``, so whoever owns a partition
                next fences whoever owned it before and ends what it left open.
            producer_name: this service instance, stamped on outputs and dead letters.
            output_topics: topics the outputs go to, created on start with the inputs and
                their dead-letter topics.
            max_batch: most records per transaction.
            poll_timeout_s: longest wait for records; bounds the reaction to :meth:`stop`.
            partitions: partition count of the topics this creates.
            create_topics: create the topics on start.
            retry_backoff_s: first delay before processing an aborted batch again.
            retry_backoff_max_s: cap of the exponentially growing delay.
            dedupe_capacity: committed event ids remembered for de-duplication.
            max_attempts: tries of one record whose transform keeps failing with retriable
                errors before it is dead-lettered with the last error.
            client_id: name of this member in broker logs (defaults to producer_name).
            on_committed: called with a transaction's outputs once it committed (never for
                an aborted one, whose batch is processed again): where counting them, e.g.
                in metrics, must count each exactly once.
        """
        _check_settings(topics, producer_name, max_batch, retry_backoff_s, retry_backoff_max_s)
        if max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {max_attempts}")
        self.bus = bus
        self.topics = tuple(topics)
        self.group_id = group_id
        self.transform = transform
        self.transactional_id_prefix = transactional_id_prefix
        self.max_attempts = max_attempts
        self.on_committed = on_committed
        self.producer_name = producer_name
        self.output_topics = tuple(output_topics)
        self.max_batch = max_batch
        self.poll_timeout_s = poll_timeout_s
        self.partitions = partitions
        self.create_topics = create_topics
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.member = bus.transactional_member(
            self.topics, group_id, transactional_id_prefix, client_id=client_id or producer_name
        )
        self.member.on_rebalance(revoked=self._forget)
        self.stats = TransformStats()
        self.fenced = False
        """Whether it stopped because newer owners took over every partition it had."""
        self._attempts: dict[tuple[str, int, int], int] = {}
        """Failed tries per (topic, partition, offset) of records not committed yet."""
        self._seen = RecentKeys(dedupe_capacity)
        self._delay = retry_backoff_s
        self._started = False
        self._stopping = asyncio.Event()
        self._abandon = False
        self._run_task: asyncio.Task[Any] | None = None
        self._run_done: asyncio.Event | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the topics, claim the transactional id and join the group (once)."""
        if self._started:
            return
        if self._stopping.is_set():
            raise BusError(f"{self} was stopped; build a new one", retriable=False)
        if self.create_topics:
            names = [*self.topics, *(topics.dead_letter(t) for t in self.topics)]
            names += self.output_topics
            replicas = self.bus.replication_factor
            await self.bus.create_topics([TopicSpec(n, self.partitions, replicas) for n in names])
        await self.member.start()
        self._started = True

    async def run(self) -> None:
        """Process batches until :meth:`stop`; raise if fenced or if the bus fails for good.

        Returns at once if :meth:`stop` came first.
        """
        if self._stopping.is_set():
            return
        self._run_task = asyncio.current_task()
        self._run_done = asyncio.Event()
        try:
            await self.start()
            while not self._stopping.is_set():
                await self.run_once()
        except asyncio.CancelledError:
            if not self._abandon or self._run_task is None:
                raise
            # Our own stop() gave up waiting: the open transaction is never committed, so
            # its batch goes to the next owner. A clean end, not a failure of run().
            self._run_task.uncancel()
            _log.warning("%s: batch abandoned uncommitted at stop; it will be redelivered", self)
        finally:
            self._run_task = None
            self._run_done.set()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop fetching, let the batch in hand commit, leave the group (for good).

        If that takes longer than ``timeout_s`` the batch is abandoned uncommitted (the next
        owner processes it: nothing lost, nothing visible twice). Stopping twice is harmless.
        """
        self._stopping.set()
        task, done = self._run_task, self._run_done
        if task is not None and done is not None and not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), timeout_s)
            except TimeoutError:
                _log.warning("%s: batch did not finish within %.1fs", self, timeout_s)
                self._abandon = True
                task.cancel()
                await done.wait()
        if self._started:
            self._started = False
            await self.member.stop()

    def __str__(self) -> str:
        return f"transformer {self.group_id} ({self.transactional_id_prefix}.*)"

    # -- one batch ----------------------------------------------------------------------------

    async def run_once(self) -> int:
        """Fetch one batch and process it, one transaction per partition; returns the records
        fetched."""
        if not self._started:
            raise BusError("Transformer is not started: call start() or run()", retriable=False)
        batch = await self._fetch()
        if not batch:
            return 0
        self.stats.fetched += len(batch)
        for tp, records in by_partition(batch).items():
            await self._partition_batch(tp, records)
        return len(batch)

    async def _partition_batch(self, tp: TP, records: Sequence[Record]) -> None:
        """One partition's records in one transaction; a failure aborts and rewinds them."""
        try:
            await self._transact(tp, records)
        except TransactionFencedError as exc:
            self.stats.dropped += 1
            if self.member.assignment():
                _log.warning("%s: %s was taken over by a newer owner; batch dropped", self, tp)
                return
            _log.error("%s: every partition was taken over by newer owners; stopping", self)
            self.fenced = True
            self._stopping.set()
            raise TransactionFencedError(
                f"{self}: every partition was taken over by newer owners (another member "
                f"uses transactional id prefix {self.transactional_id_prefix!r}): {exc}"
            ) from exc
        except Exception as exc:
            if not is_retriable(exc):
                raise
            await self._abort(records, exc)

    async def _fetch(self) -> list[Record]:
        """The next batch; a retriable fetch failure is retried with backoff."""
        delay = self.retry_backoff_s
        while True:
            try:
                batch = await self.member.fetch(self.max_batch, self.poll_timeout_s)
            except BusError as exc:
                if not exc.retriable or self._stopping.is_set():
                    raise
                _log.warning("%s: fetch failed (%s); retrying in %.2fs", self, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_backoff_max_s)
                continue
            record_consumer_lag(self.group_id, lag_by_topic(await self.member.lag(), self.topics))
            return batch

    async def _transact(self, tp: TP, records: Sequence[Record]) -> None:
        """Begin ``tp``'s transaction, process its records, commit with their offset."""
        txn = await self.member.begin(tp)
        tally = _Tally()
        try:
            for record in records:
                await self._process(txn, record, tally)
            await txn.commit(records)
        except BaseException:
            await txn.abort()
            raise
        for event_id in tally.ids:
            self._seen.add(event_id)
        for record in records:
            self._attempts.pop((record.topic, record.partition, record.offset), None)
        self._delay = self.retry_backoff_s
        s = self.stats
        s.transactions += 1
        s.transformed += tally.transformed
        s.produced += tally.produced
        s.dead_lettered += tally.dead_lettered
        s.duplicates += tally.duplicates
        if tally.dead_lettered:  # counted once committed: an aborted dead letter never was
            record_dead_letters(tp[0], self.group_id, tally.dead_lettered)
        if self.on_committed is not None and tally.outputs:
            self.on_committed(tally.outputs)
        _log.debug(
            "%s: committed %d records of %s: %d transformed, %d dead-lettered, %d duplicates",
            self,
            len(records),
            tp,
            tally.transformed,
            tally.dead_lettered,
            tally.duplicates,
        )

    async def _process(self, txn: PartitionTransaction, record: Record, tally: _Tally) -> None:
        """One record into the open transaction: its outputs, or its dead letter."""
        try:
            envelope = codec.decode_envelope(record.value)
        except DecodeError as exc:
            await self._dead_letter(txn, record, exc)
            tally.dead_lettered += 1
            return
        event_id = envelope.event_id
        if event_id in self._seen or event_id in tally.ids:
            tally.duplicates += 1
            return
        with consume_span(envelope, record, self.group_id):
            try:
                outputs = await self.transform(envelope, record)
                encoded = [self._encode(out) for out in outputs]
            except Exception as exc:
                attempts = self._attempt(record) if is_retriable(exc) else None
                if attempts is not None and attempts < self.max_attempts:
                    raise
                # Bad data, a bug, or a retriable failure that kept failing: retrying (more)
                # cannot help, and it must not stall its partition.
                await self._dead_letter(txn, record, exc, attempts)
                tally.dead_lettered += 1
            else:
                for topic, key, data, headers in encoded:
                    await txn.publish(topic, data, key=key, headers=headers)
                tally.outputs.extend(outputs)
                tally.transformed += 1
                tally.produced += len(encoded)
        tally.ids.append(event_id)

    def _attempt(self, record: Record) -> int:
        """Count one more failed try of ``record``; returns the tries so far."""
        key = (record.topic, record.partition, record.offset)
        if len(self._attempts) >= _MAX_TRACKED and key not in self._attempts:
            self._attempts.clear()  # bounded memory; worst case a record gets more tries
        self._attempts[key] = self._attempts.get(key, 0) + 1
        return self._attempts[key]

    async def _forget(self, tps: frozenset[TP]) -> None:
        """Revoked partitions: their records' tries are counted by their next owner."""
        self._attempts = {k: v for k, v in self._attempts.items() if (k[0], k[1]) not in tps}

    def _encode(self, out: Output) -> tuple[str, str, bytes, Headers]:
        """An output as a record (topic, key, value, headers), in a producer span."""
        with publish_span(out.topic):
            _, data, headers = encode_record(
                out.message,
                producer=self.producer_name,
                key=out.key,
                idempotency_key=out.idempotency_key,
                event_id=out.event_id,
                occurred_at=out.occurred_at,
            )
        return out.topic, out.key, data, headers

    async def _dead_letter(
        self,
        txn: PartitionTransaction,
        record: Record,
        exc: BaseException,
        attempts: int | None = None,
    ) -> None:
        _log.warning(
            "%s: dead-lettering %s[%d]@%d after %s: %s",
            self,
            record.topic,
            record.partition,
            record.offset,
            f"{attempts} tries" if attempts else "a non-retriable error",
            exc,
        )
        await publish_dead_letter(
            txn,
            record,
            exc,
            group_id=self.group_id,
            producer=self.producer_name,
            attempts=attempts,
        )

    async def _abort(self, batch: Sequence[Record], exc: BaseException) -> None:
        """Rewind to the (aborted) batch and back off (cut short by stop)."""
        self.stats.aborted += 1
        _log.warning(
            "%s: transaction aborted; its %d records are processed again in %.2fs: %s",
            self,
            len(batch),
            self._delay,
            exc,
        )
        await self.member.rewind(batch)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self._delay)
        self._delay = min(self._delay * 2, self.retry_backoff_max_s)


_MAX_TRACKED = 100_000
"""Most records whose failed tries are counted at once."""


def by_partition(records: Sequence[Record]) -> dict[TP, list[Record]]:
    """``records`` grouped by (topic, partition), each group in fetch (offset) order."""
    out: dict[TP, list[Record]] = {}
    for r in records:
        out.setdefault((r.topic, r.partition), []).append(r)
    return out


def _check_settings(
    topics: Sequence[str],
    producer_name: str,
    max_batch: int,
    retry_backoff_s: float,
    retry_backoff_max_s: float,
) -> None:
    """Refuse settings the loop cannot run with, naming the setting."""
    if not topics:
        raise ConfigError("Transformer needs at least one topic")
    if not producer_name:
        raise ConfigError("Transformer producer_name must not be empty")
    if max_batch < 1:
        raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
    if retry_backoff_s <= 0 or retry_backoff_max_s < retry_backoff_s:
        raise ConfigError(
            "retry_backoff_s must be > 0 and <= retry_backoff_max_s, got "
            f"{retry_backoff_s} and {retry_backoff_max_s}"
        )
