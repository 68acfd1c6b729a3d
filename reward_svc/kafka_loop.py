"""Exactly-once consume-transform-produce on Kafka, with aiokafka transactions.

One loop iteration is one Kafka transaction:

1. ``getmany`` a batch of trajectory records (``isolation_level='read_committed'``: only
   trajectories whose producer committed are scored; auto-commit off);
2. ``begin_transaction``; score each record and ``send`` the ScoredTrajectory to the output
   topic, or the untouched record to the dead-letter topic when it is poison;
3. ``send_offsets_to_transaction`` the next offsets of the batch for our consumer group;
4. ``commit_transaction``: the outputs and the input offsets become visible atomically.

If the process dies anywhere before step 4 completes, nothing of the batch is visible to
read_committed readers and the offsets are not advanced; the restarted service (same
``transactional_id``) fences the dead one — the broker aborts its open transaction — and
scores the batch again. So every trajectory yields exactly one committed scored record.

If a transaction fails while the process lives (a broker error), it is aborted and the
consumer is rewound to the batch start, so the batch is retried, never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    IllegalOperation,
    KafkaError,
    ProducerFenced,
    TopicAlreadyExistsError,
)

from podium import topics
from podium.bus.consumer import (
    EVENT_ID_HEADER,
    EVENT_TYPE_HEADER,
    dead_letter_headers,
    is_retriable,
)
from podium.bus.kafka import KafkaConfig
from podium.errors import BusError, PodiumError
from podium.rewards import RewardConfig
from podium.rewards.events import score_record
from reward_svc.config import ServiceConfig

_log = logging.getLogger("reward_svc")


@dataclass
class LoopStats:
    """What the loop did, for logs and tests."""

    transactions: int = 0
    """Committed transactions."""
    aborted: int = 0
    """Transactions aborted and retried."""
    scored: int = 0
    """Scored trajectories committed."""
    dead_lettered: int = 0
    """Poison records committed to the dead-letter topic."""
    penalties_fired: dict[str, int] = field(default_factory=dict)
    """How often each detector charged a penalty."""


async def ensure_topics(kafka: KafkaConfig, names: Sequence[str], partitions: int) -> None:
    """Create the topics the service reads and writes if they do not exist yet."""
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [n for n in names if n not in existing]
        if missing:
            # Another replica may create them first; that is fine.
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [NewTopic(n, partitions, kafka.replication_factor) for n in missing]
                )
    finally:
        await admin.close()


def _retrieve(delivery: asyncio.Future[Any]) -> None:
    """Mark a send's failure as seen. Inside a transaction a failed send also fails the commit
    (or took the producer out of the transaction), which is where it is handled; without this,
    asyncio would log each one as a "Future exception was never retrieved" traceback."""
    if not delivery.cancelled():
        delivery.exception()


def fatal_transaction_error(producer: AIOKafkaProducer) -> BaseException | None:
    """The error that put ``producer``'s transaction in aiokafka's fatal state, else None.

    aiokafka has no public accessor for it: its transaction manager keeps the state and the
    error (on the future ``commit_transaction`` would await). Reading it here also marks that
    future's exception as retrieved, so asyncio does not log it as lost.
    """
    txn = getattr(producer, "_txn_manager", None)
    if txn is None or not txn.is_fatal_error():
        return None
    waiter = txn.wait_for_transaction_end()
    cause = waiter.exception() if waiter.done() else None
    return cause if cause is not None else BusError("transactional producer in a fatal state")


class KafkaRewardService:
    """The exactly-once reward loop. ``await run()``; ``request_stop()`` ends it gracefully."""

    def __init__(
        self, config: ServiceConfig, reward: RewardConfig, *, create_topics: bool = True
    ) -> None:
        self.config = config
        self.reward = reward
        self.kafka = KafkaConfig.from_url(config.bus_url)
        self.create_topics = create_topics
        """Whether :meth:`run` creates its topics (False when the caller already did, e.g.
        :class:`reward_svc.app.RewardApp` through its bus)."""
        self.stats = LoopStats()
        self.ready = asyncio.Event()
        """Set once the transactional producer and the consumer are started."""
        self.fenced = False
        """Whether the loop stopped because a newer instance took over the transactional id."""
        self._stop = asyncio.Event()

    def request_stop(self) -> None:
        """Finish the transaction in hand, then stop (called from the SIGTERM handler)."""
        self._stop.set()

    async def run(self) -> None:
        """Consume, score and produce until :meth:`request_stop`."""
        cfg = self.config
        dlq = topics.dead_letter(cfg.in_topic)
        if self.create_topics:
            await ensure_topics(self.kafka, [cfg.in_topic, cfg.out_topic, dlq], cfg.partitions)
        common = self.kafka.client_kwargs()
        consumer = AIOKafkaConsumer(
            cfg.in_topic,
            **common,
            group_id=cfg.group_id,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            session_timeout_ms=self.kafka.session_timeout_ms,
            heartbeat_interval_ms=self.kafka.heartbeat_interval_ms,
        )
        producer = AIOKafkaProducer(
            **common,
            transactional_id=cfg.transactional_id,
            enable_idempotence=True,
            acks="all",
            linger_ms=self.kafka.linger_ms,
        )
        # Starting the transactional producer runs InitProducerId: the broker bumps the epoch of
        # this transactional id, aborting whatever transaction a killed predecessor left open.
        await producer.start()
        try:
            await consumer.start()
            try:
                _log.info(
                    "reward_svc: consuming %s as %s (transactional id %s), reward %s",
                    cfg.in_topic,
                    cfg.group_id,
                    cfg.transactional_id,
                    self.reward.version,
                )
                self.ready.set()
                while not self._stop.is_set():
                    batch = await consumer.getmany(
                        timeout_ms=cfg.poll_timeout_ms, max_records=cfg.max_batch
                    )
                    if batch:
                        await self._process(consumer, producer, batch, dlq)
            finally:
                await consumer.stop()
        finally:
            await producer.stop()
        _log.info("reward_svc: stopped (%s)", self.stats)

    def _fence(self, producer: AIOKafkaProducer) -> None:
        """Another instance took over our transactional id: we must not write again."""
        fatal_transaction_error(producer)  # seen here: asyncio need not report it as lost
        _log.error("reward_svc: fenced by a newer instance; stopping")
        self.fenced = True
        self._stop.set()

    async def _abort_and_rewind(
        self,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        batch: dict[TopicPartition, list[Any]],
        exc: BaseException,
    ) -> None:
        """Abort the open transaction and seek back to the batch start: retried, never skipped."""
        _log.warning("reward_svc: transaction aborted, batch will be retried: %s", exc)
        self.stats.aborted += 1
        try:
            await producer.abort_transaction()
        except KafkaError as abort_exc:  # pragma: no cover - broker gone as well
            raise BusError(f"abort failed: {abort_exc}", retriable=True) from abort_exc
        for tp, records in batch.items():
            consumer.seek(tp, records[0].offset)
        await asyncio.sleep(0.5)

    async def _process(
        self,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        batch: dict[TopicPartition, list[Any]],
        dlq: str,
    ) -> None:
        """One batch, one transaction; on a broker error abort and rewind, never skip."""
        cfg = self.config
        scored = dead = 0
        fired: list[str] = []
        try:
            await producer.begin_transaction()
            for records in batch.values():
                for record in records:
                    if cfg.record_delay_ms:
                        await asyncio.sleep(cfg.record_delay_ms / 1000)
                    try:
                        out = score_record(
                            record.value,
                            self.reward,
                            producer=cfg.producer_name,
                            fixed_progress=cfg.fixed_progress,
                        )
                    except Exception as exc:
                        # Bad bytes, an unscorable trajectory, or a scoring bug on this one
                        # record: retrying cannot help, so it goes to the dead-letter topic.
                        if is_retriable(exc):
                            raise
                        _log.warning(
                            "reward_svc: dead-lettering %s[%d]@%d: %s",
                            record.topic,
                            record.partition,
                            record.offset,
                            exc,
                        )
                        sent = await producer.send(
                            dlq,
                            value=record.value,
                            key=record.key,
                            headers=[
                                *(record.headers or ()),
                                *dead_letter_headers(
                                    record.topic,
                                    record.partition,
                                    record.offset,
                                    exc,
                                    group_id=cfg.group_id,
                                    producer=cfg.producer_name,
                                ),
                            ],
                        )
                        sent.add_done_callback(_retrieve)
                        dead += 1
                        continue
                    sent = await producer.send(
                        cfg.out_topic,
                        value=out.value,
                        key=out.key.encode(),
                        headers=[
                            (EVENT_ID_HEADER, out.event_id.encode()),
                            (EVENT_TYPE_HEADER, b"podium.v1.ScoredTrajectory"),
                        ],
                    )
                    sent.add_done_callback(_retrieve)
                    scored += 1
                    fired += [f.name for f in out.breakdown.findings if f.triggered]
            offsets = {tp: records[-1].offset + 1 for tp, records in batch.items()}
            await producer.send_offsets_to_transaction(offsets, cfg.group_id)
            await producer.commit_transaction()
        except ProducerFenced:
            self._fence(producer)
            return
        except IllegalOperation as exc:
            # aiokafka's sender failed in the background (e.g. AddPartitionsToTxn answered
            # ProducerFenced) and took the producer out of its transaction; the next send then
            # only says "not in transaction". The recorded cause decides what to do.
            cause = fatal_transaction_error(producer)
            if isinstance(cause, ProducerFenced):
                self._fence(producer)
                return
            if cause is not None:
                raise BusError(
                    f"transactional producer failed: {type(cause).__name__}: {cause}",
                    retriable=False,
                ) from cause
            await self._abort_and_rewind(consumer, producer, batch, exc)
            return
        except (KafkaError, PodiumError, OSError) as exc:
            await self._abort_and_rewind(consumer, producer, batch, exc)
            return
        self.stats.transactions += 1
        self.stats.scored += scored
        self.stats.dead_lettered += dead
        for name in fired:
            self.stats.penalties_fired[name] = self.stats.penalties_fired.get(name, 0) + 1
        _log.info(
            "reward_svc: committed %d scored, %d dead-lettered (total %d/%d)",
            scored,
            dead,
            self.stats.scored,
            self.stats.dead_lettered,
        )
