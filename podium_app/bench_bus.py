"""The event-bus benchmark behind ``podium bench bus`` (bench/README.md, "Event bus").

What is measured is the path services take, beside aiokafka alone, on the same broker in the
same run:

* **bus**: :class:`~podium.bus.EventPublisher` (codec envelope, trace context in the envelope
  and headers, event id and type headers, a producer span in a sampled trace) over
  :meth:`KafkaBus.publish` (a publish returns once durable, so concurrency comes from many
  publishing tasks, as from many live sessions in a service), each event inside its session's
  span (:class:`Sessions`: :data:`SESSION_EVENTS` events a session); consumed by an
  :class:`~podium.bus.EventConsumer` (fetch a batch of ``max_batch``, decode each envelope,
  de-duplicate by event id, the handler in the producer's context and, in a sampled trace, a
  consumer span, commit the batch), with a tracer provider installed as a standalone service
  has one (its sampler from ``OTEL_TRACES_SAMPLER``, reported in the JSON: :func:`tracing`);
* **raw**: :class:`podium.bus.raw.RawProducer` / :class:`~podium.bus.raw.RawConsumer` —
  aiokafka with exactly the bus's settings (``KafkaConfig.producer_kwargs`` /
  ``consumer_kwargs``), each send awaited until durable, each batch committed after it is
  processed, the same envelopes encoded and decoded by :mod:`podium.codec`, nothing else.

Each measurement (*phase*) has a fresh topic and consumer group; the consumer runs in a process
of its own (as a consuming service does), the producer in this one. An event counts once the
consumer has decoded it. Latency is from the envelope's ``produced_at`` (stamped by the codec
inside the publish call) to the decode, on the host's wall clock (producer and consumer are on
the same host). A warm-up (``warmup`` events, marked by their idempotency key) precedes each
phase and is left out of every figure.

* **saturation**: ``in_flight`` tasks each publish events back to back for ``duration_s``;
  events per second = events decoded / (last decode - first timed publish call);
* **offered load**: events are published open-loop on a fixed schedule (event ``i`` at
  ``i / rate``), each in its own task, whatever happened to the earlier ones, so a slow
  consumer or broker shows up as latency rather than as a lower rate; the producer's own lag
  behind the schedule is reported beside (``max_schedule_lag_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import multiprocessing
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context

from podium import codec, telemetry
from podium.bus import EventConsumer, EventPublisher, KafkaBus, KafkaConfig, Record, TopicSpec
from podium.bus.raw import RawConsumer, RawProducer
from podium.errors import ConfigError, PodiumError
from podium.topics import dead_letter
from podium.v1 import envelope_pb2, subtask_pb2

_log = logging.getLogger(__name__)

CLIENTS = ("bus", "raw")
"""The two clients measured side by side in every phase kind."""
PRODUCER = "bench-bus"
"""Producer name stamped on the envelopes (and the bench's service name in traces)."""
WARMUP_KEY = "bench-bus-warmup"
"""Idempotency key of warm-up events: the consumer leaves them out of every figure."""
SESSIONS = 64
"""Distinct keys (session ids) the events are spread over, so every partition is used."""
SESSION_EVENTS = 32
"""Consecutive events published in one session's trace on the bus path (a session of the
shipped tasks assigns and reports about this many subtasks)."""
EVENTS = 256
"""Distinct prebuilt payloads the load cycles through."""
READY_TIMEOUT_S = 90.0
"""How long a consumer process may take to start and join its group."""
BACKLOG_S = 0.25
"""An offered load whose unacknowledged publishes exceed this many seconds of it (a backlog
the bus is not draining) is given up as not sustained. Small, because a backlog is also a
cost of its own: every publish waiting for its partition's batch to drain is woken by each
drain (aiokafka), so a backlog of many thousands swamps the producer's event loop and ends
in the client's timeouts instead of a measurement."""
DRAIN_TIMEOUT_S = 120.0
"""How long, after the producer is done, the consumer may take to decode the rest."""

TARGET_EVENTS_PER_S = 50_000.0
"""Acceptance (issue 17): produce+consume events per second at saturation."""
TARGET_P99_MS = 50.0
"""Acceptance: p99 end-to-end latency at 1,000 events/s offered."""
TARGET_P99_LOAD = 1000.0
"""The offered load the p99 target is set at."""
TARGET_BUS_TO_RAW = 0.75
"""Acceptance: the bus layer costs at most 25 % of the raw client's throughput."""


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """What one ``podium bench bus`` run measures."""

    duration_s: float = 10.0
    """Seconds of publishing per phase (after the warm-up)."""
    loads: tuple[float, ...] = (1000.0, 10000.0)
    """Offered loads (events per second) of the latency phases."""
    in_flight: int = 1000
    """Publishing tasks at saturation (each awaits its publish: like that many live sessions)."""
    partitions: int = 3
    """Partitions of each phase's topic (the bus's default)."""
    max_batch: int = 100
    """Records per fetch and commit of the consumers (``EventConsumer``'s default)."""
    warmup: int = 500
    """Events published and consumed before each phase's timed part."""

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be > 0, got {getattr(self, name)}"
            for name in ("duration_s", "in_flight", "partitions", "max_batch")
            if not getattr(self, name) > 0
        ]
        if self.warmup < 0:
            problems.append(f"warmup must be >= 0, got {self.warmup}")
        if not self.loads or not all(rate > 0 and math.isfinite(rate) for rate in self.loads):
            problems.append(f"loads must be positive events per second, got {list(self.loads)}")
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass(frozen=True, slots=True)
class Phase:
    """One measurement: a client, a fresh topic and group, saturation or an offered load."""

    client: str
    """``bus`` or ``raw``."""
    topic: str
    """The phase's own topic."""
    group: str
    """The consumer's own group."""
    rate: float | None
    """Offered events per second; None = saturation."""
    settings: BenchSettings
    """The run's settings."""

    @property
    def name(self) -> str:
        """``bus saturation``, ``raw 1000/s``..."""
        return f"{self.client} " + ("saturation" if self.rate is None else f"{self.rate:g}/s")


@dataclass(frozen=True, slots=True)
class Production:
    """What the producer side of a phase did."""

    sent: int
    """Timed events published (and acknowledged)."""
    start_ns: int
    """Wall clock of the first timed publish call."""
    end_ns: int
    """Wall clock once the last timed publish was acknowledged."""
    cpu_s: float = 0.0
    """CPU seconds of the producer's process over the timed part."""
    sustained: bool = True
    """Offered load: whether the whole schedule was published (False: the bus fell so far
    behind that the producer gave it up, see :func:`offer`)."""
    max_schedule_lag_ms: float = 0.0
    """Offered load: how far behind its schedule the producer launched an event, at worst."""

    @property
    def produce_per_s(self) -> float:
        """Events acknowledged per second of publishing."""
        return rate_per_s(self.sent, (self.end_ns - self.start_ns) / 1e9)


@dataclass(frozen=True, slots=True)
class Delivery:
    """What the consumer side of a phase saw (warm-up events excluded)."""

    consumed: int
    """Timed events decoded."""
    warm: int
    """Warm-up events decoded."""
    last_ns: int
    """Wall clock of the last timed decode (0: none)."""
    p50_ms: float
    """Median publish-to-decode latency."""
    p99_ms: float
    """99th percentile of it."""
    max_ms: float
    """Slowest event."""
    mean_ms: float
    """Mean latency."""
    cpu_s: float = 0.0
    """CPU seconds of the consumer's process from the first timed decode to the last."""


@dataclass(frozen=True, slots=True)
class PhaseResult:
    """A phase's two sides, and the figures made of them."""

    phase: Phase
    production: Production
    delivery: Delivery

    @property
    def events_per_s(self) -> float:
        """Events decoded per second, from the first timed publish call to the last decode."""
        return rate_per_s(
            self.delivery.consumed, (self.delivery.last_ns - self.production.start_ns) / 1e9
        )

    @property
    def events_per_cpu_s(self) -> float:
        """Events per CPU-second of the producer and consumer processes together: what a
        loaded, shared machine distorts far less than the wall-clock rate."""
        return rate_per_s(self.delivery.consumed, self.production.cpu_s + self.delivery.cpu_s)

    def as_json(self) -> dict[str, Any]:
        """The phase's figures (rounded) for the JSON report."""
        out: dict[str, Any] = {
            "events_per_s": round(self.events_per_s, 1),
            "produce_per_s": round(self.production.produce_per_s, 1),
            "produced": self.production.sent,
            "consumed": self.delivery.consumed,
            "p50_ms": round(self.delivery.p50_ms, 3),
            "p99_ms": round(self.delivery.p99_ms, 3),
            "max_ms": round(self.delivery.max_ms, 3),
            "mean_ms": round(self.delivery.mean_ms, 3),
            "producer_cpu_s": round(self.production.cpu_s, 3),
            "consumer_cpu_s": round(self.delivery.cpu_s, 3),
            "events_per_cpu_s": round(self.events_per_cpu_s, 1),
        }
        if self.phase.rate is not None:
            out = {"offered_per_s": as_number(self.phase.rate), **out}
            out["max_schedule_lag_ms"] = round(self.production.max_schedule_lag_ms, 3)
            out["sustained"] = self.production.sustained
        return out


# -- the math (pure) -------------------------------------------------------------------------


def parse_loads(text: str) -> tuple[float, ...]:
    """``"1000,10000"`` as offered loads; a :class:`ConfigError` naming the bad item."""
    out: list[float] = []
    for item in text.split(","):
        try:
            rate = float(item)
        except ValueError:
            raise ConfigError(
                f"--loads: {item.strip()!r} is not a number (e.g. 1000,10000)"
            ) from None
        if not (rate > 0 and math.isfinite(rate)):
            raise ConfigError(f"--loads: {item.strip()!r} must be a positive number of events/s")
        out.append(rate)
    return tuple(out)


def planned_events(duration_s: float, rate: float) -> int:
    """Events an open-loop schedule of ``rate``/s offers in ``duration_s``: those due at
    ``i / rate < duration_s`` (at least one)."""
    return max(1, math.ceil(duration_s * rate - 1e-9))


def due_events(elapsed_s: float, rate: float, planned: int) -> int:
    """Events of the schedule due by ``elapsed_s`` (event ``i`` at ``i / rate``), at most
    ``planned``: a late producer catches up at once rather than shifting the schedule."""
    if elapsed_s < 0:
        return 0
    return min(planned, math.floor(elapsed_s * rate + 1e-9) + 1)


def schedule_lag_s(elapsed_s: float, rate: float, index: int) -> float:
    """How late event ``index`` is launched at ``elapsed_s`` (0 when on time)."""
    return max(0.0, elapsed_s - index / rate)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank: the smallest value with at least ``q`` % of
    the values at or below it (always one of the values; no interpolation)."""
    if not sorted_values:
        raise ConfigError("percentile of no values")
    if not 0 < q <= 100:
        raise ConfigError(f"percentile q must be in (0, 100], got {q}")
    rank = math.ceil(q / 100 * len(sorted_values) - 1e-9)
    return float(sorted_values[max(rank, 1) - 1])


def max_outstanding(rate: float, settings: BenchSettings) -> int:
    """Unacknowledged publishes an offered load may pile up before it counts as not
    sustained: :data:`BACKLOG_S` seconds of it, and never fewer than saturation's
    ``in_flight``."""
    return max(settings.in_flight, math.ceil(rate * BACKLOG_S))


def as_number(rate: float) -> float | int:
    """``rate`` as the JSON writes it: ``1000``, not ``1000.0``; ``2.5`` stays."""
    return int(rate) if rate.is_integer() else rate


def rate_per_s(count: int, seconds: float) -> float:
    """``count`` per second over ``seconds`` (0 over an empty span)."""
    return count / seconds if seconds > 0 else 0.0


# -- events ----------------------------------------------------------------------------------


def sample_event(i: int) -> subtask_pb2.SubtaskResult:
    """A sub-agent's result as the sub-agent service publishes it (the busiest event type:
    one per subtask execution), with a tool call and a short output."""
    session = session_key(i)
    return subtask_pb2.SubtaskResult(
        session_id=session,
        execution_id=f"{session}/t{i % 30:02d}/a0",
        subtask_id=f"t{i % 30:02d}",
        agent=("planner", "coder", "reviewer", "searcher")[i % 4],
        outcome=subtask_pb2.OUTCOME_SUCCESS,
        output=f"result of subtask t{i % 30:02d}: 42 rows, digest {i:016x}",
        start_time=0.125 * i,
        end_time=0.125 * i + 1.5,
        tool_calls=[
            subtask_pb2.ToolCall(
                name="search", arguments_json='{"q": "latency"}', ok=True, result_digest=f"{i:08x}"
            )
        ],
        verified=True,
    )


@functools.cache
def _events() -> tuple[subtask_pb2.SubtaskResult, ...]:
    return tuple(sample_event(i) for i in range(EVENTS))


def event(i: int) -> subtask_pb2.SubtaskResult:
    """Event ``i`` of the load: one of :data:`EVENTS` prebuilt results (what a service builds
    before it publishes is its own work, not the bus's; each publish still makes and encodes
    a new envelope)."""
    return _events()[i % EVENTS]


def session_key(i: int) -> str:
    """The key of event ``i``: one of :data:`SESSIONS` session ids."""
    return f"bench-session-{i % SESSIONS:03d}"


@dataclass
class Tally:
    """The consumer's count and latencies (publish call to decode, nanoseconds)."""

    latencies_ns: list[int] = field(default_factory=list)
    warm: int = 0
    last_ns: int = 0
    first_cpu_s: float = 0.0
    last_cpu_s: float = 0.0

    @property
    def consumed(self) -> int:
        return len(self.latencies_ns)

    def add(self, envelope: envelope_pb2.Envelope) -> None:
        """One decoded event, now."""
        now = time.time_ns()
        if envelope.idempotency_key == WARMUP_KEY:
            self.warm += 1
            return
        self.latencies_ns.append(now - envelope.produced_at.ToNanoseconds())
        self.last_ns = now
        self.last_cpu_s = time.process_time()
        if len(self.latencies_ns) == 1:
            self.first_cpu_s = self.last_cpu_s

    def delivery(self) -> Delivery:
        ms = sorted(v / 1e6 for v in self.latencies_ns)
        if not ms:
            return Delivery(0, self.warm, 0, 0.0, 0.0, 0.0, 0.0)
        return Delivery(
            consumed=len(ms),
            warm=self.warm,
            last_ns=self.last_ns,
            p50_ms=percentile(ms, 50),
            p99_ms=percentile(ms, 99),
            max_ms=ms[-1],
            mean_ms=sum(ms) / len(ms),
            cpu_s=self.last_cpu_s - self.first_cpu_s,
        )


# -- the producer side -----------------------------------------------------------------------

Send = Callable[[int, bool], Awaitable[None]]
"""``await send(i, warm)``: publish event ``i`` (a warm-up event if ``warm``) until durable."""


class Sessions:
    """The bus path's traces: event ``i`` is published inside the span of session
    ``i // SESSION_EVENTS``, as a service publishes inside a session's (or a consumed event's)
    span, so its events carry that session's trace context; a session's span ends once its
    events were published. Whether a session is sampled is the tracer provider's decision
    (``OTEL_TRACES_SAMPLER``; the SDK's default samples every one)."""

    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        self._tracer = tracer or trace.get_tracer(PRODUCER)
        self._open: dict[int, tuple[trace.Span, Context, list[int]]] = {}

    def context(self, i: int) -> Context:
        """The context event ``i`` is published in (its session's span started if new)."""
        n = i // SESSION_EVENTS
        found = self._open.get(n)
        if found is None:
            span = self._tracer.start_span("session", attributes={"podium.session_id": n})
            found = self._open[n] = (span, trace.set_span_in_context(span), [0])
        return found[1]

    def published(self, i: int) -> None:
        """Event ``i`` was published: its session ends with its last event."""
        found = self._open.get(i // SESSION_EVENTS)
        if found is None:  # ended already (the warm-up's events count too)
            return
        span, _, done = found
        done[0] += 1
        if done[0] == SESSION_EVENTS:
            span.end()
            del self._open[i // SESSION_EVENTS]

    def close(self) -> None:
        """End the sessions still open (the phase ended in their middle)."""
        for span, _, _ in self._open.values():
            span.end()
        self._open.clear()


@contextlib.asynccontextmanager
async def bus_sender(config: KafkaConfig, topic: str) -> AsyncIterator[Send]:
    """Events through :class:`EventPublisher` on a :class:`KafkaBus`, each inside its
    session's span (:class:`Sessions`)."""
    bus = KafkaBus(config)
    await bus.start()
    publisher = EventPublisher(bus, producer_name=PRODUCER)
    sessions = Sessions()

    async def send(i: int, warm: bool) -> None:
        # Made current in the calling task's own context (a publishing task, or the event's
        # own task), which nothing else reads: no detach needed, one contextvar write per event.
        otel_context.attach(sessions.context(i))
        await publisher.publish(
            topic, event(i), key=session_key(i), idempotency_key=WARMUP_KEY if warm else ""
        )
        sessions.published(i)

    try:
        yield send
    finally:
        sessions.close()
        await bus.stop()


@contextlib.asynccontextmanager
async def raw_sender(config: KafkaConfig, topic: str) -> AsyncIterator[Send]:
    """The same envelopes (codec-encoded, no trace context or headers) through aiokafka."""
    producer = RawProducer(config)
    await producer.start()

    async def send(i: int, warm: bool) -> None:
        key = session_key(i)
        _, data = codec.encode_event(
            event(i), producer=PRODUCER, key=key, idempotency_key=WARMUP_KEY if warm else ""
        )
        await producer.send(topic, data, key.encode())

    try:
        yield send
    finally:
        await producer.stop()


async def warm_up(send: Send, count: int, in_flight: int) -> None:
    """``count`` warm-up events (connections, metadata, the first batches), ``in_flight`` at
    a time."""
    for start in range(0, count, in_flight):
        await asyncio.gather(*(send(i, True) for i in range(start, min(count, start + in_flight))))


async def saturate(send: Send, duration_s: float, in_flight: int) -> Production:
    """``in_flight`` tasks publish back to back for ``duration_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + duration_s
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while loop.time() < end:
            i = sent
            sent += 1
            await send(i, False)

    start_ns, cpu0 = time.time_ns(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return Production(
        sent=sent, start_ns=start_ns, end_ns=time.time_ns(), cpu_s=time.process_time() - cpu0
    )


async def offer(send: Send, duration_s: float, rate: float, max_outstanding: int) -> Production:
    """Open loop: event ``i`` published at ``i / rate`` in a task of its own. A load the bus
    cannot carry would pile up publishes without end (and time them out in the client), so
    once more than ``max_outstanding`` are unacknowledged the schedule is given up: the phase
    is reported not sustained, with the latencies of what was published."""
    loop = asyncio.get_running_loop()
    planned = planned_events(duration_s, rate)
    tasks: list[asyncio.Future[None]] = []
    lag = 0.0
    outstanding = 0

    def acknowledged(_task: asyncio.Future[None]) -> None:
        nonlocal outstanding
        outstanding -= 1

    start_ns, t0, cpu0 = time.time_ns(), loop.time(), time.process_time()
    while len(tasks) < planned and outstanding <= max_outstanding:
        elapsed = loop.time() - t0
        due = due_events(elapsed, rate, planned)
        if due > len(tasks):
            lag = max(lag, schedule_lag_s(elapsed, rate, len(tasks)))
        for i in range(len(tasks), due):
            tasks.append(asyncio.ensure_future(send(i, False)))
            tasks[-1].add_done_callback(acknowledged)
            outstanding += 1
        if len(tasks) < planned:
            await asyncio.sleep(max(0.0, t0 + len(tasks) / rate - loop.time()))
    await asyncio.gather(*tasks)
    return Production(
        sent=len(tasks),
        sustained=len(tasks) == planned,
        start_ns=start_ns,
        end_ns=time.time_ns(),
        cpu_s=time.process_time() - cpu0,
        max_schedule_lag_ms=lag * 1000,
    )


# -- the consumer side (a process of its own) ------------------------------------------------


@contextlib.asynccontextmanager
async def bus_receiver(
    phase: Phase, config: KafkaConfig, tally: Tally
) -> AsyncIterator[asyncio.Task[None]]:
    """An :class:`EventConsumer` on a :class:`KafkaBus`, joined, running in a task."""
    telemetry.setup_tracing(f"{PRODUCER}-consumer", set_global=True)
    bus = KafkaBus(config)
    await bus.start()

    async def handle(envelope: envelope_pb2.Envelope, _record: Record) -> None:
        tally.add(envelope)

    consumer = EventConsumer(
        bus,
        [phase.topic],
        phase.group,
        handle,
        producer_name=f"{PRODUCER}-consumer",
        max_batch=phase.settings.max_batch,
        partitions=phase.settings.partitions,
    )
    try:
        await consumer.start()
        task = asyncio.create_task(consumer.run())
        try:
            yield task
        finally:
            await consumer.stop()
            await task
    finally:
        await bus.stop()


@contextlib.asynccontextmanager
async def raw_receiver(
    phase: Phase, config: KafkaConfig, tally: Tally
) -> AsyncIterator[asyncio.Task[None]]:
    """A :class:`RawConsumer`, joined, decoding (codec) and committing batch by batch in a
    task, as ``EventConsumer`` does minus the bus layer."""
    consumer = RawConsumer(config, phase.topic, phase.group)
    await consumer.start()

    async def run() -> None:
        while True:
            values = await consumer.fetch(phase.settings.max_batch, 0.2)
            for value in values:
                tally.add(codec.decode_envelope(value))
            if values:
                await consumer.commit()

    task = asyncio.create_task(run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()


async def _until_expected(
    tally: Tally, conn: Connection, task: asyncio.Task[None], deadline: float
) -> None:
    """Until every expected event was decoded (the parent sends the count once the producer
    is done), the consume task fails, or ``deadline`` (loop time) passes."""
    loop = asyncio.get_running_loop()
    expected: int | None = None
    while loop.time() < deadline:
        if expected is None and conn.poll():
            expected = int(conn.recv()[1])
        if expected is not None and tally.consumed >= expected:
            return
        if task.done():
            task.result()  # raises what stopped it
            raise PodiumError("the consume loop ended early")
        await asyncio.sleep(0.005)


async def _consume(phase: Phase, config: KafkaConfig, conn: Connection) -> None:
    tally = Tally()
    receiver = bus_receiver if phase.client == "bus" else raw_receiver
    async with receiver(phase, config, tally) as task:
        conn.send(("ready",))
        deadline = (
            asyncio.get_running_loop().time()
            + READY_TIMEOUT_S
            + phase.settings.duration_s
            + DRAIN_TIMEOUT_S
        )
        await _until_expected(tally, conn, task, deadline)
    conn.send(("done", tally.delivery()))


def consume_main(phase: Phase, config: KafkaConfig, conn: Connection) -> None:
    """The consumer process: join, report ready, decode until told how many to expect and
    all have come, report the :class:`Delivery`; a failure is reported as one line."""
    try:
        asyncio.run(_consume(phase, config, conn))
    except Exception as exc:  # the parent names it; a traceback would only repeat it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


async def _receive(conn: Connection, kind: str, timeout_s: float) -> Any:
    """The consumer process's next message, which must be ``kind``."""
    if not await asyncio.to_thread(conn.poll, timeout_s):
        raise PodiumError(f"the consumer process did not report {kind!r} within {timeout_s:g} s")
    try:
        message = conn.recv()
    except EOFError:
        raise PodiumError(f"the consumer process exited before reporting {kind!r}") from None
    if message[0] == "error":
        raise PodiumError(f"the consumer process failed: {message[1]}")
    return message[1] if len(message) > 1 else None


# -- a phase, a run --------------------------------------------------------------------------


async def _produce(phase: Phase, config: KafkaConfig) -> Production:
    sender = bus_sender if phase.client == "bus" else raw_sender
    s = phase.settings
    async with sender(config, phase.topic) as send:
        await warm_up(send, s.warmup, s.in_flight)
        if phase.rate is None:
            return await saturate(send, s.duration_s, s.in_flight)
        return await offer(send, s.duration_s, phase.rate, max_outstanding(phase.rate, s))


async def create_scratch_topic(config: KafkaConfig, topic: str, partitions: int) -> None:
    """Create a measurement's own topic (``config``: a principal that may create it)."""
    admin = KafkaBus(config)
    await admin.start()
    try:
        await admin.create_topics([TopicSpec(topic, partitions)])
    finally:
        await admin.stop()


async def delete_scratch_topic(config: KafkaConfig, topic: str) -> str:
    """Delete a measurement's own topic once measured, with its dead-letter topic (which the
    bus's consumer makes), so a benchmark on a shared broker leaves nothing behind; "" when
    deleted, else what stopped it (the caller reports it: a leftover topic is no reason to
    lose the figures)."""
    admin = KafkaBus(config)
    try:
        await admin.start()
        try:
            await admin.delete_topics([topic, dead_letter(topic)])
        finally:
            await admin.stop()
    except PodiumError as exc:
        return (
            f"topic {topic} was left on the broker ({exc}); delete it with a principal allowed "
            "to, e.g. `kafka-topics.sh --delete --topic ...`"
        )
    return ""


async def run_phase(phase: Phase, config: KafkaConfig) -> PhaseResult:
    """One phase: its topic, its consumer process, the producer here; a
    :class:`PodiumError` if the consumer did not decode exactly what was published."""
    await create_scratch_topic(config, phase.topic, phase.settings.partitions)
    try:
        return await _run_phase(phase, config)
    finally:
        left = await delete_scratch_topic(config, phase.topic)
        if left:
            _log.warning("%s", left)


async def _run_phase(phase: Phase, config: KafkaConfig) -> PhaseResult:
    """The measurement of :func:`run_phase` on its (existing) topic."""
    context = multiprocessing.get_context("spawn")  # fork under a running loop is unsafe
    here, there = context.Pipe()
    process = context.Process(target=consume_main, args=(phase, config, there), daemon=True)
    process.start()
    there.close()
    try:
        await _receive(here, "ready", READY_TIMEOUT_S)
        production = await _produce(phase, config)
        here.send(("expect", production.sent))
        delivery: Delivery = await _receive(
            here, "done", READY_TIMEOUT_S + phase.settings.duration_s + DRAIN_TIMEOUT_S + 10
        )
    finally:
        await asyncio.to_thread(process.join, 30.0)
        if process.is_alive():
            process.kill()
            await asyncio.to_thread(process.join, 5.0)
        here.close()
    if delivery.consumed != production.sent:
        raise PodiumError(
            f"{phase.name}: the consumer decoded {delivery.consumed} of {production.sent} events"
        )
    return PhaseResult(phase, production, delivery)


def plan(settings: BenchSettings, run_id: str) -> list[Phase]:
    """The run's phases: saturation, then each load; bus and raw back to back in each, so
    both meet the same machine load."""
    rates: list[float | None] = [None, *settings.loads]
    phases = []
    for n, rate in enumerate(rates):
        for client in CLIENTS:
            name = f"{run_id}.{n}.{client}"
            phases.append(
                Phase(client, f"podium.bench.bus.{name}", f"bench-bus.{name}", rate, settings)
            )
    return phases


async def measure(
    config: KafkaConfig, settings: BenchSettings, run_id: str, say: Callable[[str], None]
) -> list[PhaseResult]:
    """Every phase of :func:`plan`, in order (``config``: a principal that may create topics
    and groups)."""
    telemetry.setup_tracing(PRODUCER, set_global=True)  # as a standalone service has one
    out = []
    for phase in plan(settings, run_id):
        say(f"{phase.name}: {settings.duration_s:g} s on {phase.topic}")
        result = await run_phase(phase, config)
        say(
            f"{phase.name}: {result.events_per_s:,.0f} events/s decoded, p50 "
            f"{result.delivery.p50_ms:.2f} ms, p99 {result.delivery.p99_ms:.2f} ms"
        )
        out.append(result)
    return out


# -- the report ------------------------------------------------------------------------------


def _find(results: Sequence[PhaseResult], client: str, rate: float | None) -> PhaseResult:
    return next(r for r in results if r.phase.client == client and r.phase.rate == rate)


def verdicts(report: dict[str, Any]) -> dict[str, Any]:
    """The acceptance targets of issue 17 and whether this run met each."""
    sat = report["saturation"]["events_per_s"]
    ratio = report["bus_to_raw"]
    out: dict[str, Any] = {
        "saturation_events_per_s": {
            "target": f">= {TARGET_EVENTS_PER_S:g}",
            "value": sat,
            "met": sat >= TARGET_EVENTS_PER_S,
        },
        "bus_to_raw": {
            "target": f">= {TARGET_BUS_TO_RAW:g}",
            "value": ratio,
            "met": ratio >= TARGET_BUS_TO_RAW,
        },
    }
    at = [load for load in report["loads"] if load["offered_per_s"] == TARGET_P99_LOAD]
    if at:
        p99 = at[0]["p99_ms"]
        out["p99_ms_at_1000_per_s"] = {
            "target": f"<= {TARGET_P99_MS:g}",
            "value": p99,
            "met": p99 <= TARGET_P99_MS and at[0]["sustained"],
        }
    return out


def report(
    results: Sequence[PhaseResult], settings: BenchSettings, extra: dict[str, Any]
) -> dict[str, Any]:
    """The documented JSON: ``saturation``, ``raw_client`` and ``loads`` (the bus's), the
    ratio, the raw client's loads beside, the settings, the verdicts."""
    bus, raw = _find(results, "bus", None), _find(results, "raw", None)
    out: dict[str, Any] = {
        "saturation": bus.as_json(),
        "raw_client": {
            **raw.as_json(),
            "loads": [_find(results, "raw", rate).as_json() for rate in settings.loads],
        },
        "loads": [_find(results, "bus", rate).as_json() for rate in settings.loads],
        "bus_to_raw": round(bus.events_per_s / raw.events_per_s, 3) if raw.events_per_s else 0.0,
        "bus_to_raw_per_cpu_s": round(bus.events_per_cpu_s / raw.events_per_cpu_s, 3)
        if raw.events_per_cpu_s
        else 0.0,
    }
    out["config"] = {**asdict(settings), "loads": [as_number(r) for r in settings.loads], **extra}
    out["targets"] = verdicts(out)
    return out


def tracing() -> dict[str, Any]:
    """How the bus path was traced: the sampler of the bench's tracer provider (the SDK's
    default, parent-based always on, unless ``OTEL_TRACES_SAMPLER`` says otherwise; the
    consumer process reads the same variables). A span per event is made only in sampled
    traces (``podium.bus.consumer.traced``), so this decides much of the bus's cost."""
    sampler = getattr(trace.get_tracer_provider(), "sampler", None)
    return {"sampler": sampler.get_description() if sampler is not None else "none"}


def machine() -> dict[str, Any]:
    """Where the run happened: cores and load average (the machine may be shared)."""
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}


@contextlib.contextmanager
def local_broker(work_dir: Path, say: Callable[[str], None]) -> Iterator[KafkaConfig]:
    """A fresh local secured broker in ``work_dir/kafka`` (the admin's connection), stopped
    whatever happens; a broker a killed run left there is stopped first."""
    import shutil

    from podium_app.kafka_broker import KafkaBroker

    run_dir = work_dir / "kafka"
    if (run_dir / "state.json").exists():
        KafkaBroker(run_dir).stop()
    shutil.rmtree(run_dir, ignore_errors=True)
    broker = KafkaBroker(run_dir)
    say(f"starting a local secured Kafka broker in {run_dir}")
    try:
        broker.start(180.0)
        yield KafkaConfig.from_url(broker.client_url(), sasl_password=broker.passwords()["admin"])
    finally:
        say("stopping the local broker")
        broker.stop()
