"""``podium bench rollout``: what safe shipping costs, in two figures.

**Shadow throughput** — the rollout controller decides promotion on *paired twins*: for each
live session, the candidate and the incumbent each run a twin of it in the simulator (same
task, pool and seed). This phase runs :meth:`podium.rollout.TwinEvaluator.paired` on a seeded
suite (``--sessions`` pairs over tasks from :func:`podium.envs.swarm.generator.generate_suite`
on the shipped pool): the candidate is a learned policy (a freshly initialised
``SwarmPolicyNet``, deciding greedily as live traffic does: its cost per decision is that of
any trained version of the same shape), the incumbent the cpls rule engine. Both twins of a
pair count, so one pair is 2 twin sessions. *Per core* is per CPU-second: twin sessions divided
by the process CPU time of the timed evaluation (the cores it actually used, measured), which a
busy machine does not distort the way wall time does (the evaluation runs on one Python thread
with ``--torch-threads`` intra-op threads, default 1; the wall-clock rate is reported beside).

**Promote propagation** — ``--replicas`` orchestrator replicas' :class:`RolloutFollower` s
follow the rollout topic (each in its own consumer group, as in production); the bench writes
``--sessions`` successive rollout states the way the controller does (the state and its
transition in one transaction, each made by :mod:`podium.rollout.machine`: propose, then
operator-forced steps through offline, shadow, 1/5/20/100% and promotion, again and again) and
measures, for each, the time from just before the write until every replica has applied it,
i.e. routes new sessions by it. ``--bus`` is ``inproc://`` (default: the in-process bus) or
``kafka://...``; on Kafka the states go to a private topic ``podium.rollout.v1.bench-<id>``,
never to the live rollout topic of whatever deployment shares the broker.

JSON (``--json OUT``)::

    {"twin_sessions_per_s_per_core": X,
     "promote_propagation_ms": {"p50": X, "p99": X},
     "config": {...}, "twins": {...}, "propagation": {...}}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.errors import ConfigError, PodiumError
from podium_app.commands import fail

if TYPE_CHECKING:
    from orchestrator_svc.arms import RolloutFollower
    from podium.bus import Bus
    from podium.envs.swarm import TaskSpec
    from podium.envs.swarm.spec import PoolSpec
    from podium.policy.network import SwarmPolicyNet
    from podium.v1 import rollout_pb2

PROG = "podium bench rollout"
WRITER = "bench-rollout"
"""Writer name on the states the bench writes."""
APPLY_TIMEOUT_S = 30.0
"""How long one change may take to reach every replica before the bench gives up."""


@dataclass(frozen=True, slots=True)
class TwinFigures:
    """The shadow evaluation's measurement."""

    pairs: int
    """Twin pairs evaluated (candidate and incumbent on one case)."""
    twin_sessions: int
    """Twin sessions run: 2 per pair."""
    wall_s: float
    """Wall seconds of the timed evaluation (after a warm-up)."""
    cpu_s: float
    """Process CPU seconds over the same span."""
    threads: int
    """torch intra-op threads (the evaluation itself runs on one Python thread)."""
    twin_sessions_per_s: float
    """Twin sessions per wall second."""
    twin_sessions_per_s_per_core: float
    """Twin sessions per CPU-second of the process (``twin_sessions / cpu_s``)."""
    paired_mean: float
    """Mean of candidate - incumbent over the pairs (a sanity figure, not a verdict)."""


@dataclass(frozen=True, slots=True)
class PropagationFigures:
    """The promote propagation measurement."""

    changes: int
    """State changes timed."""
    replicas: int
    """Followers that had to apply each one."""
    bus: str
    """``inproc`` or ``kafka``."""
    p50_ms: float
    """Median time from the write until every replica applied the state, milliseconds."""
    p99_ms: float
    """99th percentile of the same."""
    max_ms: float
    """Slowest change."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium bench rollout``."""
    parser.add_argument("--json", metavar="OUT", help="write the result as JSON here")
    parser.add_argument(
        "--sessions",
        type=int,
        default=200,
        help="twin pairs evaluated, and rollout state changes timed (default 200)",
    )
    parser.add_argument(
        "--replicas", type=int, default=3, help="orchestrator replicas following the state"
    )
    parser.add_argument(
        "--bus", default="inproc://", help="inproc:// (default) or kafka://HOST:PORT"
    )
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="torch intra-op threads for the twins"
    )
    parser.add_argument("--batch", type=int, default=32, help="twins run in lock-step at once")
    parser.add_argument("--seed", type=int, default=0)


# -- shadow twins ----------------------------------------------------------------------------


def measure_twins(pairs: int, seed: int, threads: int, batch: int) -> TwinFigures:
    """Time ``TwinEvaluator.paired`` (learned candidate vs cpls) on ``pairs`` seeded cases."""
    import numpy as np
    import torch

    from podium.envs.swarm.generator import generate_suite
    from podium.envs.swarm.spec import default_pool
    from podium.rollout.twins import TwinCase, TwinEvaluator, learned_twin, rule_twin

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    pool = default_pool()
    tasks = generate_suite(max(1, min(pairs, 50)), seed, sizes=(5, 30))
    cases = [
        TwinCase(
            session_id=f"bench-{seed}-{i}", task=tasks[i % len(tasks)], seed=seed * 100_003 + i
        )
        for i in range(pairs)
    ]
    evaluator = TwinEvaluator(pool, batch=batch)
    candidate = learned_twin("1", _fresh_net(pool, tasks[0], seed), agents=pool.agent_names())
    incumbent = rule_twin("rules:cpls")
    evaluator.paired(candidate, incumbent, cases[: min(4, pairs)])  # warm-up: lazy inits, caches
    cpu0, t0 = time.process_time(), time.perf_counter()
    diffs = evaluator.paired(candidate, incumbent, cases)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    per_s = 2 * pairs / wall
    return TwinFigures(
        pairs=pairs,
        twin_sessions=2 * pairs,
        wall_s=wall,
        cpu_s=cpu,
        threads=threads,
        twin_sessions_per_s=per_s,
        twin_sessions_per_s_per_core=2 * pairs / max(cpu, 1e-9),
        paired_mean=float(np.mean(diffs)),
    )


def _fresh_net(pool: PoolSpec, task: TaskSpec, seed: int) -> SwarmPolicyNet:
    """An untrained policy network for ``pool`` (as ``podium train`` builds its agent before
    behaviour cloning); the observation layout does not depend on the task."""
    import torch

    from podium.envs.swarm import EnvConfig, SwarmEnv
    from podium.policy.agent import SwarmAgent

    torch.manual_seed(seed)
    net = SwarmAgent(SwarmEnv(task, pool, EnvConfig()).layout).net
    net.eval()
    return net


# -- promote propagation ---------------------------------------------------------------------


def next_change(
    state: rollout_pb2.RolloutState, n: int, now: datetime
) -> tuple[rollout_pb2.RolloutState, rollout_pb2.RolloutTransition]:
    """The controller's next change in an endless walk: propose a version when idle, else
    force the candidate one step (offline -> shadow -> 1 -> 5 -> 20 -> 100% -> promoted)."""
    from podium.rollout import machine
    from podium.v1 import rollout_pb2

    if state.stage == rollout_pb2.ROLLOUT_STAGE_IDLE:
        return machine.propose(state, str(n), "bench", "operator:bench", now)
    return machine.advance(
        state, rollout_pb2.Evidence(summary="bench"), now, actor="operator:bench", override=True
    )


class StateWriter:
    """Writes a state and its transition in one transaction (Kafka) or back to back
    (the in-process bus has no pending transactions: a publish is visible at once)."""

    def __init__(self, bus: Bus, topic: str) -> None:
        self.bus = bus
        self.topic = topic
        self._producer: Any = None

    async def start(self) -> None:
        from podium.bus import KafkaBus

        if isinstance(self.bus, KafkaBus):
            # The controller's principal may only use transactional ids starting "rollout".
            self._producer = self.bus.transactional_producer(
                f"rollout.bench.{uuid.uuid4().hex[:8]}"
            )
            await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def write(
        self, state: rollout_pb2.RolloutState, transition: rollout_pb2.RolloutTransition
    ) -> None:
        from podium.codec import encode_event
        from podium.v1 import rollout_pb2

        # What the controller writes per step: transition, state, and its evidence checkpoint.
        checkpoint = rollout_pb2.ControllerCheckpoint(
            seq=state.seq, writer_epoch=state.writer_epoch
        )
        records = [
            (f"transition:{transition.seq:012d}", transition),
            ("state", state),
            ("checkpoint", checkpoint),
        ]
        encoded = [(k, encode_event(m, producer=WRITER, key=k)[1]) for k, m in records]
        if self._producer is None:
            for key, value in encoded:
                await self.bus.publish(self.topic, value, key=key)
            return
        await self._producer.begin()
        for key, value in encoded:
            await self._producer.publish(self.topic, value, key=key)
        await self._producer.commit()


class Arrivals:
    """When each replica applied each seq; wakes the waiter once all have."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.applied: dict[int, list[float]] = {}
        self.done: dict[int, asyncio.Event] = {}

    def expect(self, seq: int) -> asyncio.Event:
        self.applied[seq] = []
        self.done[seq] = asyncio.Event()
        return self.done[seq]

    def on_state(self, state: rollout_pb2.RolloutState) -> None:
        """A follower's ``on_state``: it routes by ``state`` from now on."""
        times = self.applied.get(state.seq)
        if times is None:
            return
        times.append(time.perf_counter())
        if len(times) >= self.replicas:
            self.done[state.seq].set()


async def _start_followers(
    bus: Bus, topic: str, replicas: int, arrivals: Arrivals
) -> list[tuple[RolloutFollower, asyncio.Task[None]]]:
    from orchestrator_svc.arms import RolloutFollower

    run = uuid.uuid4().hex[:8]
    out = []
    for i in range(replicas):
        follower = RolloutFollower(
            bus, f"bench-rollout.{run}.rollout.{i}", topic=topic, on_state=arrivals.on_state
        )
        await follower.start()
        out.append((follower, asyncio.create_task(follower.run())))
    return out


async def _timed_change(
    writer: StateWriter,
    arrivals: Arrivals,
    state: rollout_pb2.RolloutState,
    transition: rollout_pb2.RolloutTransition,
) -> float:
    """Milliseconds from just before writing ``state`` until every replica applied it."""
    done = arrivals.expect(state.seq)
    t0 = time.perf_counter()
    await writer.write(state, transition)
    try:
        await asyncio.wait_for(done.wait(), APPLY_TIMEOUT_S)
    except TimeoutError:
        got = len(arrivals.applied[state.seq])
        raise PodiumError(
            f"rollout state seq {state.seq} reached {got} of {arrivals.replicas} replicas "
            f"within {APPLY_TIMEOUT_S:g} s"
        ) from None
    return (max(arrivals.applied[state.seq]) - t0) * 1000.0


async def measure_propagation(
    bus: Bus, changes: int, replicas: int, warmup: int = 3
) -> list[float]:
    """Per timed change, milliseconds until all ``replicas`` applied it (``bus`` started)."""
    from podium.bus import KafkaBus, TopicSpec
    from podium.rollout import RolloutSettings, initial_state

    topic = _bench_topic(bus)
    if isinstance(bus, KafkaBus):
        await bus.create_topics(
            [TopicSpec(topic, partitions=1, config=(("cleanup.policy", "compact"),))]
        )
    arrivals = Arrivals(replicas)
    writer = StateWriter(bus, topic)
    await writer.start()
    followers = await _start_followers(bus, topic, replicas, arrivals)
    try:
        state = initial_state(RolloutSettings(), datetime.now(UTC), WRITER)
        out = []
        for n in range(warmup + changes):
            state, transition = next_change(state, n + 1, datetime.now(UTC))
            ms = await _timed_change(writer, arrivals, state, transition)
            if n >= warmup:  # the first changes also wait out the groups' first assignment
                out.append(ms)
        return out
    finally:
        for follower, task in followers:
            await follower.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await writer.stop()


def _bench_topic(bus: Bus) -> str:
    """The topic the bench's states go to: never the live rollout topic of a shared broker."""
    from podium import topics
    from podium.bus import KafkaBus

    if isinstance(bus, KafkaBus):
        return f"{topics.ROLLOUT}.bench-{uuid.uuid4().hex[:8]}"
    return topics.ROLLOUT


async def _propagation(url: str, changes: int, replicas: int) -> PropagationFigures:
    import numpy as np

    from podium.bus import connect, is_kafka_url

    bus = connect(url)
    await bus.start()
    try:
        ms = await measure_propagation(bus, changes, replicas)
    finally:
        await bus.stop()
    a = np.asarray(ms)
    return PropagationFigures(
        changes=changes,
        replicas=replicas,
        bus="kafka" if is_kafka_url(url) else "inproc",
        p50_ms=float(np.percentile(a, 50)),
        p99_ms=float(np.percentile(a, 99)),
        max_ms=float(a.max()),
    )


# -- the command -----------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> None:
    problems: list[str] = []
    for name, low in (("sessions", 1), ("replicas", 1), ("torch_threads", 1), ("batch", 1)):
        if getattr(args, name) < low:
            problems.append(f"--{name.replace('_', '-')} must be >= {low}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        problems.append(f"--json {args.json}: its directory does not exist")
    if problems:
        raise ConfigError("; ".join(problems))
    from podium.bus import connect

    connect(args.bus)  # a bad URL is reported before anything is timed


def result_json(
    twins: TwinFigures, prop: PropagationFigures, args: argparse.Namespace
) -> dict[str, Any]:
    """The documented JSON: the two headline figures first, the details beside them."""
    return {
        "twin_sessions_per_s_per_core": round(twins.twin_sessions_per_s_per_core, 2),
        "promote_propagation_ms": {"p50": round(prop.p50_ms, 3), "p99": round(prop.p99_ms, 3)},
        "config": {
            "sessions": args.sessions,
            "replicas": args.replicas,
            "bus": prop.bus,
            "torch_threads": args.torch_threads,
            "batch": args.batch,
            "seed": args.seed,
            "per_core": "twin sessions per CPU-second of the timed evaluation (process CPU time)",
            "candidate": "fresh SwarmPolicyNet (greedy)",
            "incumbent": "rules:cpls",
        },
        "twins": asdict(twins),
        "propagation": asdict(prop),
    }


def _print(twins: TwinFigures, prop: PropagationFigures) -> None:
    print(
        f"shadow twins: {twins.twin_sessions} sessions ({twins.pairs} pairs, learned vs cpls) in "
        f"{twins.wall_s:.2f} s wall, {twins.cpu_s:.2f} s CPU: "
        f"{twins.twin_sessions_per_s_per_core:,.1f}/s per core (per CPU-second), "
        f"{twins.twin_sessions_per_s:,.1f}/s wall clock"
    )
    print(
        f"promote propagation to {prop.replicas} replicas ({prop.bus}, {prop.changes} changes): "
        f"p50 {prop.p50_ms:.2f} ms, p99 {prop.p99_ms:.2f} ms, max {prop.max_ms:.2f} ms"
    )


def run(args: argparse.Namespace) -> int:
    """Both measurements; 0 done, 2 on bad input, 1 on a failure while measuring."""
    try:
        _check(args)
        twins = measure_twins(args.sessions, args.seed, args.torch_threads, args.batch)
        prop = asyncio.run(_propagation(args.bus, args.sessions, args.replicas))
    except PodiumError as exc:
        return fail(PROG, exc)
    _print(twins, prop)
    if args.json:
        try:
            Path(args.json).write_text(
                json.dumps(result_json(twins, prop, args), indent=2) + "\n", encoding="utf-8"
            )
        except OSError as exc:
            print(f"{PROG}: --json {args.json}: cannot write ({exc.strerror})", file=sys.stderr)
            return 2
    return 0
