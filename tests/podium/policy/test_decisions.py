"""The wire form of recorded decisions: slot rows, global token and (slot, agent) pair rows of
pools of any size survive a trajectory's trip through protobuf bytes exactly."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from podium.envs.swarm.baselines import CplsPolicy
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.observation import PAIR_FEATURES, SLOT_FEATURES
from podium.envs.swarm.spec import default_pool, parse_pool
from podium.envs.swarm.trajectory import episode_trajectory
from podium.errors import DecodeError
from podium.policy.decisions import (
    Episode,
    EpisodeRecorder,
    decision_data,
    decode_swarm_observation,
    encode_swarm_observation,
    episode_from_trajectory,
    episode_to_decisions,
)
from podium.v1 import trajectory_pb2

TRIO = parse_pool(
    {
        "name": "trio",
        "agents": [
            {"name": "ui-one", "kinds": {"ui": {"speed": 1.5, "success": 0.9}}},
            {"name": "api-one", "kinds": {"api": {"speed": 1.2, "success": 0.8}}},
            {"name": "all", "kinds": {"*": {"speed": 0.6, "success": 0.95}}},
        ],
    }
)


def _recorded(pool: object = TRIO) -> tuple[SwarmEnv, Episode, trajectory_pb2.Trajectory]:
    """A cpls episode of a 6-subtask task, recorded, and its trajectory through bytes."""
    task = generate_task("diamond", 6, 2, kinds=["ui", "api"])
    env = SwarmEnv(task, pool, EnvConfig(max_subtasks=8))  # type: ignore[arg-type]
    obs, _ = env.reset(seed=1)
    rec = EpisodeRecorder(env.layout, env.codec, len(task.subtasks))
    cpls = CplsPolicy()
    while True:
        a = cpls.act(env).action
        rec.record(obs, env.action_masks(), a, log_prob=-0.25, value=0.5)
        obs, r, term, trunc, info = env.step(a)
        rec.reward(r)
        if term or trunc:
            break
    ep = rec.episode(terminated=term, info=info)
    traj = episode_trajectory(env, data=rec.decision_data())
    wire = trajectory_pb2.Trajectory.FromString(traj.SerializeToString())
    return env, ep, wire


def test_a_three_agent_pool_round_trips_while_the_learner_is_configured_for_nine() -> None:
    env, ep, wire = _recorded()
    assert list(wire.agents) == ["ui-one", "api-one", "all"]
    assert ep.agents == env.pool.agent_names and ep.num_agents == 3
    assert ep.pairs.shape == (ep.length, 6, 3, PAIR_FEATURES)
    lay = env.layout
    # The caller's pool (the default one, nine agents) is only a fallback.
    back = episode_from_trajectory(
        wire, SLOT_FEATURES, lay.global_token_features, default_pool().agent_names()
    )
    assert back.agents == ep.agents
    for name in ("slots", "globals_", "pairs", "masks", "actions", "log_probs", "values"):
        np.testing.assert_array_equal(getattr(back, name), getattr(ep, name), err_msg=name)
    np.testing.assert_array_equal(back.rewards, ep.rewards)
    # An episode's own encoding is the recorder's, byte for byte.
    assert decision_data(ep).observation_tensors == [d.observation_tensor for d in wire.decisions]


def test_a_trajectory_that_names_no_agents_decodes_with_the_callers_pool() -> None:
    env, ep, wire = _recorded()
    del wire.agents[:]
    G = env.layout.global_token_features
    back = episode_from_trajectory(wire, SLOT_FEATURES, G, env.pool.agent_names)
    assert back.agents == ep.agents
    np.testing.assert_array_equal(back.pairs, ep.pairs)
    by_count = episode_from_trajectory(wire, SLOT_FEATURES, G, 3)
    assert by_count.agents == () and by_count.num_agents == 3
    with pytest.raises(DecodeError, match=r"decision 0: observation_tensor holds .* expected"):
        episode_from_trajectory(wire, SLOT_FEATURES, G, 9)  # the wrong pool: sizes disagree


def test_bad_agent_names_are_refused_by_name() -> None:
    env, _, wire = _recorded()
    G = env.layout.global_token_features
    dup = trajectory_pb2.Trajectory()
    dup.CopyFrom(wire)
    dup.agents[:] = ["ui-one", "ui-one", "all"]
    with pytest.raises(DecodeError, match="not distinct"):
        episode_from_trajectory(dup, SLOT_FEATURES, G, 3)
    swapped = trajectory_pb2.Trajectory()
    swapped.CopyFrom(wire)
    swapped.agents[:] = ["api-one", "ui-one", "all"]  # same count, another order
    with pytest.raises(DecodeError, match="addresses agent"):
        episode_from_trajectory(swapped, SLOT_FEATURES, G, 3)


def test_the_swarm_observation_encoding_is_slots_then_token_then_pairs() -> None:
    rng = np.random.default_rng(0)
    n, A, G = 3, 5, 7
    slots = rng.random((n, SLOT_FEATURES), dtype=np.float32)
    token = rng.random(G, dtype=np.float32)
    pairs = rng.random((n, A, PAIR_FEATURES), dtype=np.float32)
    data = encode_swarm_observation(slots, token, pairs)
    s, t, p = decode_swarm_observation(data, n, A, SLOT_FEATURES, G, "obs")
    np.testing.assert_array_equal(s, slots)
    np.testing.assert_array_equal(t, token)
    np.testing.assert_array_equal(p, pairs)
    flat = np.frombuffer(zlib.decompress(data), dtype="<f4")
    np.testing.assert_array_equal(flat[: n * SLOT_FEATURES], slots.reshape(-1))
    np.testing.assert_array_equal(flat[-n * A * PAIR_FEATURES :], pairs.reshape(-1))
    with pytest.raises(DecodeError, match="obs: observation_tensor holds"):
        decode_swarm_observation(data, n, A - 1, SLOT_FEATURES, G, "obs")


def test_episode_to_decisions_names_the_agents() -> None:
    _, ep, wire = _recorded()
    bare = trajectory_pb2.Trajectory()
    bare.CopyFrom(wire)
    del bare.agents[:]
    for d in bare.decisions:
        d.observation_tensor = b""
    episode_to_decisions(ep, bare)
    assert list(bare.agents) == list(ep.agents)
    assert [d.observation_tensor for d in bare.decisions] == [
        d.observation_tensor for d in wire.decisions
    ]
    bare.agents[:] = ["x", "y", "z"]
    with pytest.raises(DecodeError, match="names agents"):
        episode_to_decisions(ep, bare)
