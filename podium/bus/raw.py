"""aiokafka with none of the bus layer around it: the peer ``podium bench bus`` measures
:class:`~podium.bus.KafkaBus` against.

The figure of the raw client only means something beside the bus's if both move the same
bytes with the same settings, so these clients are built from the same
:meth:`KafkaConfig.producer_kwargs` / :meth:`KafkaConfig.consumer_kwargs` as
:class:`~podium.bus.KafkaBus` and :class:`~podium.bus.kafka.KafkaSubscriber` (idempotent,
``acks=all``, the same linger, batch size and compression; manual commits, read_committed)
and are used the same way: a send returns once the record is durable, and a batch is
committed after it was processed. What is missing is exactly the bus layer: trace spans and
context, envelope headers, de-duplication, the dead-letter path, :class:`~podium.bus.Record`.
It lives here because aiokafka is spoken only under ``podium/bus``; nothing but the benchmark
uses it.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from podium.bus.kafka import KafkaConfig, bus_error, connect_error
from podium.errors import BusError


class RawProducer:
    """aiokafka's producer with :class:`~podium.bus.KafkaBus`'s producer settings."""

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect (the caller creates the topics)."""
        producer = AIOKafkaProducer(**self.config.producer_kwargs())
        try:
            await producer.start()
        except (KafkaError, OSError) as exc:
            await producer.stop()
            raise await connect_error(self.config, exc) from exc
        self._producer = producer

    async def stop(self) -> None:
        """Flush and disconnect."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def send(self, topic: str, value: bytes, key: bytes) -> None:
        """Append one record; returns once it is durable (as ``KafkaBus.publish`` does)."""
        if self._producer is None:
            raise BusError("raw producer is not started", retriable=False)
        try:
            await self._producer.send_and_wait(topic, value, key=key)
        except KafkaError as exc:
            raise bus_error(f"publish to {topic}", exc) from exc


class RawConsumer:
    """aiokafka's consumer, one member of ``group_id`` on ``topic``, with
    :class:`~podium.bus.kafka.KafkaSubscriber`'s consumer settings."""

    def __init__(self, config: KafkaConfig, topic: str, group_id: str) -> None:
        self.config = config
        self.topic = topic
        self.group_id = group_id
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Join the group; returns once partitions are assigned (or a ``BusError`` after
        ``join_timeout_s``)."""
        consumer = AIOKafkaConsumer(**self.config.consumer_kwargs(self.group_id))
        consumer.subscribe([self.topic])
        try:
            await consumer.start()
            await asyncio.wait_for(self._assigned(consumer), self.config.join_timeout_s)
        except (KafkaError, OSError, TimeoutError) as exc:
            await consumer.stop()
            raise bus_error(f"raw consumer start for group {self.group_id}", exc) from exc
        self._consumer = consumer

    @staticmethod
    async def _assigned(consumer: AIOKafkaConsumer) -> None:
        # The group is joined by the fetch loop; the topic is empty, so nothing is consumed.
        while not consumer.assignment():
            await consumer.getmany(timeout_ms=100)

    async def stop(self) -> None:
        """Leave the group (nothing further is committed)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    def _require(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise BusError("raw consumer is not started", retriable=False)
        return self._consumer

    async def fetch(self, max_records: int, timeout_s: float) -> list[bytes]:
        """Values of the next records (at most ``max_records``); may be empty."""
        consumer = self._require()
        try:
            batches = await consumer.getmany(
                timeout_ms=int(timeout_s * 1000), max_records=max_records
            )
        except KafkaError as exc:
            raise bus_error(f"fetch for group {self.group_id}", exc) from exc
        return [m.value or b"" for msgs in batches.values() for m in msgs]

    async def commit(self) -> None:
        """Commit everything fetched so far."""
        try:
            await self._require().commit()
        except KafkaError as exc:
            raise bus_error(f"commit for group {self.group_id}", exc) from exc
