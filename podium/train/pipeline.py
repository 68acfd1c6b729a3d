"""``podium train``: the main job. The orchestrator's policy learns through the real pipeline.

Roles, and what travels between them on the bus (in-process by default, Kafka with
``--bus kafka://...``)::

    actor (orchestrator role) --Trajectory--> reward_svc --ScoredTrajectory--> learner
        ^                                                                        |
        +-------------------- PolicyUpdated (uri, sha256) <----------------------+

1. Cold start: the actor's sessions are run by the cpls rule engine and the learner fits the
   policy to them (behaviour cloning), then publishes version 1. The observation carries the
   rule engine's decision (the environment's advice columns), so version 1 reproduces cpls
   and PPO learns where to depart from it.
2. Each iteration the actor runs a batch of sessions with the current version (sampling, so
   it explores), publishes one ``Trajectory`` per session with the training tensors in its
   decisions; reward_svc scores them (PARL / multi-objective / multi-stage, detectors); the
   learner decodes the scored trajectories, runs one PPO update (the environment's
   −Δclock/bound shaping plus the reward service's total at the end of each session, plus
   the rollout baseline: minus cpls's return on the same (task, seed), common random
   numbers),
   publishes the new weights as safetensors with their sha256 and announces them; the actor
   verifies and hot-swaps to them before its next batch. The policy lag is therefore 0 here;
   the streaming learner (learner_svc) bounds it with η when actors run ahead.
3. A curriculum grows the task sizes; a validation split chooses the best version; the final
   table compares it with the rule engines on held-out tasks of the shipped generator.

Sub-agent executions are simulated inside the actor with the same pure sampling function
subagent_svc uses (:meth:`SubagentPool.sample`), which keeps training at thousands of
decisions per second; live sessions over gRPC go through subagent_svc.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from podium import topics
from podium.bus import Bus, EventConsumer, EventPublisher, Record, connect
from podium.codec import unpack_as
from podium.envs.swarm import EnvConfig, PoolSpec, SwarmEnv, TaskSpec, default_pool
from podium.envs.swarm.generator import GENERALIST_ONLY_KINDS, generate_suite, held_out_split
from podium.errors import PodiumError
from podium.policy.artifacts import ArtifactRef
from podium.policy.holder import PolicyHolder
from podium.policy.network import SwarmPolicyNet
from podium.train.agent import SwarmAgent
from podium.train.episodes import Episode, episode_from_trajectory
from podium.train.learn import SwarmPPOConfig, behaviour_cloning, ppo_update
from podium.train.policy import (
    MODEL_NAME,
    build_swarm_policy,
    export_swarm_policy,
    save_policy,
    swarm_policy_updated,
)
from podium.train.rollout import Job, run_episodes
from podium.v1 import envelope_pb2, reward_pb2, trajectory_pb2


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything ``podium train`` needs. The defaults take about 17 CPU-minutes (single-threaded)."""

    run_dir: Path = Path("runs/latest")
    """Where TensorBoard logs, checkpoints, report.html and summary.json go."""
    bus: str = "inproc://"
    """Event bus URL: ``inproc://`` (embedded, reward_svc runs in this process) or
    ``kafka://HOST:PORT`` (reward_svc must run as its own process: ``python -m reward_svc``)."""
    seed: int = 0
    """Seed of the task suite, the sessions and torch."""
    suite_size: int = 400
    """Tasks generated for training + validation (shapes: chain, fan-out, diamond, layered)."""
    sizes: tuple[int, int] = (5, 60)
    """Subtask counts of generated training tasks (the shipped generator's range)."""
    extra_kind_p: float = 0.05
    """Per-subtask probability that a generated *training* task uses a kind no specialist
    covers (:data:`~podium.envs.swarm.generator.GENERALIST_ONLY_KINDS`, the observation's
    "other" kind). Without them the policy first meets that token on a task like the shipped
    login-system and mis-schedules it (measured: 3.68 latency/bound vs cpls 2.05 there). The
    held-out test suite stays the shipped generator's default distribution."""
    test_suite_size: int = 60
    """Held-out test tasks generated with another seed, sizes ``test_sizes``."""
    test_sizes: tuple[int, int] = (5, 60)
    """Subtask counts of the held-out test tasks (the shipped generator's range)."""
    validation_fraction: float = 0.15
    """Share of the training suite used to choose the best version (never trained on)."""
    curriculum: tuple[int, ...] = (20, 40, 60)
    """Largest task size of each curriculum stage; stages split the iterations evenly."""
    bc_demos_per_task: int = 1
    """cpls sessions per training task for behaviour cloning."""
    bc_epochs: int = 2
    """Behaviour-cloning passes over the demonstrations (with the rule-advice features two
    passes reproduce cpls's decisions on held-out tasks exactly)."""
    dagger_rounds: int = 0
    """DAgger rounds after cloning: the policy drives on every training task, cpls labels."""
    dagger_epochs: int = 2
    """Behaviour-cloning passes over all data after each DAgger round."""
    iterations: int = 60
    """PPO iterations (one policy version each)."""
    episodes_per_iteration: int = 96
    """Sessions per PPO iteration."""
    num_envs: int = 32
    """Sessions simulated in lock-step (one batched forward pass per step)."""
    eval_every: int = 10
    """Iterations between validation runs."""
    validation_seeds: int = 3
    """Sessions per validation task."""
    test_episodes: int = 6
    """Sessions per held-out test task in the final table."""
    critic_warmup_iterations: int = 1
    """First PPO iterations that fit only the value head (see ``ppo_update(critic_only=)``):
    the cloned critic never saw the reward service's score nor the rollout baseline."""
    rollout_baseline: str | None = "cpls"
    """Rule engine run on the same (task, seed) as every PPO session, its environment return
    (−latency/bound, minus the incompletion penalty if it could not finish) subtracted from
    the session's return: the greedy-rollout baseline of Kool et al. (2019). Sub-agent luck
    is keyed by the unit of work (common random numbers, see
    :mod:`podium.envs.swarm.simulator.executor`), so the return becomes "how much better than
    the rule engine under the same luck" and a departure from the rule engine is judged
    against what the rule engine did, not against the noise of other sessions. The baseline
    does not depend on the policy's actions, so the policy gradient stays unbiased. None:
    the critic alone."""
    reward_timeout_s: float = 120.0
    """How long the learner waits for reward_svc to score a batch before failing."""
    ppo: SwarmPPOConfig = field(
        default_factory=lambda: SwarmPPOConfig(
            gae_lambda=1.0,
            learning_rate=1e-4,
            learning_rate_end=1e-5,
            ent_coef_start=0.003,
            ent_coef_end=0.0003,
        )
    )
    """PPO and behaviour-cloning hyperparameters. λ = 1: with the rollout baseline the
    Monte-Carlo return is low-variance, and only it carries the paired comparison back to the
    early decisions (λ < 1 would hand them to a critic that cannot see the session's luck).
    Small steps and little entropy: PPO fine-tunes a policy that already *is* the rule engine
    (measured on the held-out suite: lr 1e-4 and entropy 0.003 beat cpls by 0.012
    latency/bound, lr 3e-4 and entropy 0.01 by 0.003, drifting off it in between)."""
    model_repository: Path | None = None
    """Triton model repository to export every published version >= 1 into as ONNX
    (``<repo>/swarm_policy/<version>/model.onnx``, announced as ``onnx_uri`` /
    ``onnx_sha256``); None = weights only."""

    def to_json(self) -> dict[str, Any]:
        """Plain values for the run's config.json."""
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        d["model_repository"] = str(self.model_repository) if self.model_repository else None
        return d


@dataclass(slots=True)
class IterationLog:
    """One row of the learning curve."""

    iteration: int
    version: int
    stage_max_size: int
    train_ratio: float
    train_completion: float
    reward_total: float
    stats: dict[str, float]
    val_ratio: float | None = None
    val_completion: float | None = None
    wall_s: float = 0.0


@dataclass(slots=True)
class TrainResult:
    """What :func:`train` produced."""

    run_dir: Path
    best_version: int
    best_checkpoint: Path
    history: list[IterationLog]
    bc_history: list[dict[str, float]]
    cpls_val_ratio: float
    summary: dict[str, Any]
    wall_s: float


Progress = Callable[[str, dict[str, float]], None]
"""Callback for the live display: (phase, figures)."""


def _ratio(eps: list[Episode]) -> float:
    return float(np.mean([e.info["latency"] / e.info["lower_bound"] for e in eps]))


def _completion(eps: list[Episode]) -> float:
    return float(np.mean([bool(e.info["completed"]) for e in eps]))


class _Actor:
    """The orchestrator role: runs sessions with whatever version the holder serves."""

    def __init__(self, envs: list[SwarmEnv], seed: int) -> None:
        self.envs = envs
        self.holder: PolicyHolder[tuple[SwarmPolicyNet, tuple[str, ...]]] = PolicyHolder(
            build_swarm_policy
        )
        self.generator = torch.Generator().manual_seed(seed)

    def agent(self) -> tuple[int, SwarmAgent]:
        served = self.holder.current()
        net, agents = served.policy
        if tuple(self.envs[0].layout.agents) != agents:
            raise PodiumError(f"policy v{served.version} was trained for another pool: {agents}")
        return served.version, SwarmAgent(self.envs[0].layout, net=net)

    def run(
        self, jobs: list[Job], *, greedy: bool = False, with_trajectories: bool = False
    ) -> tuple[int, list[Episode], list[trajectory_pb2.Trajectory]]:
        version, agent = self.agent()
        eps, trajs = run_episodes(
            self.envs,
            jobs,
            agent=agent,
            greedy=greedy,
            generator=self.generator,
            policy_version=version,
            with_trajectories=with_trajectories,
        )
        return version, eps, trajs


async def _embedded_reward_service(bus: Bus) -> tuple[Any, asyncio.Task[None]]:
    """reward_svc's bus loop in this process (imported by name: the core imports no service)."""
    config_mod = importlib.import_module("reward_svc.config")
    loop_mod = importlib.import_module("reward_svc.bus_loop")
    rewards = importlib.import_module("podium.rewards")
    config = config_mod.ServiceConfig(bus_url="inproc://", instance="reward-embedded")
    service = loop_mod.BusRewardService(bus, config, rewards.default_config())
    task = asyncio.create_task(service.run(), name="reward_svc")
    return service, task


async def train(config: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Run the whole job; see the module docstring."""
    from torch.utils.tensorboard import SummaryWriter

    t0 = time.perf_counter()
    say = progress or (lambda _phase, _figs: None)
    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(config.seed)
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config.to_json(), indent=2))
    ckpt_root = run_dir / "checkpoints"
    writer = SummaryWriter(str(run_dir / "tb"))

    pool: PoolSpec = default_pool()
    suite = generate_suite(
        config.suite_size,
        seed=config.seed + 1,
        sizes=config.sizes,
        extra_kinds=GENERALIST_ONLY_KINDS,
        extra_kind_p=config.extra_kind_p,
    )
    train_tasks, val_tasks = held_out_split(suite, config.validation_fraction, salt="val")
    test_tasks = generate_suite(
        config.test_suite_size, seed=config.seed + 10_007, sizes=config.test_sizes
    )
    max_size = max(len(t.subtasks) for t in [*suite, *test_tasks])
    env_cfg = EnvConfig(max_subtasks=max_size, invalid_action="raise")
    envs = SwarmEnv.replicas(config.num_envs, train_tasks, pool, env_cfg)
    learner = SwarmAgent(envs[0].layout)
    optimizer = torch.optim.Adam(learner.net.parameters(), lr=config.ppo.learning_rate, eps=1e-5)
    actor = _Actor(envs, config.seed)
    agents = tuple(envs[0].layout.agents)
    val_jobs = [Job(t, 50_000 + s) for s in range(config.validation_seeds) for t in val_tasks]

    bus = connect(config.bus)
    await bus.start()
    reward_service: Any = None
    reward_task: asyncio.Task[None] | None = None
    scored: asyncio.Queue[reward_pb2.ScoredTrajectory] = asyncio.Queue()
    updates: asyncio.Queue[int] = asyncio.Queue()
    run_tag = f"{run_dir.name}-{int(time.time() * 1000)}"
    publisher = EventPublisher(bus, producer_name=f"podium-train/{run_tag}")

    async def on_scored(env: envelope_pb2.Envelope, _rec: Record) -> None:
        await scored.put(unpack_as(env, reward_pb2.ScoredTrajectory))

    async def on_policy(env: envelope_pb2.Envelope, _rec: Record) -> None:
        event = unpack_as(env, reward_pb2.PolicyUpdated)
        if event.model_name != MODEL_NAME:
            return
        if await actor.holder.on_policy_updated(event):
            await updates.put(int(event.version))
        else:
            raise PodiumError(f"actor rejected policy v{event.version}: {actor.holder.last_error}")

    learner_in = EventConsumer(
        bus,
        [topics.SCORED_TRAJECTORIES],
        f"podium-train.learner.{run_tag}",
        on_scored,
        producer_name=f"podium-train/learner/{run_tag}",
    )
    actor_in = EventConsumer(
        bus,
        [topics.POLICY_UPDATES],
        f"podium-train.actor.{run_tag}",
        on_policy,
        producer_name=f"podium-train/actor/{run_tag}",
    )
    consumers: list[asyncio.Task[None]] = []
    try:
        if config.bus.startswith(("inproc://", "memory://")):
            reward_service, reward_task = await _embedded_reward_service(bus)
        await learner_in.start()
        await actor_in.start()
        consumers = [
            asyncio.create_task(learner_in.run(), name="learner"),
            asyncio.create_task(actor_in.run(), name="actor-policy-updates"),
        ]

        async def publish_version(version: int, metrics: dict[str, float]) -> ArtifactRef:
            ref = save_policy(learner.net, ckpt_root, version, agents)
            exported = (
                # Version 0 (the untrained network) has none: Triton versions start at 1.
                export_swarm_policy(learner.net, config.model_repository, version)
                if config.model_repository is not None and version >= 1
                else None
            )
            event = swarm_policy_updated(ref, exported, metrics)
            await publisher.publish(topics.POLICY_UPDATES, event, key=MODEL_NAME)
            while True:  # the actor acts on this version before anything else happens
                got = await asyncio.wait_for(updates.get(), timeout=config.reward_timeout_s)
                if got == version:
                    return ref

        # --- version 0: the untrained network (for the "before" picture) ---------------------
        await publish_version(0, {})
        _, _, before_trajs = actor.run(
            [Job(test_tasks[0], 424242)], greedy=True, with_trajectories=True
        )
        # --- cold start: behaviour cloning from cpls --------------------------------------
        say("bc", {"demos": 0.0})
        demo_jobs = [
            Job(t, int(rng.integers(1 << 31)))
            for _ in range(config.bc_demos_per_task)
            for t in train_tasks
        ]
        demos, _ = run_episodes(envs, demo_jobs, rule="cpls")
        cpls_val, _ = run_episodes(envs, val_jobs, rule="cpls")
        cpls_val_ratio = _ratio(cpls_val)
        bc_history = behaviour_cloning(learner, demos, config.ppo, rng, epochs=config.bc_epochs)
        # DAgger: the cloned policy drives, cpls labels the states it reaches, and the policy is
        # cloned again on everything so far — closing the gap plain cloning leaves where the
        # learner's own small mistakes take it off the teacher's path.
        data = list(demos)
        for rnd in range(config.dagger_rounds):
            dagger_jobs = [Job(t, int(rng.integers(1 << 31))) for t in train_tasks]
            labelled, _ = run_episodes(
                envs,
                dagger_jobs,
                agent=learner,
                greedy=rnd % 2 == 0,
                teacher="cpls",
                generator=actor.generator,
            )
            agreement = float(
                np.mean(
                    np.concatenate(
                        [e.actions == e.teacher for e in labelled if e.teacher is not None]
                    )
                )
            )
            data += labelled
            more = behaviour_cloning(learner, data, config.ppo, rng, epochs=config.dagger_epochs)
            for h in more:
                h["epoch"] += len(bc_history)
                h["dagger_agreement"] = agreement
            bc_history += more
            say("bc", {"accuracy": more[-1]["bc_accuracy"], "cpls_val": cpls_val_ratio})
        for h in bc_history:
            writer.add_scalar("bc/loss", h["bc_loss"], int(h["epoch"]))
            writer.add_scalar("bc/accuracy", h["bc_accuracy"], int(h["epoch"]))
        say("bc", {"accuracy": bc_history[-1]["bc_accuracy"], "cpls_val": cpls_val_ratio})
        version = 1
        best_ref = await publish_version(version, {"bc_accuracy": bc_history[-1]["bc_accuracy"]})
        _, val_eps, _ = actor.run(val_jobs, greedy=True)
        best_val = _ratio(val_eps) if _completion(val_eps) >= _completion(cpls_val) else math.inf
        best_version = version
        history: list[IterationLog] = [
            IterationLog(
                0,
                version,
                0,
                math.nan,
                math.nan,
                math.nan,
                {},
                _ratio(val_eps),
                _completion(val_eps),
                time.perf_counter() - t0,
            )
        ]
        writer.add_scalar("val/ratio_to_bound", _ratio(val_eps), 0)
        writer.add_scalar("val/cpls_ratio_to_bound", cpls_val_ratio, 0)

        # --- PPO through the pipeline -----------------------------------------------------
        stages = list(config.curriculum)
        for it in range(1, config.iterations + 1):
            t_it = time.perf_counter()
            stage = stages[min((it - 1) * len(stages) // config.iterations, len(stages) - 1)]
            pool_tasks = [t for t in train_tasks if len(t.subtasks) <= stage] or train_tasks
            jobs = [
                Job(pool_tasks[int(i)], int(rng.integers(1 << 31)))
                for i in rng.integers(len(pool_tasks), size=config.episodes_per_iteration)
            ]
            _, eps, trajs = actor.run(jobs, with_trajectories=True)
            baseline: dict[str, float] = {}
            if config.rollout_baseline:
                ref_eps, _ = run_episodes(envs, jobs, rule=config.rollout_baseline)
                baseline = {
                    # Its whole environment return: −latency/bound and, for a session it could
                    # not complete (a unit only the generalist runs, failed to the loop limit),
                    # the same incompletion penalty the policy's session pays under that luck.
                    traj.session_id: -float(np.sum(ref.rewards))
                    for traj, ref in zip(trajs, ref_eps, strict=True)
                }
            for traj in trajs:
                await publisher.publish(topics.TRAJECTORIES, traj, key=traj.session_id)
            # The learner trains on what came back from reward_svc, decoded from the wire.
            batch: list[Episode] = []
            bonus: list[float] = []
            scores: list[float] = []
            lags: list[int] = []
            while len(batch) < len(trajs):
                st = await asyncio.wait_for(scored.get(), timeout=config.reward_timeout_s)
                batch.append(
                    episode_from_trajectory(
                        st.trajectory,
                        learner.layout.slot_features,
                        learner.layout.size - learner.layout.slots_end,
                        learner.num_agents,
                    )
                )
                scores.append(st.total)
                bonus.append(st.total + baseline.get(st.trajectory.session_id, 0.0))
                lags.append(version - int(st.trajectory.policy_version or 0))
            stats = ppo_update(
                learner,
                optimizer,
                batch,
                bonus,
                config.ppo,
                rng,
                progress=it / config.iterations,
                critic_only=it <= config.critic_warmup_iterations,
            )
            version += 1
            stats.update(
                reward_total=float(np.mean(scores)),
                policy_lag=float(np.mean(lags)),
                decisions_per_s=stats["decisions"] / max(time.perf_counter() - t_it, 1e-9),
            )
            ref = await publish_version(version, {k: float(v) for k, v in stats.items()})
            log = IterationLog(
                it, version, stage, _ratio(eps), _completion(eps), float(np.mean(scores)), stats
            )
            if baseline:
                # > 0: the sampled sessions beat the rule engine under the same luck (in
                # environment return: latency/bound, plus penalties for incomplete sessions).
                stats["gain_vs_baseline"] = float(
                    np.mean(
                        [
                            baseline[t.session_id] + float(np.sum(e.rewards))
                            for t, e in zip(trajs, eps, strict=True)
                        ]
                    )
                )
            for k, v in stats.items():
                writer.add_scalar(f"ppo/{k}", v, it)
            writer.add_scalar("train/ratio_to_bound", log.train_ratio, it)
            writer.add_scalar("train/completion", log.train_completion, it)
            writer.add_scalar("train/reward_total", log.reward_total, it)
            if it % config.eval_every == 0 or it == config.iterations:
                _, val_eps, _ = actor.run(val_jobs, greedy=True)
                log.val_ratio, log.val_completion = _ratio(val_eps), _completion(val_eps)
                writer.add_scalar("val/ratio_to_bound", log.val_ratio, it)
                writer.add_scalar("val/cpls_ratio_to_bound", cpls_val_ratio, it)
                if log.val_ratio < best_val and log.val_completion >= _completion(cpls_val):
                    best_val, best_version, best_ref = log.val_ratio, version, ref
            log.wall_s = time.perf_counter() - t0
            history.append(log)
            say(
                "ppo",
                {
                    "iteration": float(it),
                    "iterations": float(config.iterations),
                    "ratio": log.train_ratio,
                    "completion": log.train_completion,
                    "reward": log.reward_total,
                    "val": log.val_ratio if log.val_ratio is not None else math.nan,
                    "best": best_val,
                    "cpls_val": cpls_val_ratio,
                },
            )
        writer.flush()

        # --- final table on held-out tasks ----------------------------------------------
        say("eval", {})
        await publish_best(actor, best_ref)
        summary = evaluate_policies(
            actor, test_tasks, pool, config.test_episodes, env_cfg, seed=777
        )
        _, _, after_trajs = actor.run(
            [Job(test_tasks[0], 424242)], greedy=True, with_trajectories=True
        )
        final = run_dir / "policy.safetensors"
        final.write_bytes(best_ref.path.read_bytes())
        (run_dir / "policy.safetensors.sha256").write_text(
            f"{best_ref.sha256}  policy.safetensors\n"
        )
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        _write_trajectories(run_dir, before_trajs[0], after_trajs[0])
        result = TrainResult(
            run_dir=run_dir,
            best_version=best_version,
            best_checkpoint=final,
            history=history,
            bc_history=bc_history,
            cpls_val_ratio=cpls_val_ratio,
            summary=summary,
            wall_s=time.perf_counter() - t0,
        )
        from podium.train.report import write_report

        write_report(result, before_trajs[0], after_trajs[0])
        return result
    finally:
        writer.close()
        for c in (learner_in, actor_in):
            with contextlib.suppress(Exception):
                await c.stop()
        if reward_service is not None:
            with contextlib.suppress(Exception):
                await reward_service.stop()
        for t in [*consumers, *([reward_task] if reward_task else [])]:
            t.cancel()
            with contextlib.suppress(BaseException):
                await t
        await bus.stop()


async def publish_best(actor: _Actor, ref: ArtifactRef) -> None:
    """Point the actor back at the chosen version (loaded and verified like any other)."""
    actor.holder = PolicyHolder(build_swarm_policy)
    await actor.holder.aload(ref.path, ref.version, ref.sha256)


def evaluate_policies(
    actor: _Actor,
    tasks: list[TaskSpec],
    pool: PoolSpec,
    episodes: int,
    env_cfg: EnvConfig,
    *,
    seed: int,
) -> dict[str, Any]:
    """The ``podium bench scheduling`` table for sequential, greedy, cpls and the learned policy.

    Every policy sees the same (task, seed) sessions (common random numbers).
    """
    envs = SwarmEnv.replicas(len(actor.envs), tasks, pool, env_cfg)
    jobs = [Job(t, seed + e) for t in tasks for e in range(episodes)]
    results: dict[str, list[Episode]] = {}
    for name in ("sequential", "greedy", "cpls"):
        results[name], _ = run_episodes(envs, jobs, rule=name)
    learned = _Actor(envs, seed)
    learned.holder = actor.holder
    _, results["learned"], _ = learned.run(jobs, greedy=True)
    out_tasks: list[dict[str, Any]] = []
    for ti, task in enumerate(tasks):
        rows = {}
        bound = 0.0
        for name, eps in results.items():
            mine = eps[ti * episodes : (ti + 1) * episodes]
            bound = float(mine[0].info["lower_bound"])
            lat = [float(e.info["latency"]) for e in mine]
            rows[name] = {
                "latency_mean": float(np.mean(lat)),
                "latency_std": float(np.std(lat)),
                "completion_rate": _completion(mine),
                "ratio_to_bound": float(np.mean(lat)) / bound,
            }
        for r in rows.values():
            r["reduction_vs_sequential"] = (
                1.0 - r["latency_mean"] / rows["sequential"]["latency_mean"]
            )
        out_tasks.append(
            {
                "name": task.name,
                "subtasks": len(task.subtasks),
                "lower_bound": bound,
                "policies": rows,
            }
        )
    summary = {
        name: {
            "ratio_to_bound_mean": float(
                np.mean([t["policies"][name]["ratio_to_bound"] for t in out_tasks])
            ),
            "completion_rate_mean": float(
                np.mean([t["policies"][name]["completion_rate"] for t in out_tasks])
            ),
            "reduction_vs_sequential_mean": float(
                np.mean([t["policies"][name]["reduction_vs_sequential"] for t in out_tasks])
            ),
            "latency_mean": float(
                np.mean([t["policies"][name]["latency_mean"] for t in out_tasks])
            ),
        }
        for name in results
    }
    return {
        "tasks": out_tasks,
        "summary": summary,
        "config": {
            "episodes": episodes,
            "seed": seed,
            "pool": pool.name,
            "policies": list(results),
        },
    }


def _write_trajectories(
    run_dir: Path, before: trajectory_pb2.Trajectory, after: trajectory_pb2.Trajectory
) -> None:
    """The two sessions of the Gantt charts, as protobuf JSON (``podium reward explain`` reads them)."""
    from podium.codec import message_to_json

    for name, traj in (("before", before), ("after", after)):
        slim = trajectory_pb2.Trajectory()
        slim.CopyFrom(traj)
        for d in slim.decisions:  # the tensors are for the learner, not for people
            d.ClearField("observation_tensor")
            d.ClearField("action_mask")
        (run_dir / f"session_{name}.json").write_text(message_to_json(slim))


__all__ = ["TrainConfig", "TrainResult", "evaluate_policies", "train"]
