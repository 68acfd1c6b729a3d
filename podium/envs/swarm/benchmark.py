"""Benchmarks of the swarm environment: scheduling policies against the lower bound, and the
simulator's own speed. The ``podium bench scheduling`` / ``podium bench env`` commands and
``bench/`` are thin wrappers over these functions."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from podium.envs.swarm.baselines import BASELINES, make_policy
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.planner import make_scheduler
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.scheduling import SchedulingPolicy
from podium.envs.swarm.scouting import SCOUT_SUFFIX, Scouting, base_policy
from podium.envs.swarm.spec import PoolSpec, TaskSpec, split_truth
from podium.errors import ConfigError

if TYPE_CHECKING:
    from podium.observed import AgentStats

REFERENCE = "sequential"
"""Policy every benchmark runs as the reference for ``reduction_vs_sequential``."""

PLANNER = "planner"
"""The rollout planner on the true model (:mod:`podium.envs.swarm.planner`): a reference line
that reads the truth, so it is built here rather than listed among the rule engines."""

PLANNER_ONLINE = "planner-online"
"""The rollout planner on the statistics store's estimates (``PlannerConfig.model =
"estimates"``): deployable (it reads what cpls-online reads), the teacher of
``podium train --teacher planner-online``."""

STATS_READERS = frozenset({"cpls-online", "planner-online"})
"""Rule engines that read the environment's statistics store (``env.stats``). With one of
them, or a caller's policy (a trained network reads the store through its observation),
every policy gets its own store, warmed up then fed by its own episodes."""

WARMUP_SEED = 1_000_003
"""Offset of the warm-up episodes' seeds from ``seed``: disjoint from the measured ones."""


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    """Outcome of one episode."""

    latency: float
    """Simulated makespan (clock at the end)."""
    completed: bool
    """Whether every subtask succeeded."""
    loop_detected: bool
    """Whether loop detection ended it."""
    steps: int
    """Orchestrator decisions taken."""


def run_episode(env: SwarmEnv, policy: SchedulingPolicy, task: str, seed: int) -> EpisodeResult:
    """Run ``policy`` on ``task`` until the episode ends.

    The rule engines (:func:`~podium.envs.swarm.baselines.make_policy`) and a trained network
    (``podium.policy.swarm.LearnedPolicy``) are both scheduling policies, so they are
    benchmarked by this one loop.
    """
    env.reset(seed=seed, options={"task": task})
    rng = random.Random(seed)
    while True:
        _, _, terminated, truncated, info = env.step(policy.act(env, rng).action)
        if terminated or truncated:
            return EpisodeResult(
                latency=float(info["latency"]),
                completed=bool(info["completed"]),
                loop_detected=bool(info["loop_detected"]),
                steps=int(info["steps"]),
            )


def bench_scheduling(
    tasks: Sequence[TaskSpec],
    pool: PoolSpec,
    policies: Sequence[str],
    episodes: int,
    seed: int,
    *,
    extra: Mapping[str, SchedulingPolicy] | None = None,
    true_pool: PoolSpec | None = None,
    warmup: int = 10,
) -> dict[str, Any]:
    """Mean latency, completion rate, ratio to bound and reduction vs sequential per task
    and policy, and their means over tasks. Episode e of every policy uses seed ``seed + e``
    (common random numbers across policies).

    ``policies`` names rule engines, ``planner``, or keys of ``extra``: policies built by the
    caller, such as a trained network (``{"learned": LearnedPolicy.from_checkpoint(path)}``).
    They are passed in rather than built here so this module, and ``podium bench scheduling``
    without a learned policy, never import torch.

    The sub-agents behave as ``true_pool`` says (or as ``pool``'s ``true:`` profiles say)
    while every policy but the planner, and the bound, read ``pool``'s advertisement. When
    a policy reads the statistics store (``cpls-online``, or any of ``extra``), each policy
    gets its own store, warmed by ``warmup`` cpls episodes per task on the true pool, then fed
    by that policy's own episodes; ``config`` then records ``warmup``.
    """
    if episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {episodes}")
    if warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {warmup}")
    advertised, truth = split_truth(pool, true_pool)
    engines = _policies_by_name(policies, extra or {})
    reads_stats = any(
        n in STATS_READERS or n in (extra or {}) or n.endswith(SCOUT_SUFFIX) for n in engines
    )
    warm = _new_store() if reads_stats else None
    env = SwarmEnv(
        list(tasks),
        SubagentPool(advertised),
        EnvConfig(
            max_subtasks=max(len(t.subtasks) for t in tasks),
            invalid_action="raise",  # a baseline emitting a masked action is a bug: fail loudly
        ),
        true_pool=truth,
        stats=warm,
    )
    stores = None
    if warm is not None:
        warm_up(env, tasks, warmup, seed)
        stores = {n: warm.copy() for n in engines}  # then each fed by its own policy's episodes
    out_tasks = [_bench_task(env, task, engines, episodes, seed, stores) for task in tasks]
    names = list(engines)
    config: dict[str, Any] = {
        "episodes": episodes,
        "seed": seed,
        "pool": pool.name,
        "policies": names,
    }
    if truth is not None:
        config["true_pool"] = truth.name
    if stores is not None:
        config["warmup"] = warmup
    return {"tasks": out_tasks, "summary": _summary(names, out_tasks), "config": config}


def _new_store() -> AgentStats:
    """An empty statistics store (imported only when a policy reads one)."""
    from podium.observed import AgentStats

    return AgentStats()


def warm_up(env: SwarmEnv, tasks: Sequence[TaskSpec], warmup: int, seed: int) -> None:
    """Feed ``env``'s statistics store with ``warmup`` cpls episodes per task (seeds
    ``seed + WARMUP_SEED + i``, disjoint from the measured ones), drawn from its true pool:
    what the sessions before a benchmark observed. To reproduce a benchmark's figures for one
    policy by hand, warm a store this way, then run that policy's episodes on it."""
    cpls = make_policy("cpls")
    for task in tasks:
        for i in range(warmup):
            run_episode(env, cpls, task.name, seed + WARMUP_SEED + i)


def _policies_by_name(
    policies: Sequence[str], extra: Mapping[str, SchedulingPolicy]
) -> dict[str, SchedulingPolicy]:
    """The reference first, then ``policies`` in order (duplicates once): rule engines by
    name, the planner, or the caller's ``extra``, each also as ``<name>+scout`` (with
    :mod:`~podium.envs.swarm.scouting`); ConfigError for an unknown or reserved name."""
    for reserved in (REFERENCE, PLANNER, PLANNER_ONLINE):
        if reserved in extra:
            raise ConfigError(f"policy name {reserved!r} is reserved for the {reserved} policy")
    names = [REFERENCE, *[p for p in dict.fromkeys(policies) if p != REFERENCE]]
    planners = (PLANNER, PLANNER_ONLINE)
    unknown = [
        n for n in names if n not in extra and base_policy(n) not in {*BASELINES, *planners, *extra}
    ]
    if unknown:
        known = ", ".join(sorted({*BASELINES, *planners, *extra}))
        raise ConfigError(
            f"unknown policy {unknown[0]!r}; known: {known} (each also as NAME{SCOUT_SUFFIX})"
        )
    return {n: _build(n, extra) for n in names}


def _build(name: str, extra: Mapping[str, SchedulingPolicy]) -> SchedulingPolicy:
    """The policy called ``name``: the caller's, the planner, or a fresh rule engine; a
    ``+scout`` name wraps its base policy in :class:`Scouting`."""
    if name in extra:
        return extra[name]
    if name.endswith(SCOUT_SUFFIX):
        return Scouting(_build(base_policy(name), extra))
    return make_scheduler(name)


def _bench_task(
    env: SwarmEnv,
    task: TaskSpec,
    engines: Mapping[str, SchedulingPolicy],
    episodes: int,
    seed: int,
    stores: Mapping[str, AgentStats] | None = None,
) -> dict[str, Any]:
    """One task's row: every policy's statistics over ``episodes`` seeded episodes (each
    policy on its own statistics store when there are stores)."""
    env.reset(seed=seed, options={"task": task.name})
    bound = env.bound.value
    per: dict[str, dict[str, float]] = {}
    for name, engine in engines.items():
        if stores is not None:
            env.stats = stores[name]
        runs = [run_episode(env, engine, task.name, seed + e) for e in range(episodes)]
        lat = [r.latency for r in runs]
        mean = statistics.fmean(lat)
        per[name] = {
            "latency_mean": mean,
            "latency_std": statistics.pstdev(lat),
            "completion_rate": sum(r.completed for r in runs) / episodes,
            "loop_rate": sum(r.loop_detected for r in runs) / episodes,
            "steps_mean": statistics.fmean(r.steps for r in runs),
            "ratio_to_bound": mean / bound,
        }
    ref = per[REFERENCE]["latency_mean"]
    for stats in per.values():
        stats["reduction_vs_sequential"] = 1.0 - stats["latency_mean"] / ref
    return {
        "name": task.name,
        "subtasks": len(task.subtasks),
        "lower_bound": bound,
        "policies": per,
    }


def _summary(names: Sequence[str], out_tasks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per policy, the means over tasks."""
    summary: dict[str, dict[str, float]] = {}
    for name in names:
        rows = [t["policies"][name] for t in out_tasks]
        summary[name] = {
            "ratio_to_bound_mean": statistics.fmean(r["ratio_to_bound"] for r in rows),
            "completion_rate_mean": statistics.fmean(r["completion_rate"] for r in rows),
            "reduction_vs_sequential_mean": statistics.fmean(
                r["reduction_vs_sequential"] for r in rows
            ),
            "latency_mean": statistics.fmean(r["latency_mean"] for r in rows),
        }
    return summary


@dataclass(frozen=True, slots=True)
class SpeedResult:
    """Environment throughput with a random valid policy."""

    steps: int
    """Environment steps taken."""
    episodes: int
    """Episodes finished."""
    cpu_seconds: float
    """Process CPU time spent (one core: the loop is single-threaded)."""
    wall_seconds: float
    """Wall-clock time spent."""

    @property
    def steps_per_second(self) -> float:
        """Steps per CPU second (insensitive to other processes sharing the machine)."""
        return self.steps / self.cpu_seconds if self.cpu_seconds > 0 else 0.0

    @property
    def wall_steps_per_second(self) -> float:
        """Steps per wall-clock second."""
        return self.steps / self.wall_seconds if self.wall_seconds > 0 else 0.0


def measure_env_speed(
    tasks: Sequence[TaskSpec], pool: PoolSpec, *, seconds: float = 3.0, seed: int = 0
) -> SpeedResult:
    """Step the env with a uniformly random valid action for ``seconds`` of CPU time.

    The policy's own cost (mask lookup + one draw) is included, as a training loop pays it.
    """
    advertised, truth = split_truth(pool, None)
    env = SwarmEnv(
        list(tasks), SubagentPool(advertised), EnvConfig(max_subtasks=64), true_pool=truth
    )
    rng = random.Random(seed)
    env.reset(seed=seed)
    steps = episodes = 0
    c0, w0 = time.process_time(), time.perf_counter()
    deadline = c0 + seconds
    while True:
        # Check the clock every 256 steps so timing does not dominate what it measures.
        for _ in range(256):
            valid = np.flatnonzero(env.action_masks())
            _, _, terminated, truncated, _ = env.step(valid[int(rng.random() * len(valid))])
            steps += 1
            if terminated or truncated:
                episodes += 1
                env.reset()
        if time.process_time() >= deadline:
            break
    return SpeedResult(
        steps=steps,
        episodes=episodes,
        cpu_seconds=time.process_time() - c0,
        wall_seconds=time.perf_counter() - w0,
    )
