"""The swarm environment: exact schedules, masks, loops, isolation, Gymnasium conformance."""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from podium.envs.swarm.actions import valid_action_mask
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.simulator import SwarmSimulator
from podium.envs.swarm.spec import default_pool, parse_pool, parse_task
from podium.envs.swarm.state import InvalidActionError
from podium.envs.swarm.trajectory import DecisionData, episode_trajectory
from podium.errors import ConfigError
from podium.tokens import count_tokens
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
    # Sizes counted as every token budget is (count_tokens): the merge reads its id "s#merge"
    # (3 tokens) and two chunks' ids ("s#0": 3) and outputs ("result of s#0": 5); p its id.
    assert count_tokens("result of s#0") == 5
    assert ex["s#merge"].context.context_tokens == 3 + 2 * (3 + 5)
    assert ex["p"].context.context_tokens == 1
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
        assert env.observation_space.contains(np.array(env.observation()))
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
        data=DecisionData(log_probs=[-0.5] * n, values=[1.5] * n, rewards=rewards),
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
        episode_trajectory(env, data=DecisionData(log_probs=[0.0]))


def _advice(env: SwarmEnv, obs: np.ndarray) -> tuple[str, int, int, int]:
    """Decode the advice columns of an observation: ("start", slot, agent, k) / ("wait"|...)."""
    lay = env.layout
    col = lay.slot_col
    rows = obs[: lay.slots_end].reshape(lay.max_subtasks, lay.slot_features)
    flagged = np.flatnonzero(rows[:, col.advised] > 0.5)
    g = obs[lay.global_block.slice]
    control = g[lay.global_col.advice.slice]
    if len(flagged):
        assert len(flagged) == 1 and not control.any(), "advice names one decision"
        row = rows[flagged[0]]
        pairs = obs[lay.pair_block.slice].reshape(lay.max_subtasks, lay.num_agents, -1)
        advised = pairs[:, :, lay.pair_col.advised_agent]
        slots, agents = np.nonzero(advised)
        splits = np.flatnonzero(row[col.advised_split.slice])
        assert slots.tolist() == [flagged[0]] and len(splits) == 1, "one advised (slot, agent)"
        return "start", int(flagged[0]), int(agents[0]), (1, 2, 4)[int(splits[0])]
    assert control.sum() == 1.0
    return ("wait" if g[lay.global_col.advised_wait] else "finish"), -1, -1, 0


def test_rule_advice_columns_carry_the_cpls_decision_at_every_step() -> None:
    """The observation's advice is exactly what cpls decides in that state, at every step of
    a whole noisy episode (failures and retries included), and it moves with the state."""
    from podium.envs.swarm.baselines import CplsPolicy

    pool = default_pool()
    task = generate_task("layered", 30, 3)
    env = SwarmEnv(task, pool, EnvConfig(max_subtasks=32))
    cpls = CplsPolicy()
    obs, _ = env.reset(seed=5)
    kinds_seen: set[str] = set()
    done = False
    rng = random.Random(0)
    while not done:
        kind, slot, agent, k = _advice(env, obs)
        kinds_seen.add(kind)
        want = env.codec.decode(cpls.act(env).action)
        if kind == "start":
            assert want == (1, slot, agent, k)
        else:
            assert want[0] == (2 if kind == "wait" else 3)
        # Follow the advice mostly, sometimes another valid action: advice must track states
        # cpls itself would never reach.
        a = cpls.act(env).action
        if rng.random() < 0.3:
            a = int(rng.choice(np.flatnonzero(env.action_masks())))
        obs, _, term, trunc, _ = env.step(a)
        done = term or trunc
    assert {"start", "wait"} <= kinds_seen


def test_rule_advice_off_leaves_the_columns_zero_in_the_same_layout() -> None:
    task = generate_task("diamond", 12, 1)
    on = SwarmEnv(task, default_pool(), EnvConfig(max_subtasks=16))
    off = SwarmEnv(task, default_pool(), EnvConfig(max_subtasks=16, rule_advice=False))
    assert on.layout == off.layout
    o_on, _ = on.reset(seed=1)
    o_off, _ = off.reset(seed=1)
    differs = np.flatnonzero(o_on != o_off)
    assert len(differs) > 0
    lay = on.layout
    cols = set(range(lay.slot_col.advice.start, lay.slot_col.advice.stop))
    flags = lay.global_block.start + lay.global_col.advice.start
    for i in differs:
        if i < lay.slots_end:
            assert i % lay.slot_features in cols
        elif i >= lay.pair_block.start:
            assert (i - lay.pair_block.start) % lay.pair_features == lay.pair_col.advised_agent
        else:
            assert flags <= i < flags + 2
    assert not o_off[flags : flags + 2].any()


def test_replicas_share_set_up_and_behave_like_independent_envs() -> None:
    from podium.envs.swarm.baselines import CplsPolicy

    tasks = [generate_task(s, 15, i) for i, s in enumerate(("chain", "diamond", "layered"))]
    extra = generate_task("fanout", 12, 9)
    reps = SwarmEnv.replicas(3, tasks, default_pool(), EnvConfig(max_subtasks=16))
    assert reps[0]._static is reps[2]._static and reps[0].pool is reps[1].pool
    lone = SwarmEnv(tasks, default_pool(), EnvConfig(max_subtasks=16))
    cpls = CplsPolicy()
    for env in (reps[1], lone):
        env.reset(seed=3, options={"task": extra})  # a task outside the list: added for all
    assert extra.name in reps[2]._static
    for name in (tasks[1].name, extra.name):
        traces = []
        for env in (reps[2], lone):
            obs, _ = env.reset(seed=11, options={"task": name})
            seen = [obs]
            done = False
            while not done:
                obs, _, term, trunc, info = env.step(cpls.act(env).action)
                seen.append(obs)
                done = term or trunc
            traces.append((np.stack(seen), info["latency"]))
        np.testing.assert_array_equal(traces[0][0], traces[1][0])
        assert traces[0][1] == traces[1][1]
    with pytest.raises(ConfigError, match="n >= 1"):
        SwarmEnv.replicas(0, tasks)


def test_common_random_numbers_luck_follows_the_unit_of_work_not_the_start_order() -> None:
    """Two policies with the same session seed: every (subtask, chunk, attempt) they both run
    on the same agent takes exactly as long and ends the same way, even though they start
    things in different orders (the pairing the trainer's rollout baseline relies on)."""
    from podium.envs.swarm.baselines import CplsPolicy, GreedyPolicy

    task = generate_task("diamond", 30, 4)
    runs = []
    for policy in (CplsPolicy(), GreedyPolicy()):
        env = SwarmEnv(task, default_pool(), EnvConfig(max_subtasks=32))
        env.reset(seed=21)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(policy.act(env).action)
            done = term or trunc
        st = env.state
        runs.append(
            {
                (r.slot, st.u_part[r.unit], r.attempt, r.agent): (r.end - r.start, r.success)
                for r in st.executions
            }
        )
    orders = [list(r) for r in runs]
    assert orders[0] != orders[1], "the policies should start things in different orders"
    shared = set(runs[0]) & set(runs[1])
    assert len(shared) >= 10
    for key in shared:
        assert runs[0][key][0] == pytest.approx(runs[1][key][0], rel=1e-12), key
        assert runs[0][key][1] == runs[1][key][1], key
    # And another session seed gives other luck.
    env = SwarmEnv(task, default_pool(), EnvConfig(max_subtasks=32))
    env.reset(seed=22)
    cpls = CplsPolicy()
    done = False
    while not done:
        _, _, term, trunc, _ = env.step(cpls.act(env).action)
        done = term or trunc
    other = {
        (r.slot, env.state.u_part[r.unit], r.attempt, r.agent): r.end - r.start
        for r in env.state.executions
    }
    common = set(other) & set(runs[0])
    assert sum(other[k] != runs[0][k][0] for k in common) > len(common) // 2


def _play_out(env: SwarmEnv, policy: Any) -> tuple[float, list[np.ndarray]]:
    """Run ``policy`` to the end of the episode; (latency, observations seen)."""
    seen = []
    while True:
        obs, _, term, trunc, info = env.step(policy.act(env).action)
        seen.append(obs)
        if term or trunc:
            return float(info["latency"]), seen


@pytest.mark.parametrize("how", ["clone", "deepcopy"])
def test_a_clone_taken_mid_episode_continues_exactly_and_leaves_the_original_alone(
    how: str,
) -> None:
    """A clone continued with cpls under the same seed ends at exactly the original's latency
    through exactly the same observations, and running it does not disturb the original."""
    from podium.envs.swarm.baselines import CplsPolicy

    task = generate_task("layered", 30, 6)
    config = EnvConfig(max_subtasks=32, invalid_action="raise")  # a stale mask would raise
    env = SwarmEnv(task, default_pool(), config)
    env.reset(seed=13)
    rng = random.Random(1)
    prefix = []
    for _ in range(25):  # a random prefix: failures, retries and splits in flight
        a = int(rng.choice(np.flatnonzero(env.action_masks())))
        prefix.append(a)
        env.step(a)
    assert env.state.running, "the clone should be taken with executions in flight"
    twin = env.clone() if how == "clone" else copy.deepcopy(env)
    assert twin.pool is env.pool and twin._static is env._static  # set-up is shared
    obs, mask = env.observation().copy(), env.action_masks().copy()
    decisions, clock = list(env.decisions), env.state.clock
    np.testing.assert_array_equal(twin.observation(), obs)
    np.testing.assert_array_equal(twin.action_masks(), mask)

    twin_latency, twin_seen = _play_out(twin, CplsPolicy())
    # The original is exactly where it was.
    np.testing.assert_array_equal(env.observation(), obs)
    np.testing.assert_array_equal(env.action_masks(), mask)
    assert env.decisions == decisions and env.state.clock == clock
    latency, seen = _play_out(env, CplsPolicy())
    assert twin_latency == latency
    np.testing.assert_array_equal(np.stack(twin_seen), np.stack(seen))
    # ... and it is what an environment that was never cloned does.
    fresh = SwarmEnv(task, default_pool(), config)
    fresh.reset(seed=13)
    for a in prefix:
        fresh.step(a)
    assert _play_out(fresh, CplsPolicy())[0] == latency
    # Later episodes match too: the clone carries the reset seed stream along.
    np.testing.assert_array_equal(twin.reset()[0], env.reset()[0])


def test_an_invalid_action_that_raises_is_not_recorded_as_a_decision() -> None:
    env = SwarmEnv(
        _task({"id": "a", "kind": "ui", "work": 1.0}), DET_POOL, EnvConfig(invalid_action="raise")
    )
    env.reset(seed=0)
    with pytest.raises(InvalidActionError):
        env.step(env.codec.wait)
    assert env.decisions == []
    env.step(env.codec.start(0, UI))
    assert len(env.decisions) == 1 and env.decisions[0][0] == env.codec.start(0, UI)
