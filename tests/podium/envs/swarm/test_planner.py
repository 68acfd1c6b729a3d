"""The rollout planner: valid, honest (never touches the real session), deterministic, and no
worse than the cpls it improves on; and fresh luck for the copies it simulates."""

from __future__ import annotations

import copy
import random
import statistics

import numpy as np
import pytest

from podium.envs.swarm.baselines import CplsPolicy
from podium.envs.swarm.benchmark import run_episode
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.planner import PlannerConfig, RolloutPlanner
from podium.envs.swarm.spec import default_pool, default_pool_path, default_tasks, load_pool
from podium.errors import ConfigError

TASKS = {t.name: t for t in default_tasks()}
MISADVERTISED = load_pool(default_pool_path().parent / "misadvertised.yaml")


def _env(task: str, pool: object = None) -> SwarmEnv:
    t = TASKS[task]
    return SwarmEnv(
        [t],
        pool or default_pool(),  # type: ignore[arg-type]
        EnvConfig(max_subtasks=len(t.subtasks), invalid_action="raise"),
    )


def _snapshot(env: SwarmEnv) -> tuple[object, ...]:
    assert env.sim is not None
    st = env.sim.state
    return (
        st.clock,
        [(r.id, r.agent, r.start, r.end, r.success) for r in st.executions],
        list(st.runnable),
        sorted(env.sim._events),
        env.sim._seed_base,
        env.observation().copy().tobytes(),
        env.action_masks().copy().tobytes(),
    )


def test_a_stepped_clone_leaves_the_original_alone() -> None:
    env = _env("diamond-10")
    env.reset(seed=5, options={"task": "diamond-10"})
    cpls = CplsPolicy()
    for _ in range(4):
        env.step(cpls.act(env).action)
    before = _snapshot(env)
    twin = env.clone()
    deep = copy.deepcopy(env)
    for other in (twin, deep):
        done = False
        while not done:
            _, _, te, tr, _ = other.step(cpls.act(other).action)
            done = te or tr
        assert other.state.all_done
    assert _snapshot(env) == before


def test_act_never_changes_the_session_it_plans_for() -> None:
    # Interleaving planner calls with cpls's own steps must not change anything cpls sees:
    # the same episode, to the last execution, as cpls alone.
    for seed in range(3):
        alone = _env("layered-15")
        ref = run_episode(alone, CplsPolicy(), "layered-15", seed)
        env = _env("layered-15", MISADVERTISED)
        plain = _env("layered-15", MISADVERTISED)
        plain_ref = run_episode(plain, CplsPolicy(), "layered-15", seed)
        env.reset(seed=seed, options={"task": "layered-15"})
        planner, cpls, rng = (
            RolloutPlanner(PlannerConfig(rollouts=2)),
            CplsPolicy(),
            random.Random(0),
        )
        done = False
        while not done:
            before = _snapshot(env)
            planner.act(env, rng)
            assert _snapshot(env) == before
            _, _, te, tr, info = env.step(cpls.act(env).action)
            done = te or tr
        assert info["latency"] == plain_ref.latency
        assert ref.latency != plain_ref.latency  # the truth mattered: the pools differ


def test_every_action_is_valid_and_episodes_complete() -> None:
    planner = RolloutPlanner(PlannerConfig(candidates=4, rollouts=3))
    for task, pool in (("fanout-12", None), ("login-system", MISADVERTISED)):
        env = _env(task, pool)
        for seed in range(3):
            env.reset(seed=seed, options={"task": task})
            rng = random.Random(seed)
            done = False
            while not done:
                mask = env.action_masks().copy()
                action = planner.act(env, rng).action
                assert mask[action], env.codec.decode(action)
                _, _, te, tr, info = env.step(action)  # invalid_action="raise" too
                done = te or tr
            assert info["completed"] and not info["loop_detected"]


def test_deterministic_given_the_seed() -> None:
    def latencies(seed: int) -> list[float]:
        env = _env("diamond-10", MISADVERTISED)
        planner = RolloutPlanner(PlannerConfig(rollouts=4, seed=seed))
        out = []
        for s in range(3):
            env.reset(seed=s, options={"task": "diamond-10"})
            done = False
            while not done:  # no rng passed: the planner's own seeded generator
                _, _, te, tr, info = env.step(planner.act(env).action)
                done = te or tr
            out.append(info["latency"])
        return out

    assert latencies(7) == latencies(7)
    env = _env("diamond-10")
    a = [run_episode(env, RolloutPlanner(), "diamond-10", s).latency for s in range(2)]
    b = [run_episode(env, RolloutPlanner(), "diamond-10", s).latency for s in range(2)]
    assert a == b  # run_episode's per-episode random.Random(seed) drives the rollouts


def test_no_worse_than_cpls_on_paired_seeds() -> None:
    # On the advertised = true default pool the planner improves on cpls's own choices; with
    # the significance test it deviates only when the rollouts say so clearly.
    env = _env("fanout-12")
    seeds = range(12)
    cpls = [run_episode(env, CplsPolicy(), "fanout-12", s).latency for s in seeds]
    planner = RolloutPlanner(PlannerConfig(rollouts=8))
    plan = [run_episode(env, planner, "fanout-12", s).latency for s in seeds]
    assert statistics.fmean(plan) <= 1.01 * statistics.fmean(cpls), (plan, cpls)


def test_on_a_misadvertised_pool_it_beats_cpls_reading_the_advertisement() -> None:
    env = _env("diamond-10", MISADVERTISED)
    seeds = range(6)
    cpls = [run_episode(env, CplsPolicy(), "diamond-10", s).latency for s in seeds]
    plan = [run_episode(env, RolloutPlanner(), "diamond-10", s).latency for s in seeds]
    assert statistics.fmean(plan) < 0.85 * statistics.fmean(cpls), (plan, cpls)


def test_fresh_luck_redraws_what_is_in_flight_given_only_that_it_is_still_running() -> None:
    env = _env("fanout-12")
    env.reset(seed=1, options={"task": "fanout-12"})
    cpls = CplsPolicy()
    while len(env.state.running) < 3:
        env.step(cpls.act(env).action)
    env.step(env.codec.wait)  # some time passes: the in-flight ones have run a while
    assert env.sim is not None
    clock = env.state.clock
    ends = []
    for seed in range(40):
        twin = copy.deepcopy(env.sim)
        twin.fresh_luck(seed)
        assert {e[1] for e in twin._events} == set(env.state.running)
        assert all(end >= clock for end, _, _ in twin._events)
        ends.append(sorted(twin._events))
    again = copy.deepcopy(env.sim)
    again.fresh_luck(3)
    assert sorted(again._events) == ends[3]  # a seed gives the same luck
    assert len({tuple(e) for e in ends}) > 30  # other seeds, other luck
    outcomes = [ok for e in ends for _, _, ok in e]
    assert 0 < sum(outcomes) < len(outcomes)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ConfigError, match="candidates >= 1 and rollouts >= 1"):
        RolloutPlanner(PlannerConfig(rollouts=0))
    assert RolloutPlanner().version == "reference:planner"
    assert np.isfinite(PlannerConfig().z)


def _first_decisions(
    task: str, pool: object, model: str, seed: int, stats: object = None
) -> list[int]:
    t = TASKS[task]
    env = SwarmEnv(
        [t],
        pool,  # type: ignore[arg-type]
        EnvConfig(max_subtasks=len(t.subtasks), invalid_action="raise"),
        stats=stats,  # type: ignore[arg-type]
    )
    env.reset(seed=seed, options={"task": task})
    planner = RolloutPlanner(PlannerConfig(model=model, rollouts=8))
    out = []
    for _ in range(3):  # before any execution completes: the sessions' states stay equal
        out.append(planner.act(env).action)
        env.step(out[-1])
    return out


@pytest.mark.parametrize("task", ["diamond-10", "layered-15"])
def test_the_online_planner_simulates_the_estimate_never_the_truth(task: str) -> None:
    from podium.observed import AgentStats

    for seed in range(2):
        # An empty store estimates exactly the advertisement: the online planner on a pool
        # with hidden true profiles must decide as the truth-reading planner does on a pool
        # that has none, and unlike the truth-reading planner on the real truth.
        online = _first_decisions(task, MISADVERTISED, "estimates", seed, AgentStats())
        on_advert = _first_decisions(task, MISADVERTISED.advertised(), "truth", seed)
        on_truth = _first_decisions(task, MISADVERTISED, "truth", seed)
        assert online == on_advert
        assert online != on_truth


def test_the_online_planner_keeps_one_estimate_per_episode() -> None:
    from podium.envs.swarm.planner import make_scheduler
    from podium.observed import AgentStats

    stats = AgentStats()
    t = TASKS["diamond-10"]
    env = SwarmEnv([t], MISADVERTISED, EnvConfig(max_subtasks=len(t.subtasks)), stats=stats)
    env.reset(seed=0, options={"task": t.name})
    planner = make_scheduler("planner-online")
    assert isinstance(planner, RolloutPlanner)
    assert planner.version == "rules:planner-online"
    model = planner.model(env)
    assert model.spec.agents == MISADVERTISED.advertised().agents  # nothing observed yet
    stats.record("qa-fast", "test", 1.0, 0.5, True)  # evidence arriving mid-episode
    assert planner.model(env) is model
    env.reset(seed=1, options={"task": t.name})
    assert planner.model(env) is not model  # the next episode plans on the new estimate
    assert planner.model(env).profile(model.agent_names.index("qa-fast"), "test") != model.profile(
        model.agent_names.index("qa-fast"), "test"
    )
    with pytest.raises(ConfigError, match="planner model must be one of truth, estimates"):
        RolloutPlanner(PlannerConfig(model="oracle"))
