"""SIGTERM on a real ``python -m subagent_svc`` process against a real Kafka broker.

The worker must stop consuming, finish the batch in hand, publish its results, commit, and
exit 0; the next member of the group must then get exactly the assignments that were not
processed: none again (no redelivery), none missing (no loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka_helpers import bus_env, kafka_url

from podium import codec, topics
from podium.bus import EventPublisher, KafkaBus, Subscriber
from podium.v1 import subtask_pb2, task_pb2

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def assignment(session: str, n: int, work: float) -> subtask_pb2.SubtaskAssigned:
    execution = f"{session}.run.{n}"
    return subtask_pb2.SubtaskAssigned(
        session_id=session,
        execution_id=execution,
        subtask_id=f"t{n}",
        kind="test",
        agent="qa",
        attempt=1,
        split_k=1,
        context=subtask_pb2.ExecutionContext(
            subtask=task_pb2.SubtaskSpec(id=f"t{n}", kind="test", work=work)
        ),
        sim_time=0.0,
        seed=1000 + n,
    )


async def results_of(reader: Subscriber, session: str, sink: dict[str, int]) -> None:
    """Count results of ``session`` by execution id (filtering other runs' history)."""
    for record in await reader.fetch(max_records=500, timeout_s=0.2):
        _, result = codec.decode_event(record.value, subtask_pb2.SubtaskResult)
        if result.session_id == session:
            sink[result.execution_id] = sink.get(result.execution_id, 0) + 1


async def test_sigterm_finishes_and_commits_the_batch_in_hand(
    kafka_bootstrap: str, kafka_config: Callable[..., Any], unique: Callable[[str], str]
) -> None:
    group = unique("subagent-sigterm")
    bus = KafkaBus(kafka_config(kafka_bootstrap))
    await bus.start()
    reader = bus.subscriber([topics.SUBTASK_RESULTS], unique("results-reader"))
    await reader.start()
    publisher = EventPublisher(bus, producer_name="test")
    url = kafka_url(
        kafka_bootstrap,
        auto_offset_reset="latest",
        heartbeat_interval_ms=250,
        session_timeout_ms=6000,
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")}
    environ.update(
        PYTHONPATH=str(ROOT),
        **bus_env(url),
        PODIUM_GROUP_ID=group,
        PODIUM_BATCH_MAX="4",
        PODIUM_SUBAGENT_TIME_SCALE="0.25",  # ~0.25 s of wall time per execution
        PODIUM_INSTANCE="sigterm-worker",
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "subagent_svc",
        env=environ,
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        # 1. Probe until the worker's group position is fixed (it starts at the latest offset).
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        seen_probe: dict[str, int] = {}
        for n in range(60):
            await publisher.publish(
                topics.SUBTASKS_ASSIGNED, assignment(probe, n, 0.01), key=f"p{n}"
            )
            await results_of(reader, probe, seen_probe)
            if seen_probe:
                break
            await asyncio.sleep(0.5)
        assert seen_probe, "the worker never processed a probe"
        for _ in range(10):  # drain results of probes still in flight
            await results_of(reader, probe, seen_probe)

        # 2. A blocker keeps the worker busy (~1 s) while the real work is published, so its
        #    next fetch takes a full batch of 4; SIGTERM once the first real result is out.
        await publisher.publish(topics.SUBTASKS_ASSIGNED, assignment(probe, 999, 4.0), key="b")
        await asyncio.sleep(0.3)
        session = f"sigterm-{uuid.uuid4().hex[:8]}"
        total = 12
        for n in range(total):
            await publisher.publish(
                topics.SUBTASKS_ASSIGNED, assignment(session, n, 1.0), key=f"{session}.{n}"
            )
        done: dict[str, int] = {}
        for _ in range(100):
            await results_of(reader, session, done)
            if done:
                break
        assert done, "no result before SIGTERM"
        proc.send_signal(signal.SIGTERM)
        at_signal = len(done)
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        log = stderr.decode()
        assert proc.returncode == 0, log
        assert "stop signal received" in log
        for _ in range(10):
            await results_of(reader, session, done)

        # The batch in hand was finished: whole batches of 4 only, each result exactly once,
        # and the worker did not run through the whole backlog after the signal.
        print(f"results at SIGTERM: {at_signal}, after: {len(done)} of {total}")
        assert all(count == 1 for count in done.values()), done
        assert len(done) % 4 == 0 and 4 <= len(done) < total

        # 3. The next member of the group gets exactly what was not processed.
        expected = {f"{session}.run.{n}" for n in range(total)} - set(done)
        second = KafkaBus(kafka_config(kafka_bootstrap))
        await second.start()
        member = second.subscriber([topics.SUBTASKS_ASSIGNED], group)
        await member.start()
        redelivered: list[str] = []
        for _ in range(40):
            for record in await member.fetch(max_records=500, timeout_s=0.25):
                _, a = codec.decode_event(record.value, subtask_pb2.SubtaskAssigned)
                if a.session_id == session:
                    redelivered.append(a.execution_id)
            if len(redelivered) >= len(expected):
                break
        await member.stop()
        await second.stop()
        assert sorted(redelivered) == sorted(expected)  # no loss, no redelivery, no duplicate
    finally:
        if proc.returncode is None:
            proc.kill()
            with contextlib.suppress(Exception):
                await proc.wait()
        await reader.stop()
        await bus.stop()
