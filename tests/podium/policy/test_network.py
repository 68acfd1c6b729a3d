"""The orchestrator policy network: shapes, masking, size independence, set symmetry over
subtasks *and* agents, and one network deciding on pools of different sizes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from podium.envs.swarm import EnvConfig, SwarmEnv, TaskSpec, default_pool
from podium.envs.swarm.actions import ActionCodec
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.observation import PAIR_COLUMNS
from podium.envs.swarm.spec import PoolSpec
from podium.policy.agent import Group, SwarmAgent, act_mixed
from podium.policy.network import (
    MASKED_LOGIT,
    NetworkConfig,
    SwarmPolicyNet,
    advice_indicator,
)
from podium.policy.rollout import Job, run_episodes

F, G, P = 6, 5, 4


def _net() -> SwarmPolicyNet:
    torch.manual_seed(0)
    return SwarmPolicyNet(NetworkConfig(slot_features=F, global_features=G, pair_features=P))


def _pairs(B: int, S: int, A: int, able: float = 0.7) -> torch.Tensor:
    """Random pair rows whose ``can_do`` column is 0/1 (most pairs able), as observed."""
    pairs = torch.randn(B, S, A, P)
    pairs[..., PAIR_COLUMNS.can_do] = (torch.rand(B, S, A) < able).float()
    return pairs


def test_masked_logits_and_value_shapes() -> None:
    net = _net()
    B, S, A = 2, 4, 3
    slots = torch.randn(B, S, F)
    present = torch.tensor([[True, True, True, False], [True, False, False, False]])
    mask = torch.rand(B, S * A * 3 + 2) > 0.5
    logits, value = net(slots, present, torch.randn(B, G), _pairs(B, S, A), mask)
    assert logits.shape == (B, S * A * 3 + 2)
    assert value.shape == (B,)
    assert torch.all(logits[~mask] == MASKED_LOGIT)
    assert torch.all(logits[mask] > MASKED_LOGIT / 2)


def test_config_has_no_pool_dimension() -> None:
    """Nothing in the weights is sized by the pool: the config has no agent count, and the
    same network runs on 1 and 40 agents."""
    assert set(NetworkConfig(F, G, P).to_dict()) == {
        "slot_features",
        "global_features",
        "pair_features",
        "d_model",
        "heads",
        "layers",
        "ff_mult",
    }
    net = _net().eval()
    for A in (1, 40):
        logits, _ = net(
            torch.randn(1, 3, F),
            torch.ones(1, 3, dtype=torch.bool),
            torch.randn(1, G),
            _pairs(1, 3, A),
            torch.ones(1, 3 * A * 3 + 2, dtype=torch.bool),
        )
        assert logits.shape == (1, 3 * A * 3 + 2)


def test_padding_slots_do_not_change_the_real_ones() -> None:
    """Attention ignores absent tokens: adding padding leaves real logits and the value alone."""
    net = _net().eval()
    S, A = 3, 3
    slots = torch.randn(1, S, F)
    g = torch.randn(1, G)
    pairs = _pairs(1, S, A)
    mask = torch.ones(1, S * A * 3 + 2, dtype=torch.bool)
    l1, v1 = net(slots, torch.ones(1, S, dtype=torch.bool), g, pairs, mask)
    padded = torch.cat([slots, torch.randn(1, 5, F)], dim=1)
    padded_pairs = torch.cat([pairs, _pairs(1, 5, A)], dim=1)
    present = torch.tensor([[True] * S + [False] * 5])
    mask2 = torch.zeros(1, (S + 5) * A * 3 + 2, dtype=torch.bool)
    mask2[0, : S * A * 3] = True
    mask2[0, -2:] = True
    l2, v2 = net(padded, present, g, padded_pairs, mask2)
    torch.testing.assert_close(l2[0, : S * A * 3], l1[0, : S * A * 3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(l2[0, -2:], l1[0, -2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v2, v1, atol=1e-5, rtol=1e-5)


def test_padding_agents_do_not_change_the_real_ones() -> None:
    """Zero pair rows (``can_do`` 0) appended on the agent axis, their actions masked: every
    real START logit, WAIT/FINISH and the value stay as they were (what lets a batch mix pools
    of different sizes)."""
    net = _net().eval()
    S, A, extra = 4, 3, 2
    slots, g = torch.randn(1, S, F), torch.randn(1, G)
    present = torch.ones(1, S, dtype=torch.bool)
    pairs = _pairs(1, S, A)
    l1, v1 = net(slots, present, g, pairs, torch.ones(1, S * A * 3 + 2, dtype=torch.bool))
    padded = torch.cat([pairs, torch.zeros(1, S, extra, P)], dim=2)
    mask = torch.zeros(1, S, A + extra, 3, dtype=torch.bool)
    mask[:, :, :A] = True
    flat = torch.cat([mask.reshape(1, -1), torch.ones(1, 2, dtype=torch.bool)], dim=1)
    l2, v2 = net(slots, present, g, padded, flat)
    start2 = l2[0, : S * (A + extra) * 3].reshape(S, A + extra, 3)[:, :A]
    torch.testing.assert_close(start2.reshape(-1), l1[0, : S * A * 3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(l2[0, -2:], l1[0, -2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v2, v1, atol=1e-5, rtol=1e-5)


def test_permuting_subtasks_permutes_their_logits() -> None:
    """A set encoder: no slot order is baked in, so the same task in another order gets the
    same per-subtask preferences."""
    net = _net().eval()
    S, A = 5, 3
    slots = torch.randn(1, S, F)
    g = torch.randn(1, G)
    pairs = _pairs(1, S, A)
    mask = torch.ones(1, S * A * 3 + 2, dtype=torch.bool)
    present = torch.ones(1, S, dtype=torch.bool)
    perm = torch.tensor([3, 0, 4, 1, 2])
    l1, v1 = net(slots, present, g, pairs, mask)
    l2, v2 = net(slots[:, perm], present, g, pairs[:, perm], mask)
    start1 = l1[0, : S * A * 3].reshape(S, A * 3)
    start2 = l2[0, : S * A * 3].reshape(S, A * 3)
    torch.testing.assert_close(start2, start1[perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v2, v1, atol=1e-5, rtol=1e-5)


def test_permuting_agents_permutes_their_start_logits() -> None:
    """Equivariance to agent order: agents are read by features, so listing the pool in
    another order permutes the START logits the same way and leaves WAIT, FINISH and the
    value alone (no agent position is baked into any weight)."""
    net = _net().eval()
    B, S, A = 2, 4, 5
    slots, g = torch.randn(B, S, F), torch.randn(B, G)
    present = torch.tensor([[True] * S, [True, True, False, False]])
    pairs = _pairs(B, S, A)
    mask = torch.rand(B, S, A, 3) > 0.3
    flat = torch.cat([mask.reshape(B, -1), torch.ones(B, 2, dtype=torch.bool)], dim=1)
    perm = torch.tensor([2, 4, 0, 3, 1])
    flat_p = torch.cat([mask[:, :, perm].reshape(B, -1), torch.ones(B, 2, dtype=torch.bool)], 1)
    l1, v1 = net(slots, present, g, pairs, flat)
    l2, v2 = net(slots, present, g, pairs[:, :, perm], flat_p)
    start1 = l1[:, : S * A * 3].reshape(B, S, A, 3)
    start2 = l2[:, : S * A * 3].reshape(B, S, A, 3)
    torch.testing.assert_close(start2, start1[:, :, perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(l2[:, -2:], l1[:, -2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v2, v1, atol=1e-5, rtol=1e-5)
    # And the pair features matter: another agent's features give other logits.
    swapped = pairs.clone()
    swapped[:, :, 0] = pairs[:, :, 1]
    l3, _ = net(slots, present, g, swapped, flat)
    assert (l3[:, : S * A * 3] - l1[:, : S * A * 3]).abs().max() > 1e-4


@pytest.mark.parametrize(("size", "max_parallel"), [(100, 4), (100, 100)])
def test_runs_tasks_larger_than_training_with_many_concurrent_agents(
    size: int, max_parallel: int
) -> None:
    """One network (built for the env layout) schedules a 100-subtask task to completion,
    including with max_parallel raised to 100."""
    pool = default_pool()
    task = generate_task("fanout", size, 3, name=f"big-{size}-{max_parallel}")
    task = type(task)(name=task.name, subtasks=task.subtasks, max_parallel=max_parallel)
    env = SwarmEnv([task], pool, EnvConfig(max_subtasks=size, invalid_action="raise"))
    agent = SwarmAgent(env.layout)
    obs, _ = env.reset(seed=1)
    peak = 0
    for _ in range(20 * size):
        res = agent.act(obs[None], env.action_masks()[None], size, greedy=False)
        obs, _, term, trunc, info = env.step(int(res.actions[0]))
        peak = max(peak, len(env.state.running))
        if term or trunc:
            break
    assert term and info["completed"], info
    assert peak <= max_parallel
    if max_parallel == 100:
        assert peak > 4  # it really used the extra capacity at least once


def test_agent_layout_round_trip() -> None:
    env = SwarmEnv([generate_task("chain", 6, 1)], default_pool(), EnvConfig(max_subtasks=10))
    agent = SwarmAgent(env.layout)
    a = np.array([0, 5, env.codec.wait, env.codec.finish], dtype=np.int64)
    trimmed = agent.to_trimmed(a, 6)
    per = agent.num_agents * 3
    assert list(trimmed[2:]) == [6 * per, 6 * per + 1]
    assert list(agent.to_full(trimmed, 6)) == list(a)


def four_agent_pool() -> PoolSpec:
    """A pool of 4 agents under names the default pool does not have (the generalist keeps
    every kind covered)."""
    base = {a.name: a for a in default_pool().agents}
    picked = ("backend", "security-specialist", "qa-fast", "generalist")
    agents = tuple(replace(base[n], name=f"new-{n}") for n in picked)
    return replace(default_pool(), name="four", agents=agents)


def _tasks() -> list[TaskSpec]:
    return [generate_task(shape, n, seed) for shape, n, seed in (("chain", 5, 1), ("fanout", 7, 2))]


def test_one_network_decides_on_pools_of_different_sizes() -> None:
    """Trained on one pool, run on another: the same network schedules the default 9-agent
    pool and a 4-agent pool of other names to completion, in one lock-step call whose batch
    mixes both (agents padded), and that mixed batch decides exactly as each pool alone."""
    nine, four = default_pool(), four_agent_pool()
    config = EnvConfig(max_subtasks=12, invalid_action="raise")
    envs9 = SwarmEnv.replicas(2, _tasks(), nine, config)
    envs4 = SwarmEnv.replicas(2, _tasks(), four, config)
    assert len(envs9[0].layout.agents) == 9 and len(envs4[0].layout.agents) == 4
    torch.manual_seed(3)
    agent = SwarmAgent(envs9[0].layout, d_model=32, layers=1)
    jobs = [Job(t, seed) for seed in (5, 6) for t in _tasks()]
    alone9, _ = run_episodes(envs9, jobs, agent=agent, greedy=True)
    alone4, _ = run_episodes(envs4, jobs, agent=agent, greedy=True)
    assert all(ep.info["completed"] for ep in alone9 + alone4)
    # Mixed: environments of both pools in one call (each job goes to whichever env frees up;
    # with as many envs as jobs, job i runs on env i).
    mixed_envs = [
        *SwarmEnv.replicas(2, _tasks(), nine, config),
        *SwarmEnv.replicas(2, _tasks(), four, config),
    ]
    mixed, _ = run_episodes(mixed_envs, jobs, agent=agent, greedy=True)
    for got, want in zip(mixed, [alone9[0], alone9[1], alone4[2], alone4[3]], strict=True):
        assert got.info["latency"] == want.info["latency"]
        np.testing.assert_array_equal(got.actions, want.actions)
        np.testing.assert_allclose(got.log_probs, want.log_probs, atol=1e-5)


def test_act_mixed_equals_each_pool_alone() -> None:
    """One padded forward pass over two pools gives each pool's own logits (log-probs and
    values within float tolerance) and the same greedy actions."""
    config = EnvConfig(max_subtasks=10)
    env9 = SwarmEnv(_tasks(), default_pool(), config)
    env4 = SwarmEnv(_tasks(), four_agent_pool(), config)
    torch.manual_seed(4)
    a9 = SwarmAgent(env9.layout, d_model=32)
    a4 = SwarmAgent(env4.layout, net=a9.net)
    o9, _ = env9.reset(seed=1, options={"task": _tasks()[1]})
    o4, _ = env4.reset(seed=1, options={"task": _tasks()[0]})
    g9 = Group(a9, o9[None].copy(), env9.action_masks()[None], 7)
    g4 = Group(a4, o4[None].copy(), env4.action_masks()[None], 5)
    mixed = act_mixed([g9, g4], greedy=True)
    for g, res in zip((g9, g4), mixed, strict=True):
        alone = g.agent.act(g.obs, g.masks, g.used_slots, greedy=True)
        np.testing.assert_array_equal(res.actions, alone.actions)
        np.testing.assert_allclose(res.log_probs, alone.log_probs, atol=1e-5)
        np.testing.assert_allclose(res.values, alone.values, atol=1e-5)


def test_a_planner_teaches_and_drives_by_name() -> None:
    """DAgger with a planner teacher: the labels are the online planner's decisions in the
    states visited (here the planner also drives, so, seeded alike, every label is the action
    taken), and a network's visited states are labelled too."""
    from podium.observed import AgentStats

    config = EnvConfig(max_subtasks=10, feed_stats=False)
    env = SwarmEnv(_tasks(), default_pool(), config, stats=AgentStats())
    job = Job(_tasks()[0], 3)
    (driven,), _ = run_episodes([env], [job], rule="planner-online", teacher="planner-online")
    assert driven.info["completed"] and driven.teacher is not None
    np.testing.assert_array_equal(driven.teacher, driven.actions)
    agent = SwarmAgent(env.layout, d_model=32, layers=1)
    (ep,), _ = run_episodes([env], [job], agent=agent, greedy=True, teacher="planner-online")
    assert ep.teacher is not None and len(ep.teacher) == len(ep.actions)
    assert all(0 <= a < env.codec.size for a in ep.teacher)


def test_the_advice_indicator_marks_exactly_the_rule_engines_action() -> None:
    """On the swarm observation, the one-hot the advice gain adds to is cpls's own decision
    (the environment's advisor) in every state of a session, WAIT included."""
    env = SwarmEnv(_tasks(), default_pool(), EnvConfig(max_subtasks=10))
    agent = SwarmAgent(env.layout, d_model=32, layers=1)
    assert agent.net.reads_advice and float(agent.net.advice_gain.detach()) == 0.0
    (ep,), _ = run_episodes([env], [Job(_tasks()[1], 2)], rule="cpls")
    advice = advice_indicator(
        torch.from_numpy(ep.slots), torch.from_numpy(ep.globals_), torch.from_numpy(ep.pairs)
    )
    assert torch.all(advice.sum(-1) == 1)
    codec = ActionCodec(ep.n, ep.num_agents)
    assert codec.wait in ep.actions  # WAIT is advised too, from the global flags
    np.testing.assert_array_equal(advice.argmax(-1).numpy(), ep.actions)


def test_a_checkpoint_without_the_advice_gain_loads_with_gain_zero() -> None:
    """Weights written before the gain existed load strictly, with a gain of 0: the same
    logits as before (a gain, once cloning gave one, favours the advised action)."""
    env = SwarmEnv(_tasks(), default_pool(), EnvConfig(max_subtasks=10))
    torch.manual_seed(5)
    fresh = SwarmAgent(env.layout, d_model=32, layers=1).net
    with torch.no_grad():
        fresh.advice_gain.fill_(4.0)
    old_weights = {k: v for k, v in fresh.state_dict().items() if k != "advice_gain"}
    old = SwarmPolicyNet(fresh.config)
    old.load_state_dict(old_weights, strict=True)
    assert float(old.advice_gain.detach()) == 0.0
    obs, _ = env.reset(seed=1, options={"task": _tasks()[0]})
    slots, present, globals_, pairs = (torch.from_numpy(x) for x in env.layout.split(obs[None]))
    mask = torch.from_numpy(env.action_masks()[None])
    with torch.no_grad():
        new_logits, _ = fresh(slots, present, globals_, pairs, mask)
        old_logits, _ = old(slots, present, globals_, pairs, mask)
    bonus = 4.0 * advice_indicator(slots, globals_, pairs)
    torch.testing.assert_close(new_logits[mask], (old_logits + bonus)[mask])
