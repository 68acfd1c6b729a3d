"""The event-bus contract shared by the Kafka and in-process implementations.

Semantics every implementation honours (and ``tests/bus/test_contract.py`` checks):

* ``publish`` appends to a topic partition chosen from the key (same key, same partition,
  so one session's events stay in order) and returns where it landed once durable.
* A :class:`Subscriber` joins a consumer group; partitions of its topics are shared among
  the group's live members and rebalanced when members come and go.
* Delivery is at-least-once: a record counts as consumed only after ``commit``. Records
  fetched but not committed are delivered again to whichever member owns the partition
  next (after a crash, a ``stop`` without commit, or a rebalance).
* Offsets are per (group, topic, partition); committing a record commits everything
  before it in its partition.
* A :class:`TransactionalMember` is a group member whose produced records and consumed
  offsets become visible together, in one commit, or not at all (consume-transform-produce
  exactly once). Transactions are per input partition: partition (topic, p) is written under
  the transactional id ``f"{prefix}.{topic}.{p}"``, claimed by whoever owns the partition
  BEFORE it reads the partition's committed offset. Claiming fences the previous holder (its
  open transaction is ended and its next call raises :class:`TransactionFencedError`) and
  waits for that transaction to end, so the offset read is stable: a zombie (a member paused
  past its session, still believing it owns the partition) can never commit, and a new owner
  never re-reads records a pending transaction is about to commit. This is the pre-KIP-447
  recipe; it needs no consumer-group generation in the offset commit.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from podium.errors import BusError

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic to create."""

    name: str
    """Topic name."""
    partitions: int = 3
    """Number of partitions (the unit of consumer parallelism)."""
    replication_factor: int = 1
    """Replicas per partition (1 on a single dev broker)."""
    config: tuple[tuple[str, str], ...] = ()
    """Topic-level settings, e.g. ``(("cleanup.policy", "compact"),)`` for state keyed by
    id (applied by Kafka at creation; the in-process bus keeps every record)."""


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a published record landed."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Record:
    """A consumed record, as bytes: decoding is the codec's job, not the bus's."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default=())
    timestamp_ms: int = 0

    def header(self, name: str) -> bytes | None:
        """Value of the last header called ``name``, or None."""
        for k, v in reversed(self.headers):
            if k == name:
                return v
        return None


def next_offsets(records: Sequence[Record]) -> dict[tuple[str, int], int]:
    """Per (topic, partition) of ``records``: the offset after the last one, i.e. what a
    commit of ``records`` stores (the position the group resumes from)."""
    out: dict[tuple[str, int], int] = {}
    for r in records:
        tp = (r.topic, r.partition)
        out[tp] = max(out.get(tp, 0), r.offset + 1)
    return out


def first_offsets(records: Sequence[Record]) -> dict[tuple[str, int], int]:
    """Per (topic, partition) of ``records``: the offset of the first one, where a rewind of
    ``records`` puts the position back to."""
    out: dict[tuple[str, int], int] = {}
    for r in records:
        tp = (r.topic, r.partition)
        out[tp] = min(out.get(tp, r.offset), r.offset)
    return out


class TransactionFencedError(BusError):
    """A newer member took over this transactional id: this one must never write again.

    Not retriable: two live members sharing a transactional id is a deployment error.
    """

    retriable = False


class Publisher(Protocol):
    """Anything records can be published to: a :class:`Bus`, or an open transaction."""

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> object:
        """Append one record (in a transaction: once the transaction commits)."""
        ...


class Subscriber(abc.ABC):
    """One member of a consumer group. Use ``start()`` / ``finally: stop()``."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Join the group; returns once partitions can be fetched."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Leave the group without committing anything further."""

    @abc.abstractmethod
    async def fetch(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Next records from owned partitions, in offset order per partition; may be empty."""

    @abc.abstractmethod
    async def commit(self, records: Sequence[Record] | None = None) -> None:
        """Mark ``records`` (default: everything fetched so far) as processed."""

    @abc.abstractmethod
    async def rewind(self, records: Sequence[Record]) -> None:
        """Fetch ``records`` again: each owned partition among them goes back to its first
        record (for a batch given up uncommitted; partitions no longer owned are skipped,
        their new owner starts from the last commit anyway)."""

    @abc.abstractmethod
    def assignment(self) -> frozenset[tuple[str, int]]:
        """(topic, partition) pairs this member owns now."""

    async def lag(self) -> dict[tuple[str, int], int]:
        """Per owned partition whose end is known: records between this member's position and
        the end (the consumer lag of ``podium.metrics``); empty when the bus cannot tell.
        Answers from what the last fetches learnt: it never waits on the broker."""
        return {}


TP = tuple[str, int]
"""A (topic, partition) pair."""

PartitionsCallback = Callable[[frozenset[TP]], Awaitable[None]]
"""``async def callback(partitions)``, run by a rebalance (see
:meth:`TransactionalMember.on_rebalance`)."""


def partition_transactional_id(prefix: str, topic: str, partition: int) -> str:
    """The transactional id of input partition ``(topic, partition)``: ``prefix.topic.p``.

    Stable across restarts and replicas, so whoever owns the partition next fences whoever
    owned it before; the prefix must therefore be the same for every member of a group (and
    differ between groups that read the same topic).
    """
    return f"{prefix}.{topic}.{partition}"


class PartitionTransaction(abc.ABC):
    """The open transaction of one input partition (:meth:`TransactionalMember.begin`).

    Every error is a :class:`~podium.errors.BusError`: :class:`TransactionFencedError` when
    the partition's transactional id was claimed by a newer owner (drop the batch: the new
    owner processes it), retriable ones when the partition is not owned any more or the
    broker failed (abort; the records are fetched again by whoever owns the partition).
    """

    tp: TP
    """The input partition whose records this transaction consumes."""

    @abc.abstractmethod
    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> None:
        """Add one record to the transaction (visible to readers once it commits)."""

    @abc.abstractmethod
    async def commit(self, records: Sequence[Record]) -> None:
        """Commit the published records together with the offset after ``records``.

        ``records`` all come from :attr:`tp`; empty commits the outputs alone (the offset is
        unchanged). Refused (retriable :class:`BusError`, nothing committed) if :attr:`tp` was
        revoked meanwhile; :class:`TransactionFencedError` if its id was claimed by a newer
        owner.
        """

    @abc.abstractmethod
    async def abort(self) -> None:
        """Discard the published records (the position is not moved: see
        :meth:`TransactionalMember.rewind`). Never raises: an abort the broker did not confirm
        makes the member re-claim the partition, which ends the transaction for sure."""


class TransactionalMember(abc.ABC):
    """A group member whose outputs and consumed offsets commit atomically, per partition.

    One partition batch is one transaction: ``fetch`` → for each partition of the batch,
    ``begin(tp)`` → ``publish`` the outputs → ``commit(records of tp)`` (the outputs and the
    offset after them become visible together) or, on failure, ``abort()`` and
    ``rewind(records)`` (neither becomes visible; the records are fetched again). Use
    ``start()`` / ``finally: stop()``. Every error is a :class:`~podium.errors.BusError`.
    See the module docstring for why the transactional id is per partition.
    """

    @abc.abstractmethod
    def on_rebalance(
        self,
        *,
        assigned: PartitionsCallback | None = None,
        revoked: PartitionsCallback | None = None,
    ) -> None:
        """Set rebalance callbacks (before :meth:`start`).

        ``assigned(tps)`` runs once the transactional ids of ``tps`` are claimed (previous
        holders fenced, their open transactions ended) and BEFORE their committed offsets are
        read and fetching starts, so the owner may load per-partition state there. It runs
        again for a partition whose id had to be claimed anew after a failure with an unknown
        outcome (its state must be re-read). ``revoked(tps)`` runs before ``tps`` are released
        (their open transactions are aborted after it returns).
        """

    @abc.abstractmethod
    async def start(self) -> None:
        """Join the group; returns once partitions are assigned and claimed."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Leave the group; open transactions are discarded, never committed."""

    @abc.abstractmethod
    async def fetch(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Next records of owned, claimed partitions (committed ones only), in offset order."""

    @abc.abstractmethod
    def assignment(self) -> frozenset[TP]:
        """(topic, partition) pairs this member owns now and may write for (fenced partitions
        excluded)."""

    async def lag(self) -> dict[TP, int]:
        """Per owned partition whose end is known: records between this member's position and
        the end (see :meth:`Subscriber.lag`)."""
        return {}

    @abc.abstractmethod
    async def begin(self, tp: TP) -> PartitionTransaction:
        """Open the transaction of input partition ``tp`` (one at a time per partition).

        Raises :class:`TransactionFencedError` if ``tp``'s id was claimed by a newer owner, a
        retriable :class:`BusError` if ``tp`` is not owned (any more) or not claimed yet.
        """

    @abc.abstractmethod
    async def rewind(self, records: Sequence[Record]) -> None:
        """Fetch ``records`` again (owned partitions only; see :meth:`Subscriber.rewind`)."""


class Bus(abc.ABC):
    """Publish records and create subscribers. Use ``start()`` / ``finally: stop()``."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect (producers are idempotent with acks=all on Kafka)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Flush pending publishes and disconnect."""

    @abc.abstractmethod
    async def create_topics(self, topics: Sequence[TopicSpec]) -> None:
        """Create topics that do not exist yet (existing ones are left as they are)."""

    @abc.abstractmethod
    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> RecordMetadata:
        """Append one record; returns once it is durable."""

    @abc.abstractmethod
    def subscriber(
        self,
        topics: Sequence[str],
        group_id: str,
        *,
        client_id: str = "",
    ) -> Subscriber:
        """A new (not yet started) member of ``group_id`` reading ``topics``."""

    @abc.abstractmethod
    def transactional_member(
        self,
        topics: Sequence[str],
        group_id: str,
        transactional_id_prefix: str,
        *,
        client_id: str = "",
    ) -> TransactionalMember:
        """A new (not yet started) transactional member of ``group_id`` reading ``topics``;
        partition (topic, p) is written under :func:`partition_transactional_id`."""

    @property
    def replication_factor(self) -> int:
        """Replicas per partition of the topics this bus creates (1 unless a cluster says)."""
        return 1
