"""The final table of ``podium train``: the learned policy against the rule engines.

Every policy runs the same (task, seed) sessions (common random numbers) on held-out tasks;
the result has the ``podium bench scheduling`` JSON shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from podium.codec import message_to_json
from podium.envs.swarm import BASELINES, EnvConfig, SwarmEnv, TaskSpec
from podium.observed import AgentStats
from podium.policy.decisions import Episode
from podium.policy.rollout import Job, run_episodes
from podium.v1 import trajectory_pb2
from podium_app.train.actor import Actor
from podium_app.train.suites import TrainPool


def ratio_to_bound(eps: list[Episode]) -> float:
    """Mean latency / lower bound of ``eps``."""
    return float(np.mean([e.info["latency"] / e.info["lower_bound"] for e in eps]))


def completion_rate(eps: list[Episode]) -> float:
    """Share of ``eps`` that completed every subtask."""
    return float(np.mean([bool(e.info["completed"]) for e in eps]))


def pool_envs(
    n: int,
    tasks: Sequence[TaskSpec],
    pool: TrainPool,
    env_cfg: EnvConfig,
    stats: AgentStats | None = None,
) -> list[SwarmEnv]:
    """``n`` lock-step environments on ``pool``: planners read its advertisement, the
    simulator draws from its truth (when it has one); ``stats``: the pool's statistics store,
    shared by the ``n`` and fed at each session's end (None: estimates are the
    advertisement)."""
    return SwarmEnv.replicas(
        n, list(tasks), pool.advertised, env_cfg, true_pool=pool.truth, stats=stats
    )


def _task_table(task: TaskSpec, results: dict[str, list[Episode]]) -> dict[str, Any]:
    """One task's row of the table from each policy's sessions on it."""
    rows = {}
    bound = 0.0
    for name, mine in results.items():
        bound = float(mine[0].info["lower_bound"])
        lat = [float(e.info["latency"]) for e in mine]
        rows[name] = {
            "latency_mean": float(np.mean(lat)),
            "latency_std": float(np.std(lat)),
            "completion_rate": completion_rate(mine),
            "ratio_to_bound": float(np.mean(lat)) / bound,
        }
    for r in rows.values():
        r["reduction_vs_sequential"] = 1.0 - r["latency_mean"] / rows["sequential"]["latency_mean"]
    return {
        "name": task.name,
        "subtasks": len(task.subtasks),
        "lower_bound": bound,
        "policies": rows,
    }


def evaluate_policies(
    actor: Actor,
    tasks: list[TaskSpec],
    pool: TrainPool,
    episodes: int,
    env_cfg: EnvConfig,
    *,
    seed: int,
    stats: AgentStats | None = None,
) -> dict[str, Any]:
    """The ``podium bench scheduling`` table for sequential, greedy, cpls and the learned
    policy on ``pool`` (its truth when it has one; then cpls-online too, cpls on the profiles
    the statistics store estimates).

    Every policy sees the same (task, seed) sessions (common random numbers) and, with
    ``stats`` (the store training warmed on this pool), its own copy of it, fed by its own
    sessions: no policy learns from another's.
    """
    jobs = [Job(t, seed + e) for t in tasks for e in range(episodes)]
    n = len(actor.envs)

    def envs() -> list[SwarmEnv]:
        return pool_envs(n, tasks, pool, env_cfg, stats.copy() if stats is not None else None)

    rules = ["sequential", "greedy", "cpls"]
    if pool.truth is not None and "cpls-online" in BASELINES:
        rules.append("cpls-online")
    results: dict[str, list[Episode]] = {}
    for name in rules:
        results[name], _ = run_episodes(envs(), jobs, rule=name)
    learned = Actor(envs(), seed, actor.holder.trusted)
    learned.holder = actor.holder
    _, results["learned"], _ = learned.run(jobs, greedy=True)
    out_tasks = [
        _task_table(task, {n: e[ti * episodes : (ti + 1) * episodes] for n, e in results.items()})
        for ti, task in enumerate(tasks)
    ]
    summary = {
        name: {
            f"{key}_mean": float(np.mean([t["policies"][name][key] for t in out_tasks]))
            for key in ("ratio_to_bound", "completion_rate", "reduction_vs_sequential")
        }
        | {"latency_mean": float(np.mean([t["policies"][name]["latency_mean"] for t in out_tasks]))}
        for name in results
    }
    return {
        "tasks": out_tasks,
        "summary": summary,
        "config": {
            "episodes": episodes,
            "seed": seed,
            "pool": pool.spec.name,
            "policies": list(results),
        },
    }


def write_trajectories(
    run_dir: Path, before: trajectory_pb2.Trajectory, after: trajectory_pb2.Trajectory
) -> None:
    """The two sessions of the Gantt charts, as protobuf JSON (``podium reward explain`` reads them)."""
    for name, traj in (("before", before), ("after", after)):
        slim = trajectory_pb2.Trajectory()
        slim.CopyFrom(traj)
        for d in slim.decisions:  # the tensors are for the learner, not for people
            d.ClearField("observation_tensor")
            d.ClearField("action_mask")
        (run_dir / f"session_{name}.json").write_text(message_to_json(slim))


__all__ = [
    "completion_rate",
    "evaluate_policies",
    "pool_envs",
    "ratio_to_bound",
    "write_trajectories",
]
