"""KafkaSubscriber around rebalances, on a real broker (the shared contract is test_contract.py).

Needs ``$PODIUM_KAFKA_BOOTSTRAP`` (``eval "$(scripts/kafka.sh start)"``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from kafka_helpers import config_for

from podium.bus import KafkaBus, Record, Subscriber, TopicSpec

pytestmark = pytest.mark.kafka

Names = Callable[[str], str]


async def _drain(
    member: Subscriber, want: int, *, commit: bool, timeout_s: float = 20.0
) -> list[Record]:
    """Fetch until ``want`` records arrived, committing each batch if ``commit``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    out: list[Record] = []
    while len(out) < want:
        if loop.time() > deadline:
            raise AssertionError(f"got {len(out)} of {want} records")
        batch = await member.fetch(500, timeout_s=0.2)
        if batch and commit:
            await member.commit(batch)
        out += batch
    return out


async def test_stop_during_a_rebalance_does_not_wait_out_the_revoke_grace(
    kafka_bootstrap: str, unique: Names, caplog: pytest.LogCaptureFixture
) -> None:
    """A member stopping while a rebalance waits for its uncommitted batch leaves at once.

    Its caller stops only after the batch in hand was committed or abandoned, so no commit
    can come: waiting ``revoke_grace_s`` for one would only delay the shutdown (and the
    member that joins). The abandoned records go to the new owner, none lost.
    """
    grace = 20.0
    bus = KafkaBus(
        config_for(
            kafka_bootstrap,
            client_id="podium-tests",
            heartbeat_interval_ms=250,  # a rebalance is noticed within a heartbeat
            session_timeout_ms=6000,
            revoke_grace_s=grace,
            join_timeout_s=30.0,
        )
    )
    await bus.start()
    topic, group = unique("revoke"), unique("g")
    caplog.set_level(logging.INFO, logger="aiokafka.consumer.group_coordinator")
    try:
        await bus.create_topics([TopicSpec(topic, partitions=2)])
        for i in range(6):
            await bus.publish(topic, str(i).encode(), key=f"session-{i}")
        a = bus.subscriber([topic], group, client_id="member-a")
        await a.start()
        # Fetched, never committed: a's batch was cut off (say its handler gave up at stop).
        assert len(await _drain(a, 6, commit=False)) == 6

        b = bus.subscriber([topic], group, client_id="member-b")
        joining = asyncio.create_task(b.start())

        def revoking_a() -> bool:
            # a learns of the rebalance through its heartbeat and enters its revoke callback,
            # where it waits for that batch to commit; b's revoke set is empty.
            return any(
                r.msg.startswith("Revoking previously assigned partitions")
                and isinstance(r.args, tuple)
                and r.args[0]
                and r.args[1] == group
                for r in caplog.records
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        while not revoking_a():
            assert loop.time() < deadline, "member a never saw the rebalance"
            await asyncio.sleep(0.05)

        started = loop.time()
        await a.stop()
        stopped_in = loop.time() - started
        assert stopped_in < grace / 2, f"stop took {stopped_in:.1f}s (revoke grace {grace}s)"

        await asyncio.wait_for(joining, 30.0)
        try:
            # b commits as it goes: a's leaving rebalances the group again, and b's own
            # revoke callback must not wait on a batch of its own.
            redelivered = await _drain(b, 6, commit=True)
            assert sorted(int(r.value or b"") for r in redelivered) == list(range(6))
        finally:
            await b.stop()
    finally:
        await bus.stop()
