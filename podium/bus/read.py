"""Reading a topic whole, as it is now, without a consumer group: registries and ledgers.

Compacted topics that hold state (the session ledger, the rollout registry) are read whole on
take-over; :func:`read_committed` is the one way to do so on either bus. Only committed
records are returned (Kafka reads each partition up to its last stable offset; the in-process
bus has no pending transactions, so its end offsets are final), and nobody's group position
moves.
"""

from __future__ import annotations

import uuid

from podium.bus.base import Bus, Record
from podium.bus.inproc import InProcBus
from podium.bus.kafka import KafkaBus
from podium.errors import ConfigError


async def read_committed(bus: Bus, topic: str) -> list[Record]:
    """Every committed record of ``topic`` now, partition by partition in offset order.

    A topic that does not exist reads as empty. Raises :class:`ConfigError` for a bus that is
    neither Kafka nor in-process (nothing else can be read without a group).
    """
    if isinstance(bus, KafkaBus):
        out: list[Record] = []
        for partition in await bus.partitions(topic, wait_s=5.0):
            async for chunk in bus.read_range(topic, partition, 0):
                out += chunk
        return out
    if isinstance(bus, InProcBus):
        return await _read_inproc(bus, topic)
    raise ConfigError(
        f"reading {topic} whole needs a Kafka or in-process bus, got {type(bus).__name__}"
    )


async def _read_inproc(bus: InProcBus, topic: str) -> list[Record]:
    """All of ``topic`` on the in-process bus, through a throw-away group."""
    ends = bus.end_offsets(topic)
    if not any(ends.values()):
        return []
    reader = bus.subscriber([topic], f"read-committed.{uuid.uuid4().hex}")
    await reader.start()
    out: list[Record] = []
    try:
        while len(out) < sum(ends.values()):
            chunk = await reader.fetch(timeout_s=0.1)
            out += [r for r in chunk if r.offset < ends.get(r.partition, 0)]
            if not chunk:
                break
    finally:
        await reader.stop()
    return sorted(out, key=lambda r: (r.partition, r.offset))


async def read_tail(bus: Bus, topic: str, per_partition: int) -> list[Record]:
    """The last ``per_partition`` offsets of each partition of ``topic`` (committed records
    among them: aborted ones are skipped, so fewer may come back), without a group.

    For "the newest N records" of a topic too large to read whole (trajectories); the caller
    orders and trims what comes back.
    """
    if per_partition <= 0:
        return []
    if isinstance(bus, KafkaBus):
        out: list[Record] = []
        for partition, end in sorted((await bus.end_offsets(topic)).items()):
            async for chunk in bus.read_range(topic, partition, max(0, end - per_partition), end):
                out += chunk
        return out
    if isinstance(bus, InProcBus):
        ends = bus.end_offsets(topic)
        return [
            r
            for r in await _read_inproc(bus, topic)
            if r.offset >= ends.get(r.partition, 0) - per_partition
        ]
    raise ConfigError(
        f"reading the tail of {topic} needs a Kafka or in-process bus, got {type(bus).__name__}"
    )
