"""Raw aiokafka's ceiling on this machine: how many events/s the client library itself carries.

``podium bench bus`` compares the bus layer with raw aiokafka used the way the bus uses it
(each send awaited until durable). This script asks the question behind issue 17's 50,000
events/s target: what is the most raw aiokafka moves through the broker here, with its fastest
API and every core busy. N producer processes publish the bench's own envelopes (a
``SubtaskResult`` encoded by ``podium/codec.py``, as ``podium bench bus`` does) for
``--duration-s`` into one topic, and one consumer process decodes them all; events/s = decoded /
(last decode − start). Modes:

* ``await`` — 1,000 tasks per producer, each awaiting its send until durable (the bus's way);
* ``batch`` — aiokafka's ``create_batch`` / ``send_batch``: one full batch per partition per
  round, no future per event (the cheapest path the client has).

Both use ``KafkaConfig.producer_kwargs`` / ``consumer_kwargs`` (idempotent, ``acks=all``, the
bus's linger and batch size; read_committed consumers with manual commits), so the broker does
what it does for the services. A fresh topic per run (``podium.bench.ceiling.<id>``)::

    python bench/bus_ceiling.py --bus "$PODIUM_KAFKA_BOOTSTRAP" --producers 2 --mode batch \\
        --duration-s 8 --json ceiling.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
import uuid
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from podium import codec
from podium.bus import KafkaConfig
from podium.bus.raw import RawConsumer
from podium_app.bench_bus import (
    PRODUCER,
    create_scratch_topic,
    delete_scratch_topic,
    event,
    session_key,
)

START_DELAY_S = 3.0
"""Producers start together this long after they are launched (imports and connections)."""
AWAITING_TASKS = 1000
"""Concurrent awaited sends per producer in ``await`` mode (``podium bench bus``'s in-flight)."""
KEYS = 256
"""Distinct session keys the events cycle through."""


def _envelope(i: int) -> bytes:
    """Event ``i`` as the codec writes it (encoded per event, as a service does)."""
    return codec.encode_event(event(i), producer=PRODUCER, key=session_key(i))[1]


async def _await_sends(producer: AIOKafkaProducer, topic: str, end: float) -> int:
    """Awaited sends from :data:`AWAITING_TASKS` tasks until ``end``; events sent."""
    keys = [session_key(i).encode() for i in range(KEYS)]
    sent = 0

    async def one_task() -> None:
        nonlocal sent
        while time.time() < end:
            i = sent
            sent += 1
            await producer.send_and_wait(topic, _envelope(i), key=keys[i % KEYS])

    await asyncio.gather(*(one_task() for _ in range(AWAITING_TASKS)))
    return sent


async def _batch_sends(producer: AIOKafkaProducer, topic: str, end: float) -> int:
    """Rounds of one full batch per partition until ``end``; events sent."""
    keys = [session_key(i).encode() for i in range(KEYS)]
    partitions = sorted(await producer.partitions_for(topic))
    sent = 0
    while time.time() < end:
        deliveries = []
        for partition in partitions:
            batch = producer.create_batch()
            while batch.append(key=keys[sent % KEYS], value=_envelope(sent), timestamp=None):
                sent += 1
            deliveries.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*deliveries)
    return sent


async def _produce(
    config: KafkaConfig, topic: str, mode: str, duration_s: float, start_at: float
) -> tuple[int, float]:
    producer = AIOKafkaProducer(**config.producer_kwargs())
    await producer.start()
    try:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        cpu0 = time.process_time()
        end = start_at + duration_s
        if mode == "await":
            sent = await _await_sends(producer, topic, end)
        else:
            sent = await _batch_sends(producer, topic, end)
        return sent, time.process_time() - cpu0
    finally:
        await producer.stop()


def _producer_main(
    url: str, topic: str, mode: str, duration_s: float, start_at: float, out: Queue[Any]
) -> None:
    out.put(asyncio.run(_produce(KafkaConfig.from_url(url), topic, mode, duration_s, start_at)))


async def _consume(
    config: KafkaConfig, topic: str, ready: Event, expected: Queue[int]
) -> tuple[int, float, float]:
    consumer = RawConsumer(config, topic, f"podium.bench.ceiling.{topic}")
    await consumer.start()
    ready.set()
    decoded, last, cpu0 = 0, 0.0, time.process_time()
    want: int | None = None
    try:
        while want is None or decoded < want:
            values = await consumer.fetch(2000, 0.2)
            for value in values:
                codec.decode_envelope(value)
            if values:
                decoded += len(values)
                last = time.time()
                await consumer.commit()
            if want is None and not expected.empty():
                want = expected.get()
    finally:
        await consumer.stop()
    return decoded, time.process_time() - cpu0, last


def _consumer_main(
    url: str, topic: str, ready: Event, expected: Queue[int], out: Queue[Any]
) -> None:
    out.put(asyncio.run(_consume(KafkaConfig.from_url(url), topic, ready, expected)))


def measure(
    url: str, producers: int, mode: str, duration_s: float, partitions: int
) -> dict[str, Any]:
    """One run: ``producers`` producer processes and one consumer process on a fresh topic."""
    topic = f"podium.bench.ceiling.{uuid.uuid4().hex[:8]}"
    config = KafkaConfig.from_url(url)
    asyncio.run(create_scratch_topic(config, topic, partitions))
    try:
        return _measure_on(url, topic, producers, mode, duration_s, partitions)
    finally:
        left = asyncio.run(delete_scratch_topic(config, topic))
        if left:
            print(f"bus_ceiling: {left}", file=sys.stderr)


def _measure_on(
    url: str, topic: str, producers: int, mode: str, duration_s: float, partitions: int
) -> dict[str, Any]:
    """:func:`measure` on its (existing) topic."""
    ctx = multiprocessing.get_context("spawn")
    ready, expected, consumed, produced = ctx.Event(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    load_before = os.getloadavg()[0]
    consumer = ctx.Process(target=_consumer_main, args=(url, topic, ready, expected, consumed))
    consumer.start()
    if not ready.wait(90):
        consumer.kill()
        raise SystemExit("bus_ceiling: the consumer did not join its group within 90 s")
    start_at = time.time() + START_DELAY_S
    workers = [
        ctx.Process(target=_producer_main, args=(url, topic, mode, duration_s, start_at, produced))
        for _ in range(producers)
    ]
    for w in workers:
        w.start()
    results = [produced.get() for _ in workers]
    sent = sum(r[0] for r in results)
    expected.put(sent)
    decoded, consumer_cpu, last = consumed.get()
    for p in [*workers, consumer]:
        p.join()
    return {
        "mode": mode,
        "producers": producers,
        "partitions": partitions,
        "duration_s": duration_s,
        "sent": sent,
        "events": decoded,
        "events_per_s": decoded / (last - start_at),
        "producer_cpu_us_per_event": sum(r[1] for r in results) / sent * 1e6,
        "consumer_cpu_us_per_event": consumer_cpu / decoded * 1e6,
        "load_average_before": load_before,
        "cores": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bus", default=os.environ.get("PODIUM_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--mode", choices=("await", "batch"), default="batch")
    parser.add_argument("--duration-s", type=float, default=8.0)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.bus:
        parser.error("--bus kafka://HOST:PORT (or PODIUM_KAFKA_BOOTSTRAP) is required")
    result = measure(args.bus, args.producers, args.mode, args.duration_s, args.partitions)
    print(
        f"{result['producers']} producer(s), {result['mode']}: {result['events']:,} events, "
        f"{result['events_per_s']:,.0f} events/s end to end; producer "
        f"{result['producer_cpu_us_per_event']:.1f} µs CPU/event, consumer "
        f"{result['consumer_cpu_us_per_event']:.1f} µs; load before {result['load_average_before']:.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
