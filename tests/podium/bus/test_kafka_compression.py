"""Batches another producer compressed reach the bus decoded, on a real broker.

Kafka lets every producer pick its codec (franz-go and librdkafka clients often default to
snappy or lz4), and a consumer without that codec fails on the whole fetch: one outside
worker's compressed batch would stop a service. kcat (librdkafka) is the outside producer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka_helpers import config_for, kcat_args

from podium import codec
from podium.bus import KafkaBus, TopicSpec
from podium.v1 import subtask_pb2

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
async def test_a_compressed_batch_from_another_client_is_decoded(
    kafka_bootstrap: str, unique: Callable[[str], str], compression: str, tmp_path: Path
) -> None:
    topic, group = unique(f"codec-{compression}"), unique("g")
    bus = KafkaBus(config_for(kafka_bootstrap, client_id="podium-tests"))
    await bus.start()
    try:
        await bus.create_topics([TopicSpec(topic, partitions=1)])
        sent, files = [], []
        for i in range(20):
            env, data = codec.encode_event(
                subtask_pb2.SubtaskResult(session_id="s", execution_id=f"e{i}", output="x" * 50),
                producer="kcat",
                key="s",
            )
            sent.append(env.event_id)
            (path := tmp_path / f"{i:02d}.bin").write_bytes(data)  # one file, one message
            files.append(str(path))
        kcat = await asyncio.create_subprocess_exec(
            *["kcat", *kcat_args(kafka_bootstrap), "-P", "-t", topic, "-p", "0"],
            *["-z", compression, "-X", "linger.ms=100", *files],
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(kcat.communicate(), 60)
        assert kcat.returncode == 0, err.decode(errors="replace")
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
