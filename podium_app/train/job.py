"""``podium train``: the main job. The orchestrator's policy learns through the real pipeline.

Roles, and what travels between them on the bus (in-process by default, Kafka with
``--bus kafka://...``)::

    actor (orchestrator role) --Trajectory--> reward_svc --ScoredTrajectory--> learner_svc
        ^                                                                        |
        +-------------------- PolicyUpdated (uri, sha256) <----------------------+

The same job runs on both buses; only where the services run differs
(:mod:`podium_app.train.services`): as asyncio tasks in this process on the in-process bus,
or each its own process against Kafka. The learner is learner_svc's learning loop with the
swarm algorithm in both.

1. Cold start: the rule engine (cpls) runs one session per training task and the policy is
   fitted to its decisions (behaviour cloning, here in the driver); the result is the
   learner's starting policy, which it announces as version 0. The observation carries the
   rule engine's decision (the environment's advice columns), so version 0 reproduces cpls
   and PPO learns where to depart from it.
2. Each iteration the actor runs a batch of sessions with the current version (sampling, so it
   explores) and publishes one ``Trajectory`` per session with the training tensors in its
   decisions and the rollout baseline (cpls's return on the same (task, seed), common random
   numbers); reward_svc scores them; the learner decodes the scored trajectories, runs one PPO
   update, checkpoints, commits, publishes the new weights as safetensors with their sha256 and
   announces them; the actor verifies and hot-swaps to them. With ``max_policy_lag`` 1 (the
   default) the actor samples the next batch with the version it serves while the learner
   updates on this one (policy lag 1: acting and the update share the cores); with 0 it
   waits for each version first (lag 0).
3. A curriculum grows the task sizes; a validation split chooses the best version; the final
   table compares it with the rule engines on held-out tasks.

What it trains on (:mod:`podium_app.train.suites`): the user's pool (``--pool``; planners see
its advertised profiles, the simulated sub-agents draw from its ``true:`` ones when given) or
the shipped one, optionally mixed with variants of it (``--pool-variants``: every training
session draws its pool); the user's task library (``--tasks``, a hashed part held out) or
generated suites over the pool's kinds. Validation and the final table run on the user's
pool; the report and ``summary.json`` name the pool and the tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from learner_svc.algorithms.swarm import behaviour_cloning, resolve_device
from learner_svc.checkpoint import load_checkpoint
from podium.bus import Bus, EventPublisher, connect, is_kafka_url
from podium.envs.swarm import EnvConfig, SwarmEnv
from podium.envs.swarm.benchmark import warm_up
from podium.errors import ArtifactError, ConfigError, PodiumError
from podium.observed import AgentStats
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import path_from_uri
from podium.policy.decisions import Episode
from podium.policy.holder import PolicyHolder
from podium.policy.network import SwarmPolicyNet
from podium.policy.rollout import Job, run_episodes
from podium.policy.signing import TrustedKeys
from podium.policy.swarm import (
    MODEL_NAME,
    build_swarm_policy,
    load_policy,
    resolve_checkpoint,
    save_policy,
)
from podium.v1 import reward_pb2, trajectory_pb2
from podium_app.train import resume
from podium_app.train.actor import Actor, VersionFollower, by_pool, publish_trajectories
from podium_app.train.config import (
    ADVICE,
    IterationLog,
    Progress,
    TrainConfig,
    TrainResult,
    cloning_teacher,
    config_yaml,
    hyperparameters,
    teacher_rule,
)
from podium_app.train.evaluate import (
    completion_rate,
    evaluate_policies,
    pool_envs,
    ratio_to_bound,
    write_trajectories,
)
from podium_app.train.services import (
    Deployment,
    EmbeddedServices,
    ProcessServices,
    run_key_pair,
)
from podium_app.train.suites import Suites, TrainPool, describe, task_suites, training_pools

T = TypeVar("T")


@dataclass(slots=True)
class _Best:
    """The version validation prefers so far (lowest latency/bound at cpls's completion)."""

    ratio: float
    version: int
    event: reward_pb2.PolicyUpdated


@dataclass
class _Run:
    """One run of the job: its settings, environments, actor and services."""

    config: TrainConfig
    tasks: Suites
    pools: list[TrainPool]
    """The base pool (index 0: validation and the final table run on it) and its variants."""
    env_cfg: EnvConfig
    envs: list[SwarmEnv]
    actor: Actor
    services: Deployment
    follower: VersionFollower
    publisher: EventPublisher
    writer: Any
    say: Progress
    rng: np.random.Generator
    pool_rng: np.random.Generator
    """Draws each training session's pool (its own stream: the tasks and seeds drawn from
    ``rng`` are the same with or without pool variants)."""
    device: str = "cpu"
    """Where behaviour cloning runs (``TrainConfig.device`` on this machine)."""
    t0: float = field(default_factory=time.perf_counter)
    val_jobs: list[Job] = field(default_factory=list)
    cpls_val_ratio: float = math.nan
    cpls_val_completion: float = 1.0
    history: list[IterationLog] = field(default_factory=list)
    best: _Best | None = None

    async def guarded(self, aw: Awaitable[T], what: str) -> T:
        """Await ``aw`` while checking that the services still run; time out by the config."""
        task = asyncio.ensure_future(aw)
        deadline = time.monotonic() + self.config.reward_timeout_s
        while True:
            self.services.check()
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            if time.monotonic() > deadline:
                task.cancel()
                raise PodiumError(
                    f"timed out after {self.config.reward_timeout_s:.0f}s waiting for {what}"
                )


def _cold_start(run: _Run) -> tuple[Path, list[dict[str, float]], trajectory_pb2.Trajectory]:
    """The starting policy file, the cloning history (empty with ``init``), and one session
    of the starting network (the "before" picture): behaviour cloning from the advice's rule
    engine (and DAgger rounds if configured), or the ``init`` policy when one is given."""
    cfg, tasks = run.config, run.tasks
    teacher = teacher_rule(run.env_cfg.advice)
    if cfg.init is not None:
        agent = SwarmAgent(run.envs[0].layout, net=_init_net(cfg.init))
    else:
        agent = SwarmAgent(run.envs[0].layout, None, **cfg.network_shape())
    _, before = run_episodes(
        run.envs, [Job(tasks.test[0], 424242)], agent=agent, greedy=True, with_trajectories=True
    )
    run.say("bc", {"demos": 0.0})
    cpls_val, _ = run_episodes(run.envs, run.val_jobs, rule=teacher)
    run.cpls_val_ratio, run.cpls_val_completion = (
        ratio_to_bound(cpls_val),
        completion_rate(cpls_val),
    )
    history = [] if cfg.init else _clone(run, agent, cloning_teacher(cfg))
    for h in history:
        for key, value in h.items():  # bc_loss, bc_accuracy, the departures' figures...
            if key.startswith("bc_"):
                run.writer.add_scalar(f"bc/{key[3:]}", value, int(h["epoch"]))
    accuracy = history[-1]["bc_accuracy"] if history else math.nan
    run.say("bc", {"accuracy": accuracy, "cpls_val": run.cpls_val_ratio})
    extra = {"init": "bc"} if cfg.init is None else {"init": "policy", "source": str(cfg.init)}
    ref = save_policy(agent.net, cfg.run_dir / "init", 0, tuple(run.envs[0].layout.agents), **extra)
    return ref.path, history, before[0]


def _init_path(config: TrainConfig) -> Path:
    """Where the run keeps its starting policy (the learner's version 0 when it has no
    checkpoint)."""
    return config.run_dir / "init" / MODEL_NAME / "0" / "weights.safetensors"


def _init_net(path: Path) -> SwarmPolicyNet:
    """The network of the ``--init`` policy (verified; ArtifactError naming the path)."""
    try:
        net, _trained_for = load_policy(resolve_checkpoint(path))
    except ArtifactError as exc:
        raise ArtifactError(f"--init {path}: {exc}") from None
    return net


def _clone(run: _Run, agent: SwarmAgent, teacher: str) -> list[dict[str, float]]:
    """Behaviour cloning of ``teacher``'s sessions on the training tasks, then the configured
    DAgger rounds; the history of every pass. Each collection shows its count of sessions
    (:func:`_counter`): a planner teacher costs seconds a session."""
    cfg = run.config
    demo_jobs = [
        Job(t, int(run.rng.integers(1 << 31)))
        for _ in range(cfg.bc_demos_per_task)
        for t in run.tasks.train
    ]
    count = _counter(run, 0, len(demo_jobs))
    demos, _ = by_pool(demo_jobs, _draw_pools(run, len(demo_jobs)), _rule(run, teacher, count))
    history = _cloning(run, agent, demos, cfg.bc_epochs)
    data = list(demos)
    for rnd in range(cfg.dagger_rounds):
        # DAgger: the cloned policy drives, the teacher labels the states it reaches, and the
        # policy is cloned again on everything so far.
        dagger_jobs = [Job(t, int(run.rng.integers(1 << 31))) for t in run.tasks.train]
        count = _counter(run, rnd + 1, len(dagger_jobs))
        labelled, _ = by_pool(
            dagger_jobs,
            _draw_pools(run, len(dagger_jobs)),
            _learned(run, agent.net, greedy=rnd % 2 == 0, teacher=teacher, on_episode=count),
        )
        agreement = float(
            np.mean(
                np.concatenate([e.actions == e.teacher for e in labelled if e.teacher is not None])
            )
        )
        data += labelled
        more = _cloning(run, agent, data, cfg.dagger_epochs)
        for h in more:
            h["epoch"] += len(history)
            h["dagger_agreement"] = agreement
        history += more
    return history


PROGRESS_EVERY_S = 1.0
"""Least seconds between two progress reports of one collection (the last is always shown):
without a terminal each report is a log line."""


def _counter(run: _Run, dagger_round: int, total: int) -> Callable[[Episode], None]:
    """An ``on_episode`` callback that reports the sessions of one collection done out of
    ``total`` as phase ``"collect"`` (``{"done", "total", "round"}``; round 0: the teacher's
    demonstrations, r: DAgger round r's labelled sessions); the first report, 0 done, at
    once, then at most one a :data:`PROGRESS_EVERY_S`, and always the last."""
    done, last = 0, time.monotonic()
    figures = {"total": float(total), "round": float(dagger_round)}
    run.say("collect", {"done": 0.0, **figures})

    def on_episode(_ep: Episode) -> None:
        nonlocal done, last
        done += 1
        now = time.monotonic()
        if done == total or now - last >= PROGRESS_EVERY_S:
            last = now
            run.say("collect", {"done": float(done), **figures})

    return on_episode


def _cloning(
    run: _Run, agent: SwarmAgent, demos: list[Episode], epochs: int
) -> list[dict[str, float]]:
    """Behaviour cloning on the run's device; the network back on the CPU after it, where
    the actor's sessions run it."""
    agent.net.to(run.device)
    try:
        return behaviour_cloning(agent, demos, run.config.ppo, run.rng, epochs=epochs)
    finally:
        agent.net.to("cpu")


async def _validate(run: _Run, log: IterationLog, event: reward_pb2.PolicyUpdated) -> None:
    """Greedy sessions on the validation tasks; remember the best version."""
    _, val_eps, _ = await asyncio.to_thread(run.actor.run, run.val_jobs, greedy=True)
    log.val_ratio, log.val_completion = ratio_to_bound(val_eps), completion_rate(val_eps)
    run.writer.add_scalar("val/ratio_to_bound", log.val_ratio, log.iteration)
    run.writer.add_scalar("val/cpls_ratio_to_bound", run.cpls_val_ratio, log.iteration)
    if log.val_completion >= run.cpls_val_completion and (
        run.best is None or log.val_ratio < run.best.ratio
    ):
        run.best = _Best(log.val_ratio, log.version, event)


def _draw_pools(run: _Run, n: int) -> list[int] | None:
    """The pool of each of ``n`` training sessions, uniform over the base pool and its
    variants; None (all on the base pool, nothing drawn) without variants."""
    if len(run.pools) == 1:
        return None
    return [int(p) for p in run.pool_rng.integers(len(run.pools), size=n)]


def _rule(
    run: _Run, rule: str, on_episode: Callable[[Episode], None] | None = None
) -> Callable[[int, list[Job]], tuple[list[Episode], list[trajectory_pb2.Trajectory]]]:
    """A :func:`by_pool` runner of rule engine ``rule`` on the actor's pools (``on_episode``
    called as each session ends)."""
    return lambda p, mine: run_episodes(run.actor.pools[p], mine, rule=rule, on_episode=on_episode)


def _learned(
    run: _Run,
    net: SwarmPolicyNet,
    *,
    greedy: bool,
    teacher: str,
    on_episode: Callable[[Episode], None] | None = None,
) -> Callable[[int, list[Job]], tuple[list[Episode], list[trajectory_pb2.Trajectory]]]:
    """A :func:`by_pool` runner of network ``net`` on the actor's pools, labelled by
    ``teacher`` (DAgger; ``on_episode`` called as each session ends)."""
    return lambda p, mine: run_episodes(
        run.actor.pools[p],
        mine,
        agent=SwarmAgent(run.actor.pools[p][0].layout, net=net),
        greedy=greedy,
        teacher=teacher,
        generator=run.actor.generator,
        on_episode=on_episode,
    )


def _jobs_for(run: _Run, it: int) -> tuple[int, list[Job]]:
    """The curriculum stage of iteration ``it`` and its sessions (tasks drawn from the stage;
    the last stage draws from every training task, however large)."""
    cfg, stages = run.config, list(run.config.curriculum)
    stage = stages[min((it - 1) * len(stages) // cfg.iterations, len(stages) - 1)]
    pool_tasks = [t for t in run.tasks.train if len(t.subtasks) <= stage] or run.tasks.train
    if stage == stages[-1]:
        pool_tasks = run.tasks.train
    jobs = [
        Job(pool_tasks[int(i)], int(run.rng.integers(1 << 31)))
        for i in run.rng.integers(len(pool_tasks), size=cfg.episodes_per_iteration)
    ]
    return stage, jobs


@dataclass(slots=True)
class _Batch:
    """One iteration's training sessions."""

    stage: int
    episodes: list[Episode]
    trajectories: list[trajectory_pb2.Trajectory]


def _start_sampling(run: _Run, it: int) -> asyncio.Task[_Batch]:
    """Iteration ``it``'s sessions, drawn now (the driver's random streams advance here, in
    iteration order) and simulated in a worker thread: the event loop keeps the bus
    consumers' heartbeats going (a blocked loop would get the actor evicted from its group)
    and the learner's update runs beside them."""
    stage, jobs = _jobs_for(run, it)
    pools = _draw_pools(run, len(jobs))
    baseline = run.config.rollout_baseline
    if baseline == ADVICE:
        baseline = teacher_rule(run.env_cfg.advice)

    async def sample() -> _Batch:
        eps, trajs = await asyncio.to_thread(run.actor.sample, jobs, baseline, pools)
        return _Batch(stage, eps, trajs)

    return asyncio.create_task(sample(), name=f"podium-train-sample-{it}")


@dataclass(slots=True)
class _Ahead:
    """The next iteration's sessions, sampling while the learner updates, and the driver's
    random streams as they were before they were drawn (the checkpoint of this iteration)."""

    batch: asyncio.Task[_Batch]
    streams: dict[str, Any]


async def _iteration(
    run: _Run, it: int, version: int, ahead: _Ahead | None
) -> tuple[int, _Ahead | None]:
    """One PPO iteration through the services: the new version, and the next iteration's
    sessions when they were started ahead (``TrainConfig.max_policy_lag`` >= 1, and this
    iteration does not validate: validation and sampling share the actor's environments)."""
    batch = await (ahead.batch if ahead else _start_sampling(run, it))
    eps = batch.episodes
    await publish_trajectories(run.publisher, run.services.topics.trajectories, batch.trajectories)
    validating = it % run.config.eval_every == 0 or it == run.config.iterations
    following: _Ahead | None = None
    if run.config.max_policy_lag >= 1 and not validating and it < run.config.iterations:
        streams = _streams(run)
        following = _Ahead(_start_sampling(run, it + 1), streams)
    try:
        event = await run.guarded(
            run.follower.wait_version(version + 1, None), f"policy version {version + 1}"
        )
    except BaseException:
        if following is not None:
            following.batch.cancel()
        raise
    stats = {k: float(v) for k, v in event.metrics.items()}
    log = IterationLog(
        it,
        event.version,
        batch.stage,
        ratio_to_bound(eps),
        completion_rate(eps),
        stats.get("reward_total", math.nan),
        stats,
    )
    run.writer.add_scalar("train/ratio_to_bound", log.train_ratio, it)
    run.writer.add_scalar("train/completion", log.train_completion, it)
    run.writer.add_scalar("train/reward_total", log.reward_total, it)
    if validating:
        await _validate(run, log, event)
    log.wall_s = time.perf_counter() - run.t0
    run.history.append(log)
    run.say(
        "ppo",
        {
            "iteration": float(it),
            "iterations": float(run.config.iterations),
            "ratio": log.train_ratio,
            "completion": log.train_completion,
            "reward": log.reward_total,
            "val": log.val_ratio if log.val_ratio is not None else math.nan,
            "best": run.best.ratio if run.best else math.inf,
            "cpls_val": run.cpls_val_ratio,
        },
    )
    return int(event.version), following


async def _finish(
    run: _Run, bc_history: list[dict[str, float]], before: trajectory_pb2.Trajectory
) -> TrainResult:
    """Serve the best version, the held-out table, the files and the report."""
    cfg = run.config
    run.say("eval", {})
    if run.best is None:
        raise PodiumError("no version completed the validation sessions as well as cpls")
    best = run.best.event
    best_path = path_from_uri(best.uri)
    run.actor.holder = PolicyHolder(build_swarm_policy, run.actor.holder.trusted)
    await run.actor.holder.aload(best_path, int(best.version), best.sha256)
    summary = await asyncio.to_thread(
        evaluate_policies,
        run.actor,
        run.tasks.test,
        run.pools[0],
        cfg.test_episodes,
        run.env_cfg,
        seed=777,
        stats=run.envs[0].stats,
    )
    summary["config"]["training"] = describe(run.pools, run.tasks)
    _, _, after = run.actor.run(
        [Job(run.tasks.test[0], 424242)], greedy=True, with_trajectories=True
    )
    final = cfg.run_dir / "policy.safetensors"
    final.write_bytes(best_path.read_bytes())
    (cfg.run_dir / "policy.safetensors.sha256").write_text(f"{best.sha256}  policy.safetensors\n")
    (cfg.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    write_trajectories(cfg.run_dir, before, after[0])
    result = TrainResult(
        run_dir=cfg.run_dir,
        best_version=run.best.version,
        best_checkpoint=final,
        history=run.history,
        bc_history=bc_history,
        cpls_val_ratio=run.cpls_val_ratio,
        summary=summary,
        wall_s=time.perf_counter() - run.t0,
    )
    from podium_app.train.report import write_report

    write_report(result, before, after[0])
    _log_hyperparameters(run, summary)
    return result


def _log_hyperparameters(run: _Run, summary: dict[str, Any]) -> None:
    """Every setting of the run, with its held-out figures, to TensorBoard's hparams (in
    the run's own log directory, so the HParams dashboard links the session to its curves)."""
    from torch.utils.tensorboard.summary import hparams

    learned = summary["summary"].get("learned", {})
    metrics = {
        "hparam/heldout_ratio_to_bound": learned.get("ratio_to_bound_mean", math.nan),
        "hparam/heldout_completion": learned.get("completion_rate_mean", math.nan),
        "hparam/heldout_reduction_vs_sequential": learned.get(
            "reduction_vs_sequential_mean", math.nan
        ),
        "hparam/heldout_cpls_ratio_to_bound": summary["summary"]
        .get("cpls", {})
        .get("ratio_to_bound_mean", math.nan),
        "hparam/best_val_ratio_to_bound": run.best.ratio if run.best else math.nan,
        "hparam/best_version": float(run.best.version) if run.best else math.nan,
    }
    step = run.history[-1].iteration if run.history else 0
    writer = run.writer._get_file_writer()
    for part in hparams(hyperparameters(run.config), metrics):  # type: ignore[no-untyped-call]
        writer.add_summary(part)
    for tag, value in metrics.items():
        run.writer.add_scalar(tag, value, step)
    run.writer.flush()


def training_envs(
    config: TrainConfig,
    tasks: Suites,
    pools: list[TrainPool],
    env_cfg: EnvConfig,
    stores: list[AgentStats | None] | None = None,
) -> list[list[SwarmEnv]]:
    """Each pool's lock-step environments on a statistics store of its own (none without
    :attr:`TrainConfig.agent_stats`), warmed by :attr:`TrainConfig.store_warmup` cpls
    sessions per training task on that pool's truth (the bench's own warm-up,
    :func:`podium.envs.swarm.benchmark.warm_up`); the sessions run on them feed the store
    only with :attr:`TrainConfig.stats_feed` ``"sessions"``. ``stores``: each pool's store
    as a resumed run left it (no warm-up then)."""
    acting = env_cfg if config.stats_feed == "sessions" else replace(env_cfg, feed_stats=False)
    out = []
    for i, pool in enumerate(pools):
        store = AgentStats() if config.agent_stats else None
        if stores is not None:
            store = stores[i]
        elif store is not None and config.store_warmup > 0:
            warm_up(
                pool_envs(1, tasks.train, pool, env_cfg, store)[0],
                tasks.train,
                config.store_warmup,
                config.seed,
            )
        out.append(pool_envs(config.num_envs, tasks.train, pool, acting, store))
    return out


def _new_run(
    config: TrainConfig, bus: Bus, say: Progress, state: resume.DriverState | None = None
) -> _Run:
    """The run's environments, actor, services and log; ``state``: where a resumed run's
    driver left off (its stores, random streams and figures)."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(config.seed)
    torch.set_num_threads(config.torch_threads)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    # The resolved settings: `podium train --config RUN_DIR/config.yaml` runs this run again.
    (config.run_dir / "config.yaml").write_text(config_yaml(config))
    pools = training_pools(config)
    tasks = task_suites(config, pools[0].advertised)
    env_cfg = replace(config.env, max_subtasks=tasks.max_size)
    stores = resume.restored_stores(state) if state is not None else None
    envs, *more = training_envs(config, tasks, pools, env_cfg, stores)
    # The run's own key pair: the learner signs with it, the actor trusts only it.
    actor = Actor(
        envs,
        config.seed,
        TrustedKeys.load(str(run_key_pair(config).public_path)),
        more_pools=more,
    )
    tag = f"{config.run_dir.name}-{int(time.time() * 1000)}"
    kafka = is_kafka_url(config.bus)
    services: Deployment = ProcessServices(config, tag) if kafka else EmbeddedServices(config, tag)
    run = _Run(
        config=config,
        tasks=tasks,
        pools=pools,
        env_cfg=env_cfg,
        envs=envs,
        actor=actor,
        services=services,
        follower=VersionFollower(
            actor, bus, tag, config.run_dir / "checkpoints", services.topics.policy
        ),
        publisher=EventPublisher(bus, producer_name=f"podium-train/{tag}"),
        writer=SummaryWriter(str(config.run_dir / "tb")),
        say=say,
        rng=np.random.default_rng(config.seed),
        pool_rng=np.random.default_rng([config.seed, 1]),
        device=resolve_device(config.device),
    )
    run.val_jobs = [
        Job(t, 50_000 + s) for s in range(config.validation_seeds) for t in tasks.validation
    ]
    if state is not None:
        resume.restore_streams(state, run.rng, run.pool_rng, actor.generator)
        run.cpls_val_ratio, run.cpls_val_completion = (
            state.cpls_val_ratio,
            state.cpls_val_completion,
        )
        run.history = list(state.history)
        if state.best is not None:
            run.best = _Best(*state.best)
    return run


def _streams(run: _Run) -> dict[str, Any]:
    """The driver's random streams and the pools' statistics stores as they are now."""
    stores = [envs[0].stats for envs in run.actor.pools]
    return resume.capture(run.rng, run.pool_rng, run.actor.generator, stores)


def _checkpoint(
    run: _Run,
    iteration: int,
    bc_history: list[dict[str, float]],
    streams: dict[str, Any] | None = None,
) -> None:
    """The driver's half of the run's checkpoint (:mod:`podium_app.train.resume`), after
    ``iteration`` (0: the starting version validated). ``streams``: those captured before
    the next iteration's sessions were drawn, when they are sampling ahead (a resumed run
    draws them again from there); None: as they are now."""
    streams = _streams(run) if streams is None else streams
    best = (run.best.ratio, run.best.version, run.best.event) if run.best else None
    state = resume.DriverState(
        iteration=iteration,
        **streams,
        cpls_val_ratio=run.cpls_val_ratio,
        cpls_val_completion=run.cpls_val_completion,
        history=run.history,
        bc_history=bc_history,
        best=best,
    )
    resume.save(run.config.run_dir, state)


def _resumed(config: TrainConfig) -> tuple[resume.DriverState, trajectory_pb2.Trajectory, int]:
    """The driver's state of the run in ``config.run_dir``, its "before" session and the
    iterations done (the learner's checkpoint decides: see :func:`resume.start_iteration`)."""
    state, before = resume.load(config.run_dir)
    ckpt = load_checkpoint(config.run_dir / "learner")
    if ckpt is None:
        raise ConfigError(f"--resume {config.run_dir}: the learner has no checkpoint there")
    return state, before, resume.start_iteration(state, ckpt.state.policy_version)


async def train(
    config: TrainConfig, progress: Progress | None = None, *, resume_run: bool = False
) -> TrainResult:
    """Run the whole job; see the module docstring. ``resume_run``: go on with the run in
    ``config.run_dir`` from its last checkpoint (the learner's weights, optimizer and update
    counter, the driver's random streams, stores and curves) instead of starting one."""
    resumed = _resumed(config) if resume_run else None
    bus = connect(config.bus)
    run = _new_run(config, bus, progress or (lambda _phase, _figs: None), resumed and resumed[0])
    await bus.start()
    following: asyncio.Task[None] | None = None
    exit_codes: dict[str, int] = {}
    try:
        if resumed is None:
            init, bc_history, before = _cold_start(run)
            resume.save_before(config.run_dir, before)
            version = 0
        else:
            state, before, version = resumed
            init, bc_history = _init_path(config), state.bc_history
        follower = run.follower
        await run.services.start(
            bus, init, run.tasks.max_size, {follower.group_id: [run.services.topics.policy]}
        )
        await follower.consumer.start()
        following = asyncio.create_task(follower.consumer.run(), name="actor-policy-updates")
        first = await run.guarded(
            run.follower.wait_version(version, None), f"policy version {version}"
        )
        if resumed is None:
            start = IterationLog(0, 0, 0, math.nan, math.nan, math.nan, {})
            await _validate(run, start, first)
            start.wall_s = time.perf_counter() - run.t0
            run.history.append(start)
            _checkpoint(run, 0, bc_history)
        ahead: _Ahead | None = None
        for it in range(version + 1, config.iterations + 1):
            version, ahead = await _iteration(run, it, version, ahead)
            _checkpoint(run, it, bc_history, ahead.streams if ahead else None)
        run.writer.flush()
        result = await _finish(run, bc_history, before)
    finally:
        run.writer.close()
        with contextlib.suppress(Exception):
            await run.follower.consumer.stop()
        if following is not None:
            following.cancel()
            with contextlib.suppress(BaseException):
                await following
        exit_codes = await run.services.stop()
        await bus.stop()
    result.exit_codes = exit_codes
    return result


__all__ = ["TrainConfig", "TrainResult", "train"]
