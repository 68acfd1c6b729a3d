"""The policy as a file: any pool at load time, the training pool kept for reports, old
pool-specific checkpoints refused with the fix, and ONNX parity on a pool it was not trained on."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.spec import PoolSpec
from podium.errors import ArtifactError
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import publish_weights
from podium.policy.swarm import (
    MODEL_NAME,
    LearnedPolicy,
    export_swarm_policy,
    load_policy,
    save_policy,
)
from podium.serving.export import onnx_session, torch_forward


def four_agent_pool() -> PoolSpec:
    """4 agents under names the default pool does not have (every kind still covered)."""
    base = {a.name: a for a in default_pool().agents}
    picked = ("api-fast", "infra-specialist", "qa", "generalist")
    return replace(
        default_pool(),
        name="four",
        agents=tuple(replace(base[n], name=f"renamed-{n}") for n in picked),
    )


def trained_on_default(tmp_path: Path) -> tuple[Path, SwarmAgent]:
    """A fresh network saved as if trained on the default pool."""
    env = SwarmEnv([generate_task("chain", 4, 1)], default_pool(), EnvConfig(max_subtasks=8))
    torch.manual_seed(0)
    agent = SwarmAgent(env.layout, d_model=32, layers=1)
    ref = save_policy(agent.net, tmp_path, 1, tuple(env.layout.agents))
    return ref.path, agent


def test_a_policy_decides_on_a_pool_it_was_not_trained_on(tmp_path: Path) -> None:
    path, agent = trained_on_default(tmp_path)
    net, agents = load_policy(path)
    assert agents == default_pool().agent_names()  # kept, for reports
    assert "num_agents" not in net.config.to_dict()
    for key, value in agent.net.state_dict().items():
        torch.testing.assert_close(net.state_dict()[key], value)
    policy = LearnedPolicy.from_checkpoint(path)
    task = generate_task("fanout", 6, 2)
    env = SwarmEnv([task], four_agent_pool(), EnvConfig(max_subtasks=8, invalid_action="raise"))
    env.reset(seed=3)
    for _ in range(500):
        _, _, terminated, truncated, info = env.step(policy.act(env).action)
        if terminated or truncated:
            break
    assert terminated and info["completed"], info
    assert len(env.layout.agents) == 4


def test_an_old_pool_specific_checkpoint_is_refused_naming_the_fix(tmp_path: Path) -> None:
    """A checkpoint of the network that indexed START logits by the training pool's agents
    (``num_agents`` in its metadata, no pair features) cannot read today's observation: it is
    refused at load, and the message says to retrain."""
    _, agent = trained_on_default(tmp_path / "new")
    shape = agent.net.config.to_dict()
    del shape["pair_features"]
    shape["num_agents"] = 9
    old = publish_weights(
        agent.net.state_dict(),
        tmp_path / "old",
        MODEL_NAME,
        1,
        metadata={
            "network": json.dumps(shape, sort_keys=True),
            "agents": json.dumps(list(default_pool().agent_names())),
            "kind": "podium.swarm_policy",
        },
    )
    with pytest.raises(ArtifactError, match=r"num_agents=9.*retrain it") as info:
        load_policy(old.path)
    assert str(old.path) in str(info.value)
    with pytest.raises(ArtifactError, match="retrain"):
        LearnedPolicy.from_checkpoint(old.path)


def test_onnx_export_matches_torch_on_another_pools_observations(tmp_path: Path) -> None:
    """Torch and the exported ONNX graph agree on real observations of a 4-agent pool the
    policy was not trained on (and of the 9-agent training pool), mid-session."""
    _, agent = trained_on_default(tmp_path)
    exported = export_swarm_policy(agent.net, tmp_path / "repo", 1)
    session = onnx_session(exported.path)
    tasks = [generate_task("diamond", 7, 4)]
    for pool, agents in ((four_agent_pool(), 4), (default_pool(), 9)):
        env = SwarmEnv(tasks, pool, EnvConfig(max_subtasks=8))
        bound = SwarmAgent(env.layout, net=agent.net)
        obs, _ = env.reset(seed=2)
        for _ in range(3):  # a few decisions in, so running executions show in the features
            res = bound.act(obs[None].copy(), env.action_masks()[None], 7)
            obs, *_ = env.step(int(res.actions[0]))
        inputs = bound.policy_inputs(obs[None].copy(), env.action_masks()[None], 7)
        assert inputs.n_agents == agents
        got = session.run(None, inputs.arrays())
        want = torch_forward(agent.net, inputs)
        assert got[0].shape == (1, 7 * agents * 3 + 2)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)
    # Re-exporting the same weights is idempotent (checked on a pool size of its own).
    assert export_swarm_policy(agent.net, tmp_path / "repo", 1).sha256 == exported.sha256
