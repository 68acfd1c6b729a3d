"""The consume-transform-produce primitive (podium/bus/transform.py), on both buses.

Every test takes the ``bus`` fixture (in-process and a real Kafka broker), so the in-process
twin is held to the transactional behaviour of the real thing: outputs and the consumed
offsets become visible together; a failing transform leaves nothing visible and the batch is
processed again; poison is dead-lettered inside the transaction and the partition moves on;
a newer holder of the transactional id fences the older one; a stop past its timeout
abandons the batch uncommitted, for the next owner.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Sequence

import pytest
from test_contract import drain

from podium import codec, topics
from podium.bus import (
    Bus,
    Output,
    Record,
    TopicSpec,
    TransactionFencedError,
    Transformer,
)
from podium.bus.consumer import (
    DLQ_ATTEMPTS,
    DLQ_ERROR,
    DLQ_ERROR_TYPE,
    DLQ_SOURCE_OFFSET,
    DLQ_SOURCE_TOPIC,
)
from podium.errors import ProcessingError
from podium.v1 import envelope_pb2, task_pb2

Names = Callable[[str], str]

POISON_SEED = 666
"""Inputs with this seed make the transform fail for good (dead letter)."""


class Doubler:
    """A transform: each TaskSubmitted in, one TaskSubmitted with the seed doubled out.

    ``fail_once`` seeds raise a retriable error the first time they are seen; ``block`` makes
    every call wait until it is set.
    """

    def __init__(self, out_topic: str) -> None:
        self.out_topic = out_topic
        self.calls: list[int] = []
        self.fail_once: set[int] = set()
        self.fail_always: set[int] = set()
        self.block: asyncio.Event | None = None

    async def __call__(self, env: envelope_pb2.Envelope, record: Record) -> Sequence[Output]:
        msg = codec.unpack_as(env, task_pb2.TaskSubmitted)
        self.calls.append(msg.seed)
        if self.block is not None:
            await self.block.wait()
        if msg.seed in self.fail_once:
            self.fail_once.discard(msg.seed)
            raise ProcessingError("flaky downstream", retriable=True)
        if msg.seed in self.fail_always:
            raise ProcessingError("downstream keeps timing out", retriable=True)
        if msg.seed == POISON_SEED:
            raise ProcessingError("cannot transform this one", retriable=False)
        out = task_pb2.TaskSubmitted(session_id=msg.session_id, seed=msg.seed * 2)
        return [Output(self.out_topic, out, key=msg.session_id, event_id=f"out-{env.event_id}")]


async def publish_tasks(bus: Bus, topic: str, seeds: Sequence[int]) -> list[str]:
    """One TaskSubmitted per seed (session ``s<seed>``); returns their event ids."""
    ids = []
    for seed in seeds:
        env, data = codec.encode_event(
            task_pb2.TaskSubmitted(session_id=f"s{seed}", seed=seed), producer="test"
        )
        await bus.publish(topic, data, key=f"s{seed}")
        ids.append(env.event_id)
    return ids


def transformer(
    bus: Bus, unique: Names, in_topic: str, transform: Doubler, **overrides: object
) -> Transformer:
    """A transformer with test timings (short polls and backoff), one partition per topic."""
    settings: dict[str, object] = {
        "transactional_id_prefix": unique("txn"),
        "producer_name": "test-transformer",
        "output_topics": [transform.out_topic],
        "max_batch": 50,
        "poll_timeout_s": 0.2,
        "partitions": 1,
        "retry_backoff_s": 0.05,
        "retry_backoff_max_s": 0.2,
    }
    settings.update(overrides)
    group = str(settings.pop("group_id", unique("group")))
    return Transformer(bus, [in_topic], group, transform, **settings)  # type: ignore[arg-type]


async def step_until(t: Transformer, cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """``run_once`` until ``cond()`` holds (Kafka may hand out a batch over several fetches)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached; stats={t.stats}")
        await t.run_once()


def seeds_of(records: Sequence[Record]) -> list[int]:
    return sorted(codec.decode_event(r.value, task_pb2.TaskSubmitted)[1].seed for r in records)


async def setup_topics(bus: Bus, unique: Names) -> tuple[str, str]:
    in_topic, out_topic = unique("in"), unique("out")
    await bus.create_topics(
        [TopicSpec(n, 1) for n in (in_topic, out_topic, topics.dead_letter(in_topic))]
    )
    return in_topic, out_topic


async def test_outputs_and_offsets_commit_together(bus: Bus, unique: Names) -> None:
    in_topic, out_topic = await setup_topics(bus, unique)
    ids = await publish_tasks(bus, in_topic, range(1, 8))
    # The same event published twice (an upstream retry): transformed once.
    await bus.publish(
        in_topic,
        codec.encode_event(
            task_pb2.TaskSubmitted(session_id="s1", seed=1), producer="test", event_id=ids[0]
        )[1],
        key="s1",
    )
    doubler = Doubler(out_topic)
    group = unique("group")
    t = transformer(bus, unique, in_topic, doubler, group_id=group)
    await t.start()
    try:
        await step_until(t, lambda: t.stats.transformed + t.stats.duplicates >= 8)
    finally:
        await t.stop()
    assert (t.stats.transformed, t.stats.duplicates, t.stats.aborted) == (7, 1, 0)
    reader = bus.subscriber([out_topic], unique("reader"))
    await reader.start()
    try:
        out = await drain(reader, 7)
        assert await reader.fetch(100, timeout_s=0.5) == []
    finally:
        await reader.stop()
    assert seeds_of(out) == [2 * s for s in range(1, 8)]
    assert sorted(codec.decode_envelope(r.value).event_id for r in out) == sorted(
        f"out-{i}" for i in ids
    )
    # The offsets were committed with the outputs: the group's next member has nothing to do.
    again = Doubler(out_topic)
    t2 = transformer(bus, unique, in_topic, again, group_id=group)
    await t2.start()
    try:
        for _ in range(5):
            await t2.run_once()
    finally:
        await t2.stop()
    assert again.calls == []


async def test_a_failing_transform_leaves_nothing_visible_and_is_retried(
    bus: Bus, unique: Names
) -> None:
    in_topic, out_topic = await setup_topics(bus, unique)
    await publish_tasks(bus, in_topic, range(1, 6))
    doubler = Doubler(out_topic)
    doubler.fail_once = {4}  # records 1..3 are transformed, then the batch fails
    reader = bus.subscriber([out_topic], unique("reader"))
    await reader.start()
    committed: list[Output] = []
    t = transformer(bus, unique, in_topic, doubler, on_committed=committed.extend)
    await t.start()
    try:
        await step_until(t, lambda: t.stats.aborted == 1)
        assert t.stats.transformed == 0
        assert committed == []  # the aborted transaction's outputs are never reported
        # Outputs 1..3 were written inside the aborted transaction: nobody ever sees them.
        assert await reader.fetch(100, timeout_s=1.0) == []
        await step_until(t, lambda: t.stats.transformed == 5)
        out = await drain(reader, 5)
        assert await reader.fetch(100, timeout_s=0.5) == []
    finally:
        await t.stop()
        await reader.stop()
    assert seeds_of(out) == [2, 4, 6, 8, 10]  # each once: the aborted attempt left nothing
    assert doubler.calls.count(1) == 2 and doubler.calls.count(4) == 2
    assert sorted(o.message.seed for o in committed) == [2, 4, 6, 8, 10]  # type: ignore[attr-defined]


async def test_poison_is_dead_lettered_and_processing_continues(bus: Bus, unique: Names) -> None:
    in_topic, out_topic = await setup_topics(bus, unique)
    await publish_tasks(bus, in_topic, [1])
    await bus.publish(in_topic, b"\x00not an envelope", key="garbage")
    await publish_tasks(bus, in_topic, [POISON_SEED, 2])
    doubler = Doubler(out_topic)
    t = transformer(bus, unique, in_topic, doubler)
    await t.start()
    try:
        await step_until(t, lambda: t.stats.transformed == 2)
    finally:
        await t.stop()
    assert (t.stats.dead_lettered, t.stats.aborted) == (2, 0)
    reader = bus.subscriber([out_topic, topics.dead_letter(in_topic)], unique("reader"))
    await reader.start()
    try:
        records = await drain(reader, 4)
    finally:
        await reader.stop()
    out = [r for r in records if r.topic == out_topic]
    dead = sorted((r for r in records if r.topic != out_topic), key=lambda r: r.offset)
    assert seeds_of(out) == [2, 4]
    assert dead[0].value == b"\x00not an envelope" and dead[0].key == b"garbage"
    assert [r.header(DLQ_ERROR_TYPE) for r in dead] == [b"DecodeError", b"ProcessingError"]
    assert [r.header(DLQ_SOURCE_OFFSET) for r in dead] == [b"1", b"2"]
    assert {r.header(DLQ_SOURCE_TOPIC) for r in dead} == {in_topic.encode()}


async def test_a_record_failing_retriably_max_attempts_times_is_dead_lettered(
    bus: Bus, unique: Names
) -> None:
    in_topic, out_topic = await setup_topics(bus, unique)
    await publish_tasks(bus, in_topic, [1, 7, POISON_SEED, 2])
    doubler = Doubler(out_topic)
    doubler.fail_always = {7}
    t = transformer(bus, unique, in_topic, doubler, max_attempts=3)
    await t.start()
    try:
        await step_until(t, lambda: t.stats.transformed == 2)
    finally:
        await t.stop()
    # Tried 3 times (two aborted transactions), then dead-lettered with the error; the
    # non-retriable poison was not retried at all.
    assert doubler.calls.count(7) == 3 and doubler.calls.count(POISON_SEED) == 1
    assert (t.stats.aborted, t.stats.dead_lettered) == (2, 2)
    reader = bus.subscriber([out_topic, topics.dead_letter(in_topic)], unique("reader"))
    await reader.start()
    try:
        records = await drain(reader, 4)
        assert await reader.fetch(100, timeout_s=0.5) == []
    finally:
        await reader.stop()
    assert seeds_of([r for r in records if r.topic == out_topic]) == [2, 4]
    dead = sorted((r for r in records if r.topic != out_topic), key=lambda r: r.offset)
    assert [r.header(DLQ_SOURCE_OFFSET) for r in dead] == [b"1", b"2"]
    assert [r.header(DLQ_ATTEMPTS) for r in dead] == [b"3", None]
    assert b"downstream keeps timing out" in (dead[0].header(DLQ_ERROR) or b"")


async def test_a_newer_owner_of_the_partition_ids_fences_the_older(bus: Bus, unique: Names) -> None:
    in_topic, out_topic = await setup_topics(bus, unique)
    await publish_tasks(bus, in_topic, range(1, 4))
    prefix = unique("shared-txn")
    old = transformer(bus, unique, in_topic, Doubler(out_topic), transactional_id_prefix=prefix)
    # Another group on the same topic with the same prefix (a deployment error): it claims
    # the ids of the same input partitions, so the first group loses its only partition.
    new = transformer(bus, unique, in_topic, Doubler(out_topic), transactional_id_prefix=prefix)
    new.create_topics = False
    await old.start()
    await new.start()
    try:
        with pytest.raises(TransactionFencedError, match="every partition was taken over"):
            await step_until(old, lambda: False)
        assert old.fenced and old.stats.dropped >= 1 and old.stats.transactions == 0
        stats = new.stats
        await step_until(new, lambda: stats.transformed == 3)
        reader = bus.subscriber([out_topic], unique("reader"))
        await reader.start()
        try:
            assert seeds_of(await drain(reader, 3)) == [2, 4, 6]
            assert await reader.fetch(100, timeout_s=1.0) == []
        finally:
            await reader.stop()
    finally:
        await old.stop()
        await new.stop()
    # aiokafka leaves the fenced batch's internal drain future unretrieved; collect it now, in
    # this test, so its "never retrieved" log (whose traceback formatting parses source) does
    # not fire inside a later ast.parse: CPython 3.11.7 fails a nested parse with SystemError.
    del old, new
    gc.collect()


async def test_a_stop_past_its_timeout_abandons_the_batch_for_the_next_owner(
    bus: Bus, unique: Names
) -> None:
    in_topic, out_topic = await setup_topics(bus, unique)
    await publish_tasks(bus, in_topic, range(1, 4))
    group = unique("group")
    stuck = Doubler(out_topic)
    stuck.block = asyncio.Event()  # never set: the batch cannot finish
    first = transformer(bus, unique, in_topic, stuck, group_id=group)
    run = asyncio.create_task(first.run())
    for _ in range(300):
        if stuck.calls:
            break
        await asyncio.sleep(0.05)
    assert stuck.calls, "the first transformer never got its batch"
    await first.stop(timeout_s=0.2)
    await asyncio.wait_for(run, 5)  # run() ends cleanly: an abandoned batch is no failure
    assert first.stats.transactions == 0

    second = transformer(bus, unique, in_topic, Doubler(out_topic), group_id=group)
    await second.start()
    try:
        await step_until(second, lambda: second.stats.transformed == 3)
    finally:
        await second.stop()
    reader = bus.subscriber([out_topic], unique("reader"))
    await reader.start()
    try:
        assert seeds_of(await drain(reader, 3)) == [2, 4, 6]
        assert await reader.fetch(100, timeout_s=0.5) == []
    finally:
        await reader.stop()
