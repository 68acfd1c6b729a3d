"""Guardrail metrics extracted from real scored trajectories: the shipped example trajectories
and sessions of the real swarm environment, scored by podium.rewards."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from podium.codec import message_from_json
from podium.envs.swarm import SwarmEnv, default_pool, load_task, make_policy
from podium.envs.swarm.trajectory import episode_trajectory
from podium.rewards import DETECTORS, default_config, score
from podium.rollout import DEFAULT_GUARDRAILS, LATENCY_RATIO_CAP, session_metrics
from podium.rollout.metrics import p99
from podium.v1 import reward_pb2, subtask_pb2, trajectory_pb2

DATA = Path(__file__).parents[3] / "podium" / "data"
EXAMPLES = sorted((DATA / "trajectories").glob("*.json"))
CFG = default_config()


def scored(traj: trajectory_pb2.Trajectory) -> reward_pb2.ScoredTrajectory:
    return score(traj, CFG, 0).to_proto(traj)


def example(name: str) -> trajectory_pb2.Trajectory:
    text = (DATA / "trajectories" / f"{name}.json").read_text(encoding="utf-8")
    return message_from_json(text, trajectory_pb2.Trajectory)


def env_session(
    policy_name: str, seed: int, task_file: str = "diamond-10.yaml"
) -> trajectory_pb2.Trajectory:
    env = SwarmEnv([load_task(DATA / "tasks" / task_file)], default_pool())
    env.reset(seed=seed)
    policy, rng = make_policy(policy_name), random.Random(seed)
    while True:
        _, _, terminated, truncated, _ = env.step(policy.act(env, rng).action)
        if terminated or truncated:
            break
    return episode_trajectory(env, policy_version=f"rules:{policy_name}")


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= len(DETECTORS) + 1


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_metric_of_every_guardrail_present_and_finite(path: Path) -> None:
    msg = scored(message_from_json(path.read_text(encoding="utf-8"), trajectory_pb2.Trajectory))
    m = session_metrics(msg)
    assert {g.name for g in DEFAULT_GUARDRAILS} <= set(m)
    assert {f"detector:{d}" for d in DETECTORS} <= set(m)
    assert all(math.isfinite(v) for v in m.values())
    for name in ("incomplete", "failed", *(f"detector:{d}" for d in DETECTORS)):
        assert m[name] in (0.0, 1.0)


@pytest.mark.parametrize(
    "name", [d for d in DETECTORS if (DATA / "trajectories" / f"{d}.json").exists()]
)
def test_each_hack_example_fires_exactly_its_detector_metric(name: str) -> None:
    msg = scored(example(name))
    m = session_metrics(msg)
    fired = {k.removeprefix("detector:") for k, v in m.items() if k.startswith("detector:") and v}
    assert fired == {k for k, v in msg.penalties.items() if v > 0}
    assert name in fired


def test_clean_example() -> None:
    traj = example("clean")
    m = session_metrics(scored(traj))
    assert m["incomplete"] == 0.0 and m["failed"] == 0.0
    assert m["latency_ratio"] == pytest.approx(traj.latency / traj.lower_bound)
    assert not any(v for k, v in m.items() if k.startswith("detector:"))
    assert m["decision_ms_p99"] == 0.0  # the example records no decide_ms


def test_failed_on_critical_path_is_incomplete_at_the_latency_cap() -> None:
    traj = example("failed_on_critical_path")
    assert not traj.completed
    m = session_metrics(scored(traj))
    assert m["incomplete"] == 1.0
    assert m["latency_ratio"] == LATENCY_RATIO_CAP


def test_real_environment_sessions() -> None:
    for policy in ("cpls", "sequential"):
        traj = env_session(policy, seed=3)
        m = session_metrics(scored(traj))
        assert traj.completed and m["incomplete"] == 0.0 and m["failed"] == 0.0
        assert m["latency_ratio"] == pytest.approx(min(traj.latency / traj.lower_bound, 4.0))
        assert m["latency_ratio"] >= 1.0
    # The serial policy is slower than critical-path scheduling on the same luck.
    cpls = session_metrics(scored(env_session("cpls", 5)))["latency_ratio"]
    serial = session_metrics(scored(env_session("sequential", 5)))["latency_ratio"]
    assert serial > cpls


def test_failed_sessions() -> None:
    traj = env_session("cpls", seed=1)
    # A loop-detected session that did some work.
    loop = trajectory_pb2.Trajectory()
    loop.CopyFrom(traj)
    loop.completed = False
    loop.loop_detected = True
    m = session_metrics(scored(loop))
    assert m["incomplete"] == 1.0 and m["failed"] == 1.0
    assert m["latency_ratio"] == LATENCY_RATIO_CAP
    # A timeout (the orchestrator's end_reason label).
    timed_out = trajectory_pb2.Trajectory()
    timed_out.CopyFrom(traj)
    timed_out.completed = False
    timed_out.labels["end_reason"] = "timeout: no result within 30s for: x"
    assert session_metrics(scored(timed_out))["failed"] == 1.0
    # Stopped by itself with some work done: incomplete, not failed.
    stopped = trajectory_pb2.Trajectory()
    stopped.CopyFrom(traj)
    stopped.completed = False
    stopped.claimed_success = False
    assert any(e.outcome == subtask_pb2.OUTCOME_SUCCESS for e in stopped.executions)
    m = session_metrics(scored(stopped))
    assert m["incomplete"] == 1.0 and m["failed"] == 0.0
    # Nothing succeeded at all.
    for e in stopped.executions:
        e.outcome = subtask_pb2.OUTCOME_FAILURE
    assert session_metrics(scored(stopped))["failed"] == 1.0


def test_decision_ms_p99() -> None:
    traj = env_session("cpls", seed=2)
    assert len(traj.decisions) >= 2
    for i, d in enumerate(traj.decisions):
        d.decide_ms = float(i + 1)
    traj.decisions[0].decide_ms = 0.0  # not measured: left out
    expected = p99([float(i + 1) for i in range(1, len(traj.decisions))])
    assert session_metrics(scored(traj))["decision_ms_p99"] == expected
    assert p99([]) == 0.0
    assert p99([5.0]) == 5.0
    assert p99([float(x) for x in range(1, 201)]) == 198.0  # nearest rank: ceil(0.99 * 200)
