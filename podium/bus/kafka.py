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
  first use, so nothing depends on the broker's auto-create setting.

Every aiokafka failure surfaces as :class:`podium.errors.BusError` with ``retriable`` taken
from the Kafka error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
    TopicAlreadyExistsError,
    for_code,
)
from aiokafka.helpers import create_ssl_context

from podium.bus.base import Bus, Headers, Record, RecordMetadata, Subscriber, TopicSpec
from podium.bus.inproc import key_bytes
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
        if not isinstance(value, bytes):
            raise ConfigError(f"record value must be bytes, not {type(value).__name__}")
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
        if not topics:
            raise ConfigError("a subscriber needs at least one topic")
        if not group_id:
            raise ConfigError("group_id must not be empty")
        config = replace(self.config, client_id=client_id) if client_id else self.config
        return KafkaSubscriber(self, config, tuple(topics), group_id)


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
            for m in msgs:
                out.append(
                    Record(
                        topic=m.topic,
                        partition=m.partition,
                        offset=m.offset,
                        key=m.key,
                        value=m.value,
                        headers=tuple((k, bytes(v)) for k, v in (m.headers or ())),
                        timestamp_ms=m.timestamp,
                    )
                )
            if msgs:
                self._fetched[(tp.topic, tp.partition)] = msgs[-1].offset + 1
        return out

    async def commit(self, records: Sequence[Record] | None = None) -> None:
        consumer = self._require()
        if records is None:
            wanted = dict(self._fetched)
        else:
            wanted = {}
            for r in records:
                tp = (r.topic, r.partition)
                wanted[tp] = max(wanted.get(tp, 0), r.offset + 1)
        live = {(tp.topic, tp.partition) for tp in consumer.assignment()}
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
        self._committed.update(owned)
        self._commit_happened.set()
