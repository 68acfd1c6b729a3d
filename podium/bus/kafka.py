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
  (:class:`KafkaTransactionalMember`): a transactional producer per owned input partition
  (transactional id ``prefix.topic.p``), claimed before the partition's committed offset is
  read, the consumed offset sent into the partition's transaction: zombies are fenced and the
  offset fetch is stable without KIP-447.

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
from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    CommitFailedError,
    IllegalOperation,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    ProducerFenced,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedSaslMechanismError,
    for_code,
)
from aiokafka.helpers import create_ssl_context
from aiokafka.structs import ConsumerRecord

from podium.bus.base import (
    TP,
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
from podium.bus.inproc import check_prefix, check_value, key_bytes
from podium.errors import BusError, ConfigError

_log = logging.getLogger(__name__)

_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_OFFSET_RESETS = ("earliest", "latest")

BROKER_MESSAGE_BYTES = 1_000_000
"""The broker's message limit producers of big events (trajectories, task specs) plan for:
Kafka's default ``message.max.bytes`` (1048588) and producer ``max.request.size`` (1 MiB),
rounded down for envelope headroom."""

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
    """Replication of topics this bus creates (3 in production clusters). A floor: a
    :class:`TopicSpec` asking for fewer replicas gets this many, so a service that starts
    before the cluster's declared topics exist never creates one that ``min.insync.replicas``
    would then refuse every write to."""
    request_timeout_ms: int = 30_000
    """Upper bound on one broker request."""
    linger_ms: int = 5
    """How long the producer waits to batch records; small, because events are latency-bound."""
    max_batch_bytes: int = 262_144
    """Most bytes of one producer batch of one partition (aiokafka's ``max_batch_size``).
    aiokafka sends one request per broker at a time, with at most one batch per partition in
    it, so this bounds a producer's throughput per round trip, and every publish that finds
    its partition's batch full waits for it to be sent, then all of them race for the next
    one. aiokafka's 16 KiB default (Java's, whose producer has 5 requests in flight) halved
    the throughput of ``podium bench bus``; a batch is sent when ``linger_ms`` is up whatever
    its size, so a bigger bound costs no latency. At most :data:`BROKER_MESSAGE_BYTES`."""
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
        if not 1 <= self.max_batch_bytes <= BROKER_MESSAGE_BYTES:
            raise ConfigError(
                f"kafka max_batch_bytes must be in [1, {BROKER_MESSAGE_BYTES}], "
                f"got {self.max_batch_bytes}"
            )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                "kafka heartbeat_interval_ms must be below session_timeout_ms, got "
                f"{self.heartbeat_interval_ms} >= {self.session_timeout_ms}"
            )

    @classmethod
    def from_url(cls, url: str, *, sasl_password: str | None = None) -> KafkaConfig:
        """Parse ``kafka://host:port[,host:port][?field=value&...]``.

        Query parameters name :class:`KafkaConfig` fields (e.g.
        ``?security_protocol=SASL_SSL&sasl_username=svc``). The password is taken from
        ``$PODIUM_KAFKA_SASL_PASSWORD`` so it never appears in a URL or a process list;
        ``sasl_password`` overrides it for a caller that holds the password itself (a tool
        talking to a broker it started).
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
        password = os.environ.get(SASL_PASSWORD_ENV, "") if sasl_password is None else sasl_password
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

    def producer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the bus's producer (:class:`KafkaBus`): :meth:`client_kwargs`
        and the delivery settings (idempotent, ``acks=all``, ``linger_ms``,
        ``max_batch_bytes``). Written once, so the raw peer (``podium.bus.raw``) that
        ``podium bench bus`` measures the bus against has the same."""
        return self.client_kwargs() | {
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": self.linger_ms,
            "max_batch_size": self.max_batch_bytes,
        }

    def consumer_kwargs(self, group_id: str) -> dict[str, Any]:
        """Keyword arguments of a group member's consumer (:class:`KafkaSubscriber`): manual
        commits, the reset point, the isolation level and the group timeouts."""
        return self.client_kwargs() | {
            "group_id": group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": self.auto_offset_reset,
            "isolation_level": self.isolation_level,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "max_poll_interval_ms": self.max_poll_interval_ms,
        }


def bus_error(action: str, exc: BaseException) -> BusError:
    """Wrap an aiokafka failure, keeping Kafka's own verdict on whether to retry."""
    retriable = bool(getattr(exc, "retriable", isinstance(exc, OSError | TimeoutError)))
    return BusError(f"kafka {action} failed: {type(exc).__name__}: {exc}", retriable=retriable)


_AUTH_ERRORS = (AuthenticationFailedError, SaslAuthenticationFailed, UnsupportedSaslMechanismError)


async def connect_error(config: KafkaConfig, exc: BaseException) -> BusError:
    """The error of a failed first connection, naming authentication or TLS when that is why.

    aiokafka's bootstrap only logs why each broker refused it and raises "Unable to
    bootstrap", so a wrong password or an untrusted certificate would look like a retriable
    network failure and be retried forever. For a secured config, one direct connection to
    the first broker tells them apart: those two are not retriable.
    """
    action = f"connect to {config.bootstrap_servers}"
    if config.security_protocol == "PLAINTEXT" or not isinstance(exc, KafkaConnectionError):
        return bus_error(action, exc)
    host, _, port = config.bootstrap_servers.split(",")[0].rpartition(":")
    kwargs = {k: v for k, v in config.client_kwargs().items() if k != "bootstrap_servers"}
    try:
        conn = await create_conn(host, int(port), **kwargs)
    except _AUTH_ERRORS as cause:
        return BusError(
            f"kafka {action} failed: authentication as {config.sasl_username!r} "
            f"({config.sasl_mechanism}) refused: {type(cause).__name__}: {cause}",
            retriable=False,
        )
    except ssl.SSLError as cause:
        return BusError(
            f"kafka {action} failed: TLS handshake: {cause} "
            f"(ssl_cafile={config.ssl_cafile or 'the system CAs'})",
            retriable=False,
        )
    except (KafkaError, OSError):
        return bus_error(action, exc)
    conn.close()
    return bus_error(action, exc)


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
        producer = AIOKafkaProducer(**self.config.producer_kwargs())
        admin = AIOKafkaAdminClient(**self.config.client_kwargs())
        try:
            await producer.start()
            await admin.start()
        except (KafkaError, OSError) as exc:
            await producer.stop()
            await admin.close()
            raise await connect_error(self.config, exc) from exc
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
            # Concurrent first publishes to a topic all queue here: only the first creates it.
            wanted = [t for t in wanted if t.name not in self._known_topics]
            if not wanted:
                return
            new = [
                NewTopic(
                    t.name,
                    t.partitions,
                    max(t.replication_factor, self.config.replication_factor),
                    topic_configs=dict(t.config),
                )
                for t in wanted
            ]
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

    async def topic_names(self) -> list[str]:
        """Every topic on the cluster this principal may describe, sorted."""
        _, admin = self._started()
        try:
            return sorted(await admin.list_topics())
        except KafkaError as exc:
            raise bus_error("list topics", exc) from exc

    async def delete_topics(self, names: Sequence[str]) -> None:
        """Delete ``names`` with their records (a benchmark's own topics, once measured); a
        topic that does not exist is skipped. The broker finishes a deletion in the
        background, so a topic of the same name may be refused for a moment after. A
        principal without the Delete permission on a topic gets a BusError naming it."""
        _, admin = self._started()
        if not names:
            return
        try:
            response = await admin.delete_topics(list(names))
        except KafkaError as exc:
            raise bus_error(f"delete topics {list(names)}", exc) from exc
        failed = []
        for name, code, *_ in response.topic_error_codes:
            err = for_code(code) if code else None
            if err is not None and err is not UnknownTopicOrPartitionError:
                failed.append(f"{name}: {err.__name__}")
        self._known_topics.difference_update(names)
        if failed:
            raise BusError(f"kafka delete topics failed: {'; '.join(failed)}", retriable=False)

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
        if topic not in self._known_topics:
            await self.ensure_topics([topic])
        try:
            # send() and the delivery awaited here, not send_and_wait(): one coroutine less on
            # the path of every event (podium bench bus).
            delivery = await producer.send(
                topic, value, key=key_bytes(key), headers=[(k, bytes(v)) for k, v in headers]
            )
            md = await delivery
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
        transactional_id_prefix: str,
        *,
        client_id: str = "",
    ) -> KafkaTransactionalMember:
        _check_member(topics, group_id)
        check_prefix(transactional_id_prefix)
        # Exactly-once needs read_committed: an aborted transaction's records must stay unseen.
        config = replace(
            self.config,
            client_id=client_id or self.config.client_id,
            isolation_level="read_committed",
        )
        member = KafkaSubscriber(self, config, tuple(topics), group_id)
        return KafkaTransactionalMember(member, transactional_id_prefix)

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
            await self._position_at_end(group, tps)

    async def _position_at_end(self, group: str, tps: list[TopicPartition]) -> None:
        """Commit the end offsets of ``tps`` for ``group``.

        A commit from outside the group is refused while the group still has a member: after
        a kill -9 the dead incarnation stays a member until its session times out. So a
        refused commit is tried again until one session timeout (and a margin) has passed,
        instead of failing the restart that is replacing it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.5 * self.config.session_timeout_ms / 1000 + 5.0
        while True:
            consumer = AIOKafkaConsumer(
                group_id=group, enable_auto_commit=False, **self.config.client_kwargs()
            )
            try:
                await consumer.start()
                consumer.assign(tps)
                ends = await consumer.end_offsets(tps)
                await consumer.commit(dict(ends))
                return
            except CommitFailedError as exc:
                if loop.time() >= deadline:
                    raise bus_error(f"positioning group {group}", exc) from exc
                _log.info("group %s still has a member (a dead one?); retrying", group)
            except (KafkaError, OSError) as exc:
                raise bus_error(f"positioning group {group}", exc) from exc
            finally:
                await consumer.stop()
            await asyncio.sleep(1.0)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset to be written per partition of ``topic`` (empty if it does not exist):
        where a tail read (:func:`podium.bus.read.read_tail`) starts counting back from."""
        parts = await self.partitions(topic)
        if not parts:
            return {}
        consumer = AIOKafkaConsumer(**self.config.client_kwargs(), enable_auto_commit=False)
        tps = [TopicPartition(topic, p) for p in parts]
        try:
            await consumer.start()
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
        except (KafkaError, OSError) as exc:
            raise bus_error(f"end offsets of {topic}", exc) from exc
        finally:
            await consumer.stop()
        return {tp.partition: int(off) for tp, off in ends.items()}

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
            # Retention may have deleted the range's head: a seek below the log start is out
            # of range, and "latest" would then skip to the end (read nothing). "earliest"
            # starts at the log start instead, with no extra request when nothing was deleted
            # (asking the log start first slowed every ledger read after a broker restart).
            auto_offset_reset="earliest",
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
    """aiokafka's rebalance listener: runs in the consumer's group task, between leaving the
    old assignment and fetching from the new one."""

    def __init__(self, subscriber: KafkaSubscriber, consumer: AIOKafkaConsumer) -> None:
        self.subscriber = subscriber
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.subscriber._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        hooks = self.subscriber._hooks
        if hooks is not None:
            # Claim the partitions' transactional ids before their offsets are used (see
            # KafkaTransactionalMember).
            tps = frozenset((t.topic, t.partition) for t in assigned)
            await hooks._acquire(self.consumer, tps)
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
        self._hooks: KafkaTransactionalMember | None = None
        """The transactional member this subscriber belongs to, if any (its partitions are
        claimed on assignment and released on revocation)."""

    async def start(self) -> None:
        if self._consumer is not None:
            return
        self._stopping = False
        await self.bus.ensure_topics(self.topics)
        consumer = AIOKafkaConsumer(**self.config.consumer_kwargs(self.group_id))
        consumer.subscribe(list(self.topics), listener=_Listener(self, consumer))
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

    async def lag(self) -> dict[tuple[str, int], int]:
        """From the last fetch responses: the partition's end (the last stable offset under
        ``read_committed``, so open transactions do not count) minus the consumer's position
        (which steps over transaction markers, so a caught-up member reads 0). Partitions not
        fetched from yet are left out: their end is unknown, and their position may still be
        resolving (asking for it would wait on the broker)."""
        consumer = self._consumer
        if consumer is None:
            return {}
        committed_only = self.config.isolation_level == "read_committed"
        out: dict[tuple[str, int], int] = {}
        for tp in consumer.assignment():
            key = (tp.topic, tp.partition)
            end = consumer.last_stable_offset(tp) if committed_only else consumer.highwater(tp)
            if end is None or end < 0 or key not in self._fetched:
                continue
            try:
                position = await consumer.position(tp)
            except (KafkaError, IllegalStateError):
                continue  # revoked meanwhile
            out[key] = max(end - position, 0)
        return out

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
        if self._hooks is not None:
            await self._hooks._release(frozenset(tps))
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
    """An aiokafka record as a bus :class:`Record`. aiokafka already gives the headers as a
    tuple of ``(str, bytes)``, kept as they are (this runs for every record consumed); a header
    without a value (Kafka allows it) becomes ``b""``, as :data:`Headers` are bytes."""
    headers: Headers = m.headers or ()
    for _, value in headers:
        if value is None:
            headers = tuple((k, v or b"") for k, v in headers)
            break
    return Record(m.topic, m.partition, m.offset, m.key, m.value, headers, m.timestamp)


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
            max_batch_size=self.config.max_batch_bytes,
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
    """Exactly-once consume-transform-produce on Kafka without KIP-447: a
    :class:`KafkaSubscriber` (read committed, manual offsets, revoke grace) and one
    :class:`KafkaTransactionalProducer` per owned input partition, with the transactional id
    :func:`~podium.bus.base.partition_transactional_id`.

    Why per partition: aiokafka's ``send_offsets_to_transaction`` carries no group generation
    and its offset fetch cannot wait for a pending transaction, so with one id per member a
    zombie (paused past its session) still commits, and a new owner may read an offset a
    pending transaction is about to move. With one id per partition, the new owner's
    ``InitProducerId`` fences the zombie's producer and ends its open transaction.

    Order on assignment (:meth:`_acquire`, in the rebalance listener): pause the partitions,
    claim their ids, run the ``assigned`` callback, read their committed offsets afresh,
    seek there and resume. aiokafka starts its own committed-offset refresh *before* calling
    the listener, so the position it resolves may predate the claim; the explicit seek
    replaces it and makes aiokafka drop anything fetched from the stale position, and
    :meth:`fetch` drops records of partitions not claimed yet. A partition whose claim
    failed (broker down), or whose transaction ended with an unknown outcome (a commit or
    abort the broker did not confirm), stays paused and is claimed again by :meth:`fetch`:
    the new claim waits for that transaction to end, and the fresh offset says whether it
    committed, so the batch is neither lost nor committed twice.
    """

    def __init__(self, subscriber: KafkaSubscriber, prefix: str) -> None:
        self.subscriber = subscriber
        self.prefix = prefix
        self.config = subscriber.config
        subscriber._hooks = self
        self._producers: dict[TP, KafkaTransactionalProducer] = {}
        self._ready: set[TP] = set()
        """Owned partitions claimed and positioned: fetched from and written for."""
        self._unclaimed: set[TP] = set()
        """Owned partitions waiting for a (new) claim, paused meanwhile."""
        self._fenced: set[TP] = set()
        """Owned partitions whose id a newer owner claimed (until the next rebalance)."""
        self._open: dict[TP, KafkaPartitionTransaction] = {}
        self._generation = 0
        """Bumped by every release, so a claim that raced a rebalance is discarded."""
        self._claim_lock = asyncio.Lock()
        self._next_claim_s = 0.0
        self._claim_backoff_s = 0.0
        self._assigned_cb: PartitionsCallback | None = None
        self._revoked_cb: PartitionsCallback | None = None

    @property
    def group_id(self) -> str:
        return self.subscriber.group_id

    def on_rebalance(
        self,
        *,
        assigned: PartitionsCallback | None = None,
        revoked: PartitionsCallback | None = None,
    ) -> None:
        self._assigned_cb, self._revoked_cb = assigned, revoked

    # -- claiming and releasing partitions ----------------------------------------------------

    def _timeout_s(self) -> float:
        """Bound on one claim or abort: a stalled broker must not stall the group task."""
        return self.config.request_timeout_ms / 1000 * 2

    async def _acquire(self, consumer: AIOKafkaConsumer, tps: frozenset[TP]) -> None:
        """Newly assigned ``tps``: paused at once, then claimed (see the class docstring)."""
        consumer.pause(*(TopicPartition(*tp) for tp in tps))
        self._unclaimed |= tps
        self._claim_backoff_s = 0.0
        await self._claim(consumer, tps)

    async def _claim(self, consumer: AIOKafkaConsumer, tps: frozenset[TP]) -> None:
        """Claim ``tps``' ids, run ``assigned``, seek to the committed offsets, resume; what
        fails stays in ``_unclaimed`` for the next try."""
        async with self._claim_lock:
            generation = self._generation
            started = await asyncio.gather(*(self._start_producer(tp) for tp in sorted(tps)))
            claimed = {tp: p for tp, p in zip(sorted(tps), started, strict=True) if p is not None}
            try:
                if generation != self._generation or not claimed:
                    raise _Stale
                if self._assigned_cb is not None:
                    await self._assigned_cb(frozenset(claimed))
                offsets = await self._committed_offsets(consumer, frozenset(claimed))
                if generation != self._generation:
                    raise _Stale
            except Exception as exc:
                if not isinstance(exc, _Stale):
                    _log.warning("%s: claiming %s failed: %s", self, sorted(claimed), exc)
                await asyncio.gather(*(self._stop_producer(p) for p in claimed.values()))
                self._schedule_claim_retry()
                return
            # No await from here on: positions, readiness and producers change together.
            live = {(t.topic, t.partition) for t in consumer.assignment()}
            for tp, producer in claimed.items():
                if tp not in live:
                    continue
                self._producers[tp] = producer
                consumer.seek(TopicPartition(*tp), offsets[tp])
                consumer.resume(TopicPartition(*tp))
                self._unclaimed.discard(tp)
                self._fenced.discard(tp)
                self._ready.add(tp)
            if len(claimed) < len(tps):
                self._schedule_claim_retry()
            else:
                self._claim_backoff_s = 0.0

    def _schedule_claim_retry(self) -> None:
        loop = asyncio.get_running_loop()
        self._claim_backoff_s = min(max(self._claim_backoff_s * 2, 0.5), 10.0)
        self._next_claim_s = loop.time() + self._claim_backoff_s

    async def _start_producer(self, tp: TP) -> KafkaTransactionalProducer | None:
        """A started producer for ``tp``'s id (InitProducerId: fences the previous holder and
        waits for its open transaction to end), or None if the broker did not answer."""
        old = self._producers.pop(tp, None)
        if old is not None:
            await self._stop_producer(old)
        producer = KafkaTransactionalProducer(
            self.config, partition_transactional_id(self.prefix, *tp)
        )
        try:
            await asyncio.wait_for(producer.start(), self._timeout_s())
        except (BusError, TimeoutError) as exc:
            _log.warning("%s: claiming %s failed, retried later: %s", self, tp, exc)
            await self._stop_producer(producer)
            return None
        return producer

    async def _committed_offsets(
        self, consumer: AIOKafkaConsumer, tps: frozenset[TP]
    ) -> dict[TP, int]:
        """Where each of ``tps`` resumes: its committed offset, read now (after the claim,
        so it is stable), else the configured reset point."""
        out: dict[TP, int] = {}
        missing: list[TopicPartition] = []
        for tp in sorted(tps):
            committed = await consumer.committed(TopicPartition(*tp))
            if committed is None:
                missing.append(TopicPartition(*tp))
            else:
                out[tp] = committed
        if missing:
            if self.config.auto_offset_reset == "earliest":
                reset = await consumer.beginning_offsets(missing)
            else:
                reset = await consumer.end_offsets(missing)
            out |= {(t.topic, t.partition): off for t, off in reset.items()}
        return out

    async def _stop_producer(self, producer: KafkaTransactionalProducer) -> None:
        """Stop ``producer`` (its open transaction is ended by the next claim), bounded."""
        try:
            await asyncio.wait_for(producer.stop(), self._timeout_s())
        except Exception as exc:  # a dead producer must not stop a rebalance
            _log.warning("%s: stopping producer %s: %s", self, producer.transactional_id, exc)

    async def _release(self, tps: frozenset[TP]) -> None:
        """Revoked ``tps`` (after the revoke grace): ``revoked`` callback, then their open
        transactions are aborted and their producers stopped."""
        self._generation += 1
        if self._revoked_cb is not None and tps:
            try:
                await self._revoked_cb(tps)
            except Exception:
                _log.exception("%s: revoked callback failed for %s", self, sorted(tps))
        stopping = []
        for tp in tps:
            self._ready.discard(tp)
            self._unclaimed.discard(tp)
            self._fenced.discard(tp)
            txn = self._open.pop(tp, None)
            producer = self._producers.pop(tp, None)
            if producer is not None:
                stopping.append(self._abort_and_stop(producer, txn is not None))
        await asyncio.gather(*stopping)

    async def _abort_and_stop(self, producer: KafkaTransactionalProducer, is_open: bool) -> None:
        if is_open:
            try:
                await asyncio.wait_for(producer.abort(), self._timeout_s())
            except Exception as exc:  # the next claim ends it anyway
                _log.warning("%s: abort on revoke failed: %s", self, exc)
        await self._stop_producer(producer)

    def _unclaim(self, tp: TP, why: str) -> None:
        """``tp``'s transaction ended with an unknown outcome: pause it and claim it anew
        (the claim waits for that transaction to end; the fresh offset tells whether it
        committed)."""
        _log.warning("%s: re-claiming %s: %s", self, tp, why)
        if self._drop(tp):
            self._unclaimed.add(tp)

    def _fence(self, tp: TP) -> None:
        """A newer owner claimed ``tp``'s id: never write for it again (until reassigned)."""
        _log.warning("%s: partition %s was taken over by a newer owner (fenced)", self, tp)
        self._fenced.add(tp)
        self._drop(tp)

    def _drop(self, tp: TP) -> bool:
        """Forget ``tp``'s open transaction, producer and fetched records, and pause it;
        whether it was still assigned (and so is paused now)."""
        self._open.pop(tp, None)
        self._ready.discard(tp)
        producer = self._producers.pop(tp, None)
        if producer is not None:
            asyncio.get_running_loop().create_task(self._stop_producer(producer))
        self.subscriber._fetched.pop(tp, None)
        consumer = self.subscriber._consumer
        if consumer is None or tp not in self.subscriber._live():
            return False
        consumer.pause(TopicPartition(*tp))
        return True

    # -- the member API -----------------------------------------------------------------------

    async def start(self) -> None:
        await self.subscriber.start()

    async def stop(self) -> None:
        # aiokafka's consumer.stop() leaves the group without calling the revoke listener.
        owned = frozenset(self._ready | self._unclaimed | self._fenced | set(self._producers))
        try:
            await self._release(owned)
        finally:
            await self.subscriber.stop()

    async def fetch(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        consumer = self.subscriber._require()
        waiting = frozenset(self._unclaimed & self.subscriber._live())
        if waiting and asyncio.get_running_loop().time() >= self._next_claim_s:
            await self._claim(consumer, waiting)
        records = await self.subscriber.fetch(max_records, timeout_s)
        dropped = {(r.topic, r.partition) for r in records} - self._ready
        for tp in dropped:
            # Fetched from a position resolved before the claim: the claim seeks anew.
            self.subscriber._fetched.pop(tp, None)
        return [r for r in records if (r.topic, r.partition) in self._ready]

    def assignment(self) -> frozenset[TP]:
        return frozenset(self._ready)

    async def lag(self) -> dict[TP, int]:
        return {tp: n for tp, n in (await self.subscriber.lag()).items() if tp in self._ready}

    async def begin(self, tp: TP) -> KafkaPartitionTransaction:
        tp = (tp[0], tp[1])
        if tp in self._fenced:
            raise TransactionFencedError(
                f"transactional id {partition_transactional_id(self.prefix, *tp)!r} was "
                "claimed by a newer owner"
            )
        producer = self._producers.get(tp)
        if tp not in self._ready or producer is None or tp not in self.subscriber._live():
            raise BusError(
                f"partition {tp} is not owned and claimed by this member", retriable=True
            )
        if tp in self._open:
            raise BusError(f"a transaction of {tp} is already open", retriable=False)
        try:
            await producer.begin()
        except TransactionFencedError:
            self._fence(tp)
            raise
        except BusError as exc:
            self._unclaim(tp, f"begin failed: {exc}")
            raise BusError(str(exc), retriable=True) from exc
        txn = KafkaPartitionTransaction(self, tp, producer)
        self._open[tp] = txn
        return txn

    async def rewind(self, records: Sequence[Record]) -> None:
        await self.subscriber.rewind(records)

    def __str__(self) -> str:
        return f"transactional member of {self.group_id} ({self.prefix}.*)"


class _Stale(Exception):
    """A claim overtaken by a rebalance (or that claimed nothing): discard it."""


class KafkaPartitionTransaction(PartitionTransaction):
    """The open transaction of one input partition of a :class:`KafkaTransactionalMember`,
    on that partition's own transactional producer."""

    def __init__(
        self, member: KafkaTransactionalMember, tp: TP, producer: KafkaTransactionalProducer
    ) -> None:
        self.member = member
        self.tp = tp
        self.producer = producer

    def _check_open(self) -> None:
        if self.member._open.get(self.tp) is not self:
            if self.tp in self.member._fenced:
                raise TransactionFencedError(
                    f"partition {self.tp} was taken over by a newer owner during the transaction"
                )
            raise BusError(
                f"the transaction of {self.tp} was ended (partition revoked, or failed); its "
                "owner processes these records",
                retriable=True,
            )

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> None:
        self._check_open()
        try:
            await self.producer.publish(topic, value, key=key, headers=headers)
        except TransactionFencedError:
            self.member._fence(self.tp)
            raise
        except BusError as exc:
            if exc.retriable:
                raise
            # The producer is in a fatal state: a new claim (a new producer) recovers.
            self.member._unclaim(self.tp, f"publish failed: {exc}")
            raise BusError(str(exc), retriable=True) from exc

    async def commit(self, records: Sequence[Record]) -> None:
        self._check_open()
        offsets = next_offsets(records)
        others = sorted(set(offsets) - {self.tp})
        if others:
            raise ConfigError(
                f"the transaction of {self.tp} cannot commit records of {others}: one "
                "transaction per partition"
            )
        if self.tp not in self.member.subscriber._live():
            await self.abort()
            raise BusError(
                f"partition {self.tp} was revoked during the transaction; its new owner "
                "processes these records",
                retriable=True,
            )
        try:
            await self.producer.commit(offsets, self.member.group_id)
        except TransactionFencedError:
            self.member._fence(self.tp)
            raise
        except BusError as exc:
            # Did it commit? Only a new claim can tell (it waits for the transaction to end).
            self.member._unclaim(self.tp, f"commit outcome unknown: {exc}")
            raise BusError(str(exc), retriable=True) from exc
        self.member._open.pop(self.tp, None)
        self.member.subscriber._mark_committed(offsets)

    async def abort(self) -> None:
        if self.member._open.get(self.tp) is not self:
            return
        del self.member._open[self.tp]
        try:
            await asyncio.wait_for(self.producer.abort(), self.member._timeout_s())
        except Exception as exc:  # any failure: let a new claim end it
            self.member._unclaim(self.tp, f"abort failed: {exc}")
