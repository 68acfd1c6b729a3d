"""Baselines: cpls <= greedy < sequential on the shipped suite; determinism; state-driven use."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from podium.envs.swarm.actions import START, WAIT
from podium.envs.swarm.baselines import CplsPolicy, GreedyPolicy, SequentialPolicy, make_policy
from podium.envs.swarm.benchmark import bench_scheduling, run_episode
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.simulator import SwarmSimulator
from podium.envs.swarm.spec import default_pool, default_tasks
from podium.errors import ConfigError


@pytest.fixture(scope="module")
def suite_result() -> dict[str, object]:
    pool = default_pool()
    return bench_scheduling(default_tasks(pool), pool, ["greedy", "cpls"], episodes=10, seed=0)


def test_cpls_beats_greedy_beats_sequential_on_shipped_suite(suite_result: dict) -> None:  # type: ignore[type-arg]
    s = suite_result["summary"]
    lat = {p: s[p]["latency_mean"] for p in ("sequential", "greedy", "cpls")}
    assert lat["cpls"] <= lat["greedy"] < lat["sequential"], lat
    assert s["cpls"]["ratio_to_bound_mean"] <= s["greedy"]["ratio_to_bound_mean"]
    for p in ("sequential", "greedy", "cpls"):
        assert s[p]["completion_rate_mean"] == 1.0
        # The bound is a true lower bound of mean latency.
        assert all(t["policies"][p]["ratio_to_bound"] >= 1.0 for t in suite_result["tasks"])
    # Headroom for a learned policy: cpls is not at the bound.
    assert s["cpls"]["ratio_to_bound_mean"] > 1.1


def test_json_shape_and_definitions(suite_result: dict) -> None:  # type: ignore[type-arg]
    for t in suite_result["tasks"]:
        assert isinstance(t["name"], str) and t["lower_bound"] > 0
        seq = t["policies"]["sequential"]["latency_mean"]
        for p, v in t["policies"].items():
            assert set(v) >= {
                "latency_mean",
                "completion_rate",
                "ratio_to_bound",
                "reduction_vs_sequential",
            }, p
            assert v["ratio_to_bound"] == pytest.approx(v["latency_mean"] / t["lower_bound"])
            assert v["reduction_vs_sequential"] == pytest.approx(1 - v["latency_mean"] / seq)
    for p, v in suite_result["summary"].items():
        rows = [t["policies"][p] for t in suite_result["tasks"]]
        assert v["ratio_to_bound_mean"] == pytest.approx(
            statistics.fmean(r["ratio_to_bound"] for r in rows)
        )
        assert set(v) >= {
            "ratio_to_bound_mean",
            "completion_rate_mean",
            "reduction_vs_sequential_mean",
        }


def test_sequential_runs_one_at_a_time_on_the_generalist() -> None:
    env = SwarmEnv(generate_task("fanout", 10, 1), default_pool())
    run_episode(env, SequentialPolicy(), env.tasks[0].name, seed=5)
    st = env.state
    gen = st.pool.generalist()
    assert st.all_done and all(e.agent == gen for e in st.executions)
    ex = sorted(st.executions, key=lambda e: e.start)
    assert all(a.end <= b.start for a, b in itertools.pairwise(ex))


def test_greedy_uses_fastest_agent_and_cpls_the_most_efficient() -> None:
    pool = SubagentPool(default_pool())
    env = SwarmEnv(generate_task("fanout", 12, 2, kinds=["api"]), pool)
    run_episode(env, GreedyPolicy(), env.tasks[0].name, seed=1)
    fastest = pool.fastest_agent("api")
    assert {e.agent for e in env.state.executions if e.attempt == 1} == {fastest}
    run_episode(env, CplsPolicy(), env.tasks[0].name, seed=1)
    best = pool.most_efficient_agent("api")
    assert best != fastest  # the default pool makes these disagree for api
    assert {e.agent for e in env.state.executions if e.attempt == 1} == {best}


def test_cpls_splits_when_capacity_is_spare() -> None:
    env = SwarmEnv(generate_task("chain", 6, 3, split_p=1.0), default_pool())
    run_episode(env, CplsPolicy(), env.tasks[0].name, seed=0)
    assert any(k > 1 for k in env.state.split_k)


@pytest.mark.parametrize("name", ["sequential", "greedy", "cpls", "random"])
def test_policies_deterministic_and_drive_the_bare_state(name: str) -> None:
    task = generate_task("layered", 15, 11)
    env = SwarmEnv(task, default_pool())
    a = run_episode(env, make_policy(name), task.name, seed=7)
    b = run_episode(env, make_policy(name), task.name, seed=7)
    assert a == b and a.completed
    # Without an environment, decide() drives a bare state with the same decisions.
    sim = SwarmSimulator(task, SubagentPool(default_pool()), seed=1)
    pol = make_policy(name)
    rng = random.Random(0)
    for _ in range(10_000):
        if sim.state.all_done:
            break
        cmd = pol.decide(sim.state, rng)
        assert cmd.type in (START, WAIT)
        if cmd.type == WAIT:
            sim.wait()
        else:
            sim.decide()
            sim.start(cmd.slot, cmd.agent, cmd.k)
            sim.deliver_due()
    assert sim.state.all_done and math.isfinite(sim.state.clock)


def test_unknown_policy() -> None:
    with pytest.raises(
        ConfigError,
        match="unknown policy 'heft'; known: cpls, cpls-online, greedy, random, sequential",
    ):
        make_policy("heft")


@pytest.mark.parametrize("name", ["sequential", "greedy", "cpls"])
def test_rule_engines_let_loop_detection_end_a_hopeless_session(name: str) -> None:
    """A unit only one agent can run, failed there up to the loop limit: the rule engine
    starts it there anyway and the environment ends the session as a loop (incomplete),
    instead of the rule engine raising and taking a training run down with it."""
    from podium.envs.swarm.spec import parse_pool, parse_task

    pool = parse_pool(
        {
            "max_parallel": 2,
            "agents": [{"name": "only", "kinds": {"*": {"speed": 1.0, "success": 0.02}}}],
        }
    )
    task = parse_task({"name": "hopeless", "subtasks": [{"id": "a", "kind": "x", "work": 1.0}]})
    env = SwarmEnv(task, pool, EnvConfig(max_subtasks=2, loop_retry_limit=3))
    env.reset(seed=0)
    policy = make_policy(name)
    info: dict[str, object] = {}
    for _ in range(50):
        _, _, term, trunc, info = env.step(policy.act(env).action)
        if term or trunc:
            break
    assert info["loop_detected"] is True and info["completed"] is False
    assert "retry loop" in str(info["loop_reason"])


@pytest.mark.parametrize("name", ["sequential", "greedy", "cpls", "random"])
def test_rule_engines_are_scheduling_policies(name: str) -> None:
    """One interface for every policy: ``act(env, rng)`` gives a valid PolicyStep, stamped
    ``rules:<name>``, the same decision ``decide`` gives on the bare state."""
    from podium.envs.swarm.scheduling import PolicyStep, SchedulingPolicy

    task = generate_task("diamond", 9, 2)
    env = SwarmEnv(task, default_pool())
    env.reset(seed=1)
    policy: SchedulingPolicy = make_policy(name)
    assert policy.name == name and policy.version == f"rules:{name}"
    step = policy.act(env, random.Random(0))
    assert isinstance(step, PolicyStep) and step.log_prob == 0.0 and step.value == 0.0
    assert env.action_masks()[step.action]
    cmd = make_policy(name).decide(env.state, random.Random(0))
    assert cmd.encode(env.codec) == step.action
