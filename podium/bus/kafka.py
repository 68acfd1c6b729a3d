"""The Apache Kafka bus, on aiokafka.

Delivery settings follow ARCHITECTURE.md ("Delivery"):

* the producer is idempotent with ``acks=all``: a retried send after a broker failure or a
  lost acknowledgement is written once, in order;
* consumers never auto-commit: :meth:`KafkaSubscriber.commit` is called after processing;
* a rebalance listener gives the batch in hand a grace period to finish and commit before
  its partitions move, so a graceful rebalance causes no redelivery; whatever is still
  uncommitted after that is redelivered to the new owner (at-least-once, never lost);
* consumers read with ``isolation_level=read_committed`` so records of aborted transactions
  are never seen;
* topics are created with the configured partition count through the admin client before
  first use, so nothing depends on the broker's auto-create setting;
* consume-transform-produce is exactly once with Kafka transactions
  (:class:`KafkaTransactionalMember`): a transactional producer of its own per member, the
  consumed offsets sent into the transaction, fencing by transactional id.

Besides the bus contract, :class:`KafkaBus` offers what only Kafka can do and tools need:
reading a range of a partition's history (:meth:`KafkaBus.read_range`), describing a topic's
partitions, a standalone transactional producer, and positioning consumer groups at the end
of their topics (:meth:`KafkaBus.position_groups_at_end`). Nothing outside this package
speaks aiokafka.

Every aiokafka failure surfaces as :class:`podium.errors.BusError` with ``retriable`` taken
from the Kafka error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CommitFailedError,
    IllegalOperation,
    IllegalStateError,
    KafkaError,
    ProducerFenced,
    TopicAlreadyExistsError,
    for_code,
)
from aiokafka.helpers import create_ssl_context
from aiokafka.structs import ConsumerRecord

from podium.bus.base import (
    Bus,
    Headers,
    Record,
    RecordMetadata,
    Subscriber,
    TopicSpec,
    TransactionalMember,
    TransactionFencedError,
    first_offsets,
    next_offsets,
)
from podium.bus.inproc import check_value, key_bytes
from podium.errors import BusError, ConfigError

_log = logging.getLogger(__name__)

_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_OFFSET_RESETS = ("earliest", "latest")

SASL_PASSWORD_ENV = "PODIUM_KAFKA_SASL_PASSWORD"
"""Environment variable read for the SASL password by :meth:`KafkaConfig.from_url`."""


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """Connection and delivery settings of :class:`KafkaBus`."""

    bootstrap_servers: str
    """Comma-separated ``host:port`` list of brokers to bootstrap from."""
    client_id: str = "podium"
    """Client name shown in broker logs and quotas."""
    security_protocol: str = "PLAINTEXT"
    """One of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL."""
    sasl_mechanism: str = "PLAIN"
    """SASL mechanism when the protocol is SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."""
    sasl_username: str = ""
    """SASL user name (required for SASL_* protocols)."""
    sasl_password: str = ""
    """SASL password (required for SASL_* protocols); never logged."""
    ssl_cafile: str = ""
    """CA bundle used to verify the brokers (SSL/SASL_SSL); empty = system defaults."""
    ssl_certfile: str = ""
    """Client certificate for mutual TLS (optional)."""
    ssl_keyfile: str = ""
    """Private key of ``ssl_certfile``."""
    default_partitions: int = 3
    """Partitions of topics this bus creates implicitly (the unit of consumer parallelism)."""
    replication_factor: int = 1
    """Replication of topics this bus creates implicitly (3 in production clusters)."""
    request_timeout_ms: int = 30_000
    """Upper bound on one broker request."""
    linger_ms: int = 5
    """How long the producer waits to batch records; small, because events are latency-bound."""
    session_timeout_ms: int = 10_000
    """A consumer silent this long is considered dead and its partitions move."""
    heartbeat_interval_ms: int = 3_000
    """Consumer heartbeat period (well under ``session_timeout_ms``)."""
    max_poll_interval_ms: int = 300_000
    """Longest allowed gap between fetches before the member is evicted."""
    isolation_level: str = "read_committed"
    """read_committed hides records of open and aborted transactions."""
    auto_offset_reset: str = "earliest"
    """Where a new group starts: earliest, so events published before it started are not lost."""
    revoke_grace_s: float = 10.0
    """On rebalance, how long the batch in hand may take to finish and commit before its
    partitions are released (then it is redelivered to the new owner)."""
    join_timeout_s: float = 60.0
    """How long ``Subscriber.start`` waits for the first group assignment."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not all(
            ":" in hp for hp in self.bootstrap_servers.split(",")
        ):
            raise ConfigError(
                f"kafka bootstrap_servers must be host:port[,host:port], got {self.bootstrap_servers!r}"
            )
        choices = {
            "security_protocol": (self.security_protocol, _SECURITY_PROTOCOLS),
            "sasl_mechanism": (self.sasl_mechanism, _SASL_MECHANISMS),
            "isolation_level": (self.isolation_level, _ISOLATION_LEVELS),
            "auto_offset_reset": (self.auto_offset_reset, _OFFSET_RESETS),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(
                    f"kafka {name} must be one of {', '.join(allowed)}, got {value!r}"
                )
        if self.security_protocol.startswith("SASL") and not (
            self.sasl_username and self.sasl_password
        ):
            raise ConfigError(
                f"kafka security_protocol {self.security_protocol} needs sasl_username and "
                f"sasl_password (or ${SASL_PASSWORD_ENV})"
            )
        for name in ("default_partitions", "replication_factor", "request_timeout_ms"):
            if getattr(self, name) < 1:
                raise ConfigError(f"kafka {name} must be >= 1, got {getattr(self, name)}")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                "kafka heartbeat_interval_ms must be below session_timeout_ms, got "
                f"{self.heartbeat_interval_ms} >= {self.session_timeout_ms}"
            )

    @classmethod
    def from_url(cls, url: str) -> KafkaConfig:
        """Parse ``kafka://host:port[,host:port][?field=value&...]``.

        Query parameters name :class:`KafkaConfig` fields (e.g.
        ``?security_protocol=SASL_SSL&sasl_username=svc``). The password is taken from
        ``$PODIUM_KAFKA_SASL_PASSWORD`` so it never appears in a URL or a process list.
        """
        parts = urlsplit(url)
        if parts.scheme != "kafka":
            raise ConfigError(f"kafka URL must start with kafka://, got {url!r}")
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, raw in parse_qsl(parts.query, keep_blank_values=True):
            if name not in known or name in ("bootstrap_servers", "sasl_password"):
                raise ConfigError(f"unknown or disallowed kafka URL parameter {name!r}")
            default: object = known[name].default
            try:
                if isinstance(default, bool | int | float):
                    values[name] = type(default)(raw)
                else:
                    values[name] = raw
            except ValueError as exc:
                raise ConfigError(f"kafka URL parameter {name}={raw!r}: {exc}") from exc
        password = os.environ.get(SASL_PASSWORD_ENV, "")
        if password:
            values["sasl_password"] = password
        return cls(bootstrap_servers=parts.netloc, **values)

    def ssl_context(self) -> ssl.SSLContext | None:
        """TLS context for SSL/SASL_SSL, None for plaintext."""
        if "SSL" not in self.security_protocol:
            return None
        context: ssl.SSLContext = create_ssl_context(
            cafile=self.ssl_cafile or None,
            certfile=self.ssl_certfile or None,
            keyfile=self.ssl_keyfile or None,
        )
        return context

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by aiokafka's producer, consumer and admin client."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "client_id": self.client_id,
            "request_timeout_ms": self.request_timeout_ms,
            "security_protocol": self.security_protocol,
            "ssl_context": self.ssl_context(),
        }
        if self.security_protocol.startswith("SASL"):
            kwargs |= {
                "sasl_mechanism": self.sasl_mechanism,
                "sasl_plain_username": self.sasl_username,
                "sasl_plain_password": self.sasl_password,
            }
        return kwargs


def bus_error(action: str, exc: BaseException) -> BusError:
    """Wrap an aiokafka failure, keeping Kafka's own verdict on whether to retry."""
    retriable = bool(getattr(exc, "retriable", isinstance(exc, OSError | TimeoutError)))
    return BusError(f"kafka {action} failed: {type(exc).__name__}: {exc}", retriable=retriable)


class KafkaBus(Bus):
    """:class:`~podium.bus.base.Bus` over a real Kafka cluster."""

    def __init__(self, config: KafkaConfig | str) -> None:
        self.config = config if isinstance(config, KafkaConfig) else KafkaConfig(config)
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._known_topics: set[str] = set()
        self._topic_lock = asyncio.Lock()

    async def start(self) -> None:
        if self._producer is not None:
            return
        producer = AIOKafkaProducer(
            **self.config.client_kwargs(),
            acks="all",
            enable_idempotence=True,
            linger_ms=self.config.linger_ms,
        )
        admin = AIOKafkaAdminClient(**self.config.client_kwargs())
        try:
            await producer.start()
            await admin.start()
        except (KafkaError, OSError) as exc:
            await producer.stop()
            await admin.close()
            raise bus_error(f"connect to {self.config.bootstrap_servers}", exc) from exc
        self._producer, self._admin = producer, admin

    async def stop(self) -> None:
        producer, admin = self._producer, self._admin
        self._producer = self._admin = None
        if producer is not None:
            # stop() flushes pending sends before closing.
            await producer.stop()
        if admin is not None:
            await admin.close()

    @property
    def replication_factor(self) -> int:
        return self.config.replication_factor

    def _started(self) -> tuple[AIOKafkaProducer, AIOKafkaAdminClient]:
        if self._producer is None or self._admin is None:
            raise BusError("kafka bus is not started: call await bus.start()", retriable=False)
        return self._producer, self._admin

    async def create_topics(self, topics: Sequence[TopicSpec]) -> None:
        _, admin = self._started()
        wanted = [t for t in topics if t.name not in self._known_topics]
        if not wanted:
            return
        async with self._topic_lock:
            new = [NewTopic(t.name, t.partitions, t.replication_factor) for t in wanted]
            try:
                response = await admin.create_topics(new)
            except KafkaError as exc:
                raise bus_error(f"create topics {[t.name for t in wanted]}", exc) from exc
            for entry in response.topic_errors:
                name, code = entry[0], entry[1]
                if code != 0:
                    err = for_code(code)
                    if err is not TopicAlreadyExistsError:
                        message = entry[2] if len(entry) > 2 else ""
                        raise BusError(
                            f"kafka create topic {name} failed: {err.__name__}: {message}",
                            retriable=bool(err.retriable),
                        )
                self._known_topics.add(name)

    async def ensure_topics(self, names: Sequence[str]) -> None:
        """Create any of ``names`` not known yet, with the configured defaults."""
        missing = [n for n in names if n not in self._known_topics]
        if missing:
            await self.create_topics(
                [
                    TopicSpec(n, self.config.default_partitions, self.config.replication_factor)
                    for n in missing
                ]
            )

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> RecordMetadata:
        producer, _ = self._started()
        check_value(value)
        await self.ensure_topics([topic])
        try:
            md = await producer.send_and_wait(
                topic, value, key=key_bytes(key), headers=[(k, bytes(v)) for k, v in headers]
            )
        except KafkaError as exc:
            raise bus_error(f"publish to {topic}", exc) from exc
        return RecordMetadata(md.topic, md.partition, md.offset)

    def subscriber(
        self,
        topics: Sequence[str],
        group_id: str,
        *,
        client_id: str = "",
    ) -> KafkaSubscriber:
        _check_member(topics, group_id)
        config = replace(self.config, client_id=client_id) if client_id else self.config
        return KafkaSubscriber(self, config, tuple(topics), group_id)

    def transactional_member(
        self,
        topics: Sequence[str],
        group_id: str,
        transactional_id: str,
        *,
        client_id: str = "",
    ) -> KafkaTransactionalMember:
        _check_member(topics, group_id)
        # Exactly-once needs read_committed: an aborted transaction's records must stay unseen.
        config = replace(
            self.config,
            client_id=client_id or self.config.client_id,
            isolation_level="read_committed",
        )
        member = KafkaSubscriber(self, config, tuple(topics), group_id)
        producer = KafkaTransactionalProducer(config, transactional_id)
        return KafkaTransactionalMember(member, producer)

    def transactional_producer(
        self, transactional_id: str, *, client_id: str = ""
    ) -> KafkaTransactionalProducer:
        """A (not yet started) transactional producer of its own, outside any group."""
        config = replace(self.config, client_id=client_id) if client_id else self.config
        return KafkaTransactionalProducer(config, transactional_id)

    async def partitions(self, topic: str, *, wait_s: float = 0.0) -> list[int]:
        """Partition numbers of ``topic``; empty if it does not exist (after ``wait_s``: a
        topic created a moment ago takes a little while to show in the metadata)."""
        _, admin = self._started()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                described = await admin.describe_topics([topic])
            except KafkaError as exc:
                raise bus_error(f"describe topic {topic}", exc) from exc
            found = sorted(
                p["partition"]
                for d in described
                if d.get("error_code") == 0
                for p in d["partitions"]
            )
            if found or loop.time() >= deadline:
                return found
            await asyncio.sleep(0.25)

    async def position_groups_at_end(self, groups: Mapping[str, Sequence[str]]) -> None:
        """Commit, for each consumer group, the current end offset of each of its topics.

        A group that joins later then starts exactly there: it neither misses an event
        published after this call (as ``auto_offset_reset=latest`` can, when a member resolves
        its position only after the event) nor replays older runs (as ``earliest`` does on a
        shared broker). Topics created a moment ago are waited for; a topic still missing
        after 10 s is a :class:`ConfigError`.
        """
        for group, names in groups.items():
            tps: list[TopicPartition] = []
            for name in names:
                parts = await self.partitions(name, wait_s=10.0)
                if not parts:
                    raise ConfigError(f"group {group}: topic {name} does not exist on the broker")
                tps += [TopicPartition(name, p) for p in parts]
            consumer = AIOKafkaConsumer(
                group_id=group, enable_auto_commit=False, **self.config.client_kwargs()
            )
            try:
                await consumer.start()
                consumer.assign(tps)
                ends = await consumer.end_offsets(tps)
                await consumer.commit(dict(ends))
            except (KafkaError, OSError) as exc:
                raise bus_error(f"positioning group {group}", exc) from exc
            finally:
                await consumer.stop()

    async def read_range(
        self,
        topic: str,
        partition: int,
        start: int,
        stop: int | None = None,
        *,
        max_records: int = 500,
    ) -> AsyncIterator[list[Record]]:
        """Committed records of one partition with offsets in ``[start, stop)``, in chunks.

        Read without a consumer group (nothing is committed, nobody's position moves);
        ``stop=None`` means the partition's end when the call starts. Records of aborted
        transactions are skipped (read_committed), so a chunk may hold fewer offsets than the
        range it covers.
        """
        consumer = AIOKafkaConsumer(
            **self.config.client_kwargs(),
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        tp = TopicPartition(topic, partition)
        try:
            await consumer.start()
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            stop = end if stop is None else min(stop, end)
            if start >= stop:
                return
            consumer.seek(tp, start)
            while await consumer.position(tp) < stop:
                batch = await consumer.getmany(tp, timeout_ms=1000, max_records=max_records)
                chunk = [_record(m) for m in batch.get(tp, []) if m.offset < stop]
                if chunk:
                    yield chunk
        except (KafkaError, OSError) as exc:
            raise bus_error(f"read {topic}[{partition}]", exc) from exc
        finally:
            await consumer.stop()


def _check_member(topics: Sequence[str], group_id: str) -> None:
    """Refuse a group member without topics or group (the in-process bus refuses the same)."""
    if not topics:
        raise ConfigError("a subscriber needs at least one topic")
    if not group_id:
        raise ConfigError("group_id must not be empty")


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, subscriber: KafkaSubscriber) -> None:
        self.subscriber = subscriber

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.subscriber._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.subscriber._on_assigned(set(assigned))


class KafkaSubscriber(Subscriber):
    """A member of a Kafka consumer group (an aiokafka consumer with manual commits)."""

    def __init__(
        self, bus: KafkaBus, config: KafkaConfig, topics: tuple[str, ...], group_id: str
    ) -> None:
        self.bus = bus
        self.config = config
        self.topics = topics
        self.group_id = group_id
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: frozenset[tuple[str, int]] = frozenset()
        self._joined = asyncio.Event()
        # Per partition: offset after the last record handed out, and after the last commit.
        self._fetched: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._commit_happened = asyncio.Event()
        # Set by stop(): no commit can come any more, so a rebalance must not wait for one.
        self._stopping = False

    async def start(self) -> None:
        if self._consumer is not None:
            return
        self._stopping = False
        await self.bus.ensure_topics(self.topics)
        consumer = AIOKafkaConsumer(
            **self.config.client_kwargs(),
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset=self.config.auto_offset_reset,
            isolation_level=self.config.isolation_level,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            max_poll_interval_ms=self.config.max_poll_interval_ms,
        )
        consumer.subscribe(list(self.topics), listener=_Listener(self))
        try:
            await consumer.start()
        except (KafkaError, OSError) as exc:
            await consumer.stop()
            raise bus_error(f"consumer start for group {self.group_id}", exc) from exc
        self._consumer = consumer
        try:
            await asyncio.wait_for(self._joined.wait(), self.config.join_timeout_s)
        except TimeoutError as exc:
            await self.stop()
            raise BusError(
                f"kafka group {self.group_id}: no assignment within {self.config.join_timeout_s}s",
                retriable=True,
            ) from exc

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            # aiokafka's stop waits for its group task, which may be inside a rebalance,
            # i.e. in _on_revoked waiting for the batch in hand to commit. The caller stops
            # after that batch was committed or abandoned, so nothing more will come: wake
            # the wait now rather than sit out revoke_grace_s before leaving the group.
            self._stopping = True
            self._commit_happened.set()
            # With auto-commit off, aiokafka commits nothing here: uncommitted records are
            # redelivered to the next owner, which is the contract.
            await consumer.stop()
        self._assigned = frozenset()
        self._joined.clear()

    def assignment(self) -> frozenset[tuple[str, int]]:
        return self._assigned

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        self._assigned = frozenset((tp.topic, tp.partition) for tp in assigned)
        self._joined.set()

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Give the batch in hand ``revoke_grace_s`` to commit before the partitions move."""
        tps = {(tp.topic, tp.partition) for tp in revoked}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.revoke_grace_s
        while not self._stopping and (pending := self._pending(tps)):
            remaining = deadline - loop.time()
            if remaining <= 0:
                _log.warning(
                    "group %s: rebalance with uncommitted records on %s; they will be redelivered",
                    self.group_id,
                    sorted(pending),
                )
                break
            self._commit_happened.clear()
            try:
                await asyncio.wait_for(self._commit_happened.wait(), remaining)
            except TimeoutError:
                continue
        for tp in tps:
            self._fetched.pop(tp, None)
            self._committed.pop(tp, None)
        self._assigned = self._assigned - tps

    def _pending(self, tps: set[tuple[str, int]]) -> set[tuple[str, int]]:
        return {tp for tp in tps if self._fetched.get(tp, 0) > self._committed.get(tp, 0)}

    def _require(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise BusError(f"subscriber of group {self.group_id} is not started", retriable=False)
        return self._consumer

    async def fetch(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        consumer = self._require()
        if max_records < 1:
            raise ConfigError(f"max_records must be >= 1, got {max_records}")
        try:
            batches = await consumer.getmany(
                timeout_ms=int(max(timeout_s, 0.0) * 1000), max_records=max_records
            )
        except KafkaError as exc:
            raise bus_error(f"fetch for group {self.group_id}", exc) from exc
        out: list[Record] = []
        for tp, msgs in batches.items():
            out += [_record(m) for m in msgs]
            if msgs:
                self._fetched[(tp.topic, tp.partition)] = msgs[-1].offset + 1
        return out

    async def commit(self, records: Sequence[Record] | None = None) -> None:
        consumer = self._require()
        wanted = dict(self._fetched) if records is None else next_offsets(records)
        live = self._live()
        owned = {tp: off for tp, off in wanted.items() if tp in live}
        if len(owned) < len(wanted):
            _log.info(
                "group %s: not committing revoked partitions %s; their new owner redelivers",
                self.group_id,
                sorted(set(wanted) - set(owned)),
            )
        if not owned:
            return
        try:
            await consumer.commit({TopicPartition(t, p): off for (t, p), off in owned.items()})
        except (CommitFailedError, IllegalStateError) as exc:
            # The group moved on (rebalance or eviction): same outcome as a revoked partition.
            _log.warning("group %s: commit rejected after rebalance: %s", self.group_id, exc)
            return
        except KafkaError as exc:
            raise bus_error(f"commit for group {self.group_id}", exc) from exc
        self._mark_committed(owned)

    def _live(self) -> set[tuple[str, int]]:
        """Partitions the consumer owns right now (the listener's view lags a rebalance)."""
        return {(tp.topic, tp.partition) for tp in self._require().assignment()}

    def _mark_committed(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Record a commit (this member's, or its transaction's) and wake a waiting revoke."""
        self._committed.update(offsets)
        self._commit_happened.set()

    async def rewind(self, records: Sequence[Record]) -> None:
        consumer = self._require()
        live = self._live()
        for tp, first in first_offsets(records).items():
            if tp in live:
                consumer.seek(TopicPartition(*tp), first)
                self._fetched.pop(tp, None)  # nothing of it is held any more
        # A revoke waiting for these records must re-check: they are no longer held.
        self._commit_happened.set()


def _record(m: ConsumerRecord[bytes, bytes]) -> Record:
    """An aiokafka record as a bus :class:`Record`."""
    return Record(
        topic=m.topic,
        partition=m.partition,
        offset=m.offset,
        key=m.key,
        value=m.value,
        headers=tuple((k, bytes(v)) for k, v in (m.headers or ())),
        timestamp_ms=m.timestamp,
    )


def _retrieve(delivery: asyncio.Future[Any]) -> None:
    """Mark a transactional send's failure as seen.

    Inside a transaction a failed send also fails the commit (or takes the producer out of the
    transaction), which is where it is handled; without this, asyncio would log each one as a
    "Future exception was never retrieved" traceback.
    """
    if not delivery.cancelled():
        delivery.exception()


def fatal_transaction_error(producer: AIOKafkaProducer) -> BaseException | None:
    """The error that put ``producer``'s transaction in aiokafka's fatal state, else None.

    This is the one place Podium reads aiokafka's private ``_txn_manager``, because aiokafka
    has no public accessor: when its background sender is fenced (AddPartitionsToTxn answers
    ProducerFenced) it takes the producer out of the transaction, and the next public call
    only says "not in transaction"; the cause, which decides between "fenced: stop" and
    "retry the batch", is kept on the future ``commit_transaction`` would await. Reading it
    here also marks that future's exception as retrieved, so asyncio does not log it as lost.
    """
    txn = getattr(producer, "_txn_manager", None)
    if txn is None or not txn.is_fatal_error():
        return None
    waiter = txn.wait_for_transaction_end()
    cause = waiter.exception() if waiter.done() else None
    return cause if cause is not None else BusError("transactional producer in a fatal state")


_TXN_ERRORS = (KafkaError, IllegalOperation, OSError)
"""What a transactional call may raise: Kafka errors, and aiokafka's IllegalOperation (not a
KafkaError) when its background sender has taken the producer out of the transaction."""


class KafkaTransactionalProducer:
    """A Kafka transactional producer: records published between :meth:`begin` and
    :meth:`commit` become visible to read_committed readers together, or (after
    :meth:`abort`, or a crash) never.

    Its :meth:`start` claims the transactional id: the broker bumps the id's epoch, which
    aborts whatever transaction a dead predecessor left open and fences a live one.
    Failures are :class:`BusError`: :class:`TransactionFencedError` when fenced, not
    retriable when the producer is in a fatal state, retriable (abort, then retry the
    transaction) otherwise.
    """

    def __init__(self, config: KafkaConfig, transactional_id: str) -> None:
        if not transactional_id:
            raise ConfigError("transactional_id must not be empty")
        self.config = config
        self.transactional_id = transactional_id
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect and claim the transactional id (InitProducerId)."""
        if self._producer is not None:
            return
        producer = AIOKafkaProducer(
            **self.config.client_kwargs(),
            transactional_id=self.transactional_id,
            enable_idempotence=True,
            acks="all",
            linger_ms=self.config.linger_ms,
        )
        try:
            await producer.start()
        except (KafkaError, OSError) as exc:
            await producer.stop()
            raise bus_error(f"transactional producer start ({self.transactional_id})", exc) from exc
        self._producer = producer

    async def stop(self) -> None:
        """Disconnect; an open transaction is not committed (the broker aborts it when the id
        is claimed again, or when it times out)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    def _require(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise BusError("transactional producer is not started", retriable=False)
        return self._producer

    def _failure(self, action: str, exc: BaseException) -> BusError:
        """Classify a failure inside a transaction (see the class docstring)."""
        producer = self._require()
        cause: BaseException | None = exc
        if isinstance(exc, IllegalOperation):
            # The background sender may have failed and left the transaction; its recorded
            # cause says why (None: a plain abortable state).
            cause = fatal_transaction_error(producer)
            if cause is not None and not isinstance(cause, ProducerFenced):
                return BusError(
                    f"transactional producer failed: {type(cause).__name__}: {cause}",
                    retriable=False,
                )
        if isinstance(cause, ProducerFenced):
            fatal_transaction_error(producer)  # seen here: asyncio need not report it as lost
            return TransactionFencedError(
                f"transactional id {self.transactional_id!r} was claimed by a newer producer"
            )
        return BusError(f"kafka {action} failed: {type(exc).__name__}: {exc}", retriable=True)

    async def begin(self) -> None:
        """Open a transaction."""
        producer = self._require()
        try:
            await producer.begin_transaction()
        except _TXN_ERRORS as exc:
            raise self._failure("begin transaction", exc) from exc

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> None:
        """Add one record to the open transaction (delivery is confirmed by the commit)."""
        producer = self._require()
        check_value(value)
        try:
            delivery = await producer.send(
                topic, value, key=key_bytes(key), headers=[(k, bytes(v)) for k, v in headers]
            )
        except _TXN_ERRORS as exc:
            raise self._failure(f"send to {topic}", exc) from exc
        delivery.add_done_callback(_retrieve)

    async def commit(
        self, offsets: Mapping[tuple[str, int], int] | None = None, group_id: str = ""
    ) -> None:
        """Commit the open transaction, with ``offsets`` as ``group_id``'s consumed position."""
        producer = self._require()
        try:
            if offsets:
                await producer.send_offsets_to_transaction(
                    {TopicPartition(t, p): off for (t, p), off in offsets.items()}, group_id
                )
            await producer.commit_transaction()
        except _TXN_ERRORS as exc:
            raise self._failure("commit transaction", exc) from exc

    async def abort(self) -> None:
        """Abort the open transaction: nothing of it becomes visible."""
        producer = self._require()
        try:
            await producer.abort_transaction()
        except _TXN_ERRORS as exc:
            raise bus_error("abort transaction", exc) from exc


class KafkaTransactionalMember(TransactionalMember):
    """Exactly-once consume-transform-produce on Kafka: a :class:`KafkaSubscriber` (read
    committed, manual offsets, revoke grace) and a :class:`KafkaTransactionalProducer` that
    commits the subscriber's offsets inside its transaction.

    On a rebalance the revoke listener waits (``revoke_grace_s``) for the transaction in hand
    to commit, as for any batch; a commit whose partitions were revoked anyway is refused (and
    aborted by the caller), so the new owner, not this member, produces their outputs.
    Limitation: aiokafka's ``send_offsets_to_transaction`` takes a group id, not the group
    metadata of KIP-447, so zombie fencing relies on one live member per transactional id.
    """

    def __init__(self, subscriber: KafkaSubscriber, producer: KafkaTransactionalProducer) -> None:
        self.subscriber = subscriber
        self.producer = producer

    async def start(self) -> None:
        # The producer first: claiming the id aborts a dead predecessor's open transaction
        # before this member reads the offsets that transaction did not commit.
        await self.producer.start()
        try:
            await self.subscriber.start()
        except BaseException:
            await self.producer.stop()
            raise

    async def stop(self) -> None:
        try:
            await self.subscriber.stop()
        finally:
            await self.producer.stop()

    async def fetch(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        return await self.subscriber.fetch(max_records, timeout_s)

    def assignment(self) -> frozenset[tuple[str, int]]:
        return self.subscriber.assignment()

    async def begin(self) -> None:
        await self.producer.begin()

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> None:
        await self.producer.publish(topic, value, key=key, headers=headers)

    async def commit(self, records: Sequence[Record]) -> None:
        offsets = next_offsets(records)
        lost = sorted(set(offsets) - self.subscriber._live())
        if lost:
            raise BusError(
                f"partitions {lost} were revoked during the transaction; their new owner "
                "processes these records",
                retriable=True,
            )
        await self.producer.commit(offsets, self.subscriber.group_id)
        self.subscriber._mark_committed(offsets)

    async def abort(self, records: Sequence[Record]) -> None:
        try:
            await self.producer.abort()
        finally:
            await self.subscriber.rewind(records)
