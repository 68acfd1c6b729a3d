"""The consume loop and the publisher every Podium service uses.

:class:`EventConsumer` turns a :class:`~podium.bus.base.Subscriber` into at-least-once,
effectively-once processing:

1. fetch a batch, decode each record with :func:`podium.codec.decode_envelope` (the codec is
   the only place bytes become messages);
2. skip events whose ``event_id`` was already handled (bounded LRU: redelivery after a
   rebalance or crash is normal under at-least-once, handlers should not see it twice);
3. call ``await handler(envelope, record)`` inside the producer's trace context;
4. a record that cannot be decoded, whose handler fails with a non-retriable error (at once),
   or whose handler failed ``max_attempts`` times in a row with retriable errors
   (:data:`DEFAULT_MAX_ATTEMPTS`), is published unchanged to
   ``podium.topics.dead_letter(topic)`` with headers naming its source topic, partition,
   offset, the error and the attempts made, and the partition moves on: one poison message
   must not stall a session's partition, and nothing is dropped (the dead letter keeps it);
5. between attempts, retriable errors (:func:`is_retriable`: ``PodiumError.retriable``,
   connection errors, timeouts, EAGAIN-like ``OSError`` s) wait a capped exponential backoff;
6. the batch is committed only after every record in it was handled or dead-lettered.

:class:`EventPublisher` is the producing side: codec-encoded envelope, trace context in the
envelope and in Kafka headers (so kcat users and non-Python consumers see it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType

from google.protobuf.message import Message
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context

from podium import codec, telemetry, topics
from podium.bus.base import (
    Bus,
    Headers,
    Publisher,
    Record,
    RecordMetadata,
    Subscriber,
    TopicSpec,
)
from podium.errors import BusError, ConfigError, DecodeError, PodiumError
from podium.metrics import lag_by_topic, record_consumer_lag, record_dead_letters
from podium.v1 import envelope_pb2

_log = logging.getLogger(__name__)
_tracer = trace.get_tracer("podium.bus")

Handler = Callable[[envelope_pb2.Envelope, Record], Awaitable[None]]
"""``async def handler(envelope, record) -> None``; raise to signal failure."""

# Headers written on dead-lettered records. Names are stable: operators filter on them.
DLQ_SOURCE_TOPIC = "podium.dlq.source_topic"
"""Topic the dead-lettered record was read from."""
DLQ_SOURCE_PARTITION = "podium.dlq.source_partition"
"""Partition it was read from (decimal)."""
DLQ_SOURCE_OFFSET = "podium.dlq.source_offset"
"""Offset it had there (decimal)."""
DLQ_ERROR = "podium.dlq.error"
"""Error text (UTF-8, truncated to 2000 characters)."""
DLQ_ERROR_TYPE = "podium.dlq.error_type"
"""Exception class name, e.g. ``DecodeError``."""
DLQ_GROUP = "podium.dlq.group"
"""Consumer group that gave up on it."""
DLQ_PRODUCER = "podium.dlq.producer"
"""Service instance that dead-lettered it."""
DLQ_FAILED_AT_MS = "podium.dlq.failed_at_ms"
"""Wall-clock time of the failure, milliseconds since the epoch."""
DLQ_ATTEMPTS = "podium.dlq.attempts"
"""How many times the record was tried before it was given up on (decimal; absent when the
dead-lettering code does not count, e.g. a record that could not even be decoded)."""

DEFAULT_MAX_ATTEMPTS = 5
"""Tries of one record before it is dead-lettered, retriable failures included. Every
consume loop of Podium uses it (:class:`EventConsumer`, :class:`podium.bus.Transformer`): a
record that fails this often is poison for this service whatever the error says, and
retrying it forever would stall its partition. Five tries with the default backoff span
about a second plus the handler's own timeouts (a Kafka publish inside a handler waits out
the producer's request timeout before it fails), so a broker blip does not dead-letter
healthy records."""

EVENT_ID_HEADER = "podium.event_id"
"""Envelope event id, copied into a header so it can be read without protobuf."""
EVENT_TYPE_HEADER = "podium.event_type"
"""Envelope payload type, copied into a header for the same reason."""

_TRACE_HEADERS = frozenset({"traceparent", "tracestate", "baggage"})
_MAX_ERROR_CHARS = 2000


def dead_letter_headers(
    topic: str,
    partition: int,
    offset: int,
    exc: BaseException,
    *,
    group_id: str,
    producer: str,
    attempts: int | None = None,
) -> Headers:
    """The headers every Podium dead letter carries: where the poison record came from
    (topic, partition, offset), why it was rejected, and who rejected it when; with
    ``attempts``, how many tries it was given."""
    error = str(exc)[:_MAX_ERROR_CHARS] or type(exc).__name__
    headers: Headers = (
        (DLQ_SOURCE_TOPIC, topic.encode()),
        (DLQ_SOURCE_PARTITION, str(partition).encode()),
        (DLQ_SOURCE_OFFSET, str(offset).encode()),
        (DLQ_ERROR, error.encode("utf-8", "replace")),
        (DLQ_ERROR_TYPE, type(exc).__name__.encode()),
        (DLQ_GROUP, group_id.encode()),
        (DLQ_PRODUCER, producer.encode()),
        (DLQ_FAILED_AT_MS, str(int(time.time() * 1000)).encode()),
    )
    if attempts is not None:
        headers += ((DLQ_ATTEMPTS, str(attempts).encode()),)
    return headers


async def publish_dead_letter(
    bus: Publisher,
    record: Record,
    exc: BaseException,
    *,
    group_id: str,
    producer: str,
    attempts: int | None = None,
) -> None:
    """Publish ``record`` unchanged (key, value, headers) to its topic's dead-letter topic with
    :func:`dead_letter_headers` appended (one attempt; callers with a retry policy loop).

    ``bus`` may be an open transaction, so that the dead letter commits with the offsets.
    """
    await bus.publish(
        topics.dead_letter(record.topic),
        record.value or b"",
        key=record.key,
        headers=record.headers
        + dead_letter_headers(
            record.topic,
            record.partition,
            record.offset,
            exc,
            group_id=group_id,
            producer=producer,
            attempts=attempts,
        ),
    )


TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.EWOULDBLOCK,
        errno.EINTR,
        errno.EBUSY,
        errno.EINPROGRESS,
        errno.EALREADY,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ENOTCONN,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.ENETRESET,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.EADDRNOTAVAIL,
        errno.ENOBUFS,
        errno.ENOMEM,
        errno.EMFILE,
        errno.ENFILE,
    }
)
"""``OSError.errno`` values that describe the moment (a busy peer, a full table, a network
that is down) rather than the request: trying again later may succeed."""


_TRANSIENT_SSL_ERRORS = (
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
    ssl.SSLWantReadError,
    ssl.SSLWantWriteError,
    ssl.SSLSyscallError,
)


def _os_error_is_transient(exc: OSError) -> bool:
    """Whether an ``OSError`` describes the moment, not the request.

    Connection errors, timeouts, ``EAGAIN`` and the like pass; a missing file, a permission, a
    path that is a directory, a bad argument (``FileNotFoundError``, ``PermissionError``,
    ``IsADirectoryError``, ``NotADirectoryError``, ``EINVAL``...) and an ``OSError`` without
    an errno do not: the same record would fail the same way forever.
    """
    if isinstance(exc, ConnectionError | TimeoutError | BlockingIOError | InterruptedError):
        return True
    if isinstance(exc, socket.gaierror):
        # Name resolution: "try again" is the resolver's transient answer, the rest are not.
        return exc.errno == socket.EAI_AGAIN
    if isinstance(exc, ssl.SSLError):
        # Its errno is an SSL_ERROR_* code, not an errno: a connection torn down mid-stream is
        # transient, a certificate or protocol failure is not.
        return isinstance(exc, _TRANSIENT_SSL_ERRORS)
    return exc.errno in TRANSIENT_ERRNOS


def is_retriable(exc: BaseException) -> bool:
    """Whether trying the same record again may succeed.

    Podium errors say so themselves. Timeouts and transient ``OSError`` s (connection errors,
    ``EAGAIN``-like errnos: :data:`TRANSIENT_ERRNOS`) are retriable; every other ``OSError``
    (a missing file, a permission, a bad argument) is about the request and is not. Anything
    else is a bug or bad data: retrying would block the partition, so it goes to the
    dead-letter topic where a human can look at it. Even retriable errors are tried at most
    :data:`DEFAULT_MAX_ATTEMPTS` times per record by the consume loops.
    """
    if isinstance(exc, PodiumError):
        return exc.retriable
    if isinstance(exc, TimeoutError):
        return True
    if isinstance(exc, OSError):
        return _os_error_is_transient(exc)
    return False


@dataclass
class ConsumerStats:
    """Counters of what a consumer did, for logs, metrics and tests."""

    fetched: int = 0
    """Records fetched from the bus (redeliveries included)."""
    handled: int = 0
    """Records the handler completed."""
    duplicates: int = 0
    """Records skipped because their event id was already handled."""
    dead_lettered: int = 0
    """Records published to a dead-letter topic."""
    exhausted: int = 0
    """Of those, records whose handler failed ``max_attempts`` times with retriable errors."""
    retries: int = 0
    """Handler or bus calls retried after a retriable error."""
    commits: int = 0
    """Successful commits."""


class _Abandoned(Exception):
    """A retry loop gave up because the consumer is stopping; the record is redelivered later."""


class RecentKeys:
    """A bounded set of recently seen keys (event ids, for de-duplication)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        if key in self._items:
            self._items.move_to_end(key)
            return True
        return False

    def add(self, key: str) -> None:
        if key in self._items:
            self._items.move_to_end(key)
            return
        self._items[key] = None  # a new key goes to the end
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def _headers_as_text(headers: Headers) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers:
        try:
            out[k] = v.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out


def trace_carrier(envelope: envelope_pb2.Envelope, record: Record) -> dict[str, str]:
    """Trace context of a consumed event: the envelope's, or the record headers' if it has none.

    The envelope is authoritative (it survives re-publishing by tools that drop headers); the
    headers are the fallback for records written by non-Podium producers.
    """
    if envelope.trace_context:
        return dict(envelope.trace_context)
    return {k: v for k, v in _headers_as_text(record.headers).items() if k in _TRACE_HEADERS}


def producer_context(envelope: envelope_pb2.Envelope, record: Record) -> Context:
    """The context a consumed event was published in (:func:`trace_carrier`'s), read without
    copying the envelope's map in the common case of a ``traceparent`` alone."""
    carried = envelope.trace_context
    if len(carried) == 1:
        traceparent = carried.get("traceparent")
        if traceparent is not None:
            return telemetry.context_from_traceparent(traceparent)
    return telemetry.extract_trace_context(trace_carrier(envelope, record))


def traced(span_context: trace.SpanContext) -> bool:
    """Whether the bus makes its own span under ``span_context``: when the trace is sampled,
    or when there is no trace yet (the span starts one, the sampler decides).

    An unsampled trace gets no producer or consumer span of the bus: the SDK's default sampler
    (parent-based) would make only a non-recording one, whose cost per event was most of the
    bus layer's (``podium bench bus``). Its events still carry the trace context and the
    consumer's handler still runs in it, so a session stays one trace, sampled or not.
    """
    return not span_context.is_valid or bool(span_context.trace_flags.sampled)


class _SpanScope:
    """A span made current for a block (``with``), or, in an unsampled trace (:func:`traced`),
    only the context the event belongs to. A class rather than a generator context manager:
    it runs once per event on both sides of the bus, where the generator's frame and wrapper
    were a measurable share of the layer's cost."""

    __slots__ = ("_context", "_make", "_scope", "_token")

    def __init__(self, context: Context | None, make: Callable[[Context | None], trace.Span]):
        self._context = context
        """The context the event belongs to (None: the current one, nothing to attach)."""
        self._make = make
        """Starts the span under a given parent context (called only when traced)."""
        self._scope: contextlib.AbstractContextManager[trace.Span] | None = None
        self._token: object = None

    def __enter__(self) -> trace.Span:
        if self._context is not None:
            self._token = otel_context.attach(self._context)
        try:
            parent = trace.get_current_span(self._context)
            if not traced(parent.get_span_context()):
                return parent
            self._scope = trace.use_span(self._make(self._context), end_on_exit=True)
            return self._scope.__enter__()
        except BaseException:
            if self._token is not None:  # no __exit__ follows a failed __enter__
                otel_context.detach(self._token)  # type: ignore[arg-type]
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._scope is not None:
                self._scope.__exit__(kind, exc, tb)
        finally:
            if self._token is not None:
                otel_context.detach(self._token)  # type: ignore[arg-type]


def consume_span(
    envelope: envelope_pb2.Envelope, record: Record, group_id: str
) -> contextlib.AbstractContextManager[trace.Span]:
    """The consumer span of processing one event, in its producer's trace (what it publishes
    meanwhile joins that trace too: one trace per session). In an unsampled trace the block
    runs in the producer's context without a span of its own (:func:`traced`); the producer's
    (non-recording) span is what ``with`` gives then."""

    def make(parent: Context | None) -> trace.Span:
        return _tracer.start_span(
            f"{record.topic} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "kafka",
                "messaging.destination.name": record.topic,
                "messaging.kafka.destination.partition": record.partition,
                "messaging.kafka.message.offset": record.offset,
                "messaging.consumer.group.name": group_id,
                "messaging.message.id": envelope.event_id,
            },
        )

    return _SpanScope(producer_context(envelope, record), make)


def publish_span(topic: str) -> contextlib.AbstractContextManager[trace.Span]:
    """The producer span of publishing one event to ``topic``, current inside the block. In
    an unsampled trace there is none (:func:`traced`): the event carries the caller's context,
    and ``with`` gives the caller's span."""

    def make(parent: Context | None) -> trace.Span:
        return _tracer.start_span(
            f"{topic} publish",
            context=parent,
            kind=trace.SpanKind.PRODUCER,
            attributes={"messaging.system": "kafka", "messaging.destination.name": topic},
        )

    return _SpanScope(None, make)


_NONE: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
"""The publish scope of an unsampled trace: nothing to start (:func:`publish_span` would make
the same decision, at the price of its own object per event)."""


def encode_record(
    message: Message,
    *,
    producer: str,
    key: str,
    idempotency_key: str = "",
    event_id: str | None = None,
    occurred_at: datetime | None = None,
    extra_headers: Mapping[str, str] | None = None,
) -> tuple[envelope_pb2.Envelope, bytes, Headers]:
    """``message`` as a Podium record: the codec's envelope bytes, and headers carrying the
    current trace context, the event id and the event type (readable without protobuf)."""
    carrier, trace_headers = telemetry.trace_carrier_and_headers()
    envelope, data = codec.encode_event(
        message,
        producer=producer,
        key=key,
        trace_context=carrier,
        idempotency_key=idempotency_key,
        event_id=event_id,
        occurred_at=occurred_at,
    )
    headers = (
        *trace_headers,
        (EVENT_ID_HEADER, envelope.event_id.encode()),
        (EVENT_TYPE_HEADER, envelope.type.encode()),
    )
    if extra_headers:
        headers += tuple((k, v.encode()) for k, v in extra_headers.items())
    return envelope, data, headers


class EventConsumer:
    """Runs ``handler`` over every event of ``topics`` as one member of ``group_id``.

    Use either ``await consumer.run()`` (in a task; ``await consumer.stop()`` ends it
    gracefully) or ``start()`` / ``run_once()`` / ``stop()`` for step-by-step control.
    """

    def __init__(
        self,
        bus: Bus,
        topics: Sequence[str],
        group_id: str,
        handler: Handler,
        *,
        producer_name: str,
        dlq: bool = True,
        max_batch: int = 100,
        fetch_timeout_s: float = 0.2,
        dedupe_capacity: int = 100_000,
        retry_backoff_s: float = 0.05,
        retry_backoff_max_s: float = 5.0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        create_topics: bool = True,
        partitions: int = 3,
        client_id: str = "",
    ) -> None:
        """
        Args:
            bus: a started bus.
            topics: topics to consume.
            group_id: consumer group; members of one group share the partitions.
            handler: called once per new event; raise to signal failure.
            producer_name: this service instance, stamped on dead-lettered records.
            dlq: dead-letter poison records (True) or stop with the error (False).
            max_batch: records per fetch; the unit of commit.
            fetch_timeout_s: how long one fetch waits for records; bounds stop latency.
            dedupe_capacity: event ids remembered for de-duplication.
            retry_backoff_s: first delay before retrying a retriable failure.
            retry_backoff_max_s: cap of the exponentially growing delay.
            max_attempts: handler calls per record before it is dead-lettered, retriable
                failures included (a non-retriable failure is dead-lettered at the first).
            create_topics: create the topics and their dead-letter topics on start.
            partitions: partition count used when creating topics.
            client_id: name of this member in broker logs (defaults to producer_name).
        """
        if not topics:
            raise ConfigError("EventConsumer needs at least one topic")
        if not group_id:
            raise ConfigError("EventConsumer group_id must not be empty")
        if not producer_name:
            raise ConfigError("EventConsumer producer_name must not be empty")
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        if max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {max_attempts}")
        if dedupe_capacity < 1:
            raise ConfigError(f"dedupe_capacity must be >= 1, got {dedupe_capacity}")
        if retry_backoff_s <= 0 or retry_backoff_max_s < retry_backoff_s:
            raise ConfigError(
                "retry_backoff_s must be > 0 and <= retry_backoff_max_s, got "
                f"{retry_backoff_s} and {retry_backoff_max_s}"
            )
        self.bus = bus
        self.topics = tuple(topics)
        self.group_id = group_id
        self.handler = handler
        self.producer_name = producer_name
        self.dlq = dlq
        self.max_batch = max_batch
        self.fetch_timeout_s = fetch_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.max_attempts = max_attempts
        self.create_topics = create_topics
        self.partitions = partitions
        self.stats = ConsumerStats()
        self._seen = RecentKeys(dedupe_capacity)
        self._subscriber: Subscriber = bus.subscriber(
            self.topics, group_id, client_id=client_id or producer_name
        )
        self._started = False
        self._stopping = asyncio.Event()
        self._running = False
        self._run_done: asyncio.Event | None = None

    @property
    def subscriber(self) -> Subscriber:
        """The underlying group member (e.g. to inspect its assignment)."""
        return self._subscriber

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Create topics (and dead-letter topics) if configured, then join the group."""
        if self._started:
            return
        if self.create_topics:
            names = list(self.topics)
            if self.dlq:
                names += [topics.dead_letter(t) for t in self.topics]
            await self.bus.create_topics([TopicSpec(n, self.partitions) for n in names])
        await self._subscriber.start()
        self._started = True
        self._stopping.clear()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop gracefully: stop fetching, finish and commit the batch in hand, leave the group.

        If ``run()`` is active this waits for it (up to ``timeout_s``; after that the batch
        is abandoned uncommitted, so it is redelivered to the next owner, never lost).
        """
        self._stopping.set()
        if self._running and self._run_done is not None:
            try:
                await asyncio.wait_for(self._run_done.wait(), timeout_s)
            except TimeoutError:
                _log.warning("%s: run() did not finish within %.1fs", self.group_id, timeout_s)
        if self._started:
            self._started = False
            await self._subscriber.stop()

    async def run(self) -> None:
        """Consume until :meth:`stop` is called (or a non-dead-letterable error with dlq=False)."""
        await self.start()
        self._running = True
        self._run_done = asyncio.Event()
        try:
            while not self._stopping.is_set():
                await self.run_once()
        finally:
            self._running = False
            self._run_done.set()

    async def run_once(self) -> int:
        """Fetch one batch, handle it, commit it. Returns the number of records fetched."""
        if not self._started:
            raise BusError("EventConsumer is not started: call start() or run()", retriable=False)
        batch = await self._fetch()
        if not batch:
            return 0
        self.stats.fetched += len(batch)
        done: list[Record] = []
        try:
            for record in batch:
                await self._process(record)
                done.append(record)
        except _Abandoned:
            _log.info(
                "%s: stopping with %d of %d records handled; the rest will be redelivered",
                self.group_id,
                len(done),
                len(batch),
            )
        finally:
            # Commit what was handled even if a later record raised (dlq=False), so only the
            # failing record and those after it are redelivered.
            if done:
                await self._commit(done)
        return len(batch)

    # -- internals ----------------------------------------------------------------------------

    async def _fetch(self) -> list[Record]:
        delay = self.retry_backoff_s
        while True:
            try:
                batch = await self._subscriber.fetch(self.max_batch, self.fetch_timeout_s)
            except BusError as exc:
                if not exc.retriable or self._stopping.is_set():
                    raise
                self.stats.retries += 1
                _log.warning("%s: fetch failed (%s); retrying in %.2fs", self.group_id, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_backoff_max_s)
                continue
            lags = lag_by_topic(await self._subscriber.lag(), self.topics)
            record_consumer_lag(self.group_id, lags)
            return batch

    async def _process(self, record: Record) -> None:
        try:
            envelope = codec.decode_envelope(record.value)
        except DecodeError as exc:
            await self._dead_letter(record, exc)
            return
        if envelope.event_id in self._seen:
            self.stats.duplicates += 1
            return
        failure = await self._attempt(envelope, record)
        if failure is None:
            self._seen.add(envelope.event_id)
            self.stats.handled += 1
            return
        error, attempts = failure
        if not self.dlq:
            raise error
        await self._dead_letter(record, error, attempts=attempts)
        # The event was dealt with (parked for a human), so a redelivery is a duplicate.
        self._seen.add(envelope.event_id)

    async def _attempt(
        self, envelope: envelope_pb2.Envelope, record: Record
    ) -> tuple[Exception, int] | None:
        """Call the handler until it succeeds (None), fails non-retriably, or has failed
        ``max_attempts`` times; then the last error and the number of calls made."""
        delay = self.retry_backoff_s
        attempt = 0
        while True:
            attempt += 1
            try:
                with consume_span(envelope, record, self.group_id):
                    await self.handler(envelope, record)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_retriable(exc):
                    return exc, attempt
                if attempt >= self.max_attempts:
                    self.stats.exhausted += 1
                    _log.error(
                        "%s: %s[%d]@%d failed %d times, the last with %s: %s; giving up on it",
                        self.group_id,
                        record.topic,
                        record.partition,
                        record.offset,
                        attempt,
                        type(exc).__name__,
                        exc,
                    )
                    return exc, attempt
                if self._stopping.is_set():
                    raise _Abandoned from exc
                self.stats.retries += 1
                _log.warning(
                    "%s: retriable failure %d of %d on %s[%d]@%d (%s); retrying in %.2fs",
                    self.group_id,
                    attempt,
                    self.max_attempts,
                    record.topic,
                    record.partition,
                    record.offset,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_backoff_max_s)
                continue
            return None

    async def _dead_letter(
        self, record: Record, exc: BaseException, *, attempts: int | None = None
    ) -> None:
        if not self.dlq:
            raise exc
        target = topics.dead_letter(record.topic)
        error = str(exc)[:_MAX_ERROR_CHARS] or type(exc).__name__
        _log.error(
            "%s: dead-lettering %s[%d]@%d to %s: %s",
            self.group_id,
            record.topic,
            record.partition,
            record.offset,
            target,
            error,
        )
        delay = self.retry_backoff_s
        while True:
            try:
                # The original key keeps the dead letters of one session together and in order.
                await publish_dead_letter(
                    self.bus,
                    record,
                    exc,
                    group_id=self.group_id,
                    producer=self.producer_name,
                    attempts=attempts,
                )
            except BusError as err:
                if not err.retriable:
                    raise
                if self._stopping.is_set():
                    raise _Abandoned from err
                self.stats.retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_backoff_max_s)
                continue
            self.stats.dead_lettered += 1
            record_dead_letters(record.topic, self.group_id)
            return

    async def _commit(self, records: Sequence[Record]) -> None:
        delay = self.retry_backoff_s
        for _attempt in range(10):
            try:
                await self._subscriber.commit(records)
            except BusError as exc:
                if not exc.retriable:
                    # The partitions were taken away by a rebalance: their new owner restarts
                    # from the last commit and redelivers, and the event-id LRU absorbs the
                    # duplicates if they come back here.
                    _log.warning("%s: commit rejected (%s)", self.group_id, exc)
                    return
                self.stats.retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_backoff_max_s)
                continue
            self.stats.commits += 1
            return
        _log.error("%s: giving up committing %d records", self.group_id, len(records))


@dataclass(frozen=True)
class PublishedEvent:
    """What :meth:`EventPublisher.publish` wrote and where."""

    envelope: envelope_pb2.Envelope
    """The envelope as written (its ``event_id`` identifies the event everywhere)."""
    metadata: RecordMetadata
    """Topic, partition and offset it landed at."""


class EventPublisher:
    """Publishes Podium events: codec-encoded envelopes with trace context."""

    def __init__(self, bus: Bus, *, producer_name: str) -> None:
        if not producer_name:
            raise ConfigError("EventPublisher producer_name must not be empty")
        self.bus = bus
        self.producer_name = producer_name

    async def publish(
        self,
        topic: str,
        message: Message,
        *,
        key: str,
        idempotency_key: str = "",
        event_id: str | None = None,
        occurred_at: datetime | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> PublishedEvent:
        """Wrap ``message`` in an envelope keyed by ``key`` (e.g. the session id) and publish it.

        Pass a stable ``event_id`` when re-publishing the same logical event (e.g. after a
        crash) so consumers dedupe it; ``idempotency_key`` names the business operation.
        """
        scope = (
            publish_span(topic) if traced(trace.get_current_span().get_span_context()) else _NONE
        )
        with scope:
            envelope, data, headers = encode_record(
                message,
                producer=self.producer_name,
                key=key,
                idempotency_key=idempotency_key,
                event_id=event_id,
                occurred_at=occurred_at,
                extra_headers=extra_headers,
            )
            metadata = await self.bus.publish(topic, data, key=key, headers=headers)
        return PublishedEvent(envelope, metadata)
