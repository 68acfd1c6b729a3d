"""The transactional member contract (podium/bus/base.py), on both buses.

One transaction per input partition: a partition's outputs and its offset become visible
together; an aborted one leaves nothing; the rebalance callbacks run around the claim; a
newer owner of a partition's transactional id fences that partition only; begin on a
partition not owned is a retriable error.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest
from test_contract import drain

from podium.bus import (
    TP,
    Bus,
    Record,
    TopicSpec,
    TransactionalMember,
    TransactionFencedError,
    partition_transactional_id,
)
from podium.errors import BusError, ConfigError

Names = Callable[[str], str]


async def fetch_all(
    member: TransactionalMember, want: int, timeout_s: float = 30.0
) -> list[Record]:
    """Fetch until ``want`` records arrived."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    out: list[Record] = []
    while len(out) < want:
        assert loop.time() < deadline, f"got {len(out)} of {want}"
        out += await member.fetch(500, timeout_s=0.2)
    return out


def by_tp(records: list[Record]) -> dict[TP, list[Record]]:
    out: dict[TP, list[Record]] = {}
    for r in records:
        out.setdefault((r.topic, r.partition), []).append(r)
    return out


async def published(bus: Bus, topic: str, unique: Names, want: int) -> list[bytes]:
    """Values of ``topic`` visible to a read_committed reader (exactly ``want`` of them)."""
    reader = bus.subscriber([topic], unique("reader"))
    await reader.start()
    try:
        got = await drain(reader, want)
        assert await reader.fetch(100, timeout_s=0.5) == []
    finally:
        await reader.stop()
    return sorted(r.value or b"" for r in got)


async def test_a_partition_commits_its_outputs_with_its_offset(bus: Bus, unique: Names) -> None:
    in_topic, out_topic, group = unique("in"), unique("out"), unique("g")
    await bus.create_topics([TopicSpec(in_topic, 2), TopicSpec(out_topic, 1)])
    for i in range(10):
        await bus.publish(in_topic, f"v{i}".encode(), key=f"k{i}")
    member = bus.transactional_member([in_topic], group, unique("txn"))
    await member.start()
    try:
        parts = by_tp(await fetch_all(member, 10))
        assert set(parts) == {(in_topic, 0), (in_topic, 1)} == member.assignment()
        (tp_a, recs_a), (tp_b, recs_b) = sorted(parts.items())
        txn = await member.begin(tp_a)
        assert txn.tp == tp_a
        for r in recs_a:
            await txn.publish(out_topic, b"out-" + (r.value or b""), key=r.key)
        await txn.commit(recs_a)
        # Partition b: aborted, rewound, fetched again and committed.
        txn = await member.begin(tp_b)
        await txn.publish(out_topic, b"never visible")
        with pytest.raises(ConfigError, match="one transaction per partition"):
            await txn.commit(recs_a)
        await txn.abort()
        await member.rewind(recs_b)
        again = await fetch_all(member, len(recs_b))
        assert [r.offset for r in again] == [r.offset for r in recs_b]
        txn = await member.begin(tp_b)
        for r in again:
            await txn.publish(out_topic, b"out-" + (r.value or b""), key=r.key)
        await txn.commit(again)
        # An empty commit publishes its outputs and leaves the offset where it is.
        txn = await member.begin(tp_a)
        await txn.publish(out_topic, b"extra")
        await txn.commit([])
    finally:
        await member.stop()
    assert await published(bus, out_topic, unique, 11) == sorted(
        [b"extra"] + [f"out-v{i}".encode() for i in range(10)]
    )
    # The offsets were committed with the outputs: the group's next member has nothing to do.
    nxt = bus.transactional_member([in_topic], group, unique("txn"))
    await nxt.start()
    try:
        assert await nxt.fetch(100, timeout_s=1.0) == []
    finally:
        await nxt.stop()


async def test_callbacks_run_around_the_claim_and_begin_needs_ownership(
    bus: Bus, unique: Names
) -> None:
    in_topic = unique("in")
    await bus.create_topics([TopicSpec(in_topic, 2)])
    await bus.publish(in_topic, b"x", key="k")
    events: list[tuple[str, frozenset[TP]]] = []
    member = bus.transactional_member([in_topic], unique("g"), unique("txn"))

    async def assigned(tps: frozenset[TP]) -> None:
        # Claimed but not fetched yet: state loaded here is in place before any record.
        events.append(("assigned", tps))

    async def revoked(tps: frozenset[TP]) -> None:
        events.append(("revoked", tps))

    member.on_rebalance(assigned=assigned, revoked=revoked)
    await member.start()
    try:
        everything = frozenset({(in_topic, 0), (in_topic, 1)})
        assert events == [("assigned", everything)]
        assert len(await fetch_all(member, 1)) == 1
        with pytest.raises(BusError) as err:
            await member.begin((unique("other"), 0))
        assert err.value.retriable and "not owned" in str(err.value)
        txn = await member.begin((in_topic, 0))
        with pytest.raises(BusError, match="already open") as err:
            await member.begin((in_topic, 0))
        assert not err.value.retriable
        await txn.abort()
    finally:
        await member.stop()
    assert events[-1] == ("revoked", everything)


async def test_a_newer_owner_of_a_partition_id_fences_that_partition_only(
    bus: Bus, unique: Names
) -> None:
    shared, own, out_topic = unique("shared"), unique("own"), unique("out")
    await bus.create_topics([TopicSpec(shared, 1), TopicSpec(own, 1), TopicSpec(out_topic, 1)])
    await bus.publish(shared, b"s")
    await bus.publish(own, b"o")
    prefix = unique("txn")
    old = bus.transactional_member([shared, own], unique("g1"), prefix)
    await old.start()
    records = by_tp(await fetch_all(old, 2))
    # Another group reading `shared` with the same prefix claims the same partition id.
    new = bus.transactional_member([shared], unique("g2"), prefix)
    await new.start()
    try:
        with pytest.raises(
            TransactionFencedError, match=partition_transactional_id(prefix, shared, 0)
        ):
            txn = await old.begin((shared, 0))
            await txn.publish(out_topic, b"stale")
            await txn.commit(records[(shared, 0)])
        assert old.assignment() == {(own, 0)}
        with pytest.raises(TransactionFencedError):
            await old.begin((shared, 0))
        # Its other partition goes on.
        txn = await old.begin((own, 0))
        await txn.publish(out_topic, b"fresh")
        await txn.commit(records[(own, 0)])
        # The new owner starts at the (never moved) committed offset of its own group.
        [again] = await fetch_all(new, 1)
        txn = await new.begin((shared, 0))
        await txn.publish(out_topic, b"by-new")
        await txn.commit([again])
    finally:
        await old.stop()
        await new.stop()
    assert await published(bus, out_topic, unique, 2) == [b"by-new", b"fresh"]
    # aiokafka leaves the fenced batch's internal drain future unretrieved; collect it now, so
    # its "never retrieved" log does not fire inside a later ast.parse (see test_transform).
    del old, new
    gc.collect()


async def test_a_blank_prefix_is_refused(bus: Bus, unique: Names) -> None:
    with pytest.raises(ConfigError, match="transactional_id_prefix must not be empty"):
        bus.transactional_member([unique("in")], unique("g"), " ")
