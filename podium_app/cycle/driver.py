"""``podium bench cycle``: the drift scenario through the safe-shipping cycle, end to end.

Two runs on the same broker, the same sessions and the same seeds (the frozen one first):

* **frozen**: the initial policy made live and never replaced (no learner: the controller has
  no candidate to propose);
* **continuous**: the same, plus the learner in swarm mode learning from the live sessions and
  publishing candidates, which the controller walks through offline check, shadow and the
  staged rollout every ``--cycle-s``.

Each run: the services as processes (:mod:`podium_app.cycle.deploy`), the initial policy made
live by an operator override, the sub-agents started with the drift's origin placed so that it
bites ``--drift-at-s`` into the load, the load at ``--rate`` for ``--duration-s``
(:mod:`podium_app.cycle.load`), a drain until every session finished, every process stopped
whatever happened. Then the rule engines on the same sessions in the simulator, and the
initial policy there on a statistics store frozen at the drift (the ``frozen_store`` arm:
frozen weights *and* frozen knowledge of the agents, which the frozen run's live store is
not), and the windows table with the verdicts (:mod:`podium_app.cycle.measure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import fmean
from typing import Any

import grpc.aio
import yaml

from learner_svc.algorithms.swarm import SwarmSettings
from podium import topics
from podium.bus import Bus, KafkaBus
from podium.envs.swarm.drift import drift_document, load_drift
from podium.envs.swarm.spec import PoolSpec, pool_to_dict
from podium.errors import PodiumError
from podium.observed import AgentStats
from podium.observed.store import observed_pool
from podium.policy.network import SwarmPolicyNet
from podium.policy.swarm import load_policy, resolve_checkpoint
from podium.v1 import rollout_pb2
from podium_app.bootstrap import (
    announce,
    behaviour_clone,
    make_live,
    next_version,
    publish_initial,
)
from podium_app.cycle.config import RUNS, CycleConfig
from podium_app.cycle.deploy import (
    Connection,
    Deployment,
    connection,
    learner_train_config,
    wait_controller,
)
from podium_app.cycle.load import Submitter, Tail, create_topics
from podium_app.cycle.measure import (
    REFERENCE_ARMS,
    PlannedSession,
    cycle_tasks,
    frozen_store_arm,
    plan_sessions,
    preferred_drift,
    replay_ratios,
    store_at_drift,
    verdicts,
    window_table,
)
from podium_app.train.services import RunTopics, learner_settings, run_key_pair

Say = Callable[[str], None]
START_MARGIN_S = 15.0
"""Seconds between starting the sub-agents and the load's first session (they join meanwhile)."""


@dataclass
class RunResult:
    """What one run left."""

    name: str
    ratios: dict[int, float] = field(default_factory=dict)
    """Planned index -> latency/bound, measured (greedy) sessions a learned version decided."""
    all_ratios: dict[int, float] = field(default_factory=dict)
    """Planned index -> latency/bound, every finished session (the baseline arm's too)."""
    by_arm: dict[str, int] = field(default_factory=dict)
    submitted: int = 0
    finished: int = 0
    run_twice: int = 0
    incomplete: int = 0
    transitions: list[dict[str, Any]] = field(default_factory=list)
    exit_codes: dict[str, int] = field(default_factory=dict)
    load_started_at: float = 0.0
    """Unix time of the load's first session (the report places transitions by it)."""
    retrain: dict[str, Any] = field(default_factory=dict)
    """The retraining job's figures (``--retrain-after-s``; empty without one): when it
    started and announced (seconds into the load), the merge cost the store saw, the
    version it published."""
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON of the run (without the per-session ratios)."""
        out = asdict(self)
        del out["ratios"], out["all_ratios"]
        out["controller_proposed"] = sum(
            1
            for t in self.transitions
            if t["kind"] == "CANDIDATE_PROPOSED" and t["actor"] == "controller"
        )
        out["promoted"] = sum(
            1 for t in self.transitions if t["kind"] == "PROMOTED" and t["actor"] == "controller"
        )
        return out


def _transition(t: rollout_pb2.RolloutTransition) -> dict[str, Any]:
    return {
        "seq": t.seq,
        "kind": rollout_pb2.TransitionKind.Name(t.kind).removeprefix("TRANSITION_KIND_"),
        "actor": t.actor,
        "reason": t.reason,
        "live": t.state.live_version,
        "candidate": t.state.candidate_version,
        "at": t.at.seconds + t.at.nanos / 1e9,
        "summary": t.evidence.summary,
    }


def initial_policy(config: CycleConfig, say: Say) -> Path:
    """``--checkpoint``, or a behaviour clone of cpls (:func:`podium_app.bootstrap.behaviour_clone`:
    ``podium train`` with no PPO iteration on tasks like the load's, small, every kind)."""
    if config.checkpoint is not None:
        return config.checkpoint
    say("no --checkpoint:")
    return behaviour_clone(config.work_dir, config.seed, say, pool=config.pool)


def learner_of(config: CycleConfig, name: str, run_dir: Path, init: Path) -> SwarmSettings:
    """The learner settings the initial version is published with: the continuous run's
    learner's own, the frozen run's a learner's artifacts root of its own (no model repository:
    the bench's orchestrators decide in-process). Both sign with the run's key pair."""
    train = learner_train_config(config, config.work_dir / "continuous")
    if name == "continuous":
        return learner_settings(train, init, 16, RunTopics())[1]
    keys = run_key_pair(train)
    return SwarmSettings(
        artifacts_dir=str(run_dir / "artifacts"), signing_key=str(keys.private_path)
    )


async def make_initial_live(
    deploy: Deployment, bus: KafkaBus, learner: SwarmSettings, init: Path
) -> int:
    """The cold start's two shared steps (:mod:`podium_app.bootstrap`): ``init`` published with
    ``learner``'s code and key as the next version and announced, then made live by the
    operator override (no idempotence here: one broker serves both runs, so the continuous
    run replaces the frozen run's live version on purpose)."""
    version = next_version(learner.artifacts_dir, learner.model_repository)
    event = await asyncio.to_thread(publish_initial, learner, init, version)
    await announce(bus, event)
    await _wait(lambda: deploy.logs_loaded(version), deploy, 180.0, f"replicas loading v{version}")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{deploy.rollout_port}") as channel:
        await make_live(channel, str(version), 120.0)
    return version


async def _wait(pred: Callable[[], bool], deploy: Deployment, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        deploy.check()
        if time.monotonic() > deadline:
            raise PodiumError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.5)


def _progress(name: str, tail: Tail, sub: Submitter, t0: float, say: Say) -> None:
    recent = [f.ratio for i, f in sorted(tail.finished.items())[-40:]]
    state = tail.state
    where = "-"
    if state is not None:
        stage = rollout_pb2.RolloutStage.Name(state.stage).removeprefix("ROLLOUT_STAGE_").lower()
        where = f"live v{state.live_version} {stage}"
        if state.candidate_version:
            where += f" candidate v{state.candidate_version} {state.canary_percent}%"
    mean = f"{fmean(recent):.3f}" if recent else "-"
    say(
        f"[{name}] t={time.monotonic() - t0:5.0f}s submitted {sub.submitted} finished "
        f"{len(tail.finished)} recent latency/bound {mean} | {where}"
    )


async def _drive(
    name: str,
    deploy: Deployment,
    tail: Tail,
    sub: Submitter,
    origin_t0: float,
    config: CycleConfig,
    say: Say,
) -> None:
    """The load from ``origin_t0`` (monotonic) and the drain, a progress line every ~10 s."""
    loader = asyncio.create_task(sub.run_load(origin_t0))
    last = 0.0
    try:
        drain_until = None
        while True:
            deploy.check()
            if loader.done():
                loader.result()
                drain_until = drain_until or time.monotonic() + config.drain_s
            await tail.poll()
            await tail.poll()
            if time.monotonic() - last >= 10.0:
                _progress(name, tail, sub, origin_t0, say)
                last = time.monotonic()
            if drain_until and (
                len(tail.finished) >= sub.submitted or time.monotonic() > drain_until
            ):
                return
    finally:
        loader.cancel()
        with contextlib.suppress(BaseException):
            await loader


async def run_once(
    name: str,
    config: CycleConfig,
    conn: Connection,
    plan: list[PlannedSession],
    init: Path,
    say: Say,
) -> RunResult:
    """One run (``frozen`` or ``continuous``) on the broker of ``conn``."""
    t_start, started_at = time.monotonic(), time.time()
    run_dir = config.work_dir / name
    keys = run_key_pair(learner_train_config(config, config.work_dir / "continuous"))
    deploy = Deployment(config, conn, run_dir, keys.public_path)
    bus = KafkaBus(conn.admin)
    await bus.start()
    result = RunResult(name)
    tail: Tail | None = None
    try:
        await create_topics(bus)
        ppo = name == "continuous" and not config.retrain_after_s
        retrains = name == "continuous" and bool(config.retrain_after_s)
        say(_starting(name, config, ppo, retrains))
        if ppo:
            # One broker serves both runs: the learner must not learn the frozen run's sessions.
            await bus.position_groups_at_end({"learner": [topics.SCORED_TRAJECTORIES]})
        await deploy.start_services(init if ppo else None)
        await wait_controller(deploy)
        learner = learner_of(config, name, run_dir, init)
        version = await make_initial_live(deploy, bus, learner, init)
        tail = Tail(bus, name)
        if retrains:
            tail.stats = AgentStats()
            tail.split_overhead = config.pool_spec().split_overhead
        await tail.start()
        sub = Submitter(bus, name, plan)
        schedule = load_drift(config.drift)
        first = schedule.changes[0].at_s if schedule.changes else 0.0
        # One clock for both: the load's start and the drift's origin (first change at
        # drift_at_s into the load).
        t0_mono, t0_wall = time.monotonic() + START_MARGIN_S, time.time() + START_MARGIN_S
        result.load_started_at = t0_wall
        await deploy.start_subagents(t0_wall + config.drift_at_s - first)
        say(
            f"[{name}] version {version} live; load of {len(plan)} sessions starts in "
            f"{START_MARGIN_S:.0f}s"
        )
        job = (
            asyncio.create_task(retrain(config, bus, tail, learner, run_dir, t0_mono, result, say))
            if retrains
            else None
        )
        try:
            await _drive(name, deploy, tail, sub, t0_mono, config, say)
        finally:
            if job is not None:
                job.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await job
        result.exit_codes = await deploy.stop()
        await tail.drain()  # what the orchestrators published while stopping
        _collect(result, tail, sub, plan, started_at)
    finally:
        if tail is not None:
            await tail.stop()
        if not result.exit_codes:
            result.exit_codes = await deploy.stop()
        await bus.stop()
    result.wall_s = time.monotonic() - t_start
    say(
        f"[{name}] done: {result.finished}/{result.submitted} finished, {result.run_twice} run "
        f"twice, {len(result.transitions)} transitions ({result.wall_s:.0f}s)"
    )
    return result


RETRAIN_FLAGS = (
    "--teacher", "planner-online", "--bc-demos-per-task", "2", "--dagger-rounds", "1",
    "--iterations", "0", "--suite-size", "32", "--test-suite-size", "6", "--test-episodes", "1",
    "--bc-epochs", "8", "--dagger-epochs", "8", "--ppo-bc-departure-weight", "16",
    "--ppo-bc-advice-gain", "4", "--env-advice", "online", "--store-warmup", "1",
    "--rollout-baseline", "advice",
)  # fmt: skip
"""``podium train``'s flags of the retraining job: a clone of ``planner-online`` (docs/cycle.md,
"A drift the rules cannot read"; about 3 CPU-minutes)."""


async def retrain(
    config: CycleConfig,
    bus: Bus,
    tail: Tail,
    learner: SwarmSettings,
    run_dir: Path,
    t0_mono: float,
    result: RunResult,
    say: Say,
    flags: Sequence[str] = RETRAIN_FLAGS,
) -> None:
    """The retraining job (:attr:`CycleConfig.retrain_after_s`): at its time, the world the
    run's store saw written as a pool file, a clone of ``planner-online`` trained there by
    ``podium train`` with ``flags`` (a process: the load goes on), published as the learner's
    next version and announced; the controller proposes it at its next cycle. A failed
    training is reported and the run goes on without a candidate."""
    at = t0_mono + config.drift_at_s + config.retrain_after_s
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    assert tail.stats is not None
    stats = tail.stats.copy()
    work = run_dir / "retrain"
    work.mkdir(parents=True, exist_ok=True)
    pool = config.pool_spec()
    observed = observed_pool(stats, pool, f"{pool.name}-as-observed")
    world = work / "observed.yaml"
    world.write_text(yaml.safe_dump(pool_to_dict(observed), sort_keys=False))
    started = time.monotonic()
    result.retrain = {
        "started_at_s": round(started - t0_mono, 1),
        "merges_observed": round(stats.merges_observed, 1),
        "observed_merge_factor": round(stats.merge_factor(), 3),
    }
    say(
        f"[continuous] retraining on the world the store saw ({stats.merges_observed:.0f} merges, "
        f"merge cost x{stats.merge_factor():.2f}): {world}"
    )
    # The CLI module, not the ``podium`` script: where pip put the script depends on how the
    # package was installed; the interpreter running this bench is known.
    command = [sys.executable, "-m", "podium_app.cli", "train", "--pool", str(world), *flags]
    command += ["--seed", str(config.seed), "--run-dir", str(work / "run")]
    with (work / "train.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=log)
        try:
            code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    policy = work / "run" / "policy.safetensors"
    if code != 0 or not policy.is_file():
        say(f"[continuous] retraining failed (exit {code}; {work / 'train.log'}): no candidate")
        result.retrain["failed"] = code
        return
    version = next_version(learner.artifacts_dir, learner.model_repository)
    event = await asyncio.to_thread(publish_initial, learner, policy, version)
    await announce(bus, event)
    result.retrain |= {
        "version": version,
        "train_s": round(time.monotonic() - started, 1),
        "announced_at_s": round(time.monotonic() - t0_mono, 1),
    }
    say(f"[continuous] retrained candidate v{version} announced ({result.retrain['train_s']}s)")


def _starting(name: str, config: CycleConfig, ppo: bool, retrains: bool) -> str:
    """The progress line of a run's start: what it starts."""
    retraining = f"; a retraining job {config.retrain_after_s:g}s after the drift"
    return (
        f"[{name}] starting {config.replicas} orchestrator(s), reward, controller"
        + (", learner" if ppo else "")
        + (retraining if retrains else "")
    )


def _collect(
    result: RunResult, tail: Tail, sub: Submitter, plan: list[PlannedSession], since: float
) -> None:
    """The run's figures from what the tail read: ``ratios`` of the measured sessions a learned
    version decided; the transitions written since ``since`` (the registry outlives a run)."""
    result.submitted = sub.submitted
    result.finished = len(tail.finished)
    result.run_twice = sum(1 for n in tail.records.values() if n > 1)
    result.incomplete = sum(1 for f in tail.finished.values() if not f.completed)
    for i, f in tail.finished.items():
        result.all_ratios[i] = f.ratio
        result.by_arm[f.role] = result.by_arm.get(f.role, 0) + 1
        if not f.version.startswith("rules:") and not plan[i].sampled:
            result.ratios[i] = f.ratio
    result.transitions = [
        _transition(t)
        for _, t in sorted(tail.transitions.items())
        if t.at.seconds + t.at.nanos / 1e9 >= since
    ]


def _prepare(config: CycleConfig) -> None:
    """Fresh run directories (the learner must not resume an earlier bench's checkpoints)."""
    for name in ("frozen", "continuous"):
        shutil.rmtree(config.work_dir / name, ignore_errors=True)
    config.work_dir.mkdir(parents=True, exist_ok=True)


def aim_drift(
    config: CycleConfig, plan: Sequence[PlannedSession], pool: PoolSpec, net: SwarmPolicyNet
) -> tuple[CycleConfig, list[str]]:
    """``--drift-target preferred``: the scenario aimed at the agents the initial policy (``net``)
    prefers when the drift bites (:func:`preferred_drift` on :func:`store_at_drift`), written
    to ``drift.yaml`` in the work directory; the config that runs it, and what was aimed where.
    Both runs and the replayed references then drift the same agents."""
    schedule = load_drift(config.drift)
    stats = store_at_drift(plan, pool, schedule, config.drift_at_s, net)
    aimed, said = preferred_drift(schedule, pool, stats)
    path = config.work_dir / "drift.yaml"
    path.write_text(yaml.safe_dump(drift_document(aimed), sort_keys=False))
    return replace(config, drift=str(path)), said


async def run_all(config: CycleConfig, init: Path, say: Say) -> dict[str, Any]:
    """Both runs and the measurements (see the module docstring); the result JSON."""
    # SIGTERM (a supervisor, kill) cancels the run, so every finally below stops what it started.
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    if main is not None:
        loop.add_signal_handler(signal.SIGTERM, main.cancel)
    _prepare(config)
    pool = config.pool_spec()
    tasks = cycle_tasks(config.tasks, config.seed, pool)
    plan = plan_sessions(tasks, config.sessions, config.rate, config.seed, config.explore_share)
    net, _trained_for = load_policy(resolve_checkpoint(init))
    aimed: list[str] = []
    if config.drift_target == "preferred":
        config, aimed = await asyncio.to_thread(aim_drift, config, plan, pool, net)
        for line in aimed:
            say(f"drift aimed at the preferred agent: {line}")
    results: dict[str, RunResult] = {}
    async with connection(config, say) as conn:
        # Always frozen first, whatever the flag's order: it must not inherit a promoted version.
        for name in [r for r in RUNS if r in config.runs]:
            results[name] = await run_once(name, config, conn, plan, init, say)
    say(
        "rule engines and the initial policy on a store frozen at the drift, on the same "
        "sessions (simulator, true pool at each session's time)"
    )
    arms = REFERENCE_ARMS | frozen_store_arm(net)
    refs = await asyncio.to_thread(
        replay_ratios, plan, pool, load_drift(config.drift), config.drift_at_s, arms
    )
    rows = window_table(
        plan, {n: r.ratios for n, r in results.items()}, refs, config.window_s, config.windows
    )
    tail_windows = max(1, config.windows // 6)
    return {
        "config": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in asdict(config).items()
            if k != "python"
        }
        | {"initial_policy": str(init), "tail_windows": tail_windows, "drift_aimed": aimed},
        "windows": rows,
        "runs": {n: r.summary() for n, r in results.items()},
        "verdicts": verdicts(rows, config.drift_at_s, tail_windows),
    }


__all__ = ["RunResult", "initial_policy", "learner_of", "make_initial_live", "run_all", "run_once"]
