"""EventConsumer / EventPublisher behaviour, on both bus implementations.

Dedupe by event id, poison messages to the dead-letter topic without stalling the partition,
retry of retriable failures, graceful stop with commit, and trace propagation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from podium import codec, topics
from podium.bus import Bus, EventConsumer, EventPublisher, Record
from podium.bus.consumer import (
    DLQ_ERROR,
    DLQ_ERROR_TYPE,
    DLQ_GROUP,
    DLQ_SOURCE_OFFSET,
    DLQ_SOURCE_PARTITION,
    DLQ_SOURCE_TOPIC,
    EVENT_ID_HEADER,
    is_retriable,
)
from podium.errors import BusError, ConfigError, DecodeError, ProcessingError
from podium.v1 import envelope_pb2, task_pb2

Names = Callable[[str], str]


def task(session: str, seed: int = 0) -> task_pb2.TaskSubmitted:
    return task_pb2.TaskSubmitted(session_id=session, submitted_by="tests", seed=seed)


class Collector:
    """A handler that records what it saw and can be told to fail."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []  # (session_id, seed)
        self.fail: dict[int, list[Exception]] = {}  # seed -> errors to raise, in order

    async def __call__(self, env: envelope_pb2.Envelope, record: Record) -> None:
        msg = codec.unpack_as(env, task_pb2.TaskSubmitted)
        errors = self.fail.get(msg.seed)
        if errors:
            raise errors.pop(0)
        self.seen.append((msg.session_id, msg.seed))


async def run_until(
    consumer: EventConsumer, cond: Callable[[], bool], timeout_s: float = 20.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached; stats={consumer.stats}")
        await consumer.run_once()


async def read_all(bus: Bus, topic: str, group: str, want: int) -> list[Record]:
    member = bus.subscriber([topic], group)
    await member.start()
    try:
        out: list[Record] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while len(out) < want and loop.time() < deadline:
            out += await member.fetch(100, 0.2)
        return out
    finally:
        await member.stop()


async def test_duplicate_event_ids_are_handled_once(bus: Bus, unique: Names) -> None:
    topic = unique("dedupe")
    _, data = codec.encode_event(task("s1", seed=1), producer="tests", key="s1")
    await bus.publish(topic, data, key="s1")
    await bus.publish(topic, data, key="s1")  # a producer retry: same event id
    await EventPublisher(bus, producer_name="tests").publish(topic, task("s1", seed=2), key="s1")
    handler = Collector()
    consumer = EventConsumer(bus, [topic], unique("g"), handler, producer_name="tests")
    await consumer.start()
    try:
        await run_until(consumer, lambda: consumer.stats.fetched >= 3)
    finally:
        await consumer.stop()
    assert handler.seen == [("s1", 1), ("s1", 2)]
    assert consumer.stats.duplicates == 1 and consumer.stats.handled == 2


async def test_poison_record_goes_to_dlq_and_partition_keeps_moving(
    bus: Bus, unique: Names
) -> None:
    topic, group = unique("poison"), unique("g")
    pub = EventPublisher(bus, producer_name="tests")
    await pub.publish(topic, task("s1", seed=1), key="s1")
    garbage = b"\xff\x00not a protobuf envelope\x13"
    bad = await bus.publish(topic, garbage, key="s1", headers=(("origin", b"fuzzer"),))
    await pub.publish(topic, task("s1", seed=2), key="s1")  # same key: same partition, after it
    handler = Collector()
    consumer = EventConsumer(bus, [topic], group, handler, producer_name="svc-a")
    await consumer.start()
    try:
        await run_until(consumer, lambda: len(handler.seen) == 2)
    finally:
        await consumer.stop()
    assert handler.seen == [("s1", 1), ("s1", 2)]
    assert consumer.stats.dead_lettered == 1

    [dead] = await read_all(bus, topics.dead_letter(topic), unique("inspect"), 1)
    assert dead.value == garbage and dead.key == b"s1"
    assert dead.header("origin") == b"fuzzer"  # original headers are kept
    assert dead.header(DLQ_SOURCE_TOPIC) == topic.encode()
    assert dead.header(DLQ_SOURCE_PARTITION) == str(bad.partition).encode()
    assert dead.header(DLQ_SOURCE_OFFSET) == str(bad.offset).encode()
    assert dead.header(DLQ_ERROR_TYPE) == b"DecodeError"
    assert b"not a podium.v1.Envelope" in (dead.header(DLQ_ERROR) or b"")
    assert dead.header(DLQ_GROUP) == group.encode()

    # Everything was committed: a restarted member of the group gets nothing again.
    again = Collector()
    consumer = EventConsumer(bus, [topic], group, again, producer_name="svc-a")
    await consumer.start()
    try:
        assert await consumer.run_once() == 0
    finally:
        await consumer.stop()
    assert again.seen == []


async def test_non_retriable_handler_error_is_dead_lettered(bus: Bus, unique: Names) -> None:
    topic = unique("fatal")
    pub = EventPublisher(bus, producer_name="tests")
    failing = await pub.publish(topic, task("s2", seed=7), key="s2")
    await pub.publish(topic, task("s2", seed=8), key="s2")
    handler = Collector()
    handler.fail[7] = [ProcessingError("subtask graph has a cycle: a -> b -> a")]
    consumer = EventConsumer(bus, [topic], unique("g"), handler, producer_name="tests")
    await consumer.start()
    try:
        await run_until(consumer, lambda: handler.seen == [("s2", 8)])
    finally:
        await consumer.stop()
    [dead] = await read_all(bus, topics.dead_letter(topic), unique("inspect"), 1)
    assert dead.header(DLQ_ERROR) == b"subtask graph has a cycle: a -> b -> a"
    assert dead.header(DLQ_ERROR_TYPE) == b"ProcessingError"
    assert dead.header(EVENT_ID_HEADER) == failing.envelope.event_id.encode()
    assert codec.decode_envelope(dead.value).event_id == failing.envelope.event_id


async def test_retriable_errors_are_retried_not_dropped(bus: Bus, unique: Names) -> None:
    topic = unique("retry")
    await EventPublisher(bus, producer_name="tests").publish(topic, task("s3", seed=3), key="s3")
    handler = Collector()
    handler.fail[3] = [BusError("downstream busy"), ConnectionResetError("peer reset")]
    consumer = EventConsumer(
        bus, [topic], unique("g"), handler, producer_name="tests", retry_backoff_s=0.01
    )
    await consumer.start()
    try:
        await run_until(consumer, lambda: bool(handler.seen))
    finally:
        await consumer.stop()
    assert handler.seen == [("s3", 3)]
    assert consumer.stats.retries == 2 and consumer.stats.dead_lettered == 0


async def test_without_dlq_a_poison_record_stops_the_consumer_uncommitted(
    bus: Bus, unique: Names
) -> None:
    topic, group = unique("nodlq"), unique("g")
    await EventPublisher(bus, producer_name="tests").publish(topic, task("s4", seed=1), key="s4")
    await bus.publish(topic, b"\x08garbage", key="s4")
    handler = Collector()
    consumer = EventConsumer(bus, [topic], group, handler, producer_name="tests", dlq=False)
    await consumer.start()
    try:
        with pytest.raises(DecodeError):
            await run_until(consumer, lambda: False)
    finally:
        await consumer.stop()
    assert handler.seen == [("s4", 1)]
    # The good record before it was committed, the poison one was not: it comes back.
    redelivered = await read_all(bus, topic, group, 1)
    assert [r.value for r in redelivered] == [b"\x08garbage"]


async def test_graceful_stop_finishes_and_commits_the_batch_in_hand(
    bus: Bus, unique: Names
) -> None:
    topic, group = unique("graceful"), unique("g")
    pub = EventPublisher(bus, producer_name="tests")
    for i in range(20):
        await pub.publish(topic, task(f"s{i % 3}", seed=i), key=f"s{i % 3}")
    first_seen: list[int] = []
    in_hand, release = asyncio.Event(), asyncio.Event()

    async def slow(env: envelope_pb2.Envelope, record: Record) -> None:
        if not first_seen:
            in_hand.set()
            await release.wait()  # stop() is requested while this batch is being handled
        first_seen.append(codec.unpack_as(env, task_pb2.TaskSubmitted).seed)

    consumer = EventConsumer(bus, [topic], group, slow, producer_name="tests", max_batch=7)
    runner = asyncio.create_task(consumer.run())
    await asyncio.wait_for(in_hand.wait(), 20)
    stopping = asyncio.create_task(consumer.stop())
    await asyncio.sleep(0.1)
    assert not stopping.done()  # stop waits for the batch in hand
    release.set()
    await stopping
    await runner
    # The whole batch in hand was handled (nothing abandoned), and no further batch was fetched.
    assert 1 <= len(first_seen) == consumer.stats.fetched <= 7

    # It was committed: the next member of the group gets exactly the rest.
    second_seen = Collector()
    second = EventConsumer(bus, [topic], group, second_seen, producer_name="tests")
    await second.start()
    try:
        await run_until(second, lambda: len(first_seen) + len(second_seen.seen) >= 20)
        assert await second.run_once() == 0
    finally:
        await second.stop()
    rest = [seed for _, seed in second_seen.seen]
    assert sorted(first_seen + rest) == list(range(20))


async def test_trace_context_travels_in_envelope_and_headers(bus: Bus, unique: Names) -> None:
    topic = unique("trace")
    trace_id, span_id = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    parent = NonRecordingSpan(
        SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    )
    with trace.use_span(parent):
        sent = await EventPublisher(bus, producer_name="tests").publish(topic, task("s5"), key="s5")
    traceparent = sent.envelope.trace_context["traceparent"]
    assert f"{trace_id:032x}" in traceparent
    seen_trace_ids: list[int] = []
    seen_headers: list[bytes | None] = []

    async def handler(env: envelope_pb2.Envelope, record: Record) -> None:
        seen_trace_ids.append(trace.get_current_span().get_span_context().trace_id)
        seen_headers.append(record.header("traceparent"))

    consumer = EventConsumer(bus, [topic], unique("g"), handler, producer_name="tests")
    await consumer.start()
    try:
        await run_until(consumer, lambda: bool(seen_trace_ids))
    finally:
        await consumer.stop()
    assert seen_trace_ids == [trace_id]
    assert seen_headers == [traceparent.encode()]


def test_retriable_classification() -> None:
    assert is_retriable(BusError("broker down"))
    assert not is_retriable(BusError("bad", retriable=False))
    assert not is_retriable(DecodeError("garbage"))
    assert is_retriable(TimeoutError())
    assert is_retriable(ConnectionRefusedError())
    assert not is_retriable(KeyError("bug"))


async def test_consumer_rejects_bad_settings(bus: Bus) -> None:
    async def noop(env: envelope_pb2.Envelope, record: Record) -> None:
        return None

    with pytest.raises(ConfigError, match="max_batch"):
        EventConsumer(bus, ["t"], "g", noop, producer_name="x", max_batch=0)
    with pytest.raises(ConfigError, match="producer_name"):
        EventConsumer(bus, ["t"], "g", noop, producer_name="")
    with pytest.raises(ConfigError, match="at least one topic"):
        EventConsumer(bus, [], "g", noop, producer_name="x")
    consumer = EventConsumer(bus, ["t"], "g", noop, producer_name="x")
    with pytest.raises(BusError, match="not started"):
        await consumer.run_once()
