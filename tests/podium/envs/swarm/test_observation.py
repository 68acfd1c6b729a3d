"""The pool-independent observation: widths, pair rows, the incremental encoder against a
from-scratch encoding, and the statistics store the environment reads and feeds."""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest

from podium.envs.swarm.baselines import CplsPolicy
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.observation import (
    DURATION_CAP,
    GLOBAL_FEATURES,
    PAIR_FEATURES,
    RUNNING_FEATURES,
    SLOT_FEATURES,
    ObservationEncoder,
)
from podium.envs.swarm.spec import PoolSpec, default_pool, parse_pool, parse_task
from podium.envs.swarm.state import MERGE_PART
from podium.errors import ConfigError
from podium.observed import AgentStats

# Two ui agents that trade speed for reliability (cpls, by expected time to success, prefers
# "steady": 1.0 × 1.0 > 2.0 × 0.4) and a db-only agent. Deterministic durations.
DUO = parse_pool(
    {
        "name": "duo",
        "max_parallel": 2,
        "agents": [
            {"name": "quick", "kinds": {"ui": {"speed": 2.0, "success": 0.4, "noise": 0.1}}},
            {"name": "steady", "kinds": {"ui": {"speed": 1.0, "success": 1.0, "noise": 0.0}}},
            {"name": "dba", "kinds": {"db": {"speed": 1.0, "success": 1.0, "noise": 0.0}}},
        ],
    }
)
QUICK, STEADY, DBA = 0, 1, 2


def _task() -> Any:
    return parse_task(
        {
            "name": "two",
            "subtasks": [
                {"id": "a", "kind": "ui", "work": 2.0},
                {"id": "b", "kind": "db", "work": 1.0, "deps": ["a"]},
            ],
        }
    )


def _pairs(env: SwarmEnv, obs: np.ndarray) -> np.ndarray:
    lay = env.layout
    return obs[lay.pair_block.slice].reshape(lay.max_subtasks, lay.num_agents, PAIR_FEATURES)


def _play(env: SwarmEnv, policy: Any = None, rng: random.Random | None = None) -> dict[str, Any]:
    """Run the episode to its end (cpls, or uniform valid actions with ``rng``)."""
    policy = policy or CplsPolicy()
    while True:
        if rng is not None:
            a = int(rng.choice(np.flatnonzero(env.action_masks())))
        else:
            a = policy.act(env).action
        _, _, term, trunc, info = env.step(a)
        if term or trunc:
            return dict(info)


def test_no_width_depends_on_the_pool() -> None:
    """Pools of 9 and 3 agents over different kinds: the same F, G, W, P and global token; only
    the pair block's agent axis differs."""
    big = SwarmEnv(generate_task("layered", 10, 0), default_pool(), EnvConfig(max_subtasks=12))
    small = SwarmEnv(_task(), DUO, EnvConfig(max_subtasks=12))
    a, b = big.layout, small.layout
    assert (a.num_agents, b.num_agents) == (9, 3)
    for lay in (a, b):
        assert (lay.slot_features, lay.global_features) == (SLOT_FEATURES, GLOBAL_FEATURES)
        assert (lay.running_features, lay.pair_features) == (RUNNING_FEATURES, PAIR_FEATURES)
        assert lay.slots_end == 12 * SLOT_FEATURES
        assert lay.size - lay.pair_block.start == 12 * lay.num_agents * PAIR_FEATURES
    assert a.global_token_features == b.global_token_features
    assert a.token_end == b.token_end  # everything before the pair block lines up
    obs_a, _ = big.reset(seed=0)
    obs_b, _ = small.reset(seed=0)
    assert big.layout.split(obs_a[None])[3].shape[2:] == (9, PAIR_FEATURES)
    assert small.layout.split(obs_b[None])[3].shape[2:] == (3, PAIR_FEATURES)


def test_a_pair_row_says_what_the_agent_advertises_and_what_was_observed() -> None:
    stats = AgentStats(prior_weight=5.0)
    for _ in range(5):  # quick on ui: always succeeds, at pace 0.5 (speed 2, as advertised)
        stats.record("quick", "ui", 1.0, 0.5, True)
    # The advice on the advertisement (not the default, online), checked below.
    env = SwarmEnv(_task(), DUO, EnvConfig(max_subtasks=4, advice="advertised"), stats=stats)
    obs, _ = env.reset(seed=0)
    col = env.layout.pair_col
    pairs = _pairs(env, obs)
    scale = 1.0 / env.bound.value
    quick = pairs[0, QUICK]
    # Advertised: 2 units at speed 2; success 0.4; efficiency 0.8 of steady's 1.0.
    assert quick[col.can_do] == 1.0
    assert quick[col.duration] == pytest.approx(1.0 * scale)
    assert quick[col.success] == pytest.approx(0.4)
    assert quick[col.noise] == pytest.approx(0.1)
    assert quick[col.time_to_success] == pytest.approx(2.5 * scale)
    assert quick[col.relative] == pytest.approx(0.8)
    # Estimated: the store's blend of the advertisement (weight 5) with what it saw.
    est = stats.estimate("quick", "ui", DUO.agents[QUICK].profile("ui"))
    assert est is not None and 0.4 < est.success < 1.0 and 0 < est.confidence < 1
    assert quick[col.estimated_duration] == pytest.approx(2.0 / est.speed * scale, rel=1e-6)
    assert quick[col.estimated_success] == pytest.approx(est.success, rel=1e-6)
    assert quick[col.estimated_time_to_success] == pytest.approx(
        2.0 / est.speed / est.success * scale, rel=1e-6
    )
    assert quick[col.estimated_relative] == pytest.approx(min(1.0, est.speed * est.success))
    assert quick[col.confidence] == pytest.approx(est.confidence, rel=1e-6)
    # steady: nothing observed, so the estimate is the advertisement.
    steady = pairs[0, STEADY]
    assert steady[col.estimated_duration] == steady[col.duration] == pytest.approx(2.0 * scale)
    assert steady[col.confidence] == 0.0 and steady[col.relative] == 1.0
    # dba cannot do ui: the whole row is zero; on the db slot it is the only agent.
    assert not pairs[0, DBA].any()
    assert pairs[1, DBA, col.can_do] == 1.0 and pairs[1, DBA, col.relative] == 1.0
    assert not pairs[1, QUICK].any() and not pairs[1, STEADY].any()
    # The advice (cpls on the advertisement): steady for a, and the dynamic columns move.
    assert steady[col.advised_agent] == 1.0 and quick[col.advised_agent] == 0.0
    obs, *_ = env.step(env.codec.start(0, QUICK))
    pairs = _pairs(env, obs)
    mp = env.state.max_parallel
    assert pairs[0, QUICK, col.running] == pytest.approx(1 / mp)
    assert pairs[0, STEADY, col.running] == 0.0
    assert pairs[1, QUICK, col.agent_running] == pytest.approx(1 / mp)  # every slot sees it
    while env.state.running:
        obs, *_ = env.step(env.codec.wait)
    if env.state.failures:  # quick failed a: one failure of the next unit there, of 4
        assert _pairs(env, obs)[0, QUICK, col.failures] == pytest.approx(0.25)


def test_hopeless_agents_are_clipped_not_infinite() -> None:
    pool = parse_pool(
        {
            "agents": [
                {"name": "never", "kinds": {"ui": {"speed": 0.001, "success": 0.0}}},
                {"name": "ok", "kinds": {"*": {"speed": 1.0, "success": 1.0}}},
            ]
        }
    )
    env = SwarmEnv(_task(), pool, EnvConfig(max_subtasks=2))
    obs, _ = env.reset(seed=0)
    row = _pairs(env, obs)[0, 0]
    col = env.layout.pair_col
    assert row[col.duration] == row[col.time_to_success] == DURATION_CAP
    assert row[col.relative] == 0.0 and np.isfinite(obs).all()


@pytest.mark.parametrize("advice", ["advertised", "online"])
def test_the_incremental_encoder_matches_a_from_scratch_encoding(advice: str) -> None:
    """At every step of noisy random episodes (splits, failures, retries, a store that is fed
    between them), the incrementally updated vector equals a fresh encoder's of the same
    state."""
    stats = AgentStats()
    task = generate_task("layered", 16, 5, split_p=0.7)
    config = EnvConfig(max_subtasks=20, max_running_obs=3, advice=advice)  # type: ignore[arg-type]
    env = SwarmEnv(task, default_pool(), config, stats=stats)
    rng = random.Random(3)
    checked = 0
    for episode in range(3):
        obs, _ = env.reset(seed=episode)
        done = False
        while not done:
            fresh = ObservationEncoder(env.layout, env.pool, advisor=CplsPolicy())
            fresh.advice_pool = env._encoder.advice_pool
            fresh.reset(task, env._task_static, 1.0 / env.bound.value, stats)
            state = copy.deepcopy(env.state)
            state.dirty = set(range(len(task.subtasks)))
            fresh.update(state, env._task_static, env._steps / env._max_steps)
            np.testing.assert_array_equal(fresh.obs, obs)
            checked += 1
            a = int(rng.choice(np.flatnonzero(env.action_masks())))
            obs, _, term, trunc, _ = env.step(a)
            done = term or trunc
    assert checked > 50 and stats.version > 0


def test_the_store_is_fed_at_episode_end_with_each_units_exact_work() -> None:
    """Noise-free agents split and retried: every duration / work recorded is exactly 1 /
    speed (a chunk's own work, not its subtask's), so the estimated speed is the advertised
    one; nothing is recorded before the end, nor by a copy, nor with feeding off."""
    pool = parse_pool(
        {
            "max_parallel": 4,
            "split_overhead": 0.25,
            "agents": [
                {"name": "flaky", "kinds": {"ui": {"speed": 3.0, "success": 0.5, "noise": 0.0}}},
                {"name": "gen", "kinds": {"*": {"speed": 0.5, "success": 1.0, "noise": 0.0}}},
            ],
        }
    )
    task = generate_task("fanout", 8, 1, kinds=["ui"], split_p=1.0)
    stats = AgentStats()
    env = SwarmEnv(task, pool, EnvConfig(max_subtasks=8), stats=stats)
    env.reset(seed=2)
    rng = random.Random(0)
    codec = env.codec
    for _ in range(12):  # splits (preferred), failures in flight
        valid = np.flatnonzero(env.action_masks())
        splits = [a for a in valid if a < codec.wait and codec.decode(int(a))[3] > 1]
        env.step(int(rng.choice(splits or valid)))
    assert stats.version == 0, "nothing is recorded while the episode runs"
    twin = env.clone()
    _play(twin)
    assert stats.version == 0, "a copy's imagined episode feeds nothing"
    _play(env)
    done = [r for r in env.state.executions if r.success is not None]
    assert stats.version == len(done) > 0
    assert any(env.state.u_part[r.unit] >= 0 for r in done), "chunks should have run"
    assert stats.observed("flaky", "ui") > 0 and stats.observed("gen", "ui") > 0
    for name, speed in (("flaky", 3.0), ("gen", 0.5)):
        prof = pool.agents[env.pool.agent_index[name]].profile("ui")
        est = stats.estimate(name, "ui", prof)
        assert est is not None and est.speed == pytest.approx(speed, rel=1e-9)
    # Exactly the executions, in start order, with their own work.
    again = AgentStats()
    for r in done:
        names = env.pool.agent_names
        work = env.state.u_work[r.unit]
        merge = env.state.u_part[r.unit] == MERGE_PART
        again.record(names[r.agent], "ui", work, r.end - r.start, bool(r.success), merge=merge)
    assert again.to_dict() == stats.to_dict()
    # The next episode reads what was fed.
    obs, _ = env.reset(seed=3)
    assert (_pairs(env, obs)[:, :, env.layout.pair_col.confidence] > 0).any()
    # Off: not fed.
    quiet = SwarmEnv(task, pool, EnvConfig(max_subtasks=8, feed_stats=False), stats=stats)
    before = stats.version
    quiet.reset(seed=4)
    _play(quiet)
    assert stats.version == before


def test_online_advice_plans_on_the_estimated_pool() -> None:
    """quick advertises 40% success; the store saw it succeed every time. cpls on the
    advertisement advises steady, cpls on the estimates quick."""
    stats = AgentStats(prior_weight=1.0)
    for _ in range(50):
        stats.record("quick", "ui", 1.0, 0.5, True)
    col_of = {}
    for advice in ("advertised", "online"):
        config = EnvConfig(max_subtasks=2, advice=advice, feed_stats=False)  # type: ignore[arg-type]
        env = SwarmEnv(_task(), DUO, config, stats=stats)
        obs, _ = env.reset(seed=0)
        advised = np.argwhere(_pairs(env, obs)[:, :, env.layout.pair_col.advised_agent] > 0)
        col_of[advice] = advised.tolist()
    assert col_of == {"advertised": [[0, STEADY]], "online": [[0, QUICK]]}
    # Without a store, online advice is the advertised one.
    env = SwarmEnv(_task(), DUO, EnvConfig(max_subtasks=2, advice="online"))
    obs, _ = env.reset(seed=0)
    assert _pairs(env, obs)[0, STEADY, env.layout.pair_col.advised_agent] == 1.0
    with pytest.raises(ConfigError, match="advice"):
        SwarmEnv(_task(), DUO, EnvConfig(advice="oracle"))  # type: ignore[arg-type]


def test_a_pool_with_true_profiles_is_planned_on_its_advertisement() -> None:
    doc = {
        "agents": [
            {
                "name": "liar",
                "kinds": {"ui": {"speed": 1.0, "success": 1.0, "noise": 0.0}},
                "true": {"ui": {"speed": 0.25}},
            },
            {"name": "gen", "kinds": {"*": {"speed": 0.5, "success": 1.0, "noise": 0.0}}},
        ]
    }
    spec: PoolSpec = parse_pool(doc)
    assert spec.has_truth
    env = SwarmEnv(_task(), spec, EnvConfig(max_subtasks=2))
    assert env.pool.spec.truth is None and env.true_pool is not None
    obs, _ = env.reset(seed=0)
    col = env.layout.pair_col
    scale = 1.0 / env.bound.value
    assert _pairs(env, obs)[0, 0, col.duration] == pytest.approx(2.0 * scale)  # advertised
    env.step(env.codec.start(0, 0))
    while env.state.running:
        env.step(env.codec.wait)
    first = env.state.executions[0]
    assert first.end - first.start == pytest.approx(8.0)  # drawn from the truth: 2 / 0.25
    with pytest.raises(ConfigError, match="give the truth one way"):
        SwarmEnv(_task(), spec, true_pool=spec.true_spec())
