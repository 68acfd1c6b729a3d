"""The final table of ``podium train``: the learned policy against the rule engines.

Every policy runs the same (task, seed) sessions (common random numbers) on held-out tasks;
the result has the ``podium bench scheduling`` JSON shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from podium.codec import message_to_json
from podium.envs.swarm import EnvConfig, PoolSpec, SwarmEnv, TaskSpec
from podium.policy.decisions import Episode
from podium.policy.rollout import Job, run_episodes
from podium.v1 import trajectory_pb2
from podium_app.train.actor import Actor


def ratio_to_bound(eps: list[Episode]) -> float:
    """Mean latency / lower bound of ``eps``."""
    return float(np.mean([e.info["latency"] / e.info["lower_bound"] for e in eps]))


def completion_rate(eps: list[Episode]) -> float:
    """Share of ``eps`` that completed every subtask."""
    return float(np.mean([bool(e.info["completed"]) for e in eps]))


def evaluate_policies(
    actor: Actor,
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
    learned = Actor(envs, seed, actor.holder.trusted)
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
                "completion_rate": completion_rate(mine),
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


__all__ = ["completion_rate", "evaluate_policies", "ratio_to_bound", "write_trajectories"]
