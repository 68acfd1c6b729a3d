"""The fault suite's auditor: read every topic back under read_committed and count.

After a scenario the whole broker is read from the beginning by a consumer of no group
(nothing committed, nobody's position moved), with ``isolation_level=read_committed``, so
the counts are what a downstream reader of the log would see: records of aborted
transactions are invisible, records of a transaction left open stop the read at the last
stable offset (and so count as missing, as they are for every reader).

The counts (:class:`Audit`), per submitted session:

* **lost**: a ``TaskSubmitted`` with no ``Trajectory``;
* **run twice**: more than one ``Trajectory`` record for a session id;
* **unscored** / **scored twice**: a trajectory with no, or more than one, ``ScoredTrajectory``;
* **trace split**: a session whose events (task, assignments, results, trajectory, score) do
  not all carry the one trace id it was submitted with (envelope ``trace_context``);
* **dead letters**: each poison record the scenario published, found (by key) on its topic's
  dead-letter topic exactly once; ``poison_missing`` / ``poison_repeated`` otherwise.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from podium import codec, topics
from podium.bus import KafkaConfig
from podium.errors import DecodeError
from podium.v1 import envelope_pb2, reward_pb2, subtask_pb2, task_pb2, trajectory_pb2

SESSION_TOPICS = (
    topics.TASKS,
    topics.SUBTASKS_ASSIGNED,
    topics.SUBTASK_RESULTS,
    topics.TRAJECTORIES,
    topics.SCORED_TRAJECTORIES,
)
"""Topics whose events belong to one session (and so to its one trace)."""


def trace_id(envelope: envelope_pb2.Envelope) -> str:
    """The trace id of the envelope's W3C ``traceparent`` (empty when it has none)."""
    parts = envelope.trace_context.get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 else ""


def session_of(envelope: envelope_pb2.Envelope) -> str:
    """The session id an event of :data:`SESSION_TOPICS` belongs to ("" for other events)."""
    msg = codec.unpack(envelope)
    if isinstance(msg, task_pb2.TaskSubmitted | subtask_pb2.SubtaskAssigned):
        return msg.session_id
    if isinstance(msg, subtask_pb2.SubtaskResult | trajectory_pb2.Trajectory):
        return msg.session_id
    if isinstance(msg, reward_pb2.ScoredTrajectory):
        return msg.trajectory.session_id
    return ""


@dataclass
class Log:
    """Everything read back, by topic: decoded envelopes, and the keys of records that do not
    decode (poison, or a topic that does not carry envelopes)."""

    envelopes: dict[str, list[envelope_pb2.Envelope]] = field(default_factory=dict)
    raw_keys: dict[str, list[str]] = field(default_factory=dict)

    def add(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """File one record under its topic."""
        try:
            envelope = codec.decode_envelope(value)
            codec.unpack(envelope)
        except DecodeError:
            self.raw_keys.setdefault(topic, []).append((key or b"").decode("utf-8", "replace"))
            return
        self.envelopes.setdefault(topic, []).append(envelope)

    def keys(self, topic: str) -> list[str]:
        """Keys of every record on ``topic`` (decodable or not)."""
        return [e.key for e in self.envelopes.get(topic, [])] + self.raw_keys.get(topic, [])

    def total(self, topic: str) -> int:
        return len(self.envelopes.get(topic, [])) + len(self.raw_keys.get(topic, []))


def _audit_kwargs(config: KafkaConfig) -> dict[str, object]:
    """``config``'s connection (brokers, TLS, SASL) as the auditor's aiokafka clients take it."""
    return dataclasses.replace(config, client_id="fault-audit").client_kwargs()


async def all_partitions(config: KafkaConfig, only: str = "") -> list[TopicPartition]:
    """Every partition of every non-internal topic on the broker (of topic ``only`` if given)."""
    admin = AIOKafkaAdminClient(**_audit_kwargs(config))
    await admin.start()
    try:
        names = sorted(
            t for t in await admin.list_topics() if not t.startswith("__") and only in ("", t)
        )
        described = await admin.describe_topics(names) if names else []
    finally:
        await admin.close()
    return sorted(
        TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]
    )


async def read_all(config: KafkaConfig, *, timeout_s: float = 60.0) -> Log:
    """Every record of every non-internal topic, from the beginning to the last stable offset."""
    consumer = AIOKafkaConsumer(
        **_audit_kwargs(config), isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    log = Log()
    try:
        tps = await all_partitions(config)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)  # the last stable offsets, read_committed
        deadline = time.monotonic() + timeout_s
        left = {tp for tp in tps if end[tp] > 0}
        while left and time.monotonic() < deadline:
            batches = await consumer.getmany(*left, timeout_ms=500, max_records=2000)
            for tp, records in batches.items():
                for r in records:
                    if r.offset < end[tp]:
                        log.add(tp.topic, r.key, r.value)
            for tp in list(left):
                if await consumer.position(tp) >= end[tp]:
                    left.discard(tp)
        if left:
            raise AssertionError(f"audit could not read to the end of {sorted(map(str, left))}")
    finally:
        await consumer.stop()
    return log


@dataclass(frozen=True)
class Audit:
    """The counts of one scenario (see the module docstring); all must be 0 but the sizes."""

    submitted: int
    trajectories: int
    lost: int
    run_twice: int
    unscored: int
    scored_twice: int
    trace_split: int
    poison: int
    dead_letters: int
    poison_missing: int
    poison_repeated: int
    examples: dict[str, list[str]]

    @property
    def clean(self) -> bool:
        """Nothing lost, nothing twice, one trace per session, every poison record accounted."""
        return not (
            self.lost
            or self.run_twice
            or self.unscored
            or self.scored_twice
            or self.trace_split
            or self.poison_missing
            or self.poison_repeated
        )


def _per_session(log: Log, topic: str, wanted: set[str]) -> Counter[str]:
    return Counter(s for e in log.envelopes.get(topic, []) if (s := session_of(e)) in wanted)


def _traces(log: Log, wanted: set[str]) -> dict[str, Counter[tuple[str, str]]]:
    """Session id -> how many of its events each (topic, trace id) pair has."""
    out: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    for topic in SESSION_TOPICS:
        for envelope in log.envelopes.get(topic, []):
            sid = session_of(envelope)
            if sid in wanted:
                out[sid][(topic, trace_id(envelope)[:8] or "<none>")] += 1
    return out


def audit(
    log: Log, submitted: Mapping[str, str], poison: Mapping[str, Iterable[str]] | None = None
) -> Audit:
    """Count what happened to the ``submitted`` sessions (session id -> trace id) and to the
    ``poison`` records (topic -> keys of the poison records published to it)."""
    wanted = set(submitted)
    trajectories = _per_session(log, topics.TRAJECTORIES, wanted)
    scored = _per_session(log, topics.SCORED_TRAJECTORIES, wanted)
    traces = _traces(log, wanted)
    lost = sorted(wanted - set(trajectories))
    twice = sorted(s for s, n in trajectories.items() if n > 1)
    unscored = sorted(s for s in trajectories if scored[s] == 0)
    scored_twice = sorted(s for s, n in scored.items() if n > 1)
    split = sorted(
        s for s in wanted if {t for _, t in traces.get(s, Counter())} != {submitted[s][:8]}
    )
    missing: list[str] = []
    repeated: list[str] = []
    n_poison = n_dead = 0
    for topic, keys in (poison or {}).items():
        dead = Counter(log.keys(topics.dead_letter(topic)))
        for key in keys:
            n_poison += 1
            n_dead += min(dead[key], 1)
            if dead[key] == 0:
                missing.append(f"{topic}:{key}")
            elif dead[key] > 1:
                repeated.append(f"{topic}:{key} x{dead[key]}")
    return Audit(
        submitted=len(wanted),
        trajectories=sum(trajectories.values()),
        lost=len(lost),
        run_twice=len(twice),
        unscored=len(unscored),
        scored_twice=len(scored_twice),
        trace_split=len(split),
        poison=n_poison,
        dead_letters=n_dead,
        poison_missing=len(missing),
        poison_repeated=len(repeated),
        examples={
            "lost": lost[:5],
            "run_twice": [f"{s} x{trajectories[s]}" for s in twice[:5]],
            "unscored": unscored[:5],
            "scored_twice": [f"{s} x{scored[s]}" for s in scored_twice[:5]],
            "trace_split": [f"{s}: {dict(traces[s])}" for s in split[:2]],
            "poison_missing": missing[:8],
            "poison_repeated": repeated[:5],
        },
    )


async def audit_broker(
    config: KafkaConfig,
    submitted: Mapping[str, str],
    poison: Mapping[str, Iterable[str]] | None = None,
) -> Audit:
    """:func:`read_all` then :func:`audit`."""
    return audit(await read_all(config), submitted, poison)


__all__ = ["Audit", "Log", "all_partitions", "audit", "audit_broker", "read_all", "trace_id"]
