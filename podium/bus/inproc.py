"""The in-process bus: Kafka's delivery semantics inside one Python process.

It is the embedded default for a zero-setup run and for unit tests, and it is held to the same
contract suite as :class:`podium.bus.kafka.KafkaBus` (``tests/bus/test_contract.py``), so code
that works here behaves the same against a real broker:

* Records are partitioned by key with Kafka's own default partitioner (murmur2 of the key
  bytes), so a key lands on the same partition number here as on a broker. Records without a
  key are spread round-robin.
* Consumer groups share partitions among live members (round-robin, like Kafka's
  ``RoundRobinAssignor``) and rebalance whenever a member joins or leaves.
* Offsets are committed per (group, topic, partition). A member that is assigned a partition
  starts at the group's committed offset (the earliest record if none), so anything fetched
  but not committed by a previous owner is delivered again.
* A transactional member (:class:`InProcTransactionalMember`) holds each partition
  transaction's outputs back until its commit, which appends them and stores the offset in
  one step with no await in between, so readers see both or neither, as Kafka's
  ``read_committed`` readers do. Transactional ids are per input partition and carry an
  epoch: the member a partition is assigned to claims its id (fencing the earlier holder,
  like Kafka's ``InitProducerId``) in the same step as it reads the committed offset.

Everything runs on the caller's event loop; nothing here is thread-safe, which is fine because
Podium's services are single-loop asyncio programs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from podium.bus.base import (
    Bus,
    Headers,
    PartitionsCallback,
    PartitionTransaction,
    Record,
    RecordMetadata,
    Subscriber,
    TopicSpec,
    TransactionalMember,
    TransactionFencedError,
    first_offsets,
    next_offsets,
    partition_transactional_id,
)
from podium.errors import BusError, ConfigError

_log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 hash (``org.apache.kafka.common.utils.Utils.murmur2``), unsigned.

    Ported bit for bit so that the in-process bus picks the same partition for a key as
    Kafka's default partitioner; tests compare it with aiokafka's implementation.
    """
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length & ~3
    extra = length % 4
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    """Partition Kafka's default partitioner chooses for ``key`` among ``partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def key_on_partition(base: str, partition: int, partitions: int) -> str:
    """``base``, or ``base#n`` with the smallest ``n`` that makes Kafka's default partitioner
    put the record on ``partition`` of ``partitions``: a producer that wants records spread
    over distinct partitions (hence distinct members of a consumer group) keys them so.
    About ``partitions`` hashes; gives ``base`` itself if none of 64 × ``partitions`` lands."""
    if not 0 <= partition < partitions:
        raise ConfigError(f"partition {partition} is not one of {partitions}")
    if partition_for_key(base.encode("utf-8"), partitions) == partition:
        return base
    for n in range(64 * partitions):
        key = f"{base}#{n}"
        if partition_for_key(key.encode("utf-8"), partitions) == partition:
            return key
    return base


def key_bytes(key: bytes | str | None) -> bytes | None:
    """Normalise a record key: strings are UTF-8 encoded, as every Kafka client does."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    raise ConfigError(f"record key must be bytes, str or None, not {type(key).__name__}")


@dataclass
class _Topic:
    name: str
    partitions: list[list[Record]]
    next_unkeyed: int = 0


@dataclass(eq=False)
class _Group:
    group_id: str
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    members: list[InProcSubscriber] = field(default_factory=list)
    generation: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serialises rebalances of the group (joins and leaves wait for each other)."""


class InProcBus(Bus):
    """A Kafka-like bus held in memory; see the module docstring for its guarantees."""

    def __init__(self, *, default_partitions: int = 3, revoke_grace_s: float = 10.0) -> None:
        """``default_partitions`` is used for topics created implicitly by publish/subscribe,
        mirroring a broker's ``num.partitions`` with ``auto.create.topics.enable=true``;
        ``revoke_grace_s`` is how long a rebalance waits for members to commit the batch they
        hold on partitions they are losing (like ``KafkaConfig.revoke_grace_s``)."""
        if default_partitions < 1:
            raise ConfigError(f"default_partitions must be >= 1, got {default_partitions}")
        if revoke_grace_s < 0:
            raise ConfigError(f"revoke_grace_s must be >= 0, got {revoke_grace_s}")
        self.default_partitions = default_partitions
        self.revoke_grace_s = revoke_grace_s
        self._topics: dict[str, _Topic] = {}
        self._groups: dict[str, _Group] = {}
        self._txn_epochs: dict[str, int] = {}
        """Current epoch of every transactional id claimed so far."""
        self._started = False
        self._member_ids = itertools.count(1)
        # Created lazily so the bus can be constructed outside a running event loop.
        self._changed: asyncio.Condition | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._started = True

    async def stop(self) -> None:
        # Publishes are synchronous here, so there is nothing to flush.
        self._started = False

    def _check_started(self) -> None:
        if not self._started:
            raise BusError("in-process bus is not started: call await bus.start()", retriable=False)

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        """Membership changed (a join or leave): wake every waiting fetch and rebalance to
        look again."""
        await self._wake_rebalances()
        for group in self._groups.values():
            for member in group.members:
                member._wake.set()

    async def _wake_rebalances(self) -> None:
        """A commit or rewind: wake the rebalances waiting for held records (a fetch does not
        wait on other members' commits, so none is woken)."""
        cond = self._condition()
        async with cond:
            cond.notify_all()

    def _wake_owners(self, topic: str, partition: int) -> None:
        """A record landed on ``(topic, partition)``: wake only the members that own it (one
        per group), not every fetch on the bus (a swarm's dozens of members would each wake
        for every record)."""
        tp = (topic, partition)
        for group in self._groups.values():
            for member in group.members:
                if tp in member._assigned:
                    member._wake.set()

    # -- topics -------------------------------------------------------------------------------

    async def create_topics(self, topics: Sequence[TopicSpec]) -> None:
        self._check_started()
        for spec in topics:
            self._create(spec.name, spec.partitions)

    def _create(self, name: str, partitions: int) -> _Topic:
        if not name:
            raise ConfigError("topic name must not be empty")
        if partitions < 1:
            raise ConfigError(f"topic {name!r}: partitions must be >= 1, got {partitions}")
        topic = self._topics.get(name)
        if topic is None:
            topic = _Topic(name, [[] for _ in range(partitions)])
            self._topics[name] = topic
            # A new topic adds partitions to groups that already subscribe to it. They are
            # handed out without moving any existing partition, so no grace period is needed.
            for group in self._groups.values():
                eligible = [m for m in group.members if name in m.topics]
                for p in range(partitions) if eligible else ():
                    owner = eligible[p % len(eligible)]
                    owner._assign(owner._assigned | {(name, p)}, group)
        return topic

    def _topic(self, name: str) -> _Topic:
        topic = self._topics.get(name)
        return topic if topic is not None else self._create(name, self.default_partitions)

    def partitions_for(self, topic: str) -> int:
        """Number of partitions of ``topic`` (created with the default count if new)."""
        return len(self._topic(topic).partitions)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset to be written, per partition (the 'high watermark')."""
        return {p: len(log) for p, log in enumerate(self._topic(topic).partitions)}

    def committed(self, group_id: str, topic: str) -> dict[int, int]:
        """Committed offsets of ``group_id`` on ``topic`` (partitions never committed omitted)."""
        group = self._groups.get(group_id)
        if group is None:
            return {}
        return {p: off for (t, p), off in group.committed.items() if t == topic}

    # -- publish ------------------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> RecordMetadata:
        self._check_started()
        metadata = self._append(topic, value, key, headers)
        self._wake_owners(topic, metadata.partition)
        return metadata

    def _append(
        self, topic: str, value: bytes, key: bytes | str | None, headers: Headers
    ) -> RecordMetadata:
        """Append one record, synchronously (a transaction commit appends many without
        yielding to the loop in between, which is what makes it atomic)."""
        check_value(value)
        k = key_bytes(key)
        t = self._topic(topic)
        n = len(t.partitions)
        if k is None:
            partition = t.next_unkeyed % n
            t.next_unkeyed += 1
        else:
            partition = partition_for_key(k, n)
        log = t.partitions[partition]
        record = Record(
            topic=topic,
            partition=partition,
            offset=len(log),
            key=k,
            value=value,
            headers=tuple((str(h), bytes(v)) for h, v in headers),
            timestamp_ms=int(time.time() * 1000),
        )
        log.append(record)
        return RecordMetadata(topic, partition, record.offset)

    # -- groups -------------------------------------------------------------------------------

    def subscriber(
        self,
        topics: Sequence[str],
        group_id: str,
        *,
        client_id: str = "",
    ) -> InProcSubscriber:
        if not topics:
            raise ConfigError("a subscriber needs at least one topic")
        if not group_id:
            raise ConfigError("group_id must not be empty")
        return InProcSubscriber(self, tuple(topics), group_id, client_id or "inproc")

    def transactional_member(
        self,
        topics: Sequence[str],
        group_id: str,
        transactional_id_prefix: str,
        *,
        client_id: str = "",
    ) -> InProcTransactionalMember:
        check_prefix(transactional_id_prefix)
        member = self.subscriber(topics, group_id, client_id=client_id)
        return InProcTransactionalMember(member, transactional_id_prefix)

    def _claim(self, transactional_id: str) -> int:
        """A new epoch for ``transactional_id``; holders of older epochs are fenced."""
        epoch = self._txn_epochs.get(transactional_id, -1) + 1
        self._txn_epochs[transactional_id] = epoch
        return epoch

    async def _join(self, member: InProcSubscriber) -> None:
        group = self._groups.setdefault(member.group_id, _Group(member.group_id))
        async with group.lock:
            member.member_id = f"{member.client_id}-{next(self._member_ids)}"
            for name in member.topics:
                self._topic(name)
            group.members.append(member)
            await self._rebalance(group)

    async def _leave(self, member: InProcSubscriber) -> None:
        group = self._groups.get(member.group_id)
        if group is None:
            return
        async with group.lock:
            if member not in group.members:
                return
            # A leaving member commits nothing more: its partitions move at once and
            # whatever it fetched without committing is redelivered.
            group.members.remove(member)
            if member._hooks is not None and member._assigned:
                await member._hooks.before_revoke(member._assigned)
            member._assign(frozenset(), group)
            await self._rebalance(group)

    def _plan(self, group: _Group) -> dict[int, frozenset[TopicPartition]]:
        """Round-robin the group's partitions over its members in join order."""
        topics = sorted({t for m in group.members for t in m.topics})
        plan: dict[int, set[TopicPartition]] = {id(m): set() for m in group.members}
        cursor = 0
        for name in topics:
            eligible = [m for m in group.members if name in m.topics]
            for p in range(len(self._topics[name].partitions)):
                plan[id(eligible[cursor % len(eligible)])].add((name, p))
                cursor += 1
        return {k: frozenset(v) for k, v in plan.items()}

    async def _rebalance(self, group: _Group) -> None:
        """Move partitions to the new plan, as Kafka does with a revoke listener.

        Members losing a partition stop receiving its records at once, and get
        ``revoke_grace_s`` to commit the batch they hold (Kafka's ``on_partitions_revoked``);
        what is still uncommitted after that is redelivered to the new owner.
        """
        group.generation += 1
        plan = self._plan(group)
        losing = {m: m._assigned - plan[id(m)] for m in group.members}
        for m, tps in losing.items():
            m._paused = tps
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.revoke_grace_s
        cond = self._condition()
        while any(m._joined and m._pending(tps, group) for m, tps in losing.items()):
            remaining = deadline - loop.time()
            if remaining <= 0:
                _log.warning("group %s: rebalancing with uncommitted records", group.group_id)
                break
            async with cond:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cond.wait(), remaining)
        for m, tps in losing.items():
            if tps and m._hooks is not None:
                await m._hooks.before_revoke(tps)
        added = {m: plan[id(m)] - m._assigned for m in group.members}
        for m in group.members:
            m._paused = frozenset()
            # Added partitions are held (not fetched) until their owner's hook has run.
            m._held = added[m] if m._hooks is not None else frozenset()
            m._assign(plan[id(m)], group)
        for m, tps in added.items():
            if tps and m._hooks is not None:
                try:
                    await m._hooks.after_assign(tps)
                finally:
                    m._held = frozenset()
        _log.debug("group %s generation %d rebalanced", group.group_id, group.generation)

    def _commit(self, member: InProcSubscriber, offsets: dict[TopicPartition, int]) -> None:
        group = self._groups[member.group_id]
        for tp, offset in offsets.items():
            group.committed[tp] = offset


class InProcSubscriber(Subscriber):
    """A member of an in-process consumer group."""

    def __init__(
        self, bus: InProcBus, topics: tuple[str, ...], group_id: str, client_id: str
    ) -> None:
        self.bus = bus
        self.topics = topics
        self.group_id = group_id
        self.client_id = client_id
        self.member_id = ""
        self._assigned: frozenset[TopicPartition] = frozenset()
        # Next offset to fetch per owned partition; reset from the group's committed offset
        # whenever the partition is (re)assigned, which is what makes redelivery happen.
        self._position: dict[TopicPartition, int] = {}
        self._fetched: dict[TopicPartition, int] = {}
        self._joined = False
        self._rotate = 0
        # Partitions being revoked: not fetched from while their batch gets a chance to commit.
        self._paused: frozenset[TopicPartition] = frozenset()
        # Partitions just assigned whose transactional member has not finished claiming them.
        self._held: frozenset[TopicPartition] = frozenset()
        self._hooks: InProcTransactionalMember | None = None
        """The transactional member this subscriber belongs to, if any (claims partitions in
        :meth:`_assign`, runs the rebalance callbacks)."""
        self._wake = asyncio.Event()
        """Set when a record lands on an owned partition or anything changes (the bus's
        ``_notify``); a waiting :meth:`fetch` then looks again."""

    def _pending(self, tps: frozenset[TopicPartition], group: _Group) -> bool:
        """Whether records of ``tps`` were handed out but not committed yet."""
        return any(self._fetched.get(tp, 0) > group.committed.get(tp, 0) for tp in tps)

    def _assign(self, assignment: frozenset[TopicPartition], group: _Group) -> None:
        revoked = self._assigned - assignment
        added = assignment - self._assigned
        for tp in revoked:
            self._position.pop(tp, None)
            self._fetched.pop(tp, None)
        if self._hooks is not None:
            # Claim before reading the committed offset (with no await in between): the
            # previous holder is fenced, so the offset read is final.
            self._hooks._claim(added)
        for tp in added:
            self._position[tp] = group.committed.get(tp, 0)
        self._assigned = assignment

    async def start(self) -> None:
        self.bus._check_started()
        if self._joined:
            return
        self._joined = True
        await self.bus._join(self)
        # Other members waiting in fetch() must see the new assignment.
        await self.bus._notify()

    async def stop(self) -> None:
        if not self._joined:
            return
        self._joined = False
        # Wake a rebalance waiting for this member's commit: it will never come.
        await self.bus._notify()
        await self.bus._leave(self)
        await self.bus._notify()

    def assignment(self) -> frozenset[TopicPartition]:
        return self._assigned

    async def lag(self) -> dict[TopicPartition, int]:
        """Records of each owned partition's log after this member's position."""
        out: dict[TopicPartition, int] = {}
        for tp, position in self._position.items():
            log = self.bus._topics[tp[0]].partitions[tp[1]]
            out[tp] = max(len(log) - position, 0)
        return out

    def _take(self, max_records: int) -> list[Record]:
        owned = sorted(self._assigned - self._paused - self._held)
        if self._hooks is not None:
            skip = self._hooks._fenced | self._hooks._unready
            owned = [tp for tp in owned if tp not in skip]
        if not owned:
            return []
        # Rotate the starting partition so one busy partition cannot starve the others.
        start = self._rotate % len(owned)
        self._rotate += 1
        out: list[Record] = []
        for tp in owned[start:] + owned[:start]:
            log = self.bus._topics[tp[0]].partitions[tp[1]]
            pos = self._position[tp]
            chunk = log[pos : pos + (max_records - len(out))]
            if chunk:
                out.extend(chunk)
                self._position[tp] = pos + len(chunk)
                self._fetched[tp] = pos + len(chunk)
            if len(out) >= max_records:
                break
        return out

    async def fetch(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        if not self._joined:
            raise BusError(f"subscriber {self.client_id} is not started", retriable=False)
        if max_records < 1:
            raise ConfigError(f"max_records must be >= 1, got {max_records}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        while True:
            # Cleared before looking: a record landing after the look sets it again.
            self._wake.clear()
            records = self._take(max_records)
            remaining = deadline - loop.time()
            if records or remaining <= 0 or not self._joined:
                return records
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)

    async def commit(self, records: Sequence[Record] | None = None) -> None:
        if not self._joined:
            raise BusError(f"subscriber {self.client_id} is not started", retriable=False)
        wanted = dict(self._fetched) if records is None else next_offsets(records)
        owned = {tp: off for tp, off in wanted.items() if tp in self._assigned}
        lost = sorted(set(wanted) - set(owned))
        if lost:
            # Same outcome as Kafka after a rebalance: the partition's new owner starts at the
            # last committed offset, so these records are delivered again, not lost.
            _log.info("%s: not committing revoked partitions %s", self.member_id, lost)
        self.bus._commit(self, owned)
        # A rebalance may be waiting for this commit.
        await self.bus._wake_rebalances()

    async def rewind(self, records: Sequence[Record]) -> None:
        for tp, first in first_offsets(records).items():
            if tp in self._assigned:
                self._position[tp] = first
                self._fetched.pop(tp, None)  # nothing of it is held any more
        # A rebalance may be waiting for these records: they are no longer held.
        await self.bus._wake_rebalances()


def check_value(value: object) -> None:
    """Refuse a record value that is not bytes (what every Kafka client does too)."""
    if not isinstance(value, bytes):
        raise ConfigError(f"record value must be bytes, not {type(value).__name__}")


def check_prefix(prefix: str) -> None:
    """Refuse a transactional id prefix that cannot name partitions' ids."""
    if not prefix or not prefix.strip():
        raise ConfigError("transactional_id_prefix must not be empty")


class InProcTransactionalMember(TransactionalMember):
    """A member of an in-process group with one transaction per input partition.

    When a partition is assigned, its transactional id (``prefix.topic.p``) is claimed in the
    same synchronous step as its committed offset is read: the earlier holder is fenced at
    once, as Kafka's ``InitProducerId`` does. A partition transaction's outputs wait in a
    buffer until its commit, which appends them and stores the offset without yielding to the
    event loop in between: no reader, and no rebalance, observes one without the other.
    """

    def __init__(self, member: InProcSubscriber, prefix: str) -> None:
        self.member = member
        self.bus = member.bus
        self.prefix = prefix
        self._epochs: dict[TopicPartition, int] = {}
        """The epoch this member holds per claimed partition id."""
        self._fenced: set[TopicPartition] = set()
        """Owned partitions whose id a newer holder claimed (not fetched, not written)."""
        self._unready: set[TopicPartition] = set()
        """Owned partitions whose ``assigned`` callback failed (retried by :meth:`fetch`)."""
        self._open: dict[TopicPartition, InProcPartitionTransaction] = {}
        self._assigned_cb: PartitionsCallback | None = None
        self._revoked_cb: PartitionsCallback | None = None
        member._hooks = self

    def on_rebalance(
        self,
        *,
        assigned: PartitionsCallback | None = None,
        revoked: PartitionsCallback | None = None,
    ) -> None:
        self._assigned_cb, self._revoked_cb = assigned, revoked

    def _txn_id(self, tp: TopicPartition) -> str:
        return partition_transactional_id(self.prefix, *tp)

    def _claim(self, tps: frozenset[TopicPartition]) -> None:
        """Claim the ids of newly assigned partitions (synchronous: see the class docstring)."""
        for tp in tps:
            self._epochs[tp] = self.bus._claim(self._txn_id(tp))
            self._fenced.discard(tp)

    async def after_assign(self, tps: frozenset[TopicPartition]) -> None:
        """The rebalance's ``assigned`` callback (fetching of ``tps`` waits for it). If it
        fails, ``tps`` are not fetched until a retry (by :meth:`fetch`) succeeds."""
        if self._assigned_cb is None:
            return
        try:
            await self._assigned_cb(tps)
        except Exception:
            _log.exception("%s: assigned callback failed for %s; retrying", self.prefix, tps)
            self._unready |= tps
        else:
            self._unready -= tps

    async def before_revoke(self, tps: frozenset[TopicPartition]) -> None:
        """The ``revoked`` callback, then the open transactions of ``tps`` are discarded."""
        try:
            if self._revoked_cb is not None:
                await self._revoked_cb(tps)
        finally:
            for tp in tps:
                txn = self._open.pop(tp, None)
                if txn is not None:
                    txn._pending = None
                self._epochs.pop(tp, None)
                self._fenced.discard(tp)
                self._unready.discard(tp)

    async def start(self) -> None:
        self.bus._check_started()
        await self.member.start()

    async def stop(self) -> None:
        for txn in self._open.values():
            txn._pending = None
        self._open.clear()
        await self.member.stop()

    async def fetch(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        unready = frozenset(self._unready & self.member.assignment())
        if unready:
            await self.after_assign(unready)
        return await self.member.fetch(max_records, timeout_s)

    def assignment(self) -> frozenset[TopicPartition]:
        return self.member.assignment() - self.member._held - self._unready - self._fenced

    async def lag(self) -> dict[TopicPartition, int]:
        owned = self.assignment()
        return {tp: n for tp, n in (await self.member.lag()).items() if tp in owned}

    def _check(self, tp: TopicPartition, epoch: int) -> None:
        """Refuse to write for ``tp`` unless this member owns it under ``epoch``."""
        if not self.member._joined or tp not in self.member.assignment():
            raise BusError(
                f"partition {tp} is not owned by this member (any more); its owner processes "
                "its records",
                retriable=True,
            )
        if self._epochs.get(tp) != epoch or self.bus._txn_epochs.get(self._txn_id(tp)) != epoch:
            self._fenced.add(tp)
            raise TransactionFencedError(
                f"transactional id {self._txn_id(tp)!r} was claimed by a newer owner"
            )

    async def begin(self, tp: TopicPartition) -> InProcPartitionTransaction:
        tp = (tp[0], tp[1])
        if tp in self.member._held or tp in self._unready:
            raise BusError(f"partition {tp} is not ready yet", retriable=True)
        self._check(tp, self._epochs.get(tp, -1))
        if tp in self._open:
            raise BusError(f"a transaction of {tp} is already open", retriable=False)
        txn = InProcPartitionTransaction(self, tp, self._epochs[tp])
        self._open[tp] = txn
        return txn

    async def rewind(self, records: Sequence[Record]) -> None:
        await self.member.rewind(records)


class InProcPartitionTransaction(PartitionTransaction):
    """The open transaction of one partition of an :class:`InProcTransactionalMember`."""

    def __init__(self, member: InProcTransactionalMember, tp: TopicPartition, epoch: int) -> None:
        self.member = member
        self.tp = tp
        self.epoch = epoch
        self._pending: list[tuple[str, bytes, bytes | None, Headers]] | None = []

    def _buffer(self) -> list[tuple[str, bytes, bytes | None, Headers]]:
        self.member._check(self.tp, self.epoch)
        if self._pending is None or self.member._open.get(self.tp) is not self:
            raise BusError(
                f"the transaction of {self.tp} is closed (committed, aborted or revoked)",
                retriable=True,
            )
        return self._pending

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> None:
        pending = self._buffer()
        if not topic:
            raise ConfigError("topic name must not be empty")
        check_value(value)
        pending.append(
            (topic, value, key_bytes(key), tuple((str(h), bytes(v)) for h, v in headers))
        )

    async def commit(self, records: Sequence[Record]) -> None:
        pending = self._buffer()
        offsets = next_offsets(records)
        others = sorted(set(offsets) - {self.tp})
        if others:
            raise ConfigError(
                f"the transaction of {self.tp} cannot commit records of {others}: one "
                "transaction per partition"
            )
        # From here to the offset, no await: the outputs and the offset land together.
        bus = self.member.bus
        landed = [bus._append(topic, value, key, headers) for topic, value, key, headers in pending]
        bus._commit(self.member.member, offsets)
        self._close()
        for metadata in landed:
            bus._wake_owners(metadata.topic, metadata.partition)
        await bus._wake_rebalances()

    async def abort(self) -> None:
        self._close()

    def _close(self) -> None:
        self._pending = None
        if self.member._open.get(self.tp) is self:
            del self.member._open[self.tp]
