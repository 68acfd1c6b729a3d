"""Synthetic scored trajectories for the streaming-learner tests (real protobufs, real codec)."""

from __future__ import annotations

import torch

from podium import codec
from podium.bus.base import Bus, RecordMetadata
from podium.policy.decisions import encode_mask, encode_observation
from podium.rl.networks import ActorCritic
from podium.v1 import reward_pb2, trajectory_pb2

OBS_DIM = 6
N_ACTIONS = 4


def behaviour_policy(seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(OBS_DIM, N_ACTIONS, (64, 64))


def scored_trajectory(
    tid: str, policy: ActorCritic, version: int, *, steps: int = 5, seed: int = 0
) -> reward_pb2.ScoredTrajectory:
    """A session of ``steps`` decisions sampled from ``policy``; action 0 pays 1 per use, and
    the reward service's total adds the same again, so learning has a signal to follow."""
    g = torch.Generator().manual_seed(seed)
    traj = trajectory_pb2.Trajectory(
        trajectory_id=tid, session_id=tid, env="synthetic", policy_version=f"orchestrator:{version}"
    )
    paid = 0.0
    for t in range(steps):
        obs = torch.randn(1, OBS_DIM, generator=g)
        mask = torch.ones(1, N_ACTIONS, dtype=torch.bool)
        mask[0, 1 + t % (N_ACTIONS - 1)] = False  # one action invalid per step, never action 0
        with torch.no_grad():
            action, logprob, value = policy.act(obs, mask, generator=g)
        a = int(action[0])
        reward = 1.0 if a == 0 else 0.0
        paid += reward
        traj.decisions.append(
            trajectory_pb2.Decision(
                step=t,
                action=trajectory_pb2.Action(type=trajectory_pb2.ACTION_TYPE_START, index=a),
                log_prob=float(logprob[0]),
                value=float(value[0]),
                action_mask_size=N_ACTIONS,
                valid_actions=int(mask.sum()),
                policy_version=traj.policy_version,
                observation_tensor=encode_observation(obs[0].numpy()),
                action_mask=encode_mask(mask[0].numpy()),
                env_reward=reward,
            )
        )
    return reward_pb2.ScoredTrajectory(trajectory=traj, total=paid, reward_version="test:1")


async def publish_trajectories(
    bus: Bus, topic: str, ids: list[str], policy: ActorCritic, version: int, *, seed0: int = 0
) -> list[RecordMetadata]:
    """Publish one scored trajectory per id (keyed by it); where each one landed, in order."""
    landed = []
    for k, tid in enumerate(ids):
        msg = scored_trajectory(tid, policy, version, seed=seed0 + k)
        _, data = codec.encode_event(msg, producer="test", key=tid)
        landed.append(await bus.publish(topic, data, key=tid))
    return landed
