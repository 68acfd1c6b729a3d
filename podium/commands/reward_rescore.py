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
import json
import os
import sys
import uuid
from typing import Any

from podium import topics
from podium.errors import ConfigError, PodiumError

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
    bus = args.bus or os.environ.get("PODIUM_BUS", "")
    if not bus.startswith("kafka://"):
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
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    from podium.bus import KafkaBus, KafkaConfig, TopicSpec
    from podium.bus.consumer import EVENT_ID_HEADER
    from podium.rewards import load_config
    from podium.rewards.events import score_record

    reward = load_config(args.reward_config)
    kafka = KafkaConfig.from_url(bus_url)
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        described = await admin.describe_topics([args.topic])
    finally:
        await admin.close()
    parts = {p["partition"] for d in described if d.get("error_code") == 0 for p in d["partitions"]}
    if not parts:
        raise ConfigError(f"--topic: {args.topic!r} does not exist")
    chosen = sorted(parts) if not args.partition else args.partition
    for p in chosen:
        if p not in parts:
            raise ConfigError(f"--partition: {args.topic} has no partition {p}")
    bus = KafkaBus(kafka)
    await bus.start()
    try:
        await bus.create_topics([TopicSpec(args.out_topic, kafka.default_partitions)])
    finally:
        await bus.stop()
    consumer = AIOKafkaConsumer(
        **kafka.client_kwargs(), isolation_level="read_committed", enable_auto_commit=False
    )
    producer = AIOKafkaProducer(
        **kafka.client_kwargs(),
        transactional_id=f"podium-rescore-{uuid.uuid4().hex[:12]}",
        enable_idempotence=True,
        acks="all",
    )
    summary: dict[str, Any] = {
        "topic": args.topic,
        "out_topic": args.out_topic,
        "reward_version": reward.version,
        "read": 0,
        "scored": 0,
        "skipped": [],
    }
    await consumer.start()
    await producer.start()
    try:
        tps = [TopicPartition(args.topic, p) for p in chosen]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        pending: list[tuple[str, bytes, str]] = []

        async def flush() -> None:
            if not pending:
                return
            async with producer.transaction():
                for key, value, event_id in pending:
                    await producer.send(
                        args.out_topic,
                        value=value,
                        key=key.encode(),
                        headers=[(EVENT_ID_HEADER, event_id.encode())],
                    )
            summary["scored"] += len(pending)
            pending.clear()

        for tp in tps:
            stop = ends[tp] if args.to_offset == -1 else min(args.to_offset, ends[tp])
            if args.from_offset >= stop:
                continue
            consumer.seek(tp, args.from_offset)
            while await consumer.position(tp) < stop:
                batch = await consumer.getmany(tp, timeout_ms=1000, max_records=CHUNK)
                for record in batch.get(tp, []):
                    if record.offset >= stop:
                        break
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
                            {"partition": tp.partition, "offset": record.offset, "error": str(exc)}
                        )
                        continue
                    pending.append((out.key, out.value, out.event_id))
                    if len(pending) >= CHUNK:
                        await flush()
        await flush()
    finally:
        await producer.stop()
        await consumer.stop()
    return summary


def run(args: argparse.Namespace) -> int:
    """Validate the arguments, re-score, print the summary; 2 on bad input, 1 on bus failure."""
    try:
        bus_url = _validate(args)
        summary = asyncio.run(rescore(args, bus_url))
    except ConfigError as exc:
        print(f"podium reward rescore: {exc}", file=sys.stderr)
        return 2
    except PodiumError as exc:
        print(f"podium reward rescore: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0
