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
  exactly once). A member started with a transactional id fences every earlier member with
  the same id: their open transaction is discarded and their next call raises
  :class:`TransactionFencedError`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
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


class TransactionalMember(abc.ABC):
    """A group member whose outputs and consumed offsets commit atomically.

    One batch is one transaction: ``fetch`` → ``begin`` → ``publish`` the outputs →
    ``commit(batch)`` (the outputs and the offsets after the batch become visible together)
    or, on any failure, ``abort(batch)`` (neither becomes visible, and the batch is fetched
    again). Use ``start()`` / ``finally: stop()``; ``start`` fences earlier members with the
    same transactional id. Every error is a :class:`~podium.errors.BusError`: retriable ones
    mean "abort and retry the batch", :class:`TransactionFencedError` means "stop".
    """

    @abc.abstractmethod
    async def start(self) -> None:
        """Claim the transactional id (fencing earlier holders), then join the group."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Leave the group; an open transaction is discarded, never committed."""

    @abc.abstractmethod
    async def fetch(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Next records of owned partitions (committed ones only), in offset order."""

    @abc.abstractmethod
    def assignment(self) -> frozenset[tuple[str, int]]:
        """(topic, partition) pairs this member owns now."""

    @abc.abstractmethod
    async def begin(self) -> None:
        """Open a transaction."""

    @abc.abstractmethod
    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> None:
        """Add one record to the open transaction (visible to readers once it commits)."""

    @abc.abstractmethod
    async def commit(self, records: Sequence[Record]) -> None:
        """Commit the transaction together with the offsets after ``records``.

        Raises a retriable :class:`BusError` without committing anything if a partition of
        ``records`` was revoked meanwhile (its new owner processes them).
        """

    @abc.abstractmethod
    async def abort(self, records: Sequence[Record]) -> None:
        """Discard the open transaction and :meth:`Subscriber.rewind` to ``records``."""


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
        transactional_id: str,
        *,
        client_id: str = "",
    ) -> TransactionalMember:
        """A new (not yet started) transactional member of ``group_id`` reading ``topics``."""

    @property
    def replication_factor(self) -> int:
        """Replicas per partition of the topics this bus creates (1 unless a cluster says)."""
        return 1
