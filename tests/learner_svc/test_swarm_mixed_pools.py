"""The learner on sessions of mixed pools: minibatches pad agents as well as slots, padding
changes nothing, decoding takes each trajectory's own agents, and PPO and behaviour cloning
train on the mix (issue 14: one network decides on any pool)."""

from __future__ import annotations

import copy
import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from learner_svc.algorithms.swarm import (
    SwarmPPO,
    SwarmPPOConfig,
    SwarmSettings,
    _forward,
    _minibatch_loss,
    _targets,
    behaviour_cloning,
    collate,
    ppo_update,
    size_bucketed_minibatches,
    swarm_layout,
)
from podium.envs.swarm import EnvConfig, PoolSpec, SwarmEnv, default_pool, parse_pool
from podium.envs.swarm.actions import ActionCodec
from podium.envs.swarm.generator import generate_suite
from podium.errors import DecodeError
from podium.policy.agent import SwarmAgent
from podium.policy.decisions import Episode
from podium.policy.rollout import Job, run_episodes
from podium.policy.signing import ensure_key_pair
from podium.policy.swarm import save_policy
from podium.v1 import reward_pb2, trajectory_pb2

S = 16


def five_agent_pool() -> PoolSpec:
    """Another pool over the default pool's kinds: other names, other profiles, 5 agents."""
    p = {"speed": 1.0, "success": 0.9, "noise": 0.3}
    return parse_pool(
        {
            "name": "five",
            "max_parallel": 3,
            "main_step_cost": 0.05,
            "split_overhead": 0.15,
            "agents": [
                {"name": "builder", "kinds": {"api": p, "db": p, "infra": p}},
                {"name": "front", "kinds": {"ui": {**p, "speed": 1.4}, "docs": p}},
                {"name": "checker", "kinds": {"test": p, "security": {**p, "success": 0.8}}},
                {"name": "scholar", "kinds": {"research": p, "docs": {**p, "speed": 0.7}}},
                {
                    "name": "jack",
                    "kinds": {
                        k: {"speed": 0.6, "success": 0.75, "noise": 0.5}
                        for k in (
                            "api",
                            "db",
                            "docs",
                            "infra",
                            "research",
                            "security",
                            "test",
                            "ui",
                        )
                    },
                },
            ],
        }
    )


class Mixed:
    """Sampled sessions of one network on the 9-agent default pool and a 5-agent pool."""

    def __init__(self) -> None:
        tasks = generate_suite(6, seed=5, sizes=(4, 10))
        cfg = EnvConfig(max_subtasks=S, invalid_action="raise")
        self.envs9 = [SwarmEnv(tasks, default_pool(), cfg) for _ in range(3)]
        self.envs5 = [SwarmEnv(tasks, five_agent_pool(), cfg) for _ in range(3)]
        torch.manual_seed(0)
        self.agent = SwarmAgent(self.envs9[0].layout, d_model=32, layers=1)
        # The same network bound to the other pool's layout: nothing in it depends on A.
        self.agent5 = SwarmAgent(self.envs5[0].layout, net=self.agent.net)
        self.jobs = [Job(t, 100 + i) for i, t in enumerate(tasks)]
        gen = torch.Generator().manual_seed(1)
        self.eps9, self.trajs9 = run_episodes(
            self.envs9, self.jobs, agent=self.agent, generator=gen, with_trajectories=True
        )
        self.eps5, self.trajs5 = run_episodes(
            self.envs5, self.jobs, agent=self.agent5, generator=gen, with_trajectories=True
        )

    def mixed(self) -> list[Episode]:
        """Both pools' sessions interleaved (so minibatches really mix them)."""
        return [ep for pair in zip(self.eps9, self.eps5, strict=True) for ep in pair]


@pytest.fixture(scope="module")
def mixed() -> Mixed:
    return Mixed()


def _steps_of(episodes: list[Episode]) -> np.ndarray:
    return np.array([(e, t) for e, ep in enumerate(episodes) for t in range(ep.length)])


def test_the_sessions_really_come_from_two_pools(mixed: Mixed) -> None:
    assert {ep.num_agents for ep in mixed.eps9} == {9}
    assert {ep.num_agents for ep in mixed.eps5} == {5}
    assert len({ep.n for ep in mixed.mixed()}) > 1  # and tasks of several sizes


def test_collate_pads_agents_and_slots_and_moves_actions(mixed: Mixed) -> None:
    eps = mixed.mixed()
    steps = _steps_of(eps)
    batch, n_max = collate(eps, steps)
    a_max = 9
    assert n_max == max(ep.n for ep in eps)
    assert batch.pairs.shape[:3] == (len(steps), n_max, a_max)
    assert batch.masks.shape == (len(steps), ActionCodec(n_max, a_max).size)
    padded = ActionCodec(n_max, a_max)
    for i, (e, t) in enumerate(steps):
        ep = eps[e]
        own = ActionCodec(ep.n, ep.num_agents)
        # The action is the same decision in the padded layout, and valid there.
        assert padded.decode(int(batch.actions[i])) == own.decode(int(ep.actions[t]))
        assert bool(batch.masks[i, batch.actions[i]])
        # Exactly the episode's valid actions are valid: padding slots and agents never.
        valid = {own.decode(int(a)) for a in np.flatnonzero(ep.masks[t])}
        assert {padded.decode(int(a)) for a in np.flatnonzero(batch.masks[i].numpy())} == valid
        assert not batch.pairs[i, :, ep.num_agents :].any()
        assert not batch.pairs[i, ep.n :].any() and not batch.slots[i, ep.n :].any()
        np.testing.assert_array_equal(batch.pairs[i, : ep.n, : ep.num_agents].numpy(), ep.pairs[t])


@torch.no_grad()
def test_padding_changes_nothing_a_mixed_minibatch_equals_each_episode_alone(
    mixed: Mixed,
) -> None:
    """The reference test: log-probs, entropies and values of every decision in one minibatch
    mixing a 9-agent and a 5-agent pool (and tasks of several sizes) are those of each episode
    evaluated alone, and those the acting policy recorded."""
    eps = mixed.mixed()
    steps = _steps_of(eps)
    batch, _ = collate(eps, steps)
    lp, ent, v = _forward(mixed.agent, batch)
    for e, ep in enumerate(eps):
        rows = np.flatnonzero(steps[:, 0] == e)
        alone, n_alone = collate([ep], np.array([(0, t) for t in range(ep.length)]))
        assert n_alone == ep.n and alone.pairs.shape[2] == ep.num_agents
        lp_a, ent_a, v_a = _forward(mixed.agent, alone)
        torch.testing.assert_close(lp[rows], lp_a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent[rows], ent_a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v[rows], v_a, atol=1e-5, rtol=1e-5)
        # The learner recomputes exactly what the actor computed on the environment's layout.
        np.testing.assert_allclose(lp_a.numpy(), ep.log_probs, atol=1e-4)
        np.testing.assert_allclose(v_a.numpy(), ep.values, atol=1e-4)


def test_one_ppo_update_on_a_mixed_batch_decreases_its_loss(mixed: Mixed) -> None:
    eps = mixed.mixed()
    agent = SwarmAgent(mixed.envs9[0].layout, d_model=32, layers=1)
    agent.net.load_state_dict(mixed.agent.net.state_dict())
    bonus = [float(b) for b in np.linspace(-0.5, 0.5, len(eps))]
    # One gradient step on the whole batch: one epoch, one minibatch.
    cfg = SwarmPPOConfig(update_epochs=1, minibatch_size=100_000)
    t = _targets(eps, bonus, cfg)
    everything = np.arange(len(t.steps))

    def loss() -> float:
        with torch.no_grad():
            return float(_minibatch_loss(agent, eps, t, everything, cfg, cfg.ent_coef_start).loss)

    before = loss()
    opt = torch.optim.Adam(agent.net.parameters(), lr=cfg.learning_rate)
    stats = ppo_update(agent, opt, eps, bonus, cfg, np.random.default_rng(0), progress=0.0)
    assert stats["decisions"] == len(t.steps)
    assert np.isfinite(stats["loss"])
    after = loss()
    assert after < before, (before, after)


def test_minibatches_bucket_by_task_size_then_pool_size(mixed: Mixed) -> None:
    eps = mixed.mixed()
    steps = _steps_of(eps)
    keys = np.array([(eps[e].n, eps[e].num_agents) for e, _ in steps])
    batches = size_bucketed_minibatches(steps, eps, 16, np.random.default_rng(3))
    used = np.sort(np.concatenate(batches))
    np.testing.assert_array_equal(used, np.arange(len(steps)))  # every decision once
    runs = [[(int(n), int(a)) for n, a in keys[b]] for b in batches]
    spans = sorted((min(run), max(run)) for run in runs)  # lexicographic (n, A)
    # Consecutive runs of the (n, A)-sorted order: no two minibatches' key ranges interleave.
    for (_, hi), (lo, _) in itertools.pairwise(spans):
        assert hi <= lo, (hi, lo)
    # One pool: exactly the slots-only order (a single-pool learner shuffles as before).
    only9 = mixed.eps9
    s9 = _steps_of(only9)
    rng_a, rng_b = np.random.default_rng(4), np.random.default_rng(4)
    got = size_bucketed_minibatches(s9, only9, 16, rng_a)
    sizes = np.array([only9[e].n for e, _ in s9])
    perm = rng_b.permutation(len(s9))
    order = perm[np.argsort(sizes[perm], kind="stable")]
    want = [order[i : i + 16] for i in range(0, len(order), 16)]
    want = [want[i] for i in rng_b.permutation(len(want))]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_behaviour_cloning_fits_demonstrations_of_both_pools(mixed: Mixed) -> None:
    demos9, _ = run_episodes(mixed.envs9, mixed.jobs[:4], rule="cpls")
    demos5, _ = run_episodes(mixed.envs5, mixed.jobs[:4], rule="cpls")
    demos = demos9 + demos5
    torch.manual_seed(2)
    agent = SwarmAgent(mixed.envs9[0].layout, d_model=32, layers=1)

    @torch.no_grad()
    def accuracy(pool: list[Episode]) -> float:
        """How often the network's argmax is the demonstrator's action."""
        batch, _ = collate(pool, _steps_of(pool))
        logits, _ = agent.net(batch.slots, batch.present, batch.globals_, batch.pairs, batch.masks)
        return float((logits.argmax(-1) == batch.actions).float().mean())

    before = [accuracy(demos9), accuracy(demos5)]
    hist = behaviour_cloning(
        agent, demos, SwarmPPOConfig(minibatch_size=64), np.random.default_rng(0), epochs=4
    )
    after = [accuracy(demos9), accuracy(demos5)]
    assert all(np.isfinite(h["bc_loss"]) for h in hist), hist
    # Both pools' demonstrations are fitted, not one at the other's expense.
    assert all(a > b + 0.2 for a, b in zip(after, before, strict=True)), (before, after)


def _settings(tmp_path: Path) -> SwarmSettings:
    return SwarmSettings(
        artifacts_dir=str(tmp_path / "artifacts"),
        signing_key=str(ensure_key_pair(tmp_path / "keys").private_path),
        critic_warmup_updates=0,
    )


def _scored(traj: trajectory_pb2.Trajectory, i: int) -> reward_pb2.ScoredTrajectory:
    copy = trajectory_pb2.Trajectory()
    copy.CopyFrom(traj)
    copy.policy_version = "0"
    copy.labels["actions"] = "sampled"
    copy.trajectory_id = copy.session_id = f"{i}"
    return reward_pb2.ScoredTrajectory(trajectory=copy, total=0.3)


def test_decode_reads_each_trajectory_with_its_own_agents_and_update_trains_on_the_mix(
    mixed: Mixed, tmp_path: Path
) -> None:
    """A learner configured with the 9-agent default pool decodes a 5-agent pool's
    trajectories by their ``agents`` and trains on both in one update."""
    net = copy.deepcopy(mixed.agent.net)  # the fixture's network stays as it acted
    algo = SwarmPPO(_settings(tmp_path), swarm_layout(default_pool(), S), net=net)
    samples = []
    pairs = zip(mixed.trajs9 + mixed.trajs5, mixed.eps9 + mixed.eps5, strict=True)
    for i, (traj, ep) in enumerate(pairs):
        assert len(traj.agents) == ep.num_agents
        sample = algo.decode(_scored(traj, i), 0)
        assert sample is not None
        got = sample.episode
        assert got.num_agents == ep.num_agents
        np.testing.assert_array_equal(got.pairs, ep.pairs)
        np.testing.assert_array_equal(got.masks, ep.masks)
        np.testing.assert_array_equal(got.actions, ep.actions)
        samples.append(sample)
    before = {k: v.clone() for k, v in algo.agent.net.state_dict().items()}
    stats = algo.update(samples, 0)
    assert all(np.isfinite(v) for v in stats.values())
    assert stats["decisions"] == sum(s.episode.length for s in samples)
    after = algo.agent.net.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_trajectory_without_agents_decodes_with_the_configured_pool(
    mixed: Mixed, tmp_path: Path
) -> None:
    """Trajectories written before ``Trajectory.agents`` existed are the configured pool's."""
    nine = SwarmPPO(_settings(tmp_path), swarm_layout(default_pool(), S))
    old = _scored(mixed.trajs9[0], 0)
    del old.trajectory.agents[:]
    sample = nine.decode(old, 0)
    assert sample is not None and sample.episode.num_agents == 9
    np.testing.assert_array_equal(sample.episode.masks, mixed.eps9[0].masks)
    # A 5-agent session without its agents does not fit the 9-agent pool: refused, named.
    stray = _scored(mixed.trajs5[0], 1)
    del stray.trajectory.agents[:]
    with pytest.raises(DecodeError, match="trajectory 1"):
        nine.decode(stray, 0)
    # ... and is read correctly by a learner configured with its own pool.
    five = SwarmPPO(
        replace(_settings(tmp_path), artifacts_dir=str(tmp_path / "five")),
        swarm_layout(five_agent_pool(), S),
    )
    ok = five.decode(stray, 0)
    assert ok is not None and ok.episode.num_agents == 5


def test_a_policy_trained_on_another_pool_is_a_valid_starting_point(
    mixed: Mixed, tmp_path: Path
) -> None:
    """``PODIUM_LEARNER_INIT`` of a policy saved for the 5-agent pool starts a learner
    configured with the 9-agent default pool (the network reads agents by features)."""
    five = tuple(a.name for a in five_agent_pool().agents)
    ref = save_policy(mixed.agent.net, tmp_path / "init", 0, five, max_subtasks=str(S))
    algo = SwarmPPO.from_settings(replace(_settings(tmp_path), init=str(ref.path)))
    assert algo.agents == tuple(a.name for a in default_pool().agents)
    for k, v in mixed.agent.net.state_dict().items():
        assert torch.equal(algo.agent.net.state_dict()[k], v), k
    sample = algo.decode(_scored(mixed.trajs5[0], 0), 0)
    assert sample is not None and sample.episode.num_agents == 5
