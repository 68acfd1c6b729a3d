"""What only the Kafka bus offers, on a real broker: positioning groups at the end of their
topics, describing partitions, reading a range of history, a standalone transactional
producer. (Tools and drivers use these; nothing outside podium/bus speaks aiokafka.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from test_contract import drain

from podium.bus import KafkaBus, Record, TopicSpec
from podium.bus.inproc import partition_for_key
from podium.errors import BusError, ConfigError

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


async def test_read_range_starts_at_the_log_start_when_retention_deleted_the_head(
    kafka: KafkaBus, unique: Names, kafka_bootstrap: str
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.records_to_delete import RecordsToDelete
    from aiokafka.structs import TopicPartition
    from kafka_helpers import client_kwargs

    topic = unique("trimmed")
    await kafka.create_topics([TopicSpec(topic, 1)])
    for i in range(10):
        await kafka.publish(topic, str(i).encode(), key="k")
    admin = AIOKafkaAdminClient(**client_kwargs(kafka_bootstrap))
    await admin.start()
    try:  # what retention does to old segments: the log now starts at offset 6
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(6)})
    finally:
        await admin.close()
    assert await _values(kafka, topic, 0, 0, None) == ["6", "7", "8", "9"]
    assert await _values(kafka, topic, 0, 2, 8) == ["6", "7"]


async def test_the_bus_replication_factor_is_a_floor_for_topics_it_creates(
    kafka_bootstrap: str, kafka_config: Callable[..., object], unique: Names
) -> None:
    """A spec asking for 1 replica on a bus configured for 2 asks the broker for 2: the
    single test broker refuses that, which shows the floor reached the CreateTopics request."""
    from podium.errors import BusError

    bus = KafkaBus(kafka_config(kafka_bootstrap, replication_factor=2))  # type: ignore[arg-type]
    await bus.start()
    try:
        with pytest.raises(BusError, match="InvalidReplicationFactor"):
            await bus.create_topics([TopicSpec(unique("floor"), 1, replication_factor=1)])
    finally:
        await bus.stop()


async def _values(
    kafka: KafkaBus, topic: str, partition: int, start: int, stop: int | None
) -> list[str]:
    out: list[Record] = []
    async for chunk in kafka.read_range(topic, partition, start, stop, max_records=2):
        assert len(chunk) <= 2
        out += chunk
    return [(r.value or b"").decode() for r in out]


async def test_topic_config_is_applied_at_creation(
    kafka: KafkaBus, unique: Names, kafka_bootstrap: str
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
    from kafka_helpers import client_kwargs

    ledger, plain = unique("cfg.ledger"), unique("cfg.plain")
    compact = (("cleanup.policy", "compact"),)
    await kafka.create_topics([TopicSpec(ledger, 1, config=compact), TopicSpec(plain, 1)])
    admin = AIOKafkaAdminClient(**client_kwargs(kafka_bootstrap))
    await admin.start()
    try:
        resources = [ConfigResource(ConfigResourceType.TOPIC, t) for t in (ledger, plain)]
        responses = await admin.describe_configs(resources)
    finally:
        await admin.close()
    policies = {
        resource[3]: {entry[0]: entry[1] for entry in resource[4]}["cleanup.policy"]
        for response in responses
        for resource in response.resources
    }
    assert policies == {ledger: "compact", plain: "delete"}


_JOIN_AND_HANG = """
import asyncio, sys
sys.path.insert(0, sys.argv[4])
from kafka_helpers import config_for
from podium.bus import KafkaBus

async def main() -> None:
    bus = KafkaBus(config_for(sys.argv[1], session_timeout_ms=6000, heartbeat_interval_ms=1000))
    await bus.start()
    member = bus.subscriber([sys.argv[2]], sys.argv[3])
    await member.start()
    print("joined", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_positioning_a_group_outlives_a_killed_member(
    kafka_bootstrap: str, unique: Names
) -> None:
    """After a kill -9 the dead member stays in its group until its session times out; the
    restart that positions the group meanwhile must wait for that, not fail."""
    import sys
    from pathlib import Path

    from kafka_helpers import config_for

    tests_dir = str(Path(__file__).parents[2])
    topic, group = unique("pos.dead"), unique("pos.dead.g")
    bus = KafkaBus(config_for(kafka_bootstrap, session_timeout_ms=6000, heartbeat_interval_ms=1000))
    await bus.start()
    try:
        await bus.create_topics([TopicSpec(topic, 1)])
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _JOIN_AND_HANG,
            kafka_bootstrap,
            topic,
            group,
            tests_dir,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            assert (await child.stdout.readline()).strip() == b"joined"
        finally:
            child.kill()
            await child.wait()
        await bus.publish(topic, b"old", key="k")
        await bus.position_groups_at_end({group: [topic]})
        await bus.publish(topic, b"new", key="k")
        member = bus.subscriber([topic], group)
        await member.start()
        try:
            got = await drain(member, 1)
        finally:
            await member.stop()
        assert [r.value for r in got] == [b"new"]
    finally:
        await bus.stop()


async def test_delete_topics_removes_them_with_their_records_and_skips_missing_ones(
    kafka: KafkaBus, unique: Names
) -> None:
    gone, kept, missing = unique("del.gone"), unique("del.kept"), unique("del.missing")
    await kafka.create_topics([TopicSpec(gone, 2), TopicSpec(kept, 1)])
    await kafka.publish(gone, b"old", key="k")
    assert await kafka.partitions(gone, wait_s=10) == [0, 1]
    await kafka.delete_topics([gone, missing])
    for _ in range(80):  # the broker finishes a deletion in the background
        if not await kafka.partitions(gone):
            break
        await asyncio.sleep(0.25)
    assert await kafka.partitions(gone) == []
    assert await kafka.partitions(kept) == [0]
    await kafka.delete_topics([])  # nothing to do
    # The bus forgot it: a publish creates the topic again, empty but for the new record.
    for _ in range(40):
        try:
            await kafka.publish(gone, b"new", key="k")
            break
        except BusError as exc:  # refused while the deletion is still being finished
            assert exc.retriable, exc
            await asyncio.sleep(0.5)
    assert sum((await kafka.end_offsets(gone)).values()) == 1
