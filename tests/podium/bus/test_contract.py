"""The bus contract (podium/bus/base.py), run against every implementation.

Each test takes the ``bus`` fixture, which is parametrized over the in-process bus and a real
Kafka broker, so the embedded default is held to exactly the behaviour of the real thing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest
from aiokafka.partitioner import DefaultPartitioner

from podium.bus import Bus, Record, Subscriber, TopicSpec
from podium.bus.inproc import murmur2, partition_for_key
from podium.errors import ConfigError

Names = Callable[[str], str]


async def wait_for_assignment(
    members: Sequence[Subscriber], topic: str, partitions: int, timeout_s: float = 30.0
) -> None:
    """Until the members' assignments are disjoint, cover the topic, and each has some.

    Members keep fetching (and committing nothing: the topics are empty) because a Kafka
    consumer only learns of a rebalance through its heartbeat and fetch loop.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        owned = [m.assignment() for m in members]
        union = frozenset().union(*owned)
        settled = (
            sum(len(o) for o in owned) == len(union) == partitions
            and all(owned)
            and {t for t, _ in union} == {topic}
        )
        if settled:
            return
        if loop.time() > deadline:
            raise AssertionError(f"group did not settle: {owned}")
        for m in members:
            assert await m.fetch(10, timeout_s=0.05) == []


async def drain(member: Subscriber, want: int, timeout_s: float = 20.0) -> list[Record]:
    """Fetch until ``want`` records arrived (or fail after ``timeout_s``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    out: list[Record] = []
    while len(out) < want:
        if loop.time() > deadline:
            raise AssertionError(f"got {len(out)} of {want} records")
        out += await member.fetch(500, timeout_s=0.2)
    return out


def test_murmur2_matches_kafka_default_partitioner() -> None:
    # The in-process bus must put a key on the same partition number as a Kafka producer.
    partitioner = DefaultPartitioner()
    for i in range(500):
        key = f"session-{i}".encode() * (i % 5 + 1)
        assert partition_for_key(key, 7) == partitioner(key, list(range(7)), list(range(7)))
    # Known vector from Kafka's own test suite (UtilsTest.testMurmur2): "21" -> -973932308.
    assert murmur2(b"21") == (-973932308) & 0xFFFFFFFF


async def test_round_trip_keeps_key_value_and_headers(bus: Bus, unique: Names) -> None:
    topic, group = unique("roundtrip"), unique("g")
    await bus.create_topics([TopicSpec(topic, partitions=3)])
    headers = (("traceparent", b"00-abc-def-01"), ("bin", bytes([0, 255, 7])))
    md = await bus.publish(topic, b"\x00value\xff", key="session-1", headers=headers)
    assert md.topic == topic and md.offset == 0
    member = bus.subscriber([topic], group)
    await member.start()
    try:
        [rec] = await drain(member, 1)
    finally:
        await member.stop()
    assert (rec.topic, rec.partition, rec.offset) == (md.topic, md.partition, md.offset)
    assert rec.key == b"session-1"
    assert rec.value == b"\x00value\xff"
    assert rec.headers == headers
    assert rec.header("bin") == bytes([0, 255, 7])
    assert rec.header("missing") is None
    assert rec.timestamp_ms > 0


async def test_same_key_same_partition_in_publish_order(bus: Bus, unique: Names) -> None:
    topic, group = unique("order"), unique("g")
    await bus.create_topics([TopicSpec(topic, partitions=3)])
    keys = ["session-a", "session-b", "session-c", "session-d"]
    landed: dict[str, set[int]] = {k: set() for k in keys}
    for i in range(40):
        key = keys[i % len(keys)]
        md = await bus.publish(topic, f"{key}:{i}".encode(), key=key)
        landed[key].add(md.partition)
    for key, parts in landed.items():
        # One partition per key, and the one Kafka's default partitioner would choose.
        assert parts == {partition_for_key(key.encode(), 3)}
    member = bus.subscriber([topic], group)
    await member.start()
    try:
        records = await drain(member, 40)
    finally:
        await member.stop()
    for key in keys:
        seq = [int(r.value.split(b":")[1]) for r in records if r.key == key.encode() and r.value]
        assert seq == sorted(seq) and len(seq) == 10


async def test_group_members_split_partitions(bus: Bus, unique: Names) -> None:
    topic, group = unique("split"), unique("g")
    await bus.create_topics([TopicSpec(topic, partitions=4)])
    a, b = bus.subscriber([topic], group), bus.subscriber([topic], group)
    await a.start()
    await b.start()
    try:
        await wait_for_assignment([a, b], topic, 4)
        assert len(a.assignment()) == len(b.assignment()) == 2
        # Records published now reach exactly the member owning their partition.
        for i in range(12):
            await bus.publish(topic, str(i).encode(), key=f"k{i}")
        got_a = await drain(a, 0)
        got_b: list[Record] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while len(got_a) + len(got_b) < 12 and loop.time() < deadline:
            got_a += await a.fetch(100, 0.1)
            got_b += await b.fetch(100, 0.1)
        assert {(r.topic, r.partition) for r in got_a} <= a.assignment()
        assert {(r.topic, r.partition) for r in got_b} <= b.assignment()
        assert sorted(int(r.value or b"") for r in got_a + got_b) == list(range(12))
    finally:
        await a.stop()
        await b.stop()


async def test_separate_groups_each_receive_everything(bus: Bus, unique: Names) -> None:
    topic = unique("fanout")
    for i in range(6):
        await bus.publish(topic, str(i).encode(), key=str(i))
    for group in (unique("g1"), unique("g2")):
        member = bus.subscriber([topic], group)
        await member.start()
        try:
            got = await drain(member, 6)
            await member.commit()
        finally:
            await member.stop()
        assert sorted(int(r.value or b"") for r in got) == list(range(6))


async def test_uncommitted_records_are_redelivered_after_a_member_dies(
    bus: Bus, unique: Names
) -> None:
    topic, group = unique("redeliver"), unique("g")
    await bus.create_topics([TopicSpec(topic, partitions=2)])
    for i in range(8):
        await bus.publish(topic, str(i).encode(), key=f"s{i}")
    first = bus.subscriber([topic], group)
    await first.start()
    got_first = await drain(first, 8)
    # "Crash": leave without committing anything.
    await first.stop()
    second = bus.subscriber([topic], group)
    await second.start()
    try:
        got_second = await drain(second, 8)
    finally:
        await second.stop()
    coords = sorted((r.partition, r.offset, r.value) for r in got_first)
    assert sorted((r.partition, r.offset, r.value) for r in got_second) == coords


async def test_commit_marks_everything_before_it_processed(bus: Bus, unique: Names) -> None:
    topic, group = unique("commit"), unique("g")
    await bus.create_topics([TopicSpec(topic, partitions=1)])
    for i in range(10):
        await bus.publish(topic, str(i).encode(), key="one")
    member = bus.subscriber([topic], group)
    await member.start()
    records = await drain(member, 10)
    # Committing record 5 commits 0..5: the next owner starts at offset 6.
    await member.commit([records[5]])
    await member.stop()

    member = bus.subscriber([topic], group)
    await member.start()
    rest = await drain(member, 4)
    assert [r.offset for r in rest] == [6, 7, 8, 9]
    # commit() with no argument commits everything fetched so far.
    await member.commit()
    await member.stop()

    await bus.publish(topic, b"10", key="one")
    member = bus.subscriber([topic], group)
    await member.start()
    try:
        [only] = await drain(member, 1)
        assert only.value == b"10" and only.offset == 10
        assert await member.fetch(10, timeout_s=0.3) == []
    finally:
        await member.stop()


async def test_rebalance_on_join_and_leave_loses_nothing(bus: Bus, unique: Names) -> None:
    """Members join and leave while records keep arriving; every record is processed."""
    topic, group = unique("rebalance"), unique("g")
    await bus.create_topics([TopicSpec(topic, partitions=4)])
    processed: dict[str, list[int]] = {"a": [], "b": []}
    stop = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def work(name: str) -> None:
        member = bus.subscriber([topic], group, client_id=f"member-{name}")
        await member.start()
        try:
            while not stop[name].is_set():
                batch = await member.fetch(5, timeout_s=0.1)
                for r in batch:
                    await asyncio.sleep(0.005)  # "processing": a rebalance can land mid-batch
                    processed[name].append(int(r.value or b""))
                if batch:
                    await member.commit(batch)
        finally:
            await member.stop()

    async def publish(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            await bus.publish(topic, str(i).encode(), key=f"session-{i % 9}")

    task_a = asyncio.create_task(work("a"))
    await publish(0, 30)
    await _until(lambda: len(processed["a"]) >= 10)
    task_b = asyncio.create_task(work("b"))  # join: partitions move from a to b
    # Records keep arriving until b has processed one: a join waits out a rebalance, which a
    # loaded broker can take tens of seconds over, and a alone drains a fixed batch before
    # b is handed a partition.
    sent = 30
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90.0
    while not processed["b"]:
        assert loop.time() < deadline, "b was never handed a partition with records"
        await publish(sent, sent + 3)
        sent += 3
        await asyncio.sleep(0.2)
    stop["a"].set()  # leave: a's partitions move to b
    await task_a
    await publish(sent, sent + 30)
    sent += 30
    await _until(lambda: set(processed["a"]) | set(processed["b"]) >= set(range(sent)))
    stop["b"].set()
    await task_b
    seen = processed["a"] + processed["b"]
    assert set(seen) == set(range(sent))
    # Graceful handover: each member committed what it processed before giving partitions
    # up, so nothing was processed twice either.
    assert len(seen) == sent


async def _until(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_bad_arguments_are_rejected_with_a_clear_error(bus: Bus, unique: Names) -> None:
    with pytest.raises(ConfigError, match="at least one topic"):
        bus.subscriber([], unique("g"))
    with pytest.raises(ConfigError, match="group_id"):
        bus.subscriber([unique("t")], "")
    with pytest.raises(ConfigError, match="must be bytes"):
        await bus.publish(unique("t"), "text", key="k")  # type: ignore[arg-type]
