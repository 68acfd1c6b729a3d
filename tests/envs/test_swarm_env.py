"""The swarm environment: exact schedules, masks, loops, isolation, Gymnasium conformance."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.simulator.env import EnvConfig, SwarmEnv, valid_action_mask
from podium.envs.swarm.simulator.executor import SwarmSimulator
from podium.envs.swarm.spec import default_pool, parse_pool, parse_task
from podium.envs.swarm.state import InvalidActionError
from podium.envs.swarm.trajectory import episode_trajectory
from podium.errors import ConfigError
from podium.v1 import subtask_pb2, trajectory_pb2

DET_POOL = parse_pool(
    {
        "max_parallel": 2,
        "main_step_cost": 0.05,
        "split_overhead": 0.25,
        "agents": [
            {"name": "ui-s", "kinds": {"ui": {"speed": 1.0, "success": 1.0, "noise": 0.0}}},
            {"name": "db-s", "kinds": {"db": {"speed": 2.0, "success": 1.0, "noise": 0.0}}},
            {"name": "gen", "kinds": {"*": {"speed": 0.5, "success": 1.0, "noise": 0.0}}},
        ],
    }
)
UI, DB, GEN = 0, 1, 2


def _task(*subs: dict[str, Any], max_parallel: int | None = None) -> Any:
    doc: dict[str, Any] = {"name": "hand", "subtasks": list(subs)}
    if max_parallel:
        doc["max_parallel"] = max_parallel
    return parse_task(doc)


def _run(env: SwarmEnv, actions: list[int]) -> tuple[float, dict[str, Any]]:
    total, info = 0.0, {}
    for i, a in enumerate(actions):
        _, r, term, trunc, info = env.step(a)
        total += r
        assert term == (i == len(actions) - 1), f"step {i}: terminated={term}"
        assert not trunc
    return total, info


def test_chain_latency_exact() -> None:
    # a (ui, 2) -> b (db, 4). START a @0 -> clock .05, a runs .05..2.05. WAIT -> 2.05.
    # START b -> 2.10, b runs 4/2 = 2 -> 4.10. WAIT -> 4.10.
    env = SwarmEnv(
        _task(
            {"id": "a", "kind": "ui", "work": 2.0},
            {"id": "b", "kind": "db", "work": 4.0, "deps": ["a"]},
        ),
        DET_POOL,
    )
    env.reset(seed=0)
    c = env.codec
    ret, info = _run(env, [c.start(0, UI), c.wait, c.start(1, DB), c.wait])
    assert info["latency"] == pytest.approx(4.10)
    assert info["completed"] and not info["loop_detected"]
    assert ret == pytest.approx(-4.10 / env.bound.value)
    assert env.bound.value == pytest.approx(2.0 + 2.0)


def test_parallel_and_generalist_latency_exact() -> None:
    # a (ui 2) and b (db 4 on the generalist: 8) in parallel, then c (ui 1) after both.
    # START a: .05 -> ends 2.05. START b on gen: .10 -> ends 8.10. WAIT: 2.05. WAIT: 8.10.
    # START c: 8.15 -> ends 9.15. WAIT: 9.15.
    env = SwarmEnv(
        _task(
            {"id": "a", "kind": "ui", "work": 2.0},
            {"id": "b", "kind": "db", "work": 4.0},
            {"id": "c", "kind": "ui", "work": 1.0, "deps": ["a", "b"]},
        ),
        DET_POOL,
    )
    env.reset(seed=0)
    c = env.codec
    _, info = _run(env, [c.start(0, UI), c.start(1, GEN), c.wait, c.wait, c.start(2, UI), c.wait])
    assert info["latency"] == pytest.approx(9.15)
    starts = [(e.slot, e.agent, round(e.start, 6), round(e.end, 6)) for e in env.state.executions]
    assert starts == [(0, UI, 0.05, 2.05), (1, GEN, 0.10, 8.10), (2, UI, 8.15, 9.15)]


def test_split_latency_and_isolated_contexts() -> None:
    # p (ui 1) -> s (ui 4, splittable). START p: .05..1.05. WAIT: 1.05.
    # START s k=2: 1.10, chunks of 2 -> both end 3.10. WAIT: 3.10 (both delivered).
    # START s (the merge, work .25·4 = 1): 3.15..4.15. WAIT: 4.15.
    env = SwarmEnv(
        _task(
            {"id": "p", "kind": "ui", "work": 1.0},
            {"id": "s", "kind": "ui", "work": 4.0, "deps": ["p"], "splittable": True},
        ),
        DET_POOL,
    )
    env.reset(seed=0)
    c = env.codec
    assert not env.action_masks()[c.start(1, UI, 2)]  # blocked by p
    _, info = _run(env, [c.start(0, UI), c.wait, c.start(1, UI, 2), c.wait, c.start(1, UI), c.wait])
    assert info["latency"] == pytest.approx(4.15)
    traj = episode_trajectory(env, policy_version="test")
    ex = {e.subtask_id: e for e in traj.executions}
    assert set(ex) == {"p", "s#0", "s#1", "s#merge"}
    # Each execution got its own (chunk) spec and the outputs of its dependencies only.
    assert list(ex["p"].context.dependency_results) == []
    assert [d.subtask_id for d in ex["s#0"].context.dependency_results] == ["p"]
    assert ex["s#0"].context.subtask.work == pytest.approx(2.0) and ex["s#0"].split_k == 2
    assert [d.subtask_id for d in ex["s#merge"].context.dependency_results] == ["s#0", "s#1"]
    assert ex["s#merge"].context.subtask.work == pytest.approx(1.0)
    assert ex["s#merge"].start_time == pytest.approx(3.15) and ex[
        "s#merge"
    ].end_time == pytest.approx(4.15)
    assert all(e.outcome == subtask_pb2.OUTCOME_SUCCESS for e in traj.executions)
    assert traj.completed and traj.latency == pytest.approx(4.15)
    assert len(traj.decisions) == 6 and traj.decisions[2].action.split_k == 2
    assert traj.decisions[2].action.type == trajectory_pb2.ACTION_TYPE_START
    assert traj.decisions[2].action.subtask_id == "s" and traj.decisions[2].action.agent == "ui-s"
    assert traj.decisions[1].action.type == trajectory_pb2.ACTION_TYPE_WAIT
    assert traj.decisions[2].observation.ready == 1 and traj.decisions[0].action_mask_size == c.size
    assert trajectory_pb2.Trajectory.FromString(traj.SerializeToString()) == traj


def test_split_needs_free_capacity_and_kinds_are_masked() -> None:
    env = SwarmEnv(_task({"id": "s", "kind": "ui", "work": 4.0, "splittable": True}), DET_POOL)
    env.reset(seed=0)
    m, c = env.action_masks(), env.codec
    assert m[c.start(0, UI, 1)] and m[c.start(0, UI, 2)]
    assert not m[c.start(0, UI, 4)]  # 4 chunks > max_parallel 2
    assert not m[c.start(0, DB, 1)]  # db-s cannot do ui
    assert m[c.start(0, GEN, 1)]
    assert not m[c.wait] and not m[c.finish]
    assert not m[c.start(1, UI, 1)]  # padding slot


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    size=st.integers(2, 20),
    shape=st.sampled_from(["layered", "fanout", "diamond"]),
    mp=st.integers(1, 5),
)
def test_masks_never_exceed_max_parallel_and_match_rules(
    seed: int, size: int, shape: str, mp: int
) -> None:
    task = generate_task(shape, size, seed, max_parallel=mp)
    env = SwarmEnv(task, default_pool(), EnvConfig(max_subtasks=24, invalid_action="raise"))
    env.reset(seed=seed)
    rng = random.Random(seed)
    for _ in range(400):
        m = env.action_masks()
        # The incremental mask equals the one derived from the state's rules.
        assert np.array_equal(m, valid_action_mask(env.state, env.codec))
        valid = np.flatnonzero(m)
        assert len(valid) > 0
        _, _, term, trunc, _ = env.step(int(valid[rng.randrange(len(valid))]))
        assert len(env.state.running) <= mp
        assert env.observation_space.contains(env._obs)
        if term or trunc:
            break


def test_concurrency_over_a_whole_episode_never_exceeds_cap() -> None:
    task = generate_task("fanout", 20, 1, max_parallel=3)
    env = SwarmEnv(task, default_pool())
    env.reset(seed=3)
    rng = random.Random(3)
    term = trunc = False
    while not (term or trunc):
        v = np.flatnonzero(env.action_masks())
        _, _, term, trunc, _ = env.step(int(v[rng.randrange(len(v))]))
    events = sorted(
        [(e.start, 1) for e in env.state.executions] + [(e.end, -1) for e in env.state.executions],
        key=lambda x: (x[0], x[1]),
    )
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak <= 3


def test_retry_loop_detected() -> None:
    pool = parse_pool(
        {
            "agents": [
                {"name": "hopeless", "kinds": {"ui": {"speed": 1.0, "success": 0.0}}},
                {"name": "good", "kinds": {"ui": {"speed": 1.0, "success": 1.0}}},
            ]
        }
    )
    env = SwarmEnv(
        _task({"id": "a", "kind": "ui", "work": 1.0}), pool, EnvConfig(loop_retry_limit=3)
    )
    env.reset(seed=0)
    c = env.codec
    for i in range(3):  # three failures on the same agent
        _, _, term, _, _ = env.step(c.start(0, 0))
        assert not term
        _, _, term, _, _ = env.step(c.wait)
        assert not term
        assert env.state.failures == i + 1
    _, reward, term, trunc, info = env.step(c.start(0, 0))  # the fourth start is the loop
    assert term and not trunc
    assert info["loop_detected"] and not info["completed"]
    assert "retry loop" in info["loop_reason"] and "'a'" in info["loop_reason"]
    assert reward < -env.config.incomplete_penalty  # incomplete + loop penalties


def test_idle_wait_loop_detected_in_state_machine() -> None:
    sim = SwarmSimulator(
        _task({"id": "a", "kind": "ui", "work": 1.0}), SubagentPool(DET_POOL), seed=0
    )
    for _ in range(2):
        sim.wait()
        assert not sim.state.loop_detected
    sim.wait()
    assert sim.state.loop_detected and "idle loop" in sim.state.loop_reason


def test_invalid_actions_raise_or_are_reported() -> None:
    task = _task({"id": "a", "kind": "ui", "work": 1.0})
    strict = SwarmEnv(task, DET_POOL, EnvConfig(invalid_action="raise"))
    strict.reset(seed=0)
    with pytest.raises(InvalidActionError, match="WAIT with nothing running"):
        strict.step(strict.codec.wait)
    with pytest.raises(InvalidActionError, match="cannot do kind 'ui'"):
        strict.step(strict.codec.start(0, DB))
    lax = SwarmEnv(task, DET_POOL, EnvConfig(invalid_action_loop_limit=3))
    lax.reset(seed=0)
    _, r, term, _, info = lax.step(lax.codec.finish)
    assert "FINISH before every subtask succeeded" in info["invalid_action"]
    assert r == pytest.approx(-0.05 / lax.bound.value - lax.config.invalid_action_penalty)
    assert not term and lax.state.clock == pytest.approx(0.05)
    lax.step(lax.codec.finish)
    _, _, term, _, info = lax.step(lax.codec.finish)
    assert term and info["loop_detected"] and "invalid-action loop" in info["loop_reason"]


def test_early_finish_when_allowed() -> None:
    env = SwarmEnv(
        _task({"id": "a", "kind": "ui", "work": 1.0}), DET_POOL, EnvConfig(allow_early_finish=True)
    )
    env.reset(seed=0)
    assert env.action_masks()[env.codec.finish]
    _, r, term, _, info = env.step(env.codec.finish)
    assert term and not info["completed"]
    assert r == pytest.approx(-env.config.incomplete_penalty)


def test_truncation_at_max_steps() -> None:
    env = SwarmEnv(
        _task(
            {"id": "a", "kind": "ui", "work": 100.0},
            {"id": "b", "kind": "ui", "work": 1.0, "deps": ["a"]},
        ),
        DET_POOL,
        EnvConfig(max_steps=2),
    )
    env.reset(seed=0)
    env.step(env.codec.start(0, UI))
    _, _, term, trunc, info = env.step(env.codec.wait)  # a finishes; b still to do
    assert trunc and not term and not info["completed"]


def test_gymnasium_env_checker_passes() -> None:
    env = SwarmEnv(generate_task("layered", 12, 0), default_pool(), EnvConfig(max_subtasks=16))
    check_env(env, skip_render_check=True)


def test_same_seed_same_episode_different_seed_differs() -> None:
    task = generate_task("layered", 20, 4)

    def episode(seed: int) -> tuple[list[int], float]:
        env = SwarmEnv(task, default_pool())
        env.reset(seed=seed)
        rng = random.Random(99)
        acts: list[int] = []
        while True:
            v = np.flatnonzero(env.action_masks())
            a = int(v[rng.randrange(len(v))])
            acts.append(a)
            _, _, term, trunc, info = env.step(a)
            if term or trunc:
                return acts, info["latency"]

    assert episode(1) == episode(1)
    assert episode(1)[1] != episode(2)[1]


def test_several_task_sizes_share_one_encoding() -> None:
    tasks = [
        generate_task("chain", 3, 0, name="small"),
        generate_task("layered", 40, 0, name="big"),
    ]
    env = SwarmEnv(tasks, default_pool())
    o1, i1 = env.reset(seed=0, options={"task": "small"})
    o2, i2 = env.reset(seed=0, options={"task": "big"})
    assert o1.shape == o2.shape == env.observation_space.shape
    assert (i1["task"], i2["task"]) == ("small", "big")
    lay = env.layout
    present = o1[: lay.slots_end].reshape(lay.max_subtasks, lay.slot_features)[:, 0]
    assert present.sum() == 3
    # On the big task, START entries exist for its 40 slots and none past them.
    starts = env.action_masks()[: env.codec.wait].reshape(lay.max_subtasks, -1)
    assert starts[:40].any() and not starts[40:].any()


def test_trajectory_carries_policy_stats_and_failures() -> None:
    pool = parse_pool(
        {
            "agents": [
                {"name": "flaky", "kinds": {"ui": {"speed": 1.0, "success": 0.0}}},
                {"name": "good", "kinds": {"*": {"speed": 1.0, "success": 1.0}}},
            ]
        }
    )
    task = _task(
        {"id": "a", "kind": "ui", "work": 1.0},
        {"id": "b", "kind": "db", "work": 1.0, "deps": ["a"]},
    )
    env = SwarmEnv(task, pool)
    env.reset(seed=0)
    c = env.codec
    rewards = []
    for a in [c.start(0, 0), c.wait, c.start(0, 1), c.wait, c.start(1, 1), c.wait]:
        rewards.append(env.step(a)[1])
    n = len(env.decisions)
    traj = episode_trajectory(
        env,
        policy_version="v7",
        log_probs=[-0.5] * n,
        values=[1.5] * n,
        rewards=rewards,
        labels={"split": "train"},
    )
    assert [e.outcome for e in traj.executions] == [
        subtask_pb2.OUTCOME_FAILURE,
        subtask_pb2.OUTCOME_SUCCESS,
        subtask_pb2.OUTCOME_SUCCESS,
    ]
    assert [e.attempt for e in traj.executions] == [1, 2, 1]
    # b was given a's output only (from the successful attempt), nothing else.
    b_ctx = traj.executions[2].context
    assert [d.subtask_id for d in b_ctx.dependency_results] == ["a"] and b_ctx.subtask.id == "b"
    assert traj.decisions[3].observation.failed == 1
    assert all(
        d.log_prob == -0.5 and d.value == 1.5 and d.policy_version == "v7" for d in traj.decisions
    )
    assert sum(d.env_reward for d in traj.decisions) == pytest.approx(
        -traj.latency / traj.lower_bound
    )
    assert traj.labels["split"] == "train" and traj.completed
    with pytest.raises(ConfigError, match="log_probs has 1 entries for 6 decisions"):
        episode_trajectory(env, log_probs=[0.0])
