"""Exactly-once consume-transform-produce under the faults of issue 12, on a real broker.

A :class:`~podium.bus.Transformer` runs in a child process (``transformer_child.py``) and is
hit while its transaction is open; a second member of the same group (same transactional id
prefix), in this process, takes its partition over. The output topic is then read back under
read_committed: every input must be there exactly once.

* zombie: the child is paused (SIGSTOP) past its session timeout, the partition moves, the
  new owner commits, the child resumes and tries to commit its stale batch. Before the
  per-partition transactional ids it committed (aiokafka's offset commit carries no group
  generation): duplicates. Now the new owner's claim fenced it.
* crash: the child is killed (SIGKILL) with its transaction open. Before, its open
  transaction was only ended by the broker's transaction timeout (60 s), and until then
  read_committed readers saw nothing of the new owner's outputs either; now the new owner's
  claim ends it at once (and waits for it, so the offset it reads is stable).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka_helpers import kafka_url
from transformer_child import Copier, copier_transformer

from podium import codec, topics
from podium.bus import KafkaBus, KafkaConfig, TopicSpec
from podium.v1 import task_pb2

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).parents[3]
CHILD = Path(__file__).with_name("transformer_child.py")
N = 40
SESSION_MS = 6000  # the broker's group.min.session.timeout.ms


async def publish_inputs(bus: KafkaBus, topic: str, n: int) -> None:
    for seed in range(n):
        _, data = codec.encode_event(
            task_pb2.TaskSubmitted(session_id=f"s{seed}", seed=seed), producer="test"
        )
        await bus.publish(topic, data, key=f"s{seed}")


async def committed_seeds(bus: KafkaBus, topic: str) -> Counter[int]:
    """How often each seed is in ``topic`` under read_committed (one partition)."""
    seen: Counter[int] = Counter()
    async for chunk in bus.read_range(topic, 0, 0):
        for r in chunk:
            seen[codec.decode_event(r.value, task_pb2.TaskSubmitted)[1].seed] += 1
    return seen


class Child:
    """The child transformer process, its output read line by line."""

    def __init__(self, settings: dict[str, Any], log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(CHILD.parent)])}
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(settings)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log.open("wb"),
            text=True,
        )

    async def line(self, timeout_s: float = 60.0) -> str:
        assert self.proc.stdout is not None
        got = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout_s)
        assert got, f"child ended early: {self.log.read_text()}"
        return got.strip()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
async def setup(
    kafka_bootstrap: str, unique: Callable[[str], str], kafka_config: Callable[..., KafkaConfig]
) -> Any:
    """A started Kafka bus, fresh single-partition topics holding N inputs, child settings."""
    bus = KafkaBus(kafka_config(kafka_bootstrap, session_timeout_ms=SESSION_MS, revoke_grace_s=1.0))
    await bus.start()
    settings = {
        "url": kafka_url(
            kafka_bootstrap,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=250,
            revoke_grace_s=1.0,
        ),
        "in_topic": unique("eos.in"),
        "out_topic": unique("eos.out"),
        "group": unique("eos.group"),
        "prefix": unique("eos.txn"),
    }
    in_topic = settings["in_topic"]
    names = [in_topic, settings["out_topic"], topics.dead_letter(in_topic)]
    await bus.create_topics([TopicSpec(n, 1) for n in names])
    await publish_inputs(bus, in_topic, N)
    try:
        yield bus, settings
    finally:
        await bus.stop()


async def take_over(bus: KafkaBus, settings: dict[str, Any], timeout_s: float = 60.0) -> Any:
    """A member of the child's group in this process; runs until it transformed all N."""
    t = copier_transformer(bus, settings, Copier(settings["out_topic"]))
    await t.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while t.stats.transformed < N:
            assert loop.time() < deadline, f"new owner stuck: {t.stats}"
            await t.run_once()
    finally:
        await t.stop()
    return t.stats


async def test_a_zombie_paused_past_its_session_is_fenced_exactly_once(
    setup: Any, tmp_path: Path
) -> None:
    bus, settings = setup
    child = Child({**settings, "hold_s": 1.0}, tmp_path / "zombie.log")
    try:
        assert await child.line() == "OPEN"
        # Outputs are in the child's open transaction; it stalls before committing.
        os.kill(child.proc.pid, signal.SIGSTOP)
        try:
            # The broker expires the child's session; this member gets the partition.
            stats = await take_over(bus, settings)
            assert stats.transformed == N
        finally:
            os.kill(child.proc.pid, signal.SIGCONT)
        result = await child.line()
        assert result.startswith("RESULT "), result
        outcome = json.loads(result.removeprefix("RESULT "))
        assert child.proc.wait(timeout=60) == 0, (tmp_path / "zombie.log").read_text()
    finally:
        child.kill()
    seen = await committed_seeds(bus, settings["out_topic"])
    assert sorted(seen) == list(range(N))
    assert max(seen.values()) == 1, f"scored twice: {[s for s, c in seen.items() if c > 1]}"
    # The zombie's stale batch was never committed.
    assert outcome["transactions"] == 0, outcome


async def test_a_crashed_members_open_transaction_is_ended_by_the_new_owner(
    setup: Any, tmp_path: Path
) -> None:
    bus, settings = setup
    child = Child({**settings, "hold_s": 600.0}, tmp_path / "crash.log")
    try:
        assert await child.line() == "OPEN"
        child.proc.send_signal(signal.SIGKILL)  # no clean stop: the transaction stays open
        child.proc.wait(timeout=10)
    finally:
        child.kill()
    loop = asyncio.get_running_loop()
    started = loop.time()
    stats = await take_over(bus, settings)
    assert stats.transformed == N
    # The new owner's outputs are readable now, not after the broker's transaction timeout
    # (60 s) has ended the crashed member's transaction, which sits before them in the log.
    seen: Counter[int] = Counter()
    while loop.time() - started < 30 and sum(seen.values()) < N:
        seen = await committed_seeds(bus, settings["out_topic"])
        await asyncio.sleep(0.5)
    assert sorted(seen) == list(range(N)), f"visible after {loop.time() - started:.1f}s: {seen}"
    assert max(seen.values()) == 1
