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
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    def assignment(self) -> frozenset[tuple[str, int]]:
        """(topic, partition) pairs this member owns now."""


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
