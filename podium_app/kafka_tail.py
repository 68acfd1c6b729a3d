"""``podium kafka tail TOPIC``: any Podium topic as JSON lines, one record per line.

Each line is one JSON object: where the record is (``topic``, ``partition``, ``offset``), when
(``timestamp`` in UTC ISO 8601 and ``timestamp_ms``), its ``key`` and ``headers`` (text, or
``key_base64`` / ``value_base64`` for bytes that are not UTF-8), and what it holds, decoded by
:mod:`podium.codec` (the one place bytes become messages) and written with protobuf's JSON
mapping (field names as in the .proto):

* an event topic: ``envelope`` (the ``podium.v1.Envelope`` without its payload),
  ``payload_type`` and ``payload`` (the unpacked event);
* ``podium.orchestrator.sessions.v1`` (raw ``SessionDone``, no envelope): ``payload_type`` and
  ``payload``;
* a tombstone (no value, compacted topics): ``"value": null``;
* bytes that do not decode (a dead-letter topic's poison, say): ``error`` naming the problem
  and ``value_base64``; the tail goes on.

Where it starts: the newest ``--last N`` records (default 10) or, with ``--from-beginning``,
the first; records of all partitions are merged in timestamp order. It then ends, or with
``--follow`` waits for new records until interrupted; ``--max N`` stops after N lines in any
mode. Records are read committed (aborted transactions never show) and without a consumer
group: tailing moves nobody's offsets. The broker is ``--bus``, else ``$PODIUM_BUS`` (as the
services read it), else ``$PODIUM_KAFKA_BOOTSTRAP`` (as the tests and tools do), with the
password from ``$PODIUM_KAFKA_SASL_PASSWORD``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import heapq
import json
import os
import sys
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO, cast

from google.protobuf import json_format
from google.protobuf.message import Message

from podium import codec, topics
from podium.bus import KafkaBus, Record, connect, is_kafka_url
from podium.errors import ConfigError, DecodeError, PodiumError
from podium.v1 import orchestrator_pb2
from podium_app.commands import fail

BUS_ENV = ("PODIUM_BUS", "PODIUM_KAFKA_BOOTSTRAP")
"""Where the broker's URL is read from when ``--bus`` is not given, in this order."""

RAW_TOPICS: Mapping[str, type[Message]] = {
    topics.ORCHESTRATOR_SESSIONS: orchestrator_pb2.SessionDone,
}
"""Topics whose records are a bare message rather than an envelope, and its type."""


@dataclass(frozen=True, slots=True)
class TailOptions:
    """What to read of one topic and when to stop."""

    topic: str
    """The topic to read."""
    from_beginning: bool = False
    """Start at each partition's first record rather than at the newest ``last``."""
    last: int = 10
    """Without ``from_beginning``: how many of the newest records to show first (0: none)."""
    max_records: int = 0
    """Stop after this many lines (0: no limit)."""
    follow: bool = False
    """After the records present at start, keep waiting for new ones."""
    poll_s: float = 1.0
    """With ``follow``: pause between looks for new records when there were none."""


def bus_url(explicit: str, environ: Mapping[str, str]) -> str:
    """The Kafka URL to read: ``explicit``, else the first of :data:`BUS_ENV` that is set."""
    url = explicit or next((environ[v] for v in BUS_ENV if environ.get(v, "").strip()), "")
    if not url:
        raise ConfigError(f"no broker: pass --bus kafka://HOST:PORT or set {' or '.join(BUS_ENV)}")
    if not is_kafka_url(url):
        raise ConfigError(
            f"tail reads a Kafka topic: the bus must be kafka://HOST:PORT, got {url!r}"
        )
    return url


def _text_or_base64(name: str, data: bytes) -> dict[str, str]:
    """``{name: text}`` for UTF-8 bytes, else ``{name + "_base64": ...}``."""
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(data).decode("ascii")}


def _as_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def decoded(topic: str, value: bytes | None) -> dict[str, Any]:
    """What a record's value holds, as JSON-ready fields (see the module docstring)."""
    if value is None:
        return {"value": None}
    try:
        raw_type = RAW_TOPICS.get(topic)
        if raw_type is not None:
            message = codec.decode_message(value, raw_type)
            return {"payload_type": raw_type.DESCRIPTOR.full_name, "payload": _as_dict(message)}
        envelope = codec.decode_envelope(value)
        payload = codec.unpack(envelope)
    except DecodeError as exc:
        return {"error": str(exc), "value_base64": base64.b64encode(value).decode("ascii")}
    bare = type(envelope)()
    bare.CopyFrom(envelope)
    bare.ClearField("payload")
    return {
        "envelope": _as_dict(bare),
        "payload_type": payload.DESCRIPTOR.full_name,
        "payload": _as_dict(payload),
    }


def record_json(record: Record) -> dict[str, Any]:
    """One record as the JSON object of its line."""
    line: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": datetime.fromtimestamp(record.timestamp_ms / 1000, UTC).isoformat(
            timespec="milliseconds"
        ),
        "timestamp_ms": record.timestamp_ms,
    }
    line |= {"key": None} if record.key is None else _text_or_base64("key", record.key)
    line["headers"] = [{"key": k, **_text_or_base64("value", v)} for k, v in record.headers]
    return line | decoded(record.topic, record.value)


def _order(record: Record) -> tuple[int, int, int]:
    return (record.timestamp_ms, record.partition, record.offset)


async def _partition_records(
    bus: KafkaBus, topic: str, partition: int, start: int, stop: int
) -> AsyncGenerator[Record, None]:
    # read_range is an async generator: closing it stops its consumer at once.
    reader = cast(AsyncGenerator[list[Record], None], bus.read_range(topic, partition, start, stop))
    async with contextlib.aclosing(reader):
        async for chunk in reader:
            for record in chunk:
                yield record


async def merged(
    bus: KafkaBus, topic: str, starts: Mapping[int, int], stops: Mapping[int, int]
) -> AsyncGenerator[Record, None]:
    """Records of ``[starts[p], stops[p])`` of every partition, merged by timestamp."""
    readers = {
        p: _partition_records(bus, topic, p, starts[p], stops[p])
        for p in starts
        if stops.get(p, 0) > starts[p]
    }
    heads: list[tuple[tuple[int, int, int], Record]] = []
    try:
        for reader in readers.values():
            first = await anext(reader, None)
            if first is not None:
                heapq.heappush(heads, (_order(first), first))
        while heads:
            _, record = heapq.heappop(heads)
            yield record
            following = await anext(readers[record.partition], None)
            if following is not None:
                heapq.heappush(heads, (_order(following), following))
    finally:
        for reader in readers.values():
            await reader.aclose()


async def newest(bus: KafkaBus, topic: str, partition: int, end: int, n: int) -> list[Record]:
    """The newest ``n`` records of a partition below offset ``end``, oldest first.

    Offsets are not records: transaction markers and aborted records take offsets too, so the
    window reaching back from ``end`` widens until it holds ``n`` records or the partition's
    start.
    """
    window = n
    while n > 0:
        start = max(0, end - window)
        got = [r async for r in _partition_records(bus, topic, partition, start, end)]
        if len(got) >= n or start == 0:
            return got[len(got) - n :] if len(got) > n else got
        window *= 4
    return []


class Tail:
    """Reads :attr:`options`' topic and writes each record as a JSON line to ``out``."""

    def __init__(self, bus: KafkaBus, options: TailOptions, out: TextIO) -> None:
        self.bus = bus
        self.options = options
        self.out = out
        self.printed = 0
        self.positions: dict[int, int] = {}
        """Per partition, the offset after the last record read."""

    def _done(self) -> bool:
        return 0 < self.options.max_records <= self.printed

    def _emit(self, record: Record) -> None:
        self.out.write(json.dumps(record_json(record), ensure_ascii=False) + "\n")
        self.out.flush()  # a follower piped into jq or grep sees each record as it comes
        self.printed += 1
        self.positions[record.partition] = max(
            self.positions.get(record.partition, 0), record.offset + 1
        )

    async def _print(self, starts: Mapping[int, int], stops: Mapping[int, int]) -> None:
        """Print the records of ``[starts, stops)`` merged, until ``max_records``."""
        # Closed here, in order, when --max cuts it short: left to the interpreter's shutdown,
        # the nested generators would be closed all at once, each under another's feet.
        async with contextlib.aclosing(
            merged(self.bus, self.options.topic, starts, stops)
        ) as records:
            async for record in records:
                self._emit(record)
                if self._done():
                    return

    async def _ends(self) -> dict[int, int]:
        ends = await self.bus.end_offsets(self.options.topic)
        if not ends:
            raise ConfigError(f"topic {self.options.topic!r} does not exist on the broker")
        return ends

    async def initial(self) -> None:
        """The records present at start: the first ones, or the newest ``last``."""
        ends = await self._ends()
        self.positions = dict(ends)
        if self.options.from_beginning:
            await self._print(dict.fromkeys(ends, 0), ends)
            return
        # The newest `last` of the topic: the newest `last` of each partition, merged, cut.
        found: list[Record] = []
        for partition, end in ends.items():
            found += await newest(self.bus, self.options.topic, partition, end, self.options.last)
        for record in sorted(found, key=_order)[len(found) - self.options.last :]:
            if self._done():
                return
            self._emit(record)

    async def follow(self) -> None:
        """Records published after :meth:`initial`'s snapshot, until ``max_records`` (or forever)."""
        while not self._done():
            ends = await self._ends()
            fresh = {p: self.positions.get(p, 0) for p, end in ends.items()}
            before = self.printed
            await self._print(fresh, ends)
            if self.printed == before and not self._done():
                await asyncio.sleep(self.options.poll_s)

    async def run(self) -> int:
        """Initial records, then new ones with ``follow``; returns the number of lines."""
        await self.initial()
        if self.options.follow:
            await self.follow()
        return self.printed


async def tail(url: str, options: TailOptions, out: TextIO) -> int:
    """Connect to ``url``, tail, disconnect; returns the number of lines written."""
    bus = connect(url)
    assert isinstance(bus, KafkaBus)  # bus_url accepts kafka:// only
    await bus.start()
    try:
        return await Tail(bus, options, out).run()
    finally:
        await bus.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium kafka tail``."""
    parser.add_argument("topic", help="topic to read, e.g. podium.trajectories.v1")
    parser.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at each partition's first record (default: the newest --last records)",
    )
    parser.add_argument(
        "--last",
        type=int,
        default=10,
        metavar="N",
        help="newest records to show first (default 10)",
    )
    parser.add_argument(
        "--max",
        type=int,
        default=0,
        dest="max_records",
        metavar="N",
        help="stop after N records (0: no limit)",
    )
    parser.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new records until interrupted"
    )
    parser.add_argument(
        "--bus",
        default="",
        help="kafka://HOST:PORT[?...] (default: $PODIUM_BUS, then "
        "$PODIUM_KAFKA_BOOTSTRAP; password in $PODIUM_KAFKA_SASL_PASSWORD)",
    )


def options_from(args: argparse.Namespace) -> TailOptions:
    """The :class:`TailOptions` of parsed arguments; negative counts are a ConfigError."""
    for flag, value in (("--last", args.last), ("--max", args.max_records)):
        if value < 0:
            raise ConfigError(f"{flag} must be >= 0, got {value}")
    return TailOptions(
        topic=args.topic,
        from_beginning=args.from_beginning,
        last=args.last,
        max_records=args.max_records,
        follow=args.follow,
    )


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Tail the topic to stdout; 0 when done or interrupted, 2 for bad input, 1 if the bus fails."""
    try:
        url = bus_url(args.bus, os.environ if environ is None else environ)
        options = options_from(args)
        asyncio.run(tail(url, options, sys.stdout))
    except PodiumError as exc:
        return fail("podium kafka tail", exc)
    except (KeyboardInterrupt, BrokenPipeError):
        return 0  # ^C ends a follow; a closed pipe (| head) ends any tail
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m podium_app.kafka_tail TOPIC ...``."""
    parser = argparse.ArgumentParser(prog="podium kafka tail", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
