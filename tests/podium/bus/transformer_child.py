"""A :class:`~podium.bus.Transformer` in a process of its own, for the fault tests
(``test_exactly_once_faults.py``), which pause (SIGSTOP) or kill (SIGKILL) it mid-transaction.

``python transformer_child.py '<json settings>'`` processes ONE batch of the input topic with
:class:`Copier`, whose second call prints ``OPEN`` and then holds the transaction (with an
output in it) open for ``hold_s`` seconds; it then prints ``RESULT <json>`` (committed transactions, dropped batches,
fenced) and exits 0. The test does its damage while the transaction is open.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from podium import codec
from podium.bus import KafkaBus, KafkaConfig, Output, Record, TransactionFencedError, Transformer
from podium.v1 import envelope_pb2, task_pb2


class Copier:
    """Each TaskSubmitted in, the same TaskSubmitted out (event id derived from the input's);
    the second call (the first output is in the transaction by then) announces ``OPEN`` on
    stdout and waits ``hold_s``."""

    def __init__(self, out_topic: str, hold_s: float = 0.0) -> None:
        self.out_topic = out_topic
        self.hold_s = hold_s
        self.calls = 0

    async def __call__(self, env: envelope_pb2.Envelope, record: Record) -> Sequence[Output]:
        msg = codec.unpack_as(env, task_pb2.TaskSubmitted)
        self.calls += 1
        if self.calls == 2 and self.hold_s:
            # The first output is in the open transaction: give it time to reach the broker.
            await asyncio.sleep(0.5)
            print("OPEN", flush=True)
            await asyncio.sleep(self.hold_s)
        return [Output(self.out_topic, msg, key=msg.session_id, event_id=f"out-{env.event_id}")]


def copier_transformer(
    bus: KafkaBus, settings: dict[str, Any], copier: Copier, **overrides: Any
) -> Transformer:
    """The transformer both the child and the test's own member run (same group, prefix)."""
    options: dict[str, Any] = {
        "transactional_id_prefix": settings["prefix"],
        "producer_name": "eos-test",
        "output_topics": [settings["out_topic"]],
        "max_batch": 500,
        "poll_timeout_s": 0.2,
        "partitions": 1,
        "create_topics": False,
        "retry_backoff_s": 0.05,
        "retry_backoff_max_s": 0.5,
    }
    options.update(overrides)
    return Transformer(bus, [settings["in_topic"]], settings["group"], copier, **options)


async def main(settings: dict[str, Any]) -> None:
    bus = KafkaBus(KafkaConfig.from_url(settings["url"]))
    await bus.start()
    t = copier_transformer(bus, settings, Copier(settings["out_topic"], settings["hold_s"]))
    fenced = False
    try:
        await t.start()
        while t.stats.fetched == 0:
            try:
                await t.run_once()
            except TransactionFencedError:
                fenced = True
                break
        print("RESULT " + json.dumps({**vars(t.stats), "fenced": fenced}), flush=True)
    finally:
        await t.stop()
        await bus.stop()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
