"""Synthetic scored trajectories for the streaming-learner tests (real protobufs, real codec)."""

from __future__ import annotations

import torch

from podium import codec
from podium.bus.base import Bus, RecordMetadata
from podium.bus.consumer import EventPublisher
from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.envs.swarm.trajectory import ACTIONS_LABEL, SAMPLED
from podium.policy.agent import SwarmAgent
from podium.policy.decisions import encode_mask, encode_observation
from podium.policy.rollout import Job, run_episodes
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


def swarm_trajectories(
    agent: SwarmAgent, ids: list[str], version: str, *, max_subtasks: int = 16, seed0: int = 0
) -> list[trajectory_pb2.Trajectory]:
    """One sampled session per id on small generated tasks, acted by ``agent`` and labelled as
    version ``version`` (what the orchestrator writes for a learned policy's sessions)."""
    tasks = generate_suite(6, seed=5, sizes=(4, 8))
    env = SwarmEnv(
        tasks, default_pool(), EnvConfig(max_subtasks=max_subtasks, invalid_action="raise")
    )
    _, trajs = run_episodes(
        [env],
        [Job(tasks[i % len(tasks)], seed0 + i) for i in range(len(ids))],
        agent=agent,
        generator=torch.Generator().manual_seed(seed0),
        with_trajectories=True,
    )
    for tid, traj in zip(ids, trajs, strict=True):
        traj.trajectory_id = traj.session_id = tid
        traj.policy_version = version
        traj.labels[ACTIONS_LABEL] = SAMPLED
    return trajs


async def publish_scored(
    bus: Bus,
    topic: str,
    trajs: list[trajectory_pb2.Trajectory],
    totals: dict[str, float] | None = None,
) -> list[RecordMetadata]:
    """Each trajectory as reward_svc would emit it (keyed by session, total 0.5 unless
    ``totals`` names another for its id); where each landed."""
    pub = EventPublisher(bus, producer_name="reward-test")
    out = []
    for t in trajs:
        total = (totals or {}).get(t.trajectory_id, 0.5)
        scored = reward_pb2.ScoredTrajectory(trajectory=t, total=total, reward_version="test")
        out.append((await pub.publish(topic, scored, key=t.session_id)).metadata)
    return out
