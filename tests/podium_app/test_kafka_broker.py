"""Against a real Apache Kafka broker: crash safety, transactions, and third-party readability.

* The idempotent producer survives a broker ``kill -9`` and restart on the same log
  directory: every acknowledged event is consumed exactly once after event-id dedupe.
  This test runs its own broker (it kills it), so it only needs java and mvn, not
  ``$PODIUM_KAFKA_BOOTSTRAP``.
* aiokafka transactions work against the pinned broker version: committed records are
  visible to ``read_committed`` consumers, aborted ones are not, and consume-transform-produce
  commits the input offsets atomically with the output.
* What Podium writes is readable without Podium: Kafka's own console consumer (Java, the
  broker's release) reads it and ``protoc --decode`` turns a record value into a readable
  envelope (the commands documented in docs/kafka.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kafka_helpers import broker_config, client_kwargs, config_for, console_consumer

from podium import codec
from podium.bus import EventPublisher, KafkaBus, KafkaConfig, TopicSpec
from podium.errors import BusError
from podium.v1 import task_pb2
from podium_app.kafka_auth import Login
from podium_app.kafka_broker import KafkaBroker, metadata_brokers

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
Names = Callable[[str], str]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but `{name}` is not installed")
        pytest.skip(f"`{name}` is not installed")
    return path


async def _run(*cmd: str, stdin: bytes | None = None) -> bytes:
    """Run a command line tool from the repository root; its stdout, or fail with its stderr."""
    done = await asyncio.to_thread(
        subprocess.run, cmd, input=stdin, capture_output=True, timeout=60, check=False, cwd=ROOT
    )
    assert done.returncode == 0, f"{cmd[0]} failed: {done.stderr.decode(errors='replace')}"
    return done.stdout


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A private broker this test may kill; always torn down."""
    _tool("java")
    _tool("mvn")
    broker = KafkaBroker(tmp_path / "broker")
    try:
        broker.start()
        yield broker
    finally:
        broker.stop(timeout_s=15)


@pytest.fixture
async def kafka_bus(
    kafka_bootstrap: str, kafka_config: Callable[..., KafkaConfig]
) -> AsyncIterator[KafkaBus]:
    bus = KafkaBus(kafka_config(kafka_bootstrap))
    await bus.start()
    try:
        yield bus
    finally:
        await bus.stop()


@pytest.mark.slow
async def test_idempotent_producer_survives_kill9_and_restart(
    own_broker: KafkaBroker, unique: Names
) -> None:
    topic = unique("crash")
    total, workers = 400, 8
    bus = KafkaBus(broker_config(own_broker, request_timeout_ms=20_000))
    await bus.start()
    await bus.create_topics([TopicSpec(topic, partitions=3)])
    pub = EventPublisher(bus, producer_name="crash-test")
    acked: set[str] = set()
    acked_after_restart = 0
    republished = 0
    restarted = False
    next_id = iter(range(total))
    kill_now = asyncio.Event()

    async def produce() -> None:
        nonlocal republished, acked_after_restart
        for i in next_id:  # shared iterator: the workers keep several sends in flight
            event_id = f"evt-{i:05d}"
            while True:
                try:
                    # A stable event id: re-publishing after an error is the same logical event.
                    await pub.publish(
                        topic,
                        task_pb2.TaskSubmitted(session_id=f"s{i % 17}", seed=i),
                        key=f"s{i % 17}",
                        event_id=event_id,
                    )
                except BusError as exc:
                    assert exc.retriable, exc
                    republished += 1
                    await asyncio.sleep(0.2)
                    continue
                break
            acked.add(event_id)
            acked_after_restart += restarted
            if len(acked) >= total // 4:
                kill_now.set()

    async def crash() -> None:
        nonlocal restarted
        await kill_now.wait()
        await asyncio.to_thread(own_broker.kill9)
        assert own_broker.pid() is None
        await asyncio.sleep(1.0)
        await asyncio.to_thread(own_broker.start)  # same run_dir: same log dirs, same port
        restarted = True

    try:
        await asyncio.wait_for(asyncio.gather(crash(), *(produce() for _ in range(workers))), 240)
    finally:
        await bus.stop()
    assert len(acked) == total
    assert acked_after_restart > 0  # the crash really happened mid-stream

    # Consume everything from the restarted broker and dedupe by event id.
    consumer = AIOKafkaConsumer(
        topic,
        **broker_config(own_broker).client_kwargs(),
        group_id=unique("verify"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    raw: list[str] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while len(set(raw)) < total and loop.time() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                raw += [codec.decode_envelope(m.value).event_id for m in msgs]
    finally:
        await consumer.stop()
    deduped = set(raw)
    assert deduped == acked  # every acknowledged event, and nothing else
    # Duplicates can only come from our explicit re-publishes after an error, never from the
    # producer's internal retries: that is what idempotence guarantees.
    assert len(raw) - len(deduped) <= republished
    logging.getLogger(__name__).info(
        "kill -9: %d acked, %d after restart, %d re-published, %d raw duplicates",
        len(acked),
        acked_after_restart,
        republished,
        len(raw) - len(deduped),
    )


async def test_transactions_commit_and_abort(kafka_bootstrap: str, unique: Names) -> None:
    topic = unique("txn")
    producer = AIOKafkaProducer(
        **client_kwargs(kafka_bootstrap), transactional_id=unique("txn-id"), acks="all"
    )
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(3):
                await producer.send(topic, f"committed-{i}".encode(), key=b"k")
        await producer.begin_transaction()
        for i in range(2):
            await producer.send(topic, f"aborted-{i}".encode(), key=b"k")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"committed-3", key=b"k")
    finally:
        await producer.stop()

    async def read(isolation: str, want: int) -> list[bytes]:
        consumer = AIOKafkaConsumer(
            topic,
            **client_kwargs(kafka_bootstrap),
            group_id=unique("read"),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level=isolation,
        )
        await consumer.start()
        out: list[bytes] = []
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while len(out) < want and loop.time() < deadline:
                for msgs in (await consumer.getmany(timeout_ms=300)).values():
                    out += [m.value for m in msgs]
            # Wait a little longer: nothing else may show up.
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                out += [m.value for m in msgs]
        finally:
            await consumer.stop()
        return out

    committed = [b"committed-0", b"committed-1", b"committed-2", b"committed-3"]
    assert await read("read_committed", 4) == committed
    uncommitted = await read("read_uncommitted", 6)
    assert sorted(uncommitted) == sorted([*committed, b"aborted-0", b"aborted-1"])


async def test_consume_transform_produce_commits_offsets_in_the_transaction(
    kafka_bootstrap: str, unique: Names
) -> None:
    source, sink, group = unique("ctp-in"), unique("ctp-out"), unique("ctp")
    plain = AIOKafkaProducer(**client_kwargs(kafka_bootstrap), enable_idempotence=True)
    await plain.start()
    for i in range(5):
        await plain.send_and_wait(source, str(i).encode(), key=b"k", partition=0)
    await plain.stop()

    consumer = AIOKafkaConsumer(
        source,
        **client_kwargs(kafka_bootstrap),
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    producer = AIOKafkaProducer(**client_kwargs(kafka_bootstrap), transactional_id=unique("ctp"))
    await consumer.start()
    await producer.start()
    try:
        got: list[int] = []
        while len(got) < 5:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, msgs in batches.items():
                async with producer.transaction():
                    for m in msgs:
                        got.append(int(m.value))
                        await producer.send(sink, str(int(m.value) * 10).encode(), key=b"k")
                    await producer.send_offsets_to_transaction({tp: msgs[-1].offset + 1}, group)
        # The coordinator writes the commit markers just after EndTxn returns; until then the
        # transactional offset is pending and not visible, so poll briefly.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        committed = await consumer.committed(TopicPartition(source, 0))
        while committed != 5 and loop.time() < deadline:
            await asyncio.sleep(0.2)
            committed = await consumer.committed(TopicPartition(source, 0))
        assert committed == 5
    finally:
        await producer.stop()
        await consumer.stop()
    reader = AIOKafkaConsumer(
        sink,
        **client_kwargs(kafka_bootstrap),
        group_id=unique("check"),
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await reader.start()
    out: list[bytes] = []
    try:
        while len(out) < 5:
            for msgs in (await reader.getmany(timeout_ms=500)).values():
                out += [m.value for m in msgs]
    finally:
        await reader.stop()
    assert out == [b"0", b"10", b"20", b"30", b"40"]


async def test_the_console_consumer_and_protoc_read_what_podium_wrote(
    kafka_bus: KafkaBus, kafka_bootstrap: str, unique: Names, tmp_path: Path
) -> None:
    _tool("java")
    protoc = _tool("protoc")
    topic = unique("console")
    sent = await EventPublisher(kafka_bus, producer_name="console-test").publish(
        topic,
        task_pb2.TaskSubmitted(session_id="sess-42", submitted_by="alice", seed=9),
        key="sess-42",
    )
    # The commands of docs/kafka.md. Blocking tools run in a thread, off the event loop.
    read_one = f"--topic {topic} --from-beginning --max-messages 1 --timeout-ms 30000".split()
    printed = ("partition", "offset", "key")
    listing = await _run(
        *console_consumer(kafka_bootstrap, tmp_path, *read_one),
        *(arg for field in printed for arg in ("--formatter-property", f"print.{field}=true")),
        *("--formatter-property", "print.value=false"),
    )
    assert listing.decode().split() == [
        f"Partition:{sent.metadata.partition}",
        f"Offset:{sent.metadata.offset}",
        "sess-42",
    ]
    # The console consumer writes the value's bytes as they are, then a line separator.
    line = await _run(*console_consumer(kafka_bootstrap, tmp_path, *read_one))
    assert line.endswith(b"\n")
    value = line[:-1]
    assert value == sent.envelope.SerializeToString()
    protoc_cmd = [protoc, "--decode", "podium.v1.Envelope", "-I", "protos"]
    text = await _run(*protoc_cmd, "protos/podium/v1/envelope.proto", stdin=value)
    decoded = text.decode()
    assert f'event_id: "{sent.envelope.event_id}"' in decoded
    assert 'type: "podium.v1.TaskSubmitted"' in decoded
    assert 'producer: "console-test"' in decoded
    assert 'key: "sess-42"' in decoded


def test_readiness_probe_speaks_the_kafka_protocol(kafka_bootstrap: str) -> None:
    cfg = config_for(kafka_bootstrap)
    host, port = cfg.bootstrap_servers.rsplit(",", 1)[-1].rsplit(":", 1)
    login = None
    if cfg.security_protocol == "SASL_SSL":  # the secured broker: TLS, then a SCRAM login
        login = Login(Path(cfg.ssl_cafile), cfg.sasl_username, cfg.sasl_password)
    brokers = metadata_brokers(host, int(port), login=login)
    assert (host, int(port)) in {(h, p) for _, h, p in brokers}
