"""Reading a topic without a group (podium/bus/read.py), on both buses: read_committed returns
every committed record and none of an aborted transaction; read_tail the newest offsets of each
partition; a missing topic reads as empty; nobody's group position moves."""

from __future__ import annotations

from collections.abc import Callable

from test_transactional import fetch_all

from podium.bus import Bus, TopicSpec, read_committed, read_tail

Names = Callable[[str], str]


async def test_read_committed_skips_aborted_transactions(bus: Bus, unique: Names) -> None:
    src, state = unique("src"), unique("state")
    await bus.create_topics([TopicSpec(src, 1), TopicSpec(state, 2)])
    for i in range(6):
        await bus.publish(state, f"plain-{i}".encode(), key=f"k{i}")
    await bus.publish(src, b"in", key="x")
    member = bus.transactional_member([src], unique("g"), unique("txn"))
    await member.start()
    try:
        (record,) = await fetch_all(member, 1)
        txn = await member.begin((src, 0))
        await txn.publish(state, b"aborted", key="k0")
        await txn.abort()
        txn = await member.begin((src, 0))
        await txn.publish(state, b"committed", key="k0")
        await txn.commit([record])
    finally:
        await member.stop()
    got = await read_committed(bus, state)
    assert sorted(r.value or b"" for r in got) == sorted(
        [f"plain-{i}".encode() for i in range(6)] + [b"committed"]
    )
    assert [(r.partition, r.offset) for r in got] == sorted((r.partition, r.offset) for r in got)
    assert await read_committed(bus, state) == got, "reading moves nothing"


async def test_read_tail_returns_the_newest_offsets_per_partition(bus: Bus, unique: Names) -> None:
    topic = unique("tail")
    await bus.create_topics([TopicSpec(topic, 2)])
    for i in range(20):
        await bus.publish(topic, str(i).encode(), key=f"k{i}")
    whole = await read_committed(bus, topic)
    tail = await read_tail(bus, topic, 3)
    newest = {
        p: sorted((r for r in whole if r.partition == p), key=lambda r: r.offset)[-3:]
        for p in {r.partition for r in whole}
    }
    assert sorted((r.partition, r.offset) for r in tail) == sorted(
        (r.partition, r.offset) for rs in newest.values() for r in rs
    )
    assert await read_tail(bus, topic, 0) == []


async def test_a_missing_topic_reads_as_empty(bus: Bus, unique: Names) -> None:
    assert await read_committed(bus, unique("missing")) == []
