"""The producer's batching settings, written once for the bus and its raw peer, and the topic
a burst of first publishes creates once (the measured fixes of ``podium bench bus``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kafka_helpers import kafka_test_config

from podium.bus import KafkaBus, KafkaConfig
from podium.bus.kafka import BROKER_MESSAGE_BYTES, SASL_PASSWORD_ENV
from podium.bus.raw import RawConsumer, RawProducer
from podium.errors import ConfigError


def test_batch_bound_is_a_setting_with_a_default_that_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SASL_PASSWORD_ENV, raising=False)
    default = KafkaConfig("h:1").producer_kwargs()
    assert default["max_batch_size"] == 262_144  # not aiokafka's 16 KiB
    assert (default["acks"], default["enable_idempotence"], default["linger_ms"]) == (
        "all",
        True,
        5,
    )
    tuned = KafkaConfig.from_url("kafka://h:1?max_batch_bytes=65536&linger_ms=2")
    assert tuned.producer_kwargs()["max_batch_size"] == 65536
    assert tuned.producer_kwargs()["linger_ms"] == 2
    for bad in (0, BROKER_MESSAGE_BYTES + 1):
        with pytest.raises(ConfigError, match=f"max_batch_bytes must be in .* got {bad}"):
            KafkaConfig("h:1", max_batch_bytes=bad)


def test_consumer_settings_are_the_subscribers() -> None:
    config = KafkaConfig("h:1", isolation_level="read_uncommitted", session_timeout_ms=7000)
    kwargs = config.consumer_kwargs("g")
    assert kwargs["group_id"] == "g" and kwargs["enable_auto_commit"] is False
    assert kwargs["isolation_level"] == "read_uncommitted"
    assert kwargs["session_timeout_ms"] == 7000
    assert kwargs["auto_offset_reset"] == "earliest"


@pytest.mark.kafka
async def test_a_burst_of_first_publishes_creates_the_topic_once(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    bus = KafkaBus(kafka_test_config(kafka_bootstrap))
    await bus.start()
    calls: list[list[str]] = []
    admin = bus._admin
    assert admin is not None
    create = admin.create_topics

    async def counted(new: list[Any], *args: Any, **kwargs: Any) -> Any:
        calls.append([t.name for t in new])
        return await create(new, *args, **kwargs)

    admin.create_topics = counted  # type: ignore[method-assign]
    topic = unique("burst")
    try:
        landed = await asyncio.gather(
            *(bus.publish(topic, str(i).encode(), key=f"k{i % 7}") for i in range(200))
        )
    finally:
        await bus.stop()
    assert calls == [[topic]]  # before the fix: one CreateTopics per waiting publish
    assert len({(m.partition, m.offset) for m in landed}) == 200


@pytest.mark.kafka
async def test_the_raw_peer_moves_records_with_the_bus_settings(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    config = kafka_test_config(kafka_bootstrap)
    topic, group = unique("raw"), unique("g")
    bus = KafkaBus(config)
    await bus.start()
    try:
        await bus.ensure_topics([topic])
    finally:
        await bus.stop()
    consumer = RawConsumer(config, topic, group)
    await consumer.start()
    producer = RawProducer(config)
    await producer.start()
    try:
        await asyncio.gather(*(producer.send(topic, b"v%d" % i, b"k") for i in range(20)))
        got: list[bytes] = []
        for _ in range(50):
            got += await consumer.fetch(100, 0.2)
            if len(got) >= 20:
                break
        await consumer.commit()
    finally:
        await producer.stop()
        await consumer.stop()
    assert sorted(got) == sorted(b"v%d" % i for i in range(20))
