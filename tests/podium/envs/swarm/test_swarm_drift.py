"""Non-stationary sub-agents: drift scenarios, the true pool over time, and the environment
sampling outcomes from a true pool while everything the planners read stays nominal."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool, default_tasks, make_policy
from podium.envs.swarm.drift import (
    NONE,
    DriftChange,
    DriftingPool,
    DriftSchedule,
    drift_document,
    load_drift,
    parse_drift,
    scenario_names,
)
from podium.envs.swarm.pool import SubagentPool, merge_work_factor
from podium.envs.swarm.spec import PoolSpec
from podium.envs.swarm.state import MERGE_SUFFIX
from podium.errors import ConfigError, SpecError
from podium.policy.rollout import Job, run_episodes


def test_shipped_scenarios_load() -> None:
    assert {"none", "slow-specialist", "flaky-agent"} <= set(scenario_names())
    pool = default_pool()
    for name in scenario_names():
        schedule = load_drift(name)
        assert schedule.name == name
        schedule.check(pool)  # every shipped scenario fits the shipped pool
    assert load_drift("none").changes == () and load_drift("") is NONE


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ("name: x\nchanges: [{agent: qa}]", "changes[0].at_s", "missing field 'at_s'"),
        ("name: x\nchanges: [{at_s: -1, agent: qa}]", "changes[0].at_s", "must be >= 0"),
        ("name: x\nchanges: [{at_s: .nan, agent: qa}]", "changes[0].at_s", "finite number"),
        ("name: x\nchanges: [{at_s: true, agent: qa}]", "changes[0].at_s", "finite number"),
        ("name: x\nchanges: [{at_s: 1}]", "changes[0].agent", "missing field 'agent'"),
        ("name: x\nchanges: [{at_s: 1, agent: ''}]", "changes[0].agent", "non-empty string"),
        ("name: x\nchanges: [{at_s: 1, merge_factor: 0}]", "changes[0].merge_factor", "> 0"),
        (
            "name: x\nchanges: [{at_s: 1, merge_factor: 2, speed_factor: 2}]",
            "changes[0].speed_factor",
            "unknown field 'speed_factor' (allowed: at_s, merge_factor)",
        ),
        (
            "name: x\nchanges: [{at_s: 1, agent: qa, merge_factor: 2}]",
            "changes[0].merge_factor",
            "unknown field 'merge_factor'",
        ),
        (
            "name: x\nchanges: [{at_s: 1, agent: qa}, {at_s: 2, agent: qa, speed_factor: 0}]",
            "changes[1].speed_factor",
            "must be > 0",
        ),
        (
            "name: x\nchanges: [{at_s: 1, agent: qa, success_factor: -0.5}]",
            "changes[0].success_factor",
            "must be >= 0",
        ),
        ("name: x\nchanges: [{at_s: 1, agent: qa, speed: 2}]", "changes[0].speed", "unknown"),
        ("name: x\nchanges: [{at_s: 1, agent: qa, kind: 3}]", "changes[0].kind", "string"),
        ("name: x\nchanges: {at_s: 1}", "drift.changes", "must be a list"),
        ("name: x\nchanges: [7]", "changes[0]", "must be a mapping"),
        ("changes: []", "drift.name", "non-empty string"),
        ("name: x\nwhen: 3", "drift.when", "unknown field"),
    ],
)
def test_bad_scenarios_name_the_field(tmp_path: Path, body: str, field: str, words: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(SpecError) as err:
        load_drift(path)
    assert err.value.field == field
    assert field in str(err.value) and words in str(err.value) and str(path) in str(err.value)


def test_unknown_names_and_pool_mismatches_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"unknown drift scenario 'slow-specialst'.*slow-spec"):
        load_drift("slow-specialst")
    with pytest.raises(SpecError, match="no such file"):
        load_drift(tmp_path / "absent.yaml")
    pool = default_pool()
    wizard = parse_drift({"name": "w", "changes": [{"at_s": 0, "agent": "wizard"}]})
    with pytest.raises(SpecError, match=r"changes\[0\]\.agent: no agent 'wizard'") as err:
        wizard.pool_at(pool, 1.0)
    assert err.value.field == "changes[0].agent"
    wrong_kind = parse_drift({"name": "k", "changes": [{"at_s": 0, "agent": "qa", "kind": "db"}]})
    with pytest.raises(SpecError, match=r"changes\[0\]\.kind: agent 'qa' cannot do kind 'db'"):
        wrong_kind.check(pool)


def profiles(pool: PoolSpec) -> dict[tuple[str, str], tuple[float, float, float]]:
    return {
        (a.name, k): (p.speed, p.success, p.noise) for a in pool.agents for k, p in a.kinds.items()
    }


def test_pool_at_before_and_after_the_change() -> None:
    nominal = default_pool()
    slow = load_drift("slow-specialist")
    assert slow.pool_at(nominal, 0.0) is nominal
    assert slow.pool_at(nominal, 59.999) is nominal
    after = slow.pool_at(nominal, 60.0)
    assert after.agent_names() == nominal.agent_names() and after.kinds == nominal.kinds
    changed = {
        key: (was, now)
        for (key, was), now in zip(profiles(nominal).items(), profiles(after).values(), strict=True)
        if was != now
    }
    assert changed == {("backend", "api"): ((1.0, 0.95, 0.2), (0.2, 0.95, 0.2))}
    assert slow.pool_at(nominal, 1e9) == after  # stays in effect
    assert nominal.agents[1].kinds["api"].speed == 1.0  # the nominal spec never changes

    flaky = load_drift("flaky-agent").pool_at(nominal, 61.0)
    qa = next(a for a in flaky.agents if a.name == "qa")
    assert qa.kinds["test"].success == pytest.approx(0.97 * 0.2)
    assert qa.kinds["test"].speed == 1.0


def test_latest_change_wins_wildcards_and_success_is_capped() -> None:
    nominal = default_pool()
    schedule = DriftSchedule(
        "story",
        (
            DriftChange(10, "generalist", "ui", speed_factor=0.5),
            DriftChange(20, "qa", success_factor=5.0),
            DriftChange(30, "generalist", "ui"),  # back to nominal
        ),
    )
    at15 = profiles(schedule.pool_at(nominal, 15))
    assert at15[("generalist", "ui")] == (0.275, 0.8, 0.35)  # an explicit entry off the "*"
    assert at15[("generalist", "*")] == (0.55, 0.8, 0.35)  # every other kind unchanged
    assert profiles(schedule.pool_at(nominal, 25))[("qa", "test")][1] == 1.0  # capped at 1
    assert profiles(schedule.pool_at(nominal, 35))[("generalist", "ui")] == (0.55, 0.8, 0.35)
    assert [schedule.phase(t) for t in (0, 10, 25, 99)] == [0, 1, 2, 3]


def test_drifting_pool_follows_the_clock_from_its_origin() -> None:
    nominal = SubagentPool(default_pool())
    true = DriftingPool(nominal, load_drift("slow-specialist"), origin=1000.0)
    assert true.at(1000.0) is nominal and true.at(1059.9) is nominal
    later = true.at(1060.0)
    assert later is true.at(5000.0)  # one pool per phase, cached
    assert later.profile("backend", "api").speed == 0.2  # type: ignore[union-attr]
    assert later.sample("backend", "api", 2.0, 7).duration == pytest.approx(
        5 * nominal.sample("backend", "api", 2.0, 7).duration
    )


def cpls_ratios(true_pool: PoolSpec | None) -> list[float]:
    pool = default_pool()
    tasks = default_tasks(pool)
    envs = SwarmEnv.replicas(8, tasks, pool, EnvConfig(rule_advice=False), true_pool=true_pool)
    episodes, _ = run_episodes(envs, [Job(t, s) for t in tasks for s in range(3)], rule="cpls")
    return [ep.info["latency"] / ep.info["lower_bound"] for ep in episodes]


def test_cpls_gets_worse_under_drift_while_what_it_reads_is_unchanged() -> None:
    nominal = default_pool()
    drifted = load_drift("slow-specialist").pool_at(nominal, 60.0)
    before, after = np.mean(cpls_ratios(None)), np.mean(cpls_ratios(drifted))
    # Measured: about 1.48 -> 2.74 (the specialist cpls picks for api got 5x slower).
    assert after > 1.5 * before

    task = next(t for t in default_tasks(nominal) if t.name == "login-system")
    plain = SwarmEnv([task], nominal)
    drifting = SwarmEnv([task], nominal, true_pool=drifted)
    obs_plain, info_plain = plain.reset(seed=3)
    obs_drift, info_drift = drifting.reset(seed=3)
    # What the policy and the rule engines read: identical layout, bound, observation, mask.
    assert drifting.layout == plain.layout and info_drift == info_plain
    np.testing.assert_array_equal(obs_drift, obs_plain)
    np.testing.assert_array_equal(drifting.action_masks(), plain.action_masks())
    assert drifting.state.pool.spec is nominal and drifting.sim.outcomes.spec is drifted  # type: ignore[union-attr]
    engine = make_policy("cpls")
    assert engine.act(drifting).action == engine.act(plain).action


def test_no_true_pool_and_a_nominal_true_pool_behave_identically() -> None:
    pool = default_pool()
    task = default_tasks(pool)[0]
    latencies = []
    for true_pool in (None, pool, load_drift("none").pool_at(pool, 1e6)):
        env = SwarmEnv([task], pool, true_pool=true_pool)
        env.reset(seed=11)
        engine = make_policy("cpls")
        while True:
            _, _, terminated, truncated, info = env.step(engine.act(env).action)
            if terminated or truncated:
                latencies.append(info["latency"])
                break
    assert latencies[0] == latencies[1] == latencies[2]


def test_a_clone_keeps_the_true_pool_and_its_luck() -> None:
    pool = default_pool()
    drifted = load_drift("flaky-agent").pool_at(pool, 60.0)
    env = SwarmEnv(default_tasks(pool), pool, true_pool=drifted)
    env.reset(seed=5, options={"task": "login-system"})
    engine = make_policy("cpls")
    env.step(engine.act(env).action)
    twin = env.clone()
    assert twin.true_pool is env.true_pool and twin.sim.outcomes is env.sim.outcomes  # type: ignore[union-attr]
    ends = []
    for e in (env, twin):
        while True:
            _, _, terminated, truncated, info = e.step(engine.act(e).action)
            if terminated or truncated:
                ends.append(info["latency"])
                break
    assert ends[0] == ends[1]


def test_a_true_pool_with_other_agents_is_refused() -> None:
    pool = default_pool()
    other = PoolSpec(agents=pool.agents[:-1], name="fewer")
    env = SwarmEnv(default_tasks(pool)[:1], pool, true_pool=other)
    with pytest.raises(ConfigError, match="true pool 'fewer' has agents"):
        env.reset(seed=0)


def test_session_seeds_seed_the_simulator_with_the_reset_seed() -> None:
    from podium.envs.swarm.simulator import SwarmSimulator

    pool = default_pool()
    task = default_tasks(pool)[0]
    env = SwarmEnv([task], pool, EnvConfig(session_seeds=True))
    env.reset(seed=123456789)
    reference = SwarmSimulator(task, env.pool, seed=123456789)
    assert env.sim._seed_base == reference._seed_base  # type: ignore[union-attr]
    plain = SwarmEnv([task], pool)
    plain.reset(seed=123456789)
    assert plain.sim._seed_base != reference._seed_base  # type: ignore[union-attr]


# -- the pool's merges (costly-merges) ----------------------------------------------------------


def test_a_pool_change_scales_the_merge_cost_and_round_trips(tmp_path: Path) -> None:
    nominal = default_pool()
    costly = load_drift("costly-merges")
    assert costly.pool_at(nominal, 59.0) is nominal
    after = costly.pool_at(nominal, 60.0)
    assert after.split_overhead == pytest.approx(nominal.split_overhead * 8)
    assert merge_work_factor(nominal, after) == pytest.approx(8.0)
    assert all(
        now.speed == pytest.approx(was.speed * 1.15)
        for a, b in zip(nominal.agents, after.agents, strict=True)
        for was, now in zip(a.kinds.values(), b.kinds.values(), strict=True)
    )
    (tmp_path / "again.json").write_text(json.dumps(drift_document(costly)))
    assert load_drift(tmp_path / "again.json") == costly
    restored = parse_drift(
        {"name": "x", "changes": [{"at_s": 1, "merge_factor": 3}, {"at_s": 2, "merge_factor": 1}]}
    )
    assert restored.pool_at(nominal, 1.5).split_overhead == pytest.approx(0.45)
    assert restored.pool_at(nominal, 2.0).split_overhead == pytest.approx(0.15)  # latest wins
    free = replace(nominal, split_overhead=0.0)
    with pytest.raises(SpecError, match="plans merges as free"):
        costly.check(free)


def _merge_durations(true_pool: PoolSpec | None) -> dict[str, float]:
    """cpls on the task library's splittable task, seed 5: each unit's duration by id."""
    pool = default_pool()
    task = next(t for t in default_tasks(pool) if any(s.splittable for s in t.subtasks))
    env = SwarmEnv([task], pool, true_pool=true_pool)
    env.reset(seed=5)
    engine = make_policy("cpls")
    while True:
        _, _, terminated, truncated, _ = env.step(engine.act(env).action)
        if terminated or truncated:
            break
    state = env.state
    return {
        f"{state.unit_id(r.unit)}/{r.attempt}": r.end - r.start
        for r in state.executions
        if r.success is not None
    }


def test_merges_last_the_true_factor_longer_with_the_same_luck() -> None:
    """Planned at the spec's overhead, drawn at the true one: every merge lasts exactly 8x as
    long (the same seed, the same draw), every other execution exactly as long."""
    nominal = default_pool()
    plain = _merge_durations(None)
    costly = _merge_durations(replace(nominal, split_overhead=nominal.split_overhead * 8))
    merges = [u for u in plain if u.split("/")[0].endswith(MERGE_SUFFIX)]
    assert merges, "cpls should split a subtask of this task"
    assert plain.keys() == costly.keys()
    for unit, duration in plain.items():
        factor = 8.0 if unit in merges else 1.0
        assert costly[unit] == pytest.approx(duration * factor, rel=1e-12), unit
