"""``podium train --bus kafka://HOST:PORT``: the same training, each service its own process.

::

    driver --TaskSubmitted--> orchestrator_svc --SubtaskAssigned--> subagent_svc × N
                                  |      ^  <------SubtaskResult------------+
                                  |      +--PolicyUpdated (hot swap)---------------+
                                  +--Trajectory--> reward_svc --ScoredTrajectory--> learner_svc
    driver <--ScoredTrajectory / PolicyUpdated / SubtaskResult (its own consumer groups)

The driver starts (or, with ``spawn=False``, expects already running) ``python -m
orchestrator_svc`` (``PODIUM_POLICY=learned``), ``workers`` × ``python -m subagent_svc`` (one
consumer group: more processes, more partitions worked in parallel), ``python -m reward_svc``
and ``python -m learner_svc`` (``PODIUM_LEARNER_MODE=swarm``), all with ``PODIUM_BUS`` set.
It never calls into a service: it only publishes ``TaskSubmitted`` events and reads what the
services publish.

1. The starting policy (a seeded fresh network, or behaviour cloning from cpls done here) is
   saved as a safetensors file and given to the learner (``PODIUM_LEARNER_INIT``), which
   publishes and announces it as version 0.
2. Every consumer group of the run is created at the current end of its topics before any
   process starts, so no process can miss an event published after that moment, whenever it
   joins (and none replays older runs' events from a shared broker).
3. A probe session confirms the whole loop (orchestrator on version 0, workers, reward
   service) before anything is measured.
4. Per iteration: at evaluation points, the fixed evaluation set (same tasks, same seeds for
   every version: common random numbers) runs with argmax actions; then
   ``sessions_per_iteration`` training sessions (``submitted_by = "trainer:<run>"``, so the
   orchestrator samples) are submitted with tasks drawn from the curriculum stage; the learner
   trains on them once they are scored and announces the next version; the driver follows it.
5. Latency / lower bound is computed per version from the trajectories the driver reads back,
   written to ``summary.json``; every process the driver started is stopped on the way out
   (SIGTERM, then SIGKILL after ``stop_timeout_s``), whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

import podium
from podium import topics
from podium.bus.base import Record, TopicSpec
from podium.bus.consumer import EventConsumer, EventPublisher
from podium.bus.kafka import KafkaBus, KafkaConfig, bus_error
from podium.codec import unpack_as
from podium.envs.swarm import EnvConfig, SwarmEnv, TaskSpec, default_pool
from podium.envs.swarm.generator import generate_suite, held_out_split
from podium.envs.swarm.trajectory import task_to_proto
from podium.errors import ConfigError, PodiumError
from podium.train.agent import SwarmAgent
from podium.train.learn import SwarmPPOConfig, behaviour_cloning
from podium.train.policy import MODEL_NAME, save_policy
from podium.train.rollout import Job, run_episodes
from podium.v1 import envelope_pb2, reward_pb2, subtask_pb2, task_pb2

_log = logging.getLogger(__name__)

SERVICES_ROOT = Path(podium.__file__).resolve().parents[1]
"""Directory holding the service packages (the repository root), put on their PYTHONPATH."""


@dataclass(frozen=True, slots=True)
class DistributedConfig:
    """Settings of a training run with every service in its own process."""

    bus: str
    """``kafka://HOST:PORT[,HOST:PORT][?option=value...]``, passed to every process."""
    run_dir: Path = Path("runs/kafka")
    """Where the starting policy, published versions, the learner's checkpoint, process logs,
    TensorBoard logs and ``summary.json`` go (it must be readable by every process)."""
    workers: int = 2
    """``python -m subagent_svc`` processes (one consumer group)."""
    spawn: bool = True
    """Start the services; False: they already run against the same broker (orchestrator with
    ``PODIUM_POLICY=learned``, learner with ``PODIUM_LEARNER_MODE=swarm``)."""
    seed: int = 0
    """Seed of the task suite, the starting network and the sessions."""
    suite_size: int = 60
    """Generated tasks for training and evaluation."""
    sizes: tuple[int, int] = (4, 12)
    """Subtask counts of generated tasks."""
    curriculum: tuple[int, ...] = (8, 12)
    """Largest task size of each curriculum stage; stages split the iterations evenly."""
    eval_fraction: float = 0.2
    """Share of the suite held out for evaluation (never trained on)."""
    eval_tasks: int = 8
    """Evaluation tasks (from the held-out share)."""
    eval_seeds: int = 2
    """Sessions per evaluation task (fixed seeds, the same for every version)."""
    eval_every: int = 5
    """Iterations between evaluations (version 0 and the last version are always evaluated)."""
    iterations: int = 10
    """PPO iterations, one policy version each."""
    sessions_per_iteration: int = 32
    """Training sessions per iteration (the learner's batch)."""
    init: str = "scratch"
    """Starting policy: ``scratch`` (a seeded fresh network) or ``bc`` (behaviour cloning from
    cpls, run in the driver)."""
    bc_epochs: int = 4
    """Behaviour-cloning epochs when ``init`` is ``bc``."""
    learning_rate: float = 3e-4
    """The learner's Adam learning rate (cosine to a tenth of it over the run)."""
    max_policy_lag: int = 1
    """The learner's η."""
    max_subtasks: int = 64
    """Environment slot count S, the same in the driver, the learner and the orchestrator."""
    timeout_s: float = 120.0
    """Longest wait for any one step (a version, a batch of sessions, a process to be ready)."""
    stop_timeout_s: float = 30.0
    """How long a process may take to stop after SIGTERM before it is killed."""
    python: str = sys.executable
    """Interpreter that runs the services."""

    def __post_init__(self) -> None:
        if not self.bus.startswith("kafka://"):
            raise ConfigError(f"--bus: expected kafka://HOST:PORT, got {self.bus!r}")
        for name in ("workers", "iterations", "sessions_per_iteration", "eval_tasks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.init not in ("scratch", "bc"):
            raise ConfigError(f"init must be 'scratch' or 'bc', got {self.init!r}")


@dataclass(slots=True)
class VersionStats:
    """What the driver measured for one policy version."""

    version: int
    """Policy version."""
    eval_ratio: float | None = None
    """Mean latency / lower bound of the evaluation sessions (argmax), None if not evaluated."""
    eval_completion: float | None = None
    """Completion rate of the evaluation sessions."""
    eval_sessions: int = 0
    """Evaluation sessions behind the figures."""
    train_ratio: float | None = None
    """Mean latency / lower bound of the training sessions it sampled."""
    train_sessions: int = 0
    """Training sessions it ran."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The learner's metrics announced with the version."""


@dataclass(slots=True)
class DistributedResult:
    """What :func:`train_distributed` measured."""

    run_dir: Path
    versions: list[VersionStats]
    """Per version, in order."""
    results_per_worker: dict[str, int]
    """Sub-agent results of this run's sessions, by the worker (envelope producer) that sent them."""
    exit_codes: dict[str, int]
    """Exit status of every process the driver started."""
    wall_s: float

    def evaluated(self) -> list[VersionStats]:
        """Versions with an evaluation, in order."""
        return [v for v in self.versions if v.eval_ratio is not None]


Progress = Callable[[str, dict[str, float]], None]
"""Callback for progress display: (phase, figures)."""


# --------------------------------------------------------------------------- Kafka set-up


async def position_groups_at_end(config: KafkaConfig, groups: Mapping[str, Sequence[str]]) -> None:
    """Commit, for each new consumer group, the current end offset of each of its topics.

    A group that joins later then starts exactly there: it neither misses an event published
    after this call (as ``auto_offset_reset=latest`` can, when a member resolves its position
    only after the event) nor replays older runs (as ``earliest`` does on a shared broker).
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    for group, names in groups.items():
        consumer = AIOKafkaConsumer(
            group_id=group, enable_auto_commit=False, **config.client_kwargs()
        )
        try:
            await consumer.start()
            tps: list[TopicPartition] = []
            # Topics created a moment ago take a little while to show in the metadata.
            for _ in range(40):
                await consumer._client.force_metadata_update()
                parts = {t: consumer.partitions_for_topic(t) for t in names}
                if all(parts.values()):
                    tps = [TopicPartition(t, p) for t, ps in parts.items() for p in ps or ()]
                    break
                await asyncio.sleep(0.25)
            if not tps:
                raise ConfigError(f"group {group}: topics {list(names)} do not exist on the broker")
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            await consumer.commit({tp: OffsetAndMetadata(off, "") for tp, off in ends.items()})
        except PodiumError:
            raise
        except Exception as exc:
            raise bus_error(f"positioning group {group}", exc) from exc
        finally:
            await consumer.stop()


# --------------------------------------------------------------------------- processes


class ServiceProcesses:
    """The service processes this driver started; stops them all, whatever happens."""

    def __init__(self, log_dir: Path, stop_timeout_s: float) -> None:
        self.log_dir = log_dir
        self.stop_timeout_s = stop_timeout_s
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self.exit_codes: dict[str, int] = {}

    async def start(self, name: str, python: str, module: str, env: Mapping[str, str]) -> None:
        """``python -m module`` with ``env``; stdout and stderr to ``<log_dir>/<name>.log``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("wb")
        self._logs[name] = log
        self.procs[name] = await asyncio.create_subprocess_exec(
            python,
            "-m",
            module,
            env=dict(env),
            cwd=SERVICES_ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )

    def log_tail(self, name: str, chars: int = 2000) -> str:
        """The end of a process's log."""
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def check(self) -> None:
        """Raise if a process has ended (a service must run until the driver stops it)."""
        for name, proc in self.procs.items():
            if proc.returncode is not None:
                raise PodiumError(
                    f"{name} exited with status {proc.returncode}:\n{self.log_tail(name)}"
                )

    async def stop(self) -> dict[str, int]:
        """SIGTERM every process, wait up to the stop timeout, SIGKILL what is left."""
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                code = await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
            except TimeoutError:
                _log.error("%s did not stop within %.0fs; killing it", name, self.stop_timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                code = await proc.wait()
            self.exit_codes[name] = code
        for log in self._logs.values():
            log.close()
        return dict(self.exit_codes)


# --------------------------------------------------------------------------- the driver


class _Driver:
    """Submits sessions and reads back what the services publish (see the module docstring)."""

    def __init__(self, config: DistributedConfig, bus: KafkaBus, tag: str) -> None:
        self.config = config
        self.bus = bus
        self.tag = tag
        self.artifacts = (config.run_dir / "artifacts").resolve()
        self.publisher = EventPublisher(bus, producer_name=f"podium-train/{tag}")
        self.prefixes = (f"trainer:{tag}", f"eval:{tag}", f"probe:{tag}")
        self.sessions: set[str] = set()
        self.waiting: dict[str, asyncio.Future[reward_pb2.ScoredTrajectory]] = {}
        self.versions: dict[int, reward_pb2.PolicyUpdated] = {}
        self.version_seen = asyncio.Condition()
        self.producers: Counter[str] = Counter()
        self.processes: ServiceProcesses | None = None

    # -- consumers --------------------------------------------------------------------

    async def on_scored(self, env: envelope_pb2.Envelope, _rec: Record) -> None:
        scored = unpack_as(env, reward_pb2.ScoredTrajectory)
        fut = self.waiting.get(scored.trajectory.session_id)
        if fut is not None and not fut.done():
            fut.set_result(scored)

    async def on_policy(self, env: envelope_pb2.Envelope, _rec: Record) -> None:
        event = unpack_as(env, reward_pb2.PolicyUpdated)
        if event.model_name != MODEL_NAME:
            return
        if self.config.spawn and not event.uri.startswith(self.artifacts.as_uri()):
            return  # another run's learner on a shared broker
        self.versions[int(event.version)] = event
        async with self.version_seen:
            self.version_seen.notify_all()

    async def on_result(self, env: envelope_pb2.Envelope, _rec: Record) -> None:
        result = unpack_as(env, subtask_pb2.SubtaskResult)
        if result.session_id in self.sessions:
            self.producers[env.producer] += 1

    # -- waiting ------------------------------------------------------------------------

    async def _guard(self, what: str, fut: asyncio.Future[Any], timeout_s: float) -> Any:
        """Await ``fut`` while checking every half second that the processes still run."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.processes is not None:
                self.processes.check()
            left = deadline - time.monotonic()
            if left <= 0:
                fut.cancel()
                raise PodiumError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            try:
                return await asyncio.wait_for(asyncio.shield(fut), min(0.5, left))
            except TimeoutError:
                continue

    async def wait_version(self, version: int) -> reward_pb2.PolicyUpdated:
        """The announcement of ``version`` (or a later one; the first one in external mode)."""

        async def seen() -> reward_pb2.PolicyUpdated:
            async with self.version_seen:
                await self.version_seen.wait_for(lambda: any(v >= version for v in self.versions))
            return self.versions[min(v for v in self.versions if v >= version)]

        task = asyncio.ensure_future(seen())
        result: reward_pb2.PolicyUpdated = await self._guard(
            f"policy version {version}", task, self.config.timeout_s
        )
        return result

    async def run_sessions(
        self, jobs: Sequence[Job], submitted_by: str
    ) -> list[reward_pb2.ScoredTrajectory]:
        """Submit one TaskSubmitted per job; their scored trajectories, in job order."""
        loop = asyncio.get_running_loop()
        ids = []
        for job in jobs:
            sid = str(uuid.uuid4())
            self.sessions.add(sid)
            self.waiting[sid] = loop.create_future()
            ids.append(sid)
            await self.publisher.publish(
                topics.TASKS,
                task_pb2.TaskSubmitted(
                    session_id=sid,
                    task=task_to_proto(job.task),
                    submitted_by=submitted_by,
                    seed=job.seed,
                ),
                key=sid,
                idempotency_key=sid,
            )
        gathered = asyncio.ensure_future(asyncio.gather(*(self.waiting[s] for s in ids)))
        try:
            out: list[reward_pb2.ScoredTrajectory] = await self._guard(
                f"{len(jobs)} sessions ({submitted_by})", gathered, self.config.timeout_s
            )
        finally:
            for s in ids:
                self.waiting.pop(s, None)
        return out


def _ratio(scored: Sequence[reward_pb2.ScoredTrajectory]) -> float:
    return float(np.mean([s.trajectory.latency / s.trajectory.lower_bound for s in scored]))


def _completion(scored: Sequence[reward_pb2.ScoredTrajectory]) -> float:
    return float(np.mean([s.trajectory.completed for s in scored]))


def _initial_policy(
    config: DistributedConfig, train_tasks: list[TaskSpec], rng: np.random.Generator
) -> tuple[Path, dict[str, float]]:
    """The starting network (fresh, or cloned from cpls), saved as a policy file."""
    pool = default_pool()
    env_cfg = EnvConfig(max_subtasks=config.max_subtasks, invalid_action="raise")
    envs = SwarmEnv.replicas(16, train_tasks, pool, env_cfg)
    torch.manual_seed(config.seed)
    agent = SwarmAgent(envs[0].layout)
    figures: dict[str, float] = {}
    if config.init == "bc":
        demos, _ = run_episodes(
            envs, [Job(t, int(rng.integers(1 << 31))) for t in train_tasks], rule="cpls"
        )
        history = behaviour_cloning(agent, demos, SwarmPPOConfig(), rng, epochs=config.bc_epochs)
        figures["bc_accuracy"] = history[-1]["bc_accuracy"]
    ref = save_policy(
        agent.net,
        config.run_dir / "init",
        0,
        tuple(envs[0].layout.agents),
        max_subtasks=str(config.max_subtasks),
        init=config.init,
    )
    return ref.path.resolve(), figures


def _service_env(config: DistributedConfig, tag: str, init: Path) -> dict[str, dict[str, str]]:
    """Module and environment of every process, by process name."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")}
    base["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SERVICES_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    base["PODIUM_BUS"] = config.bus
    run = config.run_dir.resolve()
    specs: dict[str, dict[str, str]] = {
        "orchestrator": {
            "module": "orchestrator_svc",
            "PODIUM_GROUP_ID": f"{tag}.orchestrator",
            "PODIUM_INSTANCE": f"{tag}-orchestrator",
            "PODIUM_POLICY": "learned",
            "PODIUM_POLICY_SAMPLE_FROM": "trainer",
            "PODIUM_POLICY_MAX_SUBTASKS": str(config.max_subtasks),
            "PODIUM_GRPC_HOST": "127.0.0.1",
            "PODIUM_GRPC_PORT": "0",
        },
        "reward": {
            "module": "reward_svc",
            "PODIUM_REWARD_GROUP": f"{tag}.reward",
            "PODIUM_REWARD_TRANSACTIONAL_ID": f"{tag}-reward-0",
            "PODIUM_REWARD_INSTANCE": f"{tag}-reward",
        },
        "learner": {
            "module": "learner_svc",
            "PODIUM_LEARNER_MODE": "swarm",
            "PODIUM_GROUP_ID": f"{tag}.learner",
            "PODIUM_INSTANCE": f"{tag}-learner",
            "PODIUM_LEARNER_ARTIFACTS": str(run / "artifacts"),
            "PODIUM_LEARNER_CHECKPOINT_DIR": str(run / "learner"),
            "PODIUM_LEARNER_INIT": str(init),
            "PODIUM_LEARNER_BATCH": str(config.sessions_per_iteration),
            "PODIUM_LEARNER_MAX_LAG": str(config.max_policy_lag),
            "PODIUM_LEARNER_LR": repr(config.learning_rate),
            "PODIUM_LEARNER_LR_END": repr(config.learning_rate / 10),
            "PODIUM_LEARNER_TOTAL_UPDATES": str(config.iterations),
            "PODIUM_LEARNER_SEED": str(config.seed),
            "PODIUM_LEARNER_MAX_SUBTASKS": str(config.max_subtasks),
            "PODIUM_LEARNER_TB": str(run / "tb"),
            "PODIUM_LEARNER_LOG_EVERY": "1000",
        },
    }
    for i in range(1, config.workers + 1):
        specs[f"worker-{i}"] = {
            "module": "subagent_svc",
            "PODIUM_GROUP_ID": f"{tag}.subagent",
            "PODIUM_INSTANCE": f"{tag}-worker-{i}",
        }
    return {name: {**base, **spec} for name, spec in specs.items()}


def _groups(tag: str) -> dict[str, list[str]]:
    """Every consumer group of the run and its topics (see :func:`position_groups_at_end`)."""
    return {
        f"{tag}.orchestrator.tasks": [topics.TASKS],
        f"{tag}.orchestrator.results": [topics.SUBTASK_RESULTS],
        f"{tag}.orchestrator.scores": [topics.SCORED_TRAJECTORIES],
        f"{tag}.orchestrator.policy.{tag}-orchestrator": [topics.POLICY_UPDATES],
        f"{tag}.subagent": [topics.SUBTASKS_ASSIGNED],
        f"{tag}.reward": [topics.TRAJECTORIES],
        f"{tag}.learner": [topics.SCORED_TRAJECTORIES],
        f"{tag}.driver.scored": [topics.SCORED_TRAJECTORIES],
        f"{tag}.driver.policy": [topics.POLICY_UPDATES],
        f"{tag}.driver.results": [topics.SUBTASK_RESULTS],
    }


async def train_distributed(
    config: DistributedConfig, progress: Progress | None = None
) -> DistributedResult:
    """Run the job (see the module docstring); returns the per-version measurements."""
    t0 = time.perf_counter()
    say = progress or (lambda _phase, _figs: None)
    rng = np.random.default_rng(config.seed)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    cfg_doc = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    (config.run_dir / "config.json").write_text(json.dumps(cfg_doc, indent=2))
    tag = f"train-{uuid.uuid4().hex[:10]}"
    suite = generate_suite(config.suite_size, seed=config.seed + 1, sizes=config.sizes)
    train_tasks, held_out = held_out_split(suite, config.eval_fraction, salt="val")
    if not train_tasks or not held_out:
        raise ConfigError("suite_size too small for a training and an evaluation split")
    eval_jobs = [
        Job(t, 90_000 + s) for t in held_out[: config.eval_tasks] for s in range(config.eval_seeds)
    ]

    kafka = KafkaConfig.from_url(config.bus)
    bus = KafkaBus(kafka)
    await bus.start()
    driver = _Driver(config, bus, tag)
    processes = ServiceProcesses(config.run_dir / "logs", config.stop_timeout_s)
    consumers: list[EventConsumer] = []
    tasks: list[asyncio.Task[None]] = []
    stats: dict[int, VersionStats] = {}
    try:
        await bus.create_topics([TopicSpec(t, kafka.default_partitions) for t in topics.ALL])
        groups = _groups(tag)
        if config.spawn:
            await position_groups_at_end(kafka, groups)
        else:
            # External services: position only the driver's scored/results groups; its policy
            # group reads from the beginning to find the version currently served.
            await position_groups_at_end(
                kafka, {g: t for g, t in groups.items() if ".driver." in g and "policy" not in g}
            )
        for group, handler in (
            ("scored", driver.on_scored),
            ("policy", driver.on_policy),
            ("results", driver.on_result),
        ):
            consumer = EventConsumer(
                bus,
                groups[f"{tag}.driver.{group}"],
                f"{tag}.driver.{group}",
                handler,
                producer_name=f"podium-train/{tag}",
                max_batch=200,
            )
            await consumer.start()
            consumers.append(consumer)
            tasks.append(asyncio.create_task(consumer.run(), name=f"driver.{group}"))

        start_version = 0
        if config.spawn:
            say("init", {})
            init_path, init_figs = _initial_policy(config, train_tasks, rng)
            say("init", init_figs)
            driver.processes = processes
            for name, env in _service_env(config, tag, init_path).items():
                await processes.start(name, config.python, env.pop("module"), env)
            say("start", {"processes": float(len(processes.procs))})
        first = await driver.wait_version(0)
        if not config.spawn:
            # External learner: its announcements are read from the beginning; continue
            # from the newest one.
            await asyncio.sleep(2.0)
            first = driver.versions[max(driver.versions)]
            start_version = int(first.version)
        # Probe: the whole loop answers, and the orchestrator decides with the first version.
        probe = [Job(min(held_out, key=lambda t: len(t.subtasks)), 1)]
        for _attempt in range(60):
            got = await driver.run_sessions(probe, f"probe:{tag}")
            if got[0].trajectory.policy_version == str(start_version):
                break
            await asyncio.sleep(0.5)
        else:
            raise PodiumError(f"the orchestrator never served version {start_version}")

        async def evaluate(version: int) -> None:
            # Re-run sessions that started before the orchestrator swapped to ``version``.
            done: dict[int, reward_pb2.ScoredTrajectory] = {}
            for _attempt in range(10):
                todo = [i for i in range(len(eval_jobs)) if i not in done]
                if not todo:
                    break
                got = await driver.run_sessions([eval_jobs[i] for i in todo], f"eval:{tag}")
                for i, s in zip(todo, got, strict=True):
                    if s.trajectory.policy_version == str(version):
                        done[i] = s
                if len(done) < len(eval_jobs):
                    await asyncio.sleep(0.5)
            if len(done) < len(eval_jobs):
                raise PodiumError(f"evaluation sessions never ran on version {version}")
            scored = [done[i] for i in range(len(eval_jobs))]
            vs = stats.setdefault(version, VersionStats(version))
            vs.eval_ratio, vs.eval_completion = _ratio(scored), _completion(scored)
            vs.eval_sessions = len(scored)
            say("eval", {"version": float(version), "ratio": vs.eval_ratio})

        version = start_version
        stats[version] = VersionStats(version, metrics=dict(first.metrics))
        stages = list(config.curriculum)
        for it in range(config.iterations):
            if it % config.eval_every == 0:
                await evaluate(version)
            stage = stages[min(it * len(stages) // config.iterations, len(stages) - 1)]
            pool_tasks = [t for t in train_tasks if len(t.subtasks) <= stage] or train_tasks
            jobs = [
                Job(pool_tasks[int(i)], int(rng.integers(1, 1 << 31)))
                for i in rng.integers(len(pool_tasks), size=config.sessions_per_iteration)
            ]
            scored = await driver.run_sessions(jobs, f"trainer:{tag}")
            for s in scored:
                v = s.trajectory.policy_version
                if v.isdigit():
                    vs = stats.setdefault(int(v), VersionStats(int(v)))
                    vs.train_sessions += 1
            own = [s for s in scored if s.trajectory.policy_version == str(version)]
            if own:
                stats[version].train_ratio = _ratio(own)
            update = await driver.wait_version(version + 1)
            version = int(update.version)
            stats.setdefault(version, VersionStats(version)).metrics = dict(update.metrics)
            say(
                "ppo",
                {
                    "iteration": float(it + 1),
                    "iterations": float(config.iterations),
                    "version": float(version),
                    "ratio": stats[version - 1].train_ratio or math.nan,
                    "reward": float(update.metrics.get("reward_total", math.nan)),
                },
            )
        await evaluate(version)
    finally:
        for c in consumers:
            with contextlib.suppress(Exception):
                await c.stop(timeout_s=5.0)
        for t in tasks:
            t.cancel()
            with contextlib.suppress(BaseException):
                await t
        exit_codes = await processes.stop()
        await bus.stop()
    result = DistributedResult(
        run_dir=config.run_dir,
        versions=[stats[v] for v in sorted(stats)],
        results_per_worker=dict(driver.producers),
        exit_codes=exit_codes,
        wall_s=time.perf_counter() - t0,
    )
    summary = {
        "versions": [asdict(v) for v in result.versions],
        "results_per_worker": result.results_per_worker,
        "exit_codes": result.exit_codes,
        "wall_s": result.wall_s,
        "eval_sessions_per_version": len(eval_jobs),
    }
    (config.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return result


__all__ = [
    "DistributedConfig",
    "DistributedResult",
    "ServiceProcesses",
    "VersionStats",
    "position_groups_at_end",
    "train_distributed",
]
