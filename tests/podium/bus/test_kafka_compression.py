"""Batches another producer compressed reach the bus decoded, on a real broker.

Kafka lets every producer pick its codec (franz-go and librdkafka clients often default to
snappy or lz4), and a consumer without that codec fails on the whole fetch: one outside
worker's compressed batch would stop a service. librdkafka (``confluent_kafka``, the C client
most non-Java workers are built on) is the outside producer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import confluent_kafka
import pytest
from kafka_helpers import config_for, librdkafka_config

from podium import codec
from podium.bus import KafkaBus, TopicSpec
from podium.v1 import subtask_pb2

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
async def test_a_compressed_batch_from_another_client_is_decoded(
    kafka_bootstrap: str, unique: Callable[[str], str], compression: str
) -> None:
    topic, group = unique(f"codec-{compression}"), unique("g")
    bus = KafkaBus(config_for(kafka_bootstrap, client_id="podium-tests"))
    await bus.start()
    try:
        await bus.create_topics([TopicSpec(topic, partitions=1)])
        sent, values = [], []
        for i in range(20):
            env, data = codec.encode_event(
                subtask_pb2.SubtaskResult(session_id="s", execution_id=f"e{i}", output="x" * 50),
                producer="librdkafka",
                key="s",
            )
            sent.append(env.event_id)
            values.append(data)
        await asyncio.to_thread(_produce, kafka_bootstrap, topic, compression, values)
        sub = bus.subscriber([topic], group, client_id="podium-tests")
        await sub.start()
        try:
            got: list[str] = []
            deadline = asyncio.get_running_loop().time() + 30
            while len(got) < len(sent):
                assert asyncio.get_running_loop().time() < deadline, f"got {len(got)} of 20"
                for record in await sub.fetch(100, timeout_s=0.5):
                    env, result = codec.decode_event(record.value, subtask_pb2.SubtaskResult)
                    assert result.output == "x" * 50
                    got.append(env.event_id)
        finally:
            await sub.stop()
        assert got == sent
    finally:
        await bus.stop()


def _produce(base: str, topic: str, compression: str, values: list[bytes]) -> None:
    """Send ``values`` to partition 0 of ``topic`` from librdkafka, batched and compressed
    with ``compression`` (a linger long enough that the twenty records share batches)."""
    settings = {**librdkafka_config(base), "compression.codec": compression, "linger.ms": 100}
    producer = confluent_kafka.Producer(settings)
    failures: list[str] = []

    def on_delivery(err: confluent_kafka.KafkaError | None, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for value in values:
        producer.produce(topic, value=value, key=b"s", partition=0, on_delivery=on_delivery)
    left = producer.flush(60)
    assert left == 0, f"{left} records not delivered within 60 s"
    assert not failures, failures
