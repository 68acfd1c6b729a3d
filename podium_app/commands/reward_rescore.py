"""``podium reward rescore``: score a range of the trajectory topic again, into another topic.

Reads offsets ``[--from-offset, --to-offset)`` of each partition of ``--topic`` (read-only:
the originals are untouched), scores every trajectory with ``--reward-config`` (a new reward
version) and writes the ScoredTrajectory events to ``--out-topic`` inside Kafka transactions,
so a crashed re-score leaves no half-written chunk. Event ids are derived from the source
event id and the reward version, so re-running the same re-score is recognisably the same.
Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import uuid
from typing import TYPE_CHECKING, Any

from podium import topics
from podium.errors import ConfigError, PodiumError
from podium_app.commands import fail

if TYPE_CHECKING:
    from podium.bus.kafka import KafkaBus, KafkaTransactionalProducer
    from podium.rewards import RewardConfig
    from podium.rewards.events import Scored

CHUNK = 500
"""Records per transaction."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium reward rescore``."""
    parser.add_argument("--from-offset", type=int, required=True, help="first offset (inclusive)")
    parser.add_argument(
        "--to-offset", type=int, default=-1, help="end offset (exclusive); -1 = current end"
    )
    parser.add_argument("--reward-config", required=True, metavar="FILE", help="reward config YAML")
    parser.add_argument("--out-topic", required=True, help="topic for the re-scored trajectories")
    parser.add_argument("--topic", default=topics.TRAJECTORIES, help="trajectory topic to read")
    parser.add_argument(
        "--partition", type=int, action="append", help="partition to read (repeatable; default all)"
    )
    parser.add_argument("--bus", default="", help="kafka://HOST:PORT (default: $PODIUM_BUS)")
    parser.add_argument(
        "--progress",
        type=float,
        default=None,
        help="score at this training progress (default: from each trajectory's policy version)",
    )


def _validate(args: argparse.Namespace) -> str:
    from podium.bus import is_kafka_url  # lazy, like the rest of the bus: the CLI starts fast

    bus = args.bus or os.environ.get("PODIUM_BUS", "")
    if not is_kafka_url(bus):
        raise ConfigError(
            f"--bus: re-scoring reads Kafka history; give kafka://HOST:PORT or set PODIUM_BUS "
            f"(got {bus!r})"
        )
    if args.from_offset < 0:
        raise ConfigError(f"--from-offset: must be >= 0, got {args.from_offset}")
    if args.to_offset != -1 and args.to_offset < args.from_offset:
        raise ConfigError(
            f"--to-offset: {args.to_offset} is before --from-offset {args.from_offset}"
        )
    if args.out_topic in (args.topic, topics.TRAJECTORIES, topics.SCORED_TRAJECTORIES):
        raise ConfigError(
            f"--out-topic: {args.out_topic!r} would mix re-scores with live events; "
            "choose a topic of its own"
        )
    if args.progress is not None and args.progress < 0:
        raise ConfigError(f"--progress: must be >= 0, got {args.progress}")
    return bus


async def rescore(args: argparse.Namespace, bus_url: str) -> dict[str, Any]:
    """Do the re-score; returns the summary."""
    from podium.bus import KafkaBus, KafkaConfig, TopicSpec
    from podium.rewards import load_config

    reward = load_config(args.reward_config)
    kafka = KafkaConfig.from_url(bus_url)
    summary: dict[str, Any] = {
        "topic": args.topic,
        "out_topic": args.out_topic,
        "reward_version": reward.version,
        "read": 0,
        "scored": 0,
        "skipped": [],
    }
    bus = KafkaBus(kafka)
    await bus.start()
    try:
        chosen = await _chosen_partitions(bus, args)
        await bus.create_topics([TopicSpec(args.out_topic, kafka.default_partitions)])
        producer = bus.transactional_producer(f"podium-rescore-{uuid.uuid4().hex[:12]}")
        await producer.start()
        try:
            for partition in chosen:
                await _rescore_partition(bus, producer, args, reward, partition, summary)
        finally:
            await producer.stop()
    finally:
        await bus.stop()
    return summary


async def _chosen_partitions(bus: KafkaBus, args: argparse.Namespace) -> list[int]:
    """The partitions of ``--topic`` to read (``--partition``, default all), checked."""
    parts = await bus.partitions(args.topic)
    if not parts:
        raise ConfigError(f"--topic: {args.topic!r} does not exist")
    chosen: list[int] = parts if not args.partition else args.partition
    for p in chosen:
        if p not in parts:
            raise ConfigError(f"--partition: {args.topic} has no partition {p}")
    return chosen


async def _rescore_partition(
    bus: KafkaBus,
    producer: KafkaTransactionalProducer,
    args: argparse.Namespace,
    reward: RewardConfig,
    partition: int,
    summary: dict[str, Any],
) -> None:
    """Score ``[--from-offset, --to-offset)`` of one partition, in transactions of CHUNK."""
    from podium.rewards.events import score_record

    stop = None if args.to_offset == -1 else args.to_offset
    pending: list[Scored] = []
    async for chunk in bus.read_range(
        args.topic, partition, args.from_offset, stop, max_records=CHUNK
    ):
        for record in chunk:
            summary["read"] += 1
            try:
                out = score_record(
                    record.value,
                    reward,
                    producer="podium reward rescore",
                    fixed_progress=args.progress,
                )
            except PodiumError as exc:
                summary["skipped"].append(
                    {"partition": partition, "offset": record.offset, "error": str(exc)}
                )
                continue
            pending.append(out)
            if len(pending) >= CHUNK:
                await _flush(producer, args.out_topic, pending, summary)
    await _flush(producer, args.out_topic, pending, summary)


async def _flush(
    producer: KafkaTransactionalProducer,
    topic: str,
    pending: list[Scored],
    summary: dict[str, Any],
) -> None:
    """Write ``pending`` to ``topic`` in one transaction (all or nothing), then clear it."""
    from podium.bus.consumer import EVENT_ID_HEADER

    if not pending:
        return
    await producer.begin()
    try:
        for out in pending:
            await producer.publish(
                topic, out.value, key=out.key, headers=((EVENT_ID_HEADER, out.event_id.encode()),)
            )
        await producer.commit()
    except BaseException:
        with contextlib.suppress(PodiumError):
            await producer.abort()
        raise
    summary["scored"] += len(pending)
    pending.clear()


def run(args: argparse.Namespace) -> int:
    """Validate the arguments, re-score, print the summary; 2 on bad input, 1 on bus failure."""
    try:
        bus_url = _validate(args)
        summary = asyncio.run(rescore(args, bus_url))
    except PodiumError as exc:
        return fail("podium reward rescore", exc)
    print(json.dumps(summary, indent=2))
    return 0
