"""``podium kafka tail``: records as JSON lines, decoded by the codec; against the real broker."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Callable
from typing import Any

import pytest

from podium import codec, topics
from podium.bus import KafkaBus, Record, TopicSpec
from podium.errors import ConfigError
from podium.v1 import orchestrator_pb2, reward_pb2
from podium_app import cli
from podium_app.kafka_tail import Tail, TailOptions, bus_url, record_json


def _feedback(session: str, rating: float) -> bytes:
    _, data = codec.encode_event(
        reward_pb2.Feedback(session_id=session, rating=rating), producer="test", key=session
    )
    return data


# -- one record, one line (no broker) ----------------------------------------------------------


def test_an_event_becomes_envelope_and_payload() -> None:
    record = Record(
        topic=topics.FEEDBACK,
        partition=1,
        offset=7,
        key=b"s-1",
        value=_feedback("s-1", 0.5),
        headers=(("traceparent", b"00-abc"), ("bin", b"\xff\x00")),
        timestamp_ms=1_700_000_000_123,
    )
    line = json.loads(json.dumps(record_json(record)))  # JSON-ready as it is
    assert line["topic"] == topics.FEEDBACK and (line["partition"], line["offset"]) == (1, 7)
    assert line["timestamp"] == "2023-11-14T22:13:20.123+00:00"
    assert line["timestamp_ms"] == 1_700_000_000_123
    assert line["key"] == "s-1"
    assert line["headers"] == [
        {"key": "traceparent", "value": "00-abc"},
        {"key": "bin", "value_base64": base64.b64encode(b"\xff\x00").decode()},
    ]
    assert line["payload_type"] == "podium.v1.Feedback"
    assert line["payload"] == {"session_id": "s-1", "rating": 0.5}
    envelope = line["envelope"]
    assert envelope["type"] == "podium.v1.Feedback" and envelope["producer"] == "test"
    assert "payload" not in envelope and envelope["event_id"]


def test_the_session_ledger_is_raw_session_done() -> None:
    done = orchestrator_pb2.SessionDone(session_id="s-2")
    record = Record(topics.ORCHESTRATOR_SESSIONS, 0, 0, b"s-2", done.SerializeToString())
    line = record_json(record)
    assert line["payload_type"] == "podium.v1.SessionDone"
    assert line["payload"]["session_id"] == "s-2"
    assert "envelope" not in line


def test_tombstones_poison_and_binary_keys() -> None:
    tombstone = record_json(Record(topics.ROLLOUT, 0, 3, b"state", None))
    assert tombstone["value"] is None and "error" not in tombstone
    poison = record_json(Record(topics.dead_letter(topics.TRAJECTORIES), 0, 0, b"\x80", b"junk"))
    assert "not a podium.v1.Envelope" in poison["error"]
    assert base64.b64decode(poison["value_base64"]) == b"junk"
    assert poison["key_base64"] == base64.b64encode(b"\x80").decode() and "key" not in poison
    assert record_json(Record(topics.FEEDBACK, 0, 0, None, None))["key"] is None


def test_bus_url_is_read_like_the_services() -> None:
    env = {"PODIUM_BUS": "kafka://a:1", "PODIUM_KAFKA_BOOTSTRAP": "kafka://b:2"}
    assert bus_url("", env) == "kafka://a:1"
    assert bus_url("", {"PODIUM_KAFKA_BOOTSTRAP": "kafka://b:2"}) == "kafka://b:2"
    assert bus_url("kafka://c:3", env) == "kafka://c:3"
    with pytest.raises(ConfigError, match="PODIUM_BUS or PODIUM_KAFKA_BOOTSTRAP"):
        bus_url("", {})
    with pytest.raises(ConfigError, match="must be kafka://"):
        bus_url("inproc://", {})


def test_bad_arguments_exit_2_naming_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PODIUM_BUS", raising=False)
    monkeypatch.delenv("PODIUM_KAFKA_BOOTSTRAP", raising=False)
    assert cli.main(["kafka", "tail", "t"]) == 2
    assert "no broker" in capsys.readouterr().err
    assert cli.main(["kafka", "tail", "t", "--bus", "kafka://h:1", "--max", "-1"]) == 2
    assert "--max must be >= 0, got -1" in capsys.readouterr().err


# -- the real broker ---------------------------------------------------------------------------


async def _fill(config: Any, topic: str) -> list[str]:
    """A 2-partition topic with five events (in a known order) and a poison record."""
    bus = KafkaBus(config)
    await bus.start()
    try:
        await bus.create_topics([TopicSpec(topic, partitions=2)])
        sessions = [f"s{i}" for i in range(5)]
        for i, session in enumerate(sessions):
            await bus.publish(
                topic, _feedback(session, i / 10), key=session, headers=(("n", b"%d" % i),)
            )
            await asyncio.sleep(0.005)  # distinct timestamps: the merge order is the test's
        await bus.publish(topic, b"\x00poison", key="bad")
        return sessions
    finally:
        await bus.stop()


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.kafka
def test_tail_reads_a_topic_as_json_lines(
    kafka_bootstrap: str,
    kafka_config: Callable[..., Any],
    unique: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = unique("tail")
    sessions = asyncio.run(_fill(kafka_config(kafka_bootstrap), topic))
    base = ["kafka", "tail", topic, "--bus", kafka_bootstrap]

    assert cli.main([*base, "--from-beginning"]) == 0
    every = _lines(capsys.readouterr().out)
    assert len(every) == 6
    # Both partitions, merged in publication (timestamp) order.
    assert {line["partition"] for line in every} == {0, 1}
    assert [line["payload"]["session_id"] for line in every[:5]] == sessions
    assert [line["headers"] for line in every[:5]] == [
        [{"key": "n", "value": str(i)}] for i in range(5)
    ]
    assert all(line["key"] == line["payload"]["session_id"] for line in every[:5])
    assert every[5]["key"] == "bad" and "error" in every[5]

    assert cli.main([*base, "--from-beginning", "--max", "2"]) == 0
    assert [line["payload"]["session_id"] for line in _lines(capsys.readouterr().out)] == sessions[
        :2
    ]

    assert cli.main([*base, "--last", "3"]) == 0  # the newest three, oldest first
    newest = _lines(capsys.readouterr().out)
    assert [line.get("payload", {}).get("session_id") for line in newest] == ["s3", "s4", None]


@pytest.mark.kafka
async def test_follow_prints_records_published_after_it_started(
    kafka_bootstrap: str, kafka_config: Callable[..., Any], unique: Callable[[str], str]
) -> None:
    topic = unique("tail-follow")
    await _fill(kafka_config(kafka_bootstrap), topic)
    bus = KafkaBus(kafka_config(kafka_bootstrap))
    await bus.start()
    out = io.StringIO()
    try:
        tail = Tail(bus, TailOptions(topic, last=0, follow=True, max_records=2, poll_s=0.1), out)
        await tail.initial()  # last=0: nothing, but where "new" begins is now fixed
        assert tail.printed == 0 and tail.positions
        follower = asyncio.create_task(tail.follow())
        for session in ("late-1", "late-2"):
            await bus.publish(topic, _feedback(session, 1.0), key=session)
        await asyncio.wait_for(follower, timeout=60)  # ends at --max 2
        assert tail.printed == 2
    finally:
        await bus.stop()
    assert [line["payload"]["session_id"] for line in _lines(out.getvalue())] == [
        "late-1",
        "late-2",
    ]
