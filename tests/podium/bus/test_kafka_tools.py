"""What only the Kafka bus offers, on a real broker: positioning groups at the end of their
topics, describing partitions, reading a range of history, a standalone transactional
producer. (Tools and drivers use these; nothing outside podium/bus speaks aiokafka.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from test_contract import drain

from podium.bus import KafkaBus, Record, TopicSpec
from podium.bus.inproc import partition_for_key
from podium.errors import ConfigError

pytestmark = pytest.mark.kafka

Names = Callable[[str], str]


@pytest.fixture
async def kafka(
    kafka_bootstrap: str, kafka_config: Callable[..., object]
) -> AsyncIterator[KafkaBus]:
    bus = KafkaBus(kafka_config(kafka_bootstrap))  # type: ignore[arg-type]
    await bus.start()
    try:
        yield bus
    finally:
        await bus.stop()


async def test_position_groups_at_end_skips_history_and_misses_nothing_after(
    kafka: KafkaBus, unique: Names
) -> None:
    a, b, group = unique("pos.a"), unique("pos.b"), unique("pos.g")
    await kafka.create_topics([TopicSpec(a, 2), TopicSpec(b, 1)])
    for i in range(6):
        await kafka.publish(a if i % 2 else b, f"old-{i}".encode(), key=f"k{i}")
    await kafka.position_groups_at_end({group: [a, b]})
    # Published after positioning, before any member joined: must not be missed.
    await kafka.publish(a, b"new-a", key="x")
    await kafka.publish(b, b"new-b", key="y")
    member = kafka.subscriber([a, b], group)
    await member.start()
    try:
        got = await drain(member, 2)
        assert await member.fetch(100, timeout_s=0.5) == []
    finally:
        await member.stop()
    assert sorted(r.value for r in got) == [b"new-a", b"new-b"]


async def test_position_groups_at_end_names_a_missing_topic(
    kafka: KafkaBus, unique: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def nothing(topic: str, *, wait_s: float = 0.0) -> list[int]:
        return []

    monkeypatch.setattr(kafka, "partitions", nothing)
    missing = unique("missing")
    with pytest.raises(ConfigError, match=f"topic {missing} does not exist"):
        await kafka.position_groups_at_end({unique("g"): [missing]})


async def test_partitions_and_read_range_skip_aborted_transactions(
    kafka: KafkaBus, unique: Names
) -> None:
    topic = unique("range")
    await kafka.create_topics([TopicSpec(topic, 3)])
    assert await kafka.partitions(topic, wait_s=10) == [0, 1, 2]
    producer = kafka.transactional_producer(unique("txn"))
    await producer.start()
    try:
        for batch, commit in ((range(0, 4), True), (range(100, 103), False), (range(4, 8), True)):
            await producer.begin()
            for i in batch:
                await producer.publish(topic, str(i).encode(), key="one")
            await (producer.commit() if commit else producer.abort())
    finally:
        await producer.stop()
    partition = partition_for_key(b"one", 3)  # the Kafka default partitioner's choice
    # Every committed record, in order; the aborted ones (and their markers) never appear.
    assert await _values(kafka, topic, partition, 0, None) == [str(i) for i in range(8)]
    everything = [r async for chunk in kafka.read_range(topic, partition, 0) for r in chunk]
    assert [r.key for r in everything] == [b"one"] * 8
    # A range of offsets: aborted records occupy offsets 5..7 (plus a marker) in the log.
    first, last = everything[1].offset, everything[6].offset
    assert await _values(kafka, topic, partition, first, last) == ["1", "2", "3", "4", "5"]
    assert await _values(kafka, topic, partition, last, last) == []


async def _values(
    kafka: KafkaBus, topic: str, partition: int, start: int, stop: int | None
) -> list[str]:
    out: list[Record] = []
    async for chunk in kafka.read_range(topic, partition, start, stop, max_records=2):
        assert len(chunk) <= 2
        out += chunk
    return [(r.value or b"").decode() for r in out]
