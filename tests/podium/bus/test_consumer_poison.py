"""Poison never stops an EventConsumer, on both bus implementations (issue 12).

A handler that fails on one record — with a non-retriable error at once, with a retriable one
after ``max_attempts`` tries — parks that record on the dead-letter topic (its error and the
tries in the headers) and the rest of its partition is processed and committed. Before, every
``OSError`` counted as retriable (a missing file included) and retriable errors were retried
forever, stalling the partition; these tests then ran into their time limit.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections.abc import Callable

import pytest

from podium import codec, topics
from podium.bus import Bus, EventConsumer, EventPublisher, Record
from podium.bus.consumer import DLQ_ERROR, DLQ_ERROR_TYPE, DLQ_SOURCE_OFFSET, is_retriable
from podium.errors import BusError, ConfigError, DecodeError, ProcessingError
from podium.v1 import envelope_pb2, task_pb2

Names = Callable[[str], str]

# Long enough for a slow shared broker, short enough that a stalled partition fails the test
# instead of hanging it.
STALL_S = 45.0


class Failing:
    """A handler that fails every time on one seed (counting its calls) and records the rest."""

    def __init__(self, seed: int, error: Callable[[], Exception]) -> None:
        self.seed = seed
        self.error = error
        self.calls = 0
        self.seen: list[int] = []

    async def __call__(self, env: envelope_pb2.Envelope, record: Record) -> None:
        msg = codec.unpack_as(env, task_pb2.TaskSubmitted)
        if msg.seed == self.seed:
            self.calls += 1
            raise self.error()
        self.seen.append(msg.seed)


async def publish_seeds(bus: Bus, topic: str, seeds: list[int]) -> list[int]:
    """One task per seed, all keyed alike (one partition, in order); their offsets."""
    pub = EventPublisher(bus, producer_name="tests")
    out = []
    for seed in seeds:
        sent = await pub.publish(
            topic, task_pb2.TaskSubmitted(session_id="s", seed=seed), key="poison"
        )
        out.append(sent.metadata.offset)
    return out


async def consume_until(consumer: EventConsumer, cond: Callable[[], bool]) -> None:
    """Run the consumer until ``cond`` holds; fail (not hang) if the partition stalls."""

    async def loop() -> None:
        while not cond():
            await consumer.run_once()

    try:
        await asyncio.wait_for(loop(), STALL_S)
    except TimeoutError:
        raise AssertionError(f"partition stalled: stats={consumer.stats}") from None


async def dead_letters(bus: Bus, topic: str, group: str) -> list[Record]:
    member = bus.subscriber([topics.dead_letter(topic)], group)
    await member.start()
    try:
        out: list[Record] = []
        deadline = asyncio.get_running_loop().time() + 20
        while not out and asyncio.get_running_loop().time() < deadline:
            out += await member.fetch(100, 0.2)
        out += await member.fetch(100, 0.5)  # and nothing more
        return out
    finally:
        await member.stop()


async def assert_all_committed(bus: Bus, topic: str, group: str) -> None:
    """A new member of ``group`` gets nothing: the poison record was committed with the rest."""

    async def noop(env: envelope_pb2.Envelope, record: Record) -> None:
        raise AssertionError(f"redelivered: offset {record.offset}")

    again = EventConsumer(bus, [topic], group, noop, producer_name="tests")
    await again.start()
    try:
        assert await again.run_once() == 0
    finally:
        await again.stop()


async def test_missing_file_is_dead_lettered_at_once(bus: Bus, unique: Names) -> None:
    """Seen: a handler's FileNotFoundError was retried forever. It is about the request, not
    the moment: one call, then the dead-letter topic, and the partition moves on."""
    topic, group = unique("enoent"), unique("g")
    offsets = await publish_seeds(bus, topic, [1, 7, 8])
    handler = Failing(
        7, lambda: FileNotFoundError(errno.ENOENT, "No such file or directory", "/srv/x.bin")
    )
    consumer = EventConsumer(
        bus, [topic], group, handler, producer_name="tests", retry_backoff_s=0.01
    )
    await consumer.start()
    try:
        await consume_until(consumer, lambda: handler.seen == [1, 8])
    finally:
        await consumer.stop()
    assert handler.calls == 1
    assert consumer.stats.retries == 0 and consumer.stats.dead_lettered == 1
    [dead] = await dead_letters(bus, topic, unique("inspect"))
    assert dead.header(DLQ_ERROR_TYPE) == b"FileNotFoundError"
    assert b"/srv/x.bin" in (dead.header(DLQ_ERROR) or b"")
    assert dead.header(DLQ_SOURCE_OFFSET) == str(offsets[1]).encode()
    assert dead.header("podium.dlq.attempts") == b"1"
    await assert_all_committed(bus, topic, group)


async def test_retriable_failure_is_dead_lettered_after_max_attempts(
    bus: Bus, unique: Names
) -> None:
    """Seen: a retriable error on one record was retried forever, stalling its partition.
    After the default five tries it is dead-lettered and the records behind it are handled."""
    topic, group = unique("exhaust"), unique("g")
    offsets = await publish_seeds(bus, topic, [1, 7, 8, 9])
    handler = Failing(7, lambda: ConnectionResetError(errno.ECONNRESET, "peer reset"))
    consumer = EventConsumer(
        bus, [topic], group, handler, producer_name="tests", retry_backoff_s=0.01
    )
    await consumer.start()
    try:
        await consume_until(consumer, lambda: handler.seen == [1, 8, 9])
    finally:
        await consumer.stop()
    assert handler.calls == 5  # DEFAULT_MAX_ATTEMPTS
    assert consumer.stats.retries == 4 and consumer.stats.dead_lettered == 1
    [dead] = await dead_letters(bus, topic, unique("inspect"))
    assert dead.header(DLQ_ERROR_TYPE) == b"ConnectionResetError"
    assert dead.header(DLQ_SOURCE_OFFSET) == str(offsets[1]).encode()
    assert dead.header("podium.dlq.attempts") == b"5"
    await assert_all_committed(bus, topic, group)


async def test_max_attempts_is_a_setting_and_success_within_it_is_not_dead_lettered(
    bus: Bus, unique: Names
) -> None:
    from podium.bus.consumer import DEFAULT_MAX_ATTEMPTS

    assert DEFAULT_MAX_ATTEMPTS == 5
    topic, group = unique("attempts"), unique("g")
    await publish_seeds(bus, topic, [7, 8])
    failures = [BusError("busy"), TimeoutError()]
    seen: list[int] = []

    async def flaky(env: envelope_pb2.Envelope, record: Record) -> None:
        seed = codec.unpack_as(env, task_pb2.TaskSubmitted).seed
        if seed == 7 and failures:
            raise failures.pop(0)
        seen.append(seed)

    consumer = EventConsumer(
        bus, [topic], group, flaky, producer_name="tests", retry_backoff_s=0.01, max_attempts=3
    )
    await consumer.start()
    try:
        await consume_until(consumer, lambda: seen == [7, 8])  # third try of 7 succeeds
    finally:
        await consumer.stop()
    assert consumer.stats.dead_lettered == 0 and consumer.stats.exhausted == 0

    always = Failing(1, lambda: BusError("downstream down"))
    topic2 = unique("attempts2")
    await publish_seeds(bus, topic2, [1, 2])
    consumer = EventConsumer(
        bus, [topic2], group, always, producer_name="tests", retry_backoff_s=0.01, max_attempts=2
    )
    await consumer.start()
    try:
        await consume_until(consumer, lambda: always.seen == [2])
    finally:
        await consumer.stop()
    assert always.calls == 2 and consumer.stats.exhausted == 1
    [dead] = await dead_letters(bus, topic2, unique("inspect"))
    assert dead.header("podium.dlq.attempts") == b"2"


async def test_without_dlq_exhausted_attempts_stop_the_consumer(bus: Bus, unique: Names) -> None:
    topic = unique("nodlq")
    await publish_seeds(bus, topic, [7])
    handler = Failing(7, lambda: ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    consumer = EventConsumer(
        bus,
        [topic],
        unique("g"),
        handler,
        producer_name="tests",
        dlq=False,
        retry_backoff_s=0.01,
        max_attempts=3,
    )
    await consumer.start()
    try:
        with pytest.raises(ConnectionRefusedError):
            await consume_until(consumer, lambda: False)
    finally:
        await consumer.stop()
    assert handler.calls == 3


def test_max_attempts_must_be_positive() -> None:
    from podium.bus import InProcBus

    async def noop(env: envelope_pb2.Envelope, record: Record) -> None:
        return None

    with pytest.raises(ConfigError, match="max_attempts"):
        EventConsumer(InProcBus(), ["t"], "g", noop, producer_name="x", max_attempts=0)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(errno.ECONNRESET, "reset"),
        ConnectionRefusedError(),
        BrokenPipeError(),
        TimeoutError(),
        BlockingIOError(errno.EAGAIN, "try again"),
        InterruptedError(),
        OSError(errno.EAGAIN, "resource temporarily unavailable"),
        OSError(errno.ETIMEDOUT, "timed out"),
        OSError(errno.EHOSTUNREACH, "no route to host"),
        OSError(errno.EMFILE, "too many open files"),
        socket.gaierror(socket.EAI_AGAIN, "temporary failure in name resolution"),
        ssl.SSLEOFError(ssl.SSL_ERROR_EOF, "EOF occurred in violation of protocol"),
        BusError("broker down"),
    ],
    ids=repr,
)
def test_transient_errors_are_retriable(exc: BaseException) -> None:
    assert is_retriable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"),
        FileNotFoundError("no errno"),
        PermissionError(errno.EACCES, "denied"),
        IsADirectoryError(errno.EISDIR, "is a directory"),
        NotADirectoryError(errno.ENOTDIR, "not a directory"),
        FileExistsError(errno.EEXIST, "exists"),
        OSError(errno.EINVAL, "invalid argument"),
        OSError(errno.ENAMETOOLONG, "file name too long"),
        OSError(errno.EROFS, "read-only file system"),
        OSError("no errno at all"),
        socket.gaierror(socket.EAI_NONAME, "name or service not known"),
        ssl.SSLCertVerificationError(1, "certificate verify failed"),
        ssl.SSLError(ssl.SSL_ERROR_SSL, "wrong version number"),
        BusError("fenced", retriable=False),
        DecodeError("garbage"),
        ProcessingError("bad data"),
        ValueError("bug"),
        KeyError("bug"),
    ],
    ids=repr,
)
def test_request_errors_are_not_retriable(exc: BaseException) -> None:
    assert not is_retriable(exc)
