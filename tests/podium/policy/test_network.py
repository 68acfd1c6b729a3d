"""The orchestrator policy network: shapes, masking, size independence, set symmetry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.generator import generate_task
from podium.policy.agent import SwarmAgent
from podium.policy.network import MASKED_LOGIT, NetworkConfig, SwarmPolicyNet


def _net(F: int = 6, G: int = 5, A: int = 3) -> SwarmPolicyNet:
    torch.manual_seed(0)
    return SwarmPolicyNet(NetworkConfig(slot_features=F, global_features=G, num_agents=A))


def test_masked_logits_and_value_shapes() -> None:
    net = _net()
    B, S, A = 2, 4, 3
    slots = torch.randn(B, S, 6)
    present = torch.tensor([[True, True, True, False], [True, False, False, False]])
    mask = torch.rand(B, S * A * 3 + 2) > 0.5
    logits, value = net(slots, present, torch.randn(B, 5), mask)
    assert logits.shape == (B, S * A * 3 + 2)
    assert value.shape == (B,)
    assert torch.all(logits[~mask] == MASKED_LOGIT)
    assert torch.all(logits[mask] > MASKED_LOGIT / 2)


def test_padding_slots_do_not_change_the_real_ones() -> None:
    """Attention ignores absent tokens: adding padding leaves real logits and the value alone."""
    net = _net().eval()
    S, A = 3, 3
    slots = torch.randn(1, S, 6)
    g = torch.randn(1, 5)
    mask = torch.ones(1, S * A * 3 + 2, dtype=torch.bool)
    l1, v1 = net(slots, torch.ones(1, S, dtype=torch.bool), g, mask)
    padded = torch.cat([slots, torch.randn(1, 5, 6)], dim=1)
    present = torch.tensor([[True] * S + [False] * 5])
    mask2 = torch.zeros(1, (S + 5) * A * 3 + 2, dtype=torch.bool)
    mask2[0, : S * A * 3] = True
    mask2[0, -2:] = True
    l2, v2 = net(padded, present, g, mask2)
    torch.testing.assert_close(l2[0, : S * A * 3], l1[0, : S * A * 3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(l2[0, -2:], l1[0, -2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v2, v1, atol=1e-5, rtol=1e-5)


def test_permuting_subtasks_permutes_their_logits() -> None:
    """A set encoder: no slot order is baked in, so the same task in another order gets the
    same per-subtask preferences."""
    net = _net().eval()
    S, A = 5, 3
    slots = torch.randn(1, S, 6)
    g = torch.randn(1, 5)
    mask = torch.ones(1, S * A * 3 + 2, dtype=torch.bool)
    present = torch.ones(1, S, dtype=torch.bool)
    perm = torch.tensor([3, 0, 4, 1, 2])
    l1, v1 = net(slots, present, g, mask)
    l2, v2 = net(slots[:, perm], present, g, mask)
    start1 = l1[0, : S * A * 3].reshape(S, A * 3)
    start2 = l2[0, : S * A * 3].reshape(S, A * 3)
    torch.testing.assert_close(start2, start1[perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v2, v1, atol=1e-5, rtol=1e-5)


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
