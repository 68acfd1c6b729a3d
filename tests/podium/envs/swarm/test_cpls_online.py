"""cpls-online: cpls on the statistics store's estimated pool, pinned per episode."""

from __future__ import annotations

import logging
import statistics
from dataclasses import replace

import pytest

from podium.envs.swarm import (
    BASELINES,
    EnvConfig,
    SwarmEnv,
    default_pool,
    default_tasks,
    make_policy,
)
from podium.envs.swarm.baselines import CplsOnlinePolicy, CplsPolicy, RuleEngine
from podium.envs.swarm.spec import PoolSpec
from podium.observed import AgentStats

CONFIG = EnvConfig(rule_advice=False)


def _with_success(spec: PoolSpec, agent: str, kind: str, success: float) -> PoolSpec:
    agents = tuple(
        replace(a, kinds={**a.kinds, kind: replace(a.kinds[kind], success=success)})
        if a.name == agent
        else a
        for a in spec.agents
    )
    return replace(spec, agents=agents)


def _lying_pools() -> tuple[PoolSpec, PoolSpec]:
    """(advertised, true): the fast api and test agents advertise 95 % success and deliver 30 %,
    so cpls on the advertisement sends them the critical work and retries it again and again."""
    base = default_pool()
    advertised = _with_success(
        _with_success(base, "api-fast", "api", 0.95), "qa-fast", "test", 0.95
    )
    true = _with_success(_with_success(base, "api-fast", "api", 0.3), "qa-fast", "test", 0.3)
    return advertised, true


def _run(env: SwarmEnv, policy: RuleEngine, seed: int, task: str) -> tuple[float, list[int]]:
    """One episode: its latency and its actions."""
    env.reset(seed=seed, options={"task": task})
    actions, done, info = [], False, {}
    while not done:
        a = policy.act(env).action
        actions.append(a)
        _, _, term, trunc, info = env.step(a)
        done = term or trunc
    return float(info["latency"]), actions


def test_cpls_online_is_a_baseline() -> None:
    assert BASELINES["cpls-online"] is CplsOnlinePolicy
    policy = make_policy("cpls-online")
    assert isinstance(policy, CplsPolicy) and policy.version == "rules:cpls-online"


def test_without_a_store_it_is_cpls_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    env = SwarmEnv(default_tasks(), config=CONFIG)
    online, cpls = CplsOnlinePolicy(), CplsPolicy()
    with caplog.at_level(logging.WARNING):
        for seed in range(3):
            assert _run(env, online, seed, "diamond-10") == _run(env, cpls, seed, "diamond-10")
    warnings = [r for r in caplog.records if "cpls-online has no statistics store" in r.message]
    assert len(warnings) == 1 and "stats=AgentStats()" in warnings[0].message


def test_an_empty_store_plans_as_cpls_on_the_advertisement() -> None:
    env = SwarmEnv(default_tasks(), config=replace(CONFIG, feed_stats=False), stats=AgentStats())
    for seed in range(3):
        assert _run(env, CplsOnlinePolicy(), seed, "layered-15") == _run(
            env, CplsPolicy(), seed, "layered-15"
        )


def test_each_episode_keeps_the_estimate_it_started_with() -> None:
    advertised, true = _lying_pools()
    stats = AgentStats()
    env = SwarmEnv(
        default_tasks(), advertised, replace(CONFIG, feed_stats=False), true_pool=true, stats=stats
    )
    online = CplsOnlinePolicy()
    env.reset(seed=1, options={"task": "login-system"})
    env.step(online.act(env).action)
    first = online.estimated(env.state)
    assert first is not None
    assert first.profile("api-fast", "api") == advertised.agents[2].kinds["api"]
    for _ in range(50):  # meanwhile other sessions show api-fast failing
        stats.record("api-fast", "api", 1.0, 0.6, False)
    env.step(online.act(env).action)
    assert online.estimated(env.state) is first  # never mid-episode
    env.reset(seed=2, options={"task": "login-system"})
    online.act(env)
    fresh = online.estimated(env.state)
    assert fresh is not None and fresh is not first
    assert fresh.profile("api-fast", "api").success < 0.1  # type: ignore[union-attr]
    online.act(env)
    assert online.estimated(env.state) is fresh  # cached by the store's version


def test_one_policy_pins_each_of_several_environments() -> None:
    advertised, true = _lying_pools()
    stats = AgentStats()
    envs = SwarmEnv.replicas(
        2,
        default_tasks(),
        advertised,
        replace(CONFIG, feed_stats=False),
        true_pool=true,
        stats=stats,
    )
    online = CplsOnlinePolicy()
    envs[0].reset(seed=1, options={"task": "login-system"})
    online.act(envs[0])
    stats.record("api-fast", "api", 1.0, 0.6, False)
    envs[1].reset(seed=1, options={"task": "login-system"})
    online.act(envs[1])
    online.act(envs[0])
    a, b = online.estimated(envs[0].state), online.estimated(envs[1].state)
    assert a is not None and b is not None and a is not b


def test_on_a_lying_pool_cpls_online_beats_cpls_on_the_advertisement() -> None:
    """Paired seeds: the same sub-agent luck for both. cpls-online's store is fed by its own
    episodes (``EnvConfig.feed_stats``), after a few warm-up sessions, as in production.
    Measured 0.77× over 25 seeds × the 12 shipped tasks (mean of per-task ratios)."""
    advertised, true = _lying_pools()
    stats = AgentStats()
    online_env = SwarmEnv(default_tasks(), advertised, CONFIG, true_pool=true, stats=stats)
    plain_env = SwarmEnv(default_tasks(), advertised, CONFIG, true_pool=true)
    online, cpls = CplsOnlinePolicy(), CplsPolicy()
    tasks = ["diamond-25", "layered-30", "login-system", "microservice-deployment"]
    for i in range(8):  # warm-up: the store learns from these sessions
        _run(online_env, online, 10_000 + i, tasks[i % len(tasks)])
    assert stats.observed("api-fast", "api") > 0
    ours, theirs = [], []
    for task in tasks:
        for seed in range(15):
            ours.append(_run(online_env, online, seed, task)[0])
            theirs.append(_run(plain_env, cpls, seed, task)[0])
    ratio = statistics.fmean(ours) / statistics.fmean(theirs)
    assert ratio < 0.9, f"cpls-online / cpls mean latency = {ratio:.3f}"
    # And it learned the truth of the liar it was fed on.
    est = stats.estimate("api-fast", "api", advertised.agents[2].kinds["api"])
    assert est is not None and est.success < 0.6
