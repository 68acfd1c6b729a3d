"""``podium bench pipeline``: what the event pipeline carries, over Kafka and embedded.

Two deployments of the same services on the same load, in one run:

* **kafka**: orchestrator, ``--workers`` sub-agent workers, reward and learner, each its own
  ``python -m`` process (:class:`podium_app.cycle.deploy.Deployment` on
  :class:`~podium_app.processes.ServiceProcesses`), on a fresh local secured broker of the
  run's own (:func:`podium_app.cycle.deploy.connection`) or on ``--bus``;
* **embedded**: the same apps as asyncio tasks of this process on one
  :class:`~podium.bus.InProcBus` (as ``podium demo`` and ``podium train`` embed them).

The orchestrator runs ``PODIUM_POLICY=learned`` under ``PODIUM_ROLLOUT=latest`` (the newest
loaded version decides each new session) on a behaviour-cloned checkpoint (``--checkpoint``,
else one made as ``podium bench cycle`` makes it), announced as signed version 0 by the
learner at its start. The sub-agents run with ``PODIUM_SUBAGENT_TIME_SCALE=0``: executions
take no wall time (outcomes are still drawn from the pool), so the figures are the pipeline's
own cost. Every session is greedy (``submitted_by`` is not a training prefix), so the learner
consumes and skips them, as it does live traffic.

Measured, per deployment:

* **throughput**: ``--sessions`` tasks submitted at once; sessions per second and decisions
  per second from the first submission to the last trajectory read back, and **decisions per
  orchestrator CPU-second** (``decisions_per_s_per_core``: decisions per second divided by the
  cores the orchestrator used). The orchestrator's CPU is measured, never assumed: on Kafka the
  process's utime + stime from ``/proc/<pid>/stat`` (all its threads); embedded, the CPU time
  of the event-loop callbacks run in the orchestrator's context (:class:`LoopCpu`: every task
  the orchestrator app starts inherits a context variable naming it, and each callback's
  thread CPU time is charged to the service its context names) — the other services share the
  process, and their work must not be charged to it. The whole process's CPU is reported too.
* **version pick-up**: under a steady load of ``--rate`` sessions per second (default: half
  the throughput just measured), ``--versions``
  new versions published one after the other, the way the learner publishes
  (:mod:`podium_app.bootstrap`'s shared steps: written by ``SwarmPPO.publish`` with the
  learner's key, announced under its event id); for each, the time from the ``PolicyUpdated``
  being sent (its weights already written, as the learner writes them before announcing) to
  the ``started_at`` of the first session it decided (sessions pick their version when they
  start); p50/p99 over the versions. Also the time until the bench read that session's
  trajectory back (``to_trajectory_*``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from learner_svc.algorithms.swarm import SwarmPPO, SwarmSettings
from learner_svc.config import LearnerConfig, LoopSettings
from learner_svc.loop import LearningLoop, LoopApp
from orchestrator_svc.app import OrchestratorApp
from orchestrator_svc.config import LATEST, OrchestratorConfig
from podium import codec, rewards, topics
from podium.bus import InProcBus, KafkaBus
from podium.bus.base import Bus, Subscriber
from podium.envs.swarm.spec import TaskSpec
from podium.envs.swarm.trajectory import task_to_proto
from podium.errors import PodiumError
from podium.policy.signing import KeyPair
from podium.policy.swarm import MODEL_NAME
from podium.service import App
from podium.v1 import task_pb2, trajectory_pb2
from podium.v1.reward_pb2 import PolicyUpdated
from podium_app.bootstrap import announce, behaviour_clone, publish_initial
from podium_app.cycle.config import CycleConfig
from podium_app.cycle.deploy import Deployment, connection, learner_train_config
from podium_app.cycle.load import create_topics, index_of, session_id
from podium_app.cycle.measure import cycle_tasks
from podium_app.train.services import RunTopics, learner_settings, run_key_pair, settings_env
from reward_svc.app import RewardApp
from reward_svc.config import RewardServiceConfig
from subagent_svc.app import SubagentApp
from subagent_svc.config import SubagentConfig

Say = Callable[[str], None]

MAX_SUBTASKS = 16
"""Slot count S of the learner's versions (as ``podium bench cycle``'s learner)."""
SUBMITTED_BY = "bench-pipeline"
"""``submitted_by`` of every session: greedy (not a training prefix), as live traffic."""
PRODUCER = "bench-pipeline"

SERVICE = contextvars.ContextVar("podium_bench_service", default="")
"""The embedded service whose context a callback runs in (set around each app's start)."""


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """Everything ``podium bench pipeline`` needs; the CLI flags map 1:1 onto these fields."""

    work_dir: Path = Path("runs/pipeline")
    """Broker data, service logs, the initial policy, the published versions."""
    bus: str = ""
    """``kafka://`` URL of a broker to use; empty = a local secured KRaft broker of the run's
    own under ``work_dir/kafka``. On a shared broker the services use consumer groups and
    transactional ids of this run's own, positioned at the topics' ends."""
    workers: int = 2
    """Sub-agent workers (each its own process on Kafka, its own app embedded)."""
    sessions: int = 300
    """Sessions of each throughput measurement (submitted at once)."""
    versions: int = 8
    """Versions published for the pick-up measurement (p50/p99 over them)."""
    rate: float = 0.0
    """Sessions per second submitted while versions are published; 0 = half the sessions per
    second the throughput phase just measured on the same deployment (a load it carries
    without a backlog, so the figure is the pick-up, not a queue)."""
    warmup: int = 20
    """Sessions run (after version 0 decides one) before anything is measured."""
    checkpoint: Path | None = None
    """The learned policy (``policy.safetensors``); None = a behaviour clone of cpls made by
    ``podium train`` code, as ``podium bench cycle`` makes it."""
    seed: int = 0
    """Seed of the task mix and of the sessions' sub-agent luck."""
    tasks: int = 12
    """Distinct tasks of the load (generated, 5-10 subtasks over every kind)."""
    timeout_s: float = 300.0
    """Longest wait for any one phase (start-up, a throughput batch, a version)."""
    stop_timeout_s: float = 15.0
    """SIGTERM -> SIGKILL grace of every process."""


def validate(config: PipelineConfig) -> None:
    """Raise ``ValueError('--flag: why')`` for the first bad setting (the CLI exits 2 with it)."""
    checks: list[tuple[bool, str]] = [
        (
            not config.bus or config.bus.startswith("kafka://"),
            f"--bus: must be a kafka:// URL, got {config.bus!r}",
        ),
        (config.workers >= 1, "--workers: must be >= 1"),
        (config.sessions >= 1, "--sessions: must be >= 1"),
        (config.versions >= 1, "--versions: must be >= 1"),
        (
            math.isfinite(config.rate) and config.rate >= 0,
            "--rate: must be >= 0 sessions/s (0: half the measured throughput)",
        ),
        (config.warmup >= 0, "--warmup: must be >= 0"),
        (config.tasks >= 1, "--tasks: must be >= 1"),
        (math.isfinite(config.timeout_s) and config.timeout_s > 0, "--timeout-s: must be > 0"),
        (
            config.checkpoint is None or config.checkpoint.is_file(),
            f"--checkpoint: {config.checkpoint} is not a file",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) a live process has used, from
    ``/proc/<pid>/stat`` (fields 14 and 15, in clock ticks)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class LoopCpu:
    """Thread CPU time of event-loop callbacks, charged to the service in :data:`SERVICE` of
    the callback's context (embedded deployments: several services on one event loop).

    While :meth:`installed`, every ``asyncio.Handle`` run (task steps, callbacks, timers)
    is timed with ``time.thread_time``. Tasks copy the context they are created in, so every
    task an app starts inside ``SERVICE.set(name)`` — and every task those start — is charged
    to ``name``. Work in other threads (``asyncio.to_thread``) is not seen; the embedded
    orchestrator's decisions run on the loop (torch on one thread, set by the app).
    """

    def __init__(self) -> None:
        self.by_service: dict[str, float] = {}

    def total(self, service: str) -> float:
        """CPU seconds charged to ``service`` so far."""
        return self.by_service.get(service, 0.0)

    @contextlib.contextmanager
    def installed(self) -> Iterator[LoopCpu]:
        handle_cls = asyncio.events.Handle
        original = handle_cls._run
        totals = self.by_service

        def timed_run(handle: asyncio.Handle) -> None:
            started = time.thread_time()
            try:
                original(handle)
            finally:
                name = handle._context.get(SERVICE, "")  # type: ignore[attr-defined]
                totals[name] = totals.get(name, 0.0) + time.thread_time() - started

        handle_cls._run = timed_run  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            handle_cls._run = original  # type: ignore[method-assign]


@dataclass
class Seen:
    """What the bench keeps of one session's trajectory."""

    version: str
    decisions: int
    started_at: float
    """Unix seconds the session started (its version was chosen then)."""
    read_at: float
    """Unix seconds the bench read its trajectory."""


@dataclass
class Watch:
    """The trajectories of one run's sessions, read back in a consumer group of the bench's
    own (committed records only on Kafka)."""

    bus: Bus
    run: str
    seen: dict[int, Seen] = field(default_factory=dict)
    twice: int = 0
    _subscriber: Subscriber | None = None

    async def start(self) -> None:
        group = f"{PRODUCER}.{self.run}.{uuid.uuid4().hex[:8]}"
        if isinstance(self.bus, KafkaBus):
            # A shared broker's history is not this run's: start at the end.
            await self.bus.position_groups_at_end({group: [topics.TRAJECTORIES]})
        self._subscriber = self.bus.subscriber([topics.TRAJECTORIES], group)
        await self._subscriber.start()

    async def stop(self) -> None:
        if self._subscriber is not None:
            await self._subscriber.stop()
            self._subscriber = None

    async def poll(self, timeout_s: float = 0.2) -> None:
        assert self._subscriber is not None, "Watch.start first"
        records = await self._subscriber.fetch(max_records=2000, timeout_s=timeout_s)
        now = time.time()
        for r in records:
            if r.value is None:
                continue
            traj = codec.decode_event(r.value, trajectory_pb2.Trajectory)[1]
            i = index_of(self.run, traj.session_id)
            if i is None:
                continue
            if i in self.seen:
                self.twice += 1
                continue
            started = traj.started_at.seconds + traj.started_at.nanos / 1e9
            self.seen[i] = Seen(traj.policy_version, len(traj.decisions), started, now)

    def first_of(self, version: str) -> Seen | None:
        """The earliest-started session ``version`` decided, None if none yet."""
        mine = [s for s in self.seen.values() if s.version == version]
        return min(mine, key=lambda s: s.started_at) if mine else None


@dataclass
class Load:
    """Submits a run's sessions (``TaskSubmitted``, ids ``<run>-<index>``), tasks in turn."""

    bus: Bus
    run: str
    tasks: Sequence[TaskSpec]
    seed: int
    submitted: int = 0
    _protos: list[Any] = field(default_factory=list)

    def _event(self, i: int) -> tuple[str, bytes]:
        if not self._protos:
            self._protos = [task_to_proto(t) for t in self.tasks]
        sid = session_id(self.run, i)
        event = task_pb2.TaskSubmitted(
            session_id=sid,
            task=self._protos[i % len(self._protos)],
            submitted_by=SUBMITTED_BY,
            seed=(self.seed * 1_000_003 + i) % (2**31 - 1) + 1,
        )
        return sid, codec.encode_event(event, producer=PRODUCER, key=sid)[1]

    async def submit(self, n: int) -> range:
        """``n`` more sessions, published concurrently (in chunks); their indices."""
        first = self.submitted
        for start in range(first, first + n, 100):
            events = [self._event(i) for i in range(start, min(start + 100, first + n))]
            await asyncio.gather(*(self.bus.publish(topics.TASKS, d, key=s) for s, d in events))
            self.submitted += len(events)
        return range(first, first + n)

    async def steady(self, rate: float, stop: asyncio.Event) -> None:
        """One session every ``1/rate`` seconds until ``stop`` is set. A submission under way
        then completes: cancelling one mid-publish could put a session on the bus that
        :attr:`submitted` never counted (it would finish uncounted, and be waited for by
        nobody)."""
        t0, first = time.monotonic(), self.submitted
        while not stop.is_set():
            await self.submit(1)
            due = t0 + (self.submitted - first) / rate
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, due - time.monotonic()))


@dataclass
class Stage:
    """One deployment under measurement: its load and read-back, its health check, the CPU
    clocks, its version publisher."""

    name: str
    load: Load
    watch: Watch
    check: Callable[[], None]
    orchestrator_cpu: Callable[[], float]
    """CPU seconds the orchestrator has used so far (see the module docstring)."""
    process_cpu: Callable[[], float]
    """CPU seconds of everything the deployment runs (all its processes, or this one)."""
    loaded: Callable[[], dict[int, float]]
    """Version -> unix seconds the orchestrator loaded it (from its log)."""
    versions: VersionPublisher
    timeout_s: float

    async def wait_for(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not done():
            self.check()
            if time.monotonic() > deadline:
                raise PodiumError(
                    f"[{self.name}] timed out after {self.timeout_s:.0f}s waiting for {what}"
                )
            await self.watch.poll()


@dataclass
class VersionPublisher:
    """Publishes new versions of the initial policy the way the learner does, with the shared
    cold-start steps (:mod:`podium_app.bootstrap`): written by the learner's own code and key
    (``SwarmPPO.publish``: weights, sha256, signature) under an artifacts root of the bench's
    own, then announced under the learner's event id."""

    bus: Bus
    learner: SwarmSettings
    """The running learner's settings (its signing key), with the bench's artifacts root."""
    init: Path

    async def prepare(self, version: int) -> PolicyUpdated:
        """Write ``version`` and sign its announcement (the learner's publish step)."""
        return await asyncio.to_thread(publish_initial, self.learner, self.init, version)

    async def announce(self, event: PolicyUpdated) -> None:
        """Publish the ``PolicyUpdated`` (the learner's announce step)."""
        await announce(self.bus, event)


async def warm_up(stage: Stage, sessions: int, say: Say) -> None:
    """Sessions until version 0 (the learner's announcement) decides one, then ``sessions``
    more: torch, the bus clients and the statistics store are warm before measuring."""
    say(f"[{stage.name}] waiting for version 0 to decide a session")
    deadline = time.monotonic() + stage.timeout_s
    while stage.watch.first_of("0") is None:
        stage.check()
        if time.monotonic() > deadline:
            raise PodiumError(f"[{stage.name}] version 0 decided no session in {stage.timeout_s}s")
        await stage.load.submit(1)
        for _ in range(5):
            await stage.watch.poll()
    batch = await stage.load.submit(sessions)
    await stage.wait_for(lambda: all(i in stage.watch.seen for i in batch), "the warm-up")


async def throughput(stage: Stage, sessions: int, say: Say) -> dict[str, Any]:
    """``sessions`` submitted at once, run to their ends (see the module docstring)."""
    say(f"[{stage.name}] throughput: {sessions} sessions")
    cpu0, all0, t0 = stage.orchestrator_cpu(), stage.process_cpu(), time.monotonic()
    batch = await stage.load.submit(sessions)
    await stage.wait_for(lambda: all(i in stage.watch.seen for i in batch), "the sessions")
    # A fetch returns as soon as records arrive: now is when the last trajectory was read.
    last = time.monotonic()
    cpu_s, all_s, wall_s = (
        stage.orchestrator_cpu() - cpu0,
        stage.process_cpu() - all0,
        last - t0,
    )
    decisions = sum(stage.watch.seen[i].decisions for i in batch)
    out = summarise(sessions, decisions, wall_s, cpu_s, all_s)
    say(
        f"[{stage.name}] {out['sessions_per_s']:.1f} sessions/s, {out['decisions_per_s']:.0f} "
        f"decisions/s, orchestrator {out['orchestrator_cores']:.2f} cores -> "
        f"{out['decisions_per_s_per_core']:.0f} decisions/s per core"
    )
    return out


def summarise(
    sessions: int, decisions: int, wall_s: float, cpu_s: float, all_cpu_s: float
) -> dict[str, Any]:
    """The throughput figures of one batch (``cpu_s``: the orchestrator's CPU seconds over
    ``wall_s``; ``all_cpu_s``: the whole deployment's)."""
    if wall_s <= 0 or cpu_s <= 0:
        raise PodiumError(f"no time measured (wall {wall_s:.3f}s, orchestrator CPU {cpu_s:.3f}s)")
    return {
        "sessions": sessions,
        "decisions": decisions,
        "wall_s": round(wall_s, 3),
        "orchestrator_cpu_s": round(cpu_s, 3),
        "orchestrator_cores": round(cpu_s / wall_s, 3),
        "deployment_cpu_s": round(all_cpu_s, 3),
        "sessions_per_s": round(sessions / wall_s, 2),
        "decisions_per_s": round(decisions / wall_s, 1),
        "decisions_per_s_per_core": round(decisions / cpu_s, 1),
        "decisions_per_deployment_cpu_s": round(decisions / all_cpu_s, 1) if all_cpu_s else None,
    }


def decided_by(watch: Watch, version: str) -> Callable[[], bool]:
    """Whether ``version`` has decided a session yet."""
    return lambda: watch.first_of(version) is not None


async def version_pickup(stage: Stage, versions: int, rate: float, say: Say) -> dict[str, Any]:
    """Versions 1..``versions`` published under a steady load (see the module docstring)."""
    say(f"[{stage.name}] version pick-up: {versions} versions under {rate:g} sessions/s")
    published: dict[int, float] = {}
    stop = asyncio.Event()
    loader = asyncio.create_task(stage.load.steady(rate, stop))
    try:
        for v in range(1, versions + 1):
            event = await stage.versions.prepare(v)
            published[v] = time.time()
            await stage.versions.announce(event)
            await stage.wait_for(decided_by(stage.watch, str(v)), f"v{v} to decide a session")
            await asyncio.sleep(0.3)  # a later-started session's trajectory may come first
    finally:
        stop.set()
        # A loader that cannot finish its submission in time is cancelled by wait_for; its
        # errors surface as the waits above timing out, so none is raised twice here.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(loader, stage.timeout_s)
    upto = stage.load.submitted
    await stage.wait_for(
        lambda: all(i in stage.watch.seen for i in range(upto)), "the sessions in flight"
    )
    return pickup_figures(published, stage.watch, stage.loaded())


def pickup_figures(
    published: dict[int, float], watch: Watch, loaded: dict[int, float]
) -> dict[str, Any]:
    """p50/p99 ms from each version's publication to the start of its first session; the
    same split at the moment the orchestrator logged the version loaded (``loaded``: version
    -> unix seconds; the consumer's pick-up and the verification, then the wait for the next
    session to start), and to the bench reading that session's trajectory."""
    to_start, to_read, to_load, load_to_start = [], [], [], []
    for v, at in sorted(published.items()):
        first = watch.first_of(str(v))
        if first is None:
            raise PodiumError(f"version {v} decided no session")
        to_start.append((first.started_at - at) * 1000.0)
        to_read.append((first.read_at - at) * 1000.0)
        if v in loaded:
            to_load.append((loaded[v] - at) * 1000.0)
            load_to_start.append((first.started_at - loaded[v]) * 1000.0)
    out: dict[str, Any] = {
        "p50": round(percentile(to_start, 50), 1),
        "p99": round(percentile(to_start, 99), 1),
        "max": round(max(to_start), 1),
        "versions": len(to_start),
        "samples_ms": [round(x, 1) for x in to_start],
        "to_trajectory_p50": round(percentile(to_read, 50), 1),
        "to_trajectory_p99": round(percentile(to_read, 99), 1),
    }
    if to_load:
        out["to_loaded_p50"] = round(percentile(to_load, 50), 1)
        out["to_loaded_p99"] = round(percentile(to_load, 99), 1)
        out["loaded_to_first_session_p50"] = round(percentile(load_to_start, 50), 1)
        out["loaded_to_first_session_p99"] = round(percentile(load_to_start, 99), 1)
    return out


LOADED_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO orchestrator_svc\.learned: "
    rf"loaded {MODEL_NAME} v(\d+) "
)
"""The orchestrator's log line of a loaded version (``podium.service`` log format, local time)."""


def loaded_from_log(text: str) -> dict[int, float]:
    """Version -> unix seconds the orchestrator logged it loaded (the first time)."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        m = LOADED_LINE.match(line)
        if m is not None:
            at = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3
            out.setdefault(int(m.group(3)), at)
    return out


class LoadedVersions(logging.Handler):
    """The embedded orchestrator's loaded versions, from its log records (version -> unix
    seconds), as :func:`loaded_from_log` reads them from a process's log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.loaded: dict[int, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if record.msg == "loaded %s v%d (%s)" and isinstance(args, tuple) and len(args) == 3:
            self.loaded.setdefault(int(str(args[1])), record.created)

    @contextlib.contextmanager
    def attached(self) -> Iterator[LoadedVersions]:
        logger = logging.getLogger("orchestrator_svc.learned")
        level = logger.level
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        try:
            yield self
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)


async def measure(stage: Stage, config: PipelineConfig, say: Say) -> dict[str, Any]:
    """Warm-up, throughput, version pick-up and the consistency counts of one deployment."""
    await stage.watch.start()
    try:
        await warm_up(stage, config.warmup, say)
        out = await throughput(stage, config.sessions, say)
        rate = config.rate or max(1.0, round(out["sessions_per_s"] / 2, 1))
        out["policy_update_to_first_session_ms"] = await version_pickup(
            stage, config.versions, rate, say
        ) | {"rate": rate}
        await stage.watch.poll(0.5)
        out["submitted"] = stage.load.submitted
        out["finished"] = len(stage.watch.seen)
        out["run_twice"] = stage.watch.twice
        return out
    finally:
        await stage.watch.stop()


# ---------------------------------------------------------------------------- deployments


def learner_parts(
    config: PipelineConfig, init: Path, run_dir: Path
) -> tuple[LoopSettings, SwarmSettings, KeyPair]:
    """The learner's settings (``podium bench cycle``'s learner: ``podium train``'s loop and PPO
    settings on the standard topics) and the run's signing pair (``run_dir/keys``), which the
    learner signs with and the orchestrator trusts."""
    train = learner_train_config(CycleConfig(seed=config.seed), run_dir)
    loop, algorithm = learner_settings(train, init, MAX_SUBTASKS, RunTopics())
    return loop, algorithm, run_key_pair(train)


def versions_of(
    bus: Bus, learner: tuple[LoopSettings, SwarmSettings, KeyPair], init: Path, run_dir: Path
) -> VersionPublisher:
    """The bench's publisher of versions 1, 2, ... signed with the learner's key, written
    under ``run_dir/versions`` (never the learner's own artifacts root)."""
    settings = replace(learner[1], artifacts_dir=str(run_dir.resolve() / "versions"))
    return VersionPublisher(bus, settings, init)


def embedded_apps(
    bus: Bus, config: PipelineConfig, learner: tuple[LoopSettings, SwarmSettings, KeyPair]
) -> list[tuple[str, App]]:
    """The apps of the embedded deployment, downstream first (the order they start in)."""
    loop, algorithm, keys = learner
    learning = LearningLoop(
        loop.loop_config(LearnerConfig(bus_url="inproc://"), "learner"),
        SwarmPPO.from_settings(algorithm),
        bus,
    )
    apps: list[tuple[str, App]] = [
        ("learner", LoopApp(learning, shutdown_timeout_s=config.stop_timeout_s)),
        (
            "reward",
            RewardApp(
                RewardServiceConfig(bus_url="inproc://", instance="reward"),
                rewards.default_config(),
                bus,
            ),
        ),
    ]
    apps += [
        (
            f"subagent-{i + 1}",
            SubagentApp(
                SubagentConfig(bus_url="inproc://", instance=f"subagent-{i + 1}", time_scale=0.0),
                bus,
            ),
        )
        for i in range(config.workers)
    ]
    orchestrator = OrchestratorConfig(
        bus_url="inproc://",
        instance="orchestrator",
        policy="learned",
        rollout=LATEST,
        policy_trusted_keys=str(keys.public_path),
    )
    apps.append(("orchestrator", OrchestratorApp(orchestrator, bus, serve_grpc=False)))
    return apps


def process_envs(
    config: PipelineConfig, learner: tuple[LoopSettings, SwarmSettings, KeyPair], tag: str
) -> tuple[list[tuple[str, str, str, dict[str, str]]], dict[str, list[str]]]:
    """The processes of the Kafka deployment as (name, module, principal, env), downstream
    first, and the consumer groups to position at the topics' ends before they start. Groups
    and transactional ids are ``<principal>-<tag>``: the principals' ACLs cover them
    (prefixes), and on a shared broker nobody else's are touched."""
    loop, algorithm, keys = learner
    groups = {name: f"{name}-{tag}" for name in ("orchestrator", "subagent", "reward", "learner")}
    procs: list[tuple[str, str, str, dict[str, str]]] = [
        (
            "learner",
            "learner_svc",
            "learner",
            {
                **settings_env(loop),
                **settings_env(algorithm),
                "PODIUM_LEARNER_MODE": "swarm",
                "PODIUM_GROUP_ID": groups["learner"],
            },
        ),
        ("reward", "reward_svc", "reward", {"PODIUM_REWARD_GROUP": groups["reward"]}),
    ]
    procs += [
        (
            f"subagent-{i + 1}",
            "subagent_svc",
            "subagent",
            {"PODIUM_GROUP_ID": groups["subagent"], "PODIUM_SUBAGENT_TIME_SCALE": "0"},
        )
        for i in range(config.workers)
    ]
    procs.append(
        (
            "orchestrator",
            "orchestrator_svc",
            "orchestrator",
            {
                "PODIUM_GROUP_ID": groups["orchestrator"],
                "PODIUM_GRPC_HOST": "127.0.0.1",
                "PODIUM_GRPC_PORT": "0",
                "PODIUM_POLICY": "learned",
                "PODIUM_ROLLOUT": LATEST,
                "PODIUM_POLICY_TRUSTED_KEYS": str(keys.public_path),
            },
        )
    )
    at_end = {
        f"{groups['orchestrator']}.tasks": [topics.TASKS],
        groups["subagent"]: [topics.SUBTASKS_ASSIGNED],
        groups["reward"]: [topics.TRAJECTORIES],
        groups["learner"]: [topics.SCORED_TRAJECTORIES],
    }
    return procs, at_end


@dataclass
class Embedded:
    """The embedded deployment's apps, started each in a context naming its service (so
    :class:`LoopCpu` charges its work to it), watched and stopped upstream first."""

    apps: list[tuple[str, App]]
    waits: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def start(self) -> None:
        for name, app in self.apps:
            token = SERVICE.set(name.split("-")[0])
            try:
                await app.start()
                self.waits[name] = asyncio.create_task(app.wait(), name=name)
            finally:
                SERVICE.reset(token)

    def check(self) -> None:
        """Raise naming the app that stopped (a service must run until the bench stops it)."""
        for name, task in self.waits.items():
            if task.done():
                err = None if task.cancelled() else task.exception()
                raise PodiumError(f"embedded {name} stopped: {err!r}")

    async def stop(self) -> None:
        for name, app in reversed(self.apps):
            if name in self.waits:
                with contextlib.suppress(Exception):
                    await app.stop()
                with contextlib.suppress(BaseException):
                    await self.waits[name]


async def run_embedded(config: PipelineConfig, init: Path, say: Say) -> dict[str, Any]:
    """The embedded deployment: the apps on one in-process bus, in this process."""
    say(f"[embedded] starting orchestrator, {config.workers} sub-agent workers, reward, learner")
    bus = InProcBus()
    await bus.start()
    cpu = LoopCpu()
    run_dir = config.work_dir / "embedded"
    learner = learner_parts(config, init, run_dir)
    deployment = Embedded(embedded_apps(bus, config, learner))
    loads = LoadedVersions()
    with cpu.installed(), loads.attached():
        try:
            await deployment.start()
            stage = Stage(
                "embedded",
                Load(bus, "embedded", cycle_tasks(config.tasks, config.seed), config.seed),
                Watch(bus, "embedded"),
                deployment.check,
                lambda: cpu.total("orchestrator"),
                time.process_time,
                lambda: dict(loads.loaded),
                versions_of(bus, learner, init, run_dir),
                config.timeout_s,
            )
            result = await measure(stage, config, say)
            result["charged_cpu_s"] = {k or "bench": round(v, 3) for k, v in cpu.by_service.items()}
            return result
        finally:
            await deployment.stop()
            await bus.stop()


async def run_kafka(config: PipelineConfig, init: Path, say: Say) -> dict[str, Any]:
    """The distributed deployment: every service its own process on the broker."""
    cycle = CycleConfig(
        work_dir=config.work_dir, bus=config.bus, stop_timeout_s=config.stop_timeout_s
    )
    run_dir = config.work_dir / "kafka-run"
    async with connection(cycle, say) as conn:
        bus = KafkaBus(conn.admin)
        await bus.start()
        tag = uuid.uuid4().hex[:8]
        learner = learner_parts(config, init, run_dir)
        services, at_end = process_envs(config, learner, tag)
        deploy = Deployment(cycle, conn, run_dir, learner[2].public_path)
        try:
            await create_topics(bus)
            await bus.position_groups_at_end(at_end)
            say(
                f"[kafka] starting orchestrator, {config.workers} sub-agent workers, reward, learner"
            )
            for name, module, principal, env in services:
                await deploy.start_service(name, module, principal, env)
            procs = deploy.processes.procs
            orchestrator = procs["orchestrator"].pid
            stage = Stage(
                "kafka",
                Load(bus, f"pipeline{tag}", cycle_tasks(config.tasks, config.seed), config.seed),
                Watch(bus, f"pipeline{tag}"),
                deploy.check,
                lambda: process_cpu_s(orchestrator),
                lambda: sum(process_cpu_s(p.pid) for p in procs.values()),
                lambda: loaded_from_log(deploy.processes.log_tail("orchestrator", 10**8)),
                versions_of(bus, learner, init, run_dir),
                config.timeout_s,
            )
            result = await measure(stage, config, say)
            result["exit_codes"] = await deploy.stop()
            return result
        finally:
            await deploy.stop()
            await bus.stop()


def initial_policy(config: PipelineConfig, say: Say) -> Path:
    """``--checkpoint``, or a behaviour clone of cpls (:func:`podium_app.bootstrap.behaviour_clone`,
    as ``podium bench cycle`` makes its initial policy)."""
    if config.checkpoint is not None:
        return config.checkpoint
    say("no --checkpoint:")
    return behaviour_clone(config.work_dir, config.seed, say)


def verdicts(kafka: dict[str, Any], embedded: dict[str, Any]) -> dict[str, Any]:
    """Issue 17's acceptance targets of the pipeline and whether each is met."""
    ratio = kafka["decisions_per_s_per_core"] / embedded["decisions_per_s_per_core"]
    p99 = kafka["policy_update_to_first_session_ms"]["p99"]
    return {
        "kafka_over_embedded_per_core": round(ratio, 3),
        "per_core_at_least_half_of_embedded": ratio >= 0.5,
        "pickup_p99_ms": p99,
        "pickup_p99_within_1s": p99 <= 1000.0,
    }


async def run_all(config: PipelineConfig, init: Path, say: Say) -> dict[str, Any]:
    """Both deployments on the same load (embedded first), the result JSON."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    if main is not None:
        # SIGTERM cancels the run, so every finally stops what it started.
        loop.add_signal_handler(signal.SIGTERM, main.cancel)
    for name in ("embedded", "kafka-run"):
        shutil.rmtree(config.work_dir / name, ignore_errors=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    embedded = await run_embedded(config, init, say)
    kafka = await run_kafka(config, init, say)
    return {
        "kafka": kafka,
        "embedded": embedded,
        "policy_update_to_first_session_ms": kafka["policy_update_to_first_session_ms"],
        "verdicts": verdicts(kafka, embedded),
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
        | {"initial_policy": str(init), "cpus": os.cpu_count()},
    }


__all__ = [
    "SERVICE",
    "LoopCpu",
    "PipelineConfig",
    "initial_policy",
    "percentile",
    "process_cpu_s",
    "run_all",
    "summarise",
    "validate",
]
