"""``podium bench bus``: the event bus's throughput and latency beside the raw client's.

Protobuf envelopes (real Podium events, encoded by :mod:`podium.codec`) through the real broker:
events per second at saturation (produce + consume, end to end) and p50/p99 publish-to-decode
latency at fixed offered loads (open loop), for the bus layer services use (``EventPublisher``
over ``KafkaBus``, ``EventConsumer``) and, in the same run on the same broker, for aiokafka
alone with the same settings and bytes; the bus layer's cost is their ratio. What is measured
and how: :mod:`podium_app.bench_bus`; figures: bench/README.md ("Event bus").

Without ``--bus`` a local secured broker of the run's own is started (in ``--work-dir``) and
stopped at the end whatever happens; ``--bus kafka://...`` names a broker (its principal must
be allowed to create topics and groups; the password is read from
``$PODIUM_KAFKA_SASL_PASSWORD``). Progress goes to stderr, the table to stdout.

JSON (``--json OUT``)::

    {"saturation": {"events_per_s": N, ...}, "raw_client": {"events_per_s": N, ..., "loads": [...]},
     "loads": [{"offered_per_s": 1000, "p50_ms": X, "p99_ms": X, ...}, ...],
     "bus_to_raw": X, "config": {...}, "targets": {...}}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from podium.bus import KafkaConfig, is_kafka_url
from podium.errors import ConfigError, PodiumError
from podium_app.bench_bus import (
    BenchSettings,
    PhaseResult,
    local_broker,
    machine,
    measure,
    parse_loads,
    report,
    tracing,
)
from podium_app.commands import fail

PROG = "podium bench bus"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium bench bus`` (numbers are checked by :func:`settings_from`, so a
    bad one is one line, like every other bad input)."""
    d = BenchSettings()
    parser.add_argument("--bus", default="", help="kafka:// URL (default: a broker of its own)")
    parser.add_argument("--duration-s", default=str(d.duration_s), help="seconds per phase")
    parser.add_argument(
        "--loads", default="1000,10000", help="offered loads, events/s (default 1000,10000)"
    )
    parser.add_argument("--json", metavar="OUT", help="write the result as JSON here")
    parser.add_argument(
        "--in-flight", default=str(d.in_flight), help="publishing tasks at saturation"
    )
    parser.add_argument("--partitions", default=str(d.partitions), help="partitions per topic")
    parser.add_argument(
        "--max-batch", default=str(d.max_batch), help="records per consumer fetch and commit"
    )
    parser.add_argument("--warmup", default=str(d.warmup), help="warm-up events per phase")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="where the local broker lives (default: temp)"
    )


def _number(flag: str, raw: str, kind: type[int] | type[float]) -> Any:
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(
            f"{flag}: {raw!r} is not a{'n integer' if kind is int else ' number'}"
        ) from None


def settings_from(args: argparse.Namespace) -> BenchSettings:
    """The run's settings from the flags; a :class:`ConfigError` naming the bad one."""
    return BenchSettings(
        duration_s=_number("--duration-s", args.duration_s, float),
        loads=parse_loads(args.loads),
        in_flight=_number("--in-flight", args.in_flight, int),
        partitions=_number("--partitions", args.partitions, int),
        max_batch=_number("--max-batch", args.max_batch, int),
        warmup=_number("--warmup", args.warmup, int),
    )


def _check(args: argparse.Namespace) -> BenchSettings:
    settings = settings_from(args)
    if args.bus and not is_kafka_url(args.bus):
        raise ConfigError(f"--bus must be a kafka:// URL, got {args.bus!r}")
    if args.bus:
        KafkaConfig.from_url(args.bus)  # a bad URL is reported before a broker is touched
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise ConfigError(f"--json {args.json}: its directory does not exist")
    return settings


def _say(message: str) -> None:
    print(f"[{PROG}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _broker(args: argparse.Namespace) -> Iterator[KafkaConfig]:
    if args.bus:
        yield KafkaConfig.from_url(args.bus)
        return
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="podium-bench-bus-"))
        )
        yield stack.enter_context(local_broker(work, _say))


def _print(out: dict[str, Any]) -> None:
    sat, raw = out["saturation"], out["raw_client"]
    print(f"{'':22}{'bus':>14}{'raw aiokafka':>14}")
    print(f"{'saturation, events/s':22}{sat['events_per_s']:>14,.0f}{raw['events_per_s']:>14,.0f}")
    for bus_load, raw_load in zip(out["loads"], raw["loads"], strict=True):
        for q in ("p50_ms", "p99_ms"):
            label = f"{bus_load['offered_per_s']:g}/s {q[:3]} ms"
            print(f"{label:22}{bus_load[q]:>14.2f}{raw_load[q]:>14.2f}")
    print(f"bus / raw throughput: {out['bus_to_raw']:.3f}")
    for name, verdict in out["targets"].items():
        print(
            f"target {name} {verdict['target']}: {verdict['value']} ({'met' if verdict['met'] else 'NOT met'})"
        )


def run(args: argparse.Namespace) -> int:
    """The whole run; 0 done, 2 on bad input, 1 on a failure while measuring."""
    try:
        settings = _check(args)
        before = machine()
        with _broker(args) as config:
            results: list[PhaseResult] = asyncio.run(
                measure(config, settings, uuid.uuid4().hex[:8], _say)
            )
        extra = {
            "bus": "kafka (--bus)" if args.bus else "kafka (a local secured broker of its own)",
            "machine_before": before,
            "machine_after": machine(),
            "tracing": tracing(),
            "bus_path": "EventPublisher.publish -> KafkaBus.publish; EventConsumer",
            "raw_path": "aiokafka send_and_wait; getmany + commit per batch (podium.bus.raw)",
        }
        out = report(results, settings, extra)
    except PodiumError as exc:
        return fail(PROG, exc)
    _print(out)
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"{PROG}: --json {args.json}: cannot write ({exc.strerror})", file=sys.stderr)
            return 2
    return 0
