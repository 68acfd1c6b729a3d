"""On the same task, the sequential baseline scores a lower efficiency than cpls."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from podium.rewards import DETECTORS, default_config, score
from podium.rewards.examples import execution
from podium.v1 import task_pb2, trajectory_pb2

TASKS = Path(__file__).parents[3] / "podium" / "data" / "tasks"


def _hand_built_pair() -> tuple[trajectory_pb2.Trajectory, trajectory_pb2.Trajectory]:
    """A diamond task run sequentially and as a critical-path list schedule, by hand.

    a(2) → {b(4), c(3), d(1)} → e(2) with max_parallel 3: bound = 2 + 4 + 2 = 8.
    Sequential: 2 + 4 + 3 + 1 + 2 = 12. CPLS starts b, c, d together: 2 + 4 + 2 = 8.
    """
    task = task_pb2.TaskSpec(
        name="diamond",
        max_parallel=3,
        subtasks=[
            task_pb2.SubtaskSpec(id="a", kind="design", work=2),
            task_pb2.SubtaskSpec(id="b", kind="code", work=4, deps=["a"]),
            task_pb2.SubtaskSpec(id="c", kind="code", work=3, deps=["a"]),
            task_pb2.SubtaskSpec(id="d", kind="code", work=1, deps=["a"]),
            task_pb2.SubtaskSpec(id="e", kind="test", work=2, deps=["b", "c", "d"]),
        ],
    )

    def run(name: str, slots: dict[str, tuple[float, float]]) -> trajectory_pb2.Trajectory:
        execs = [execution(f"{name}-{s}", s, a, b) for s, (a, b) in slots.items()]
        return trajectory_pb2.Trajectory(
            trajectory_id=name,
            task=task,
            executions=execs,
            latency=max(b for _, b in slots.values()),
            lower_bound=8.0,
            completed=True,
            claimed_success=True,
            test_coverage=0.8,
            policy_version=name,
        )

    seq = run("sequential", {"a": (0, 2), "b": (2, 6), "c": (6, 9), "d": (9, 10), "e": (10, 12)})
    cpls = run("cpls", {"a": (0, 2), "b": (2, 6), "c": (2, 5), "d": (2, 3), "e": (6, 8)})
    return seq, cpls


def _env_pair(
    task_file: str = "diamond-10.yaml", seed: int = 0
) -> tuple[trajectory_pb2.Trajectory, trajectory_pb2.Trajectory] | None:
    """The same pair from the real swarm environment (its sequential and cpls baselines)."""
    try:
        from podium.envs.swarm import SwarmEnv, default_pool, load_task, make_policy
        from podium.envs.swarm.trajectory import episode_trajectory
    except ImportError:
        return None
    task = load_task(TASKS / task_file)
    out = []
    for name in ("sequential", "cpls"):
        env = SwarmEnv([task], default_pool())
        env.reset(seed=seed)
        policy, rng = make_policy(name), random.Random(seed)
        while True:
            _, _, terminated, truncated, _ = env.step(policy.act(env, rng).action)
            if terminated or truncated:
                break
        out.append(episode_trajectory(env, policy_version=name))
    return out[0], out[1]


@pytest.mark.parametrize("source", ["env", "hand"])
def test_sequential_baseline_is_less_efficient_than_cpls(source: str) -> None:
    pair = _env_pair() if source == "env" else _hand_built_pair()
    if pair is None:
        pytest.skip("podium.envs.swarm is not importable")
    seq, cpls = pair
    assert seq.task == cpls.task
    cfg = default_config()
    s, c = score(seq, cfg, 0), score(cpls, cfg, 0)
    assert s.raw["multi_objective.completion"] == c.raw["multi_objective.completion"] == 1.0
    assert s.components["multi_objective.efficiency"] < c.components["multi_objective.efficiency"]
    if source == "hand":
        assert s.raw["multi_objective.efficiency"] == pytest.approx(8 / 12)
        assert c.raw["multi_objective.efficiency"] == 1.0


@pytest.mark.parametrize("task_file", ["diamond-10.yaml", "fanout-12.yaml", "layered-15.yaml"])
@pytest.mark.parametrize("seed", [0, 1])
def test_real_baselines_fire_no_detector_and_rank_by_efficiency(task_file: str, seed: int) -> None:
    pair = _env_pair(task_file, seed)
    if pair is None:
        pytest.skip("podium.envs.swarm is not importable")
    cfg = default_config()
    seq, cpls = (score(t, cfg, 0) for t in pair)
    for b in (seq, cpls):
        assert b.penalties == dict.fromkeys(DETECTORS, 0.0)
    assert seq.raw["multi_objective.efficiency"] < cpls.raw["multi_objective.efficiency"]
    assert seq.total < cpls.total
