"""The acting side of ``podium train``: the orchestrator role with simulated sub-agents.

The actor runs sessions with whatever version its :class:`~podium.policy.holder.PolicyHolder`
serves, in lock-step over many environments (one batched forward pass per step), and
publishes one ``Trajectory`` per session. Sub-agent executions are simulated with the same
pure sampling function subagent_svc uses (:meth:`SubagentPool.sample`, keyed by the session
seed and the unit of work), which keeps training at thousands of decisions per second and lets
the actor replay any session with a rule engine under the same luck: the rollout baseline it
attaches to each trajectory (``Trajectory.baseline``). It follows ``PolicyUpdated`` on the bus
and hot-swaps to each version after verifying it (signed by the run's own key, hashed, newer),
exactly as orchestrator_svc does.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from podium.bus import Bus, EventConsumer, EventPublisher, Record
from podium.codec import unpack_as
from podium.envs.swarm import SwarmEnv
from podium.errors import PodiumError
from podium.policy.agent import SwarmAgent
from podium.policy.decisions import Episode
from podium.policy.holder import PolicyHolder
from podium.policy.network import SwarmPolicyNet
from podium.policy.rollout import Job, run_episodes
from podium.policy.signing import OUT_OF_SEQUENCE, RefusedAnnouncement, TrustedKeys
from podium.policy.swarm import MODEL_NAME, build_swarm_policy
from podium.v1 import envelope_pb2, reward_pb2, trajectory_pb2

ServedPolicy = tuple[SwarmPolicyNet, tuple[str, ...]]


class Actor:
    """Runs sessions with the served version; see the module docstring."""

    def __init__(self, envs: list[SwarmEnv], seed: int, trusted: TrustedKeys | None) -> None:
        """``trusted``: the run's public key (announcements signed by anything else, or by
        anything at all when None, are refused)."""
        self.envs = envs
        self.holder: PolicyHolder[ServedPolicy] = PolicyHolder(build_swarm_policy, trusted)
        self.generator = torch.Generator().manual_seed(seed)

    def agent(self) -> tuple[int, SwarmAgent]:
        """The served version and an agent acting with it (refusing another pool's policy)."""
        served = self.holder.current()
        net, agents = served.policy
        if tuple(self.envs[0].layout.agents) != agents:
            raise PodiumError(f"policy v{served.version} was trained for another pool: {agents}")
        return served.version, SwarmAgent(self.envs[0].layout, net=net)

    def run(
        self, jobs: list[Job], *, greedy: bool = False, with_trajectories: bool = False
    ) -> tuple[int, list[Episode], list[trajectory_pb2.Trajectory]]:
        """Run ``jobs`` with the served version: (version, episodes, trajectories)."""
        version, agent = self.agent()
        eps, trajs = run_episodes(
            self.envs,
            jobs,
            agent=agent,
            greedy=greedy,
            generator=self.generator,
            policy_version=version,
            with_trajectories=with_trajectories,
        )
        return version, eps, trajs

    def sample(
        self, jobs: list[Job], baseline_rule: str | None
    ) -> tuple[list[Episode], list[trajectory_pb2.Trajectory]]:
        """Training sessions (sampled actions), each trajectory carrying ``baseline_rule``'s
        return on the same (task, seed) when one is given."""
        if baseline_rule:
            reference, _ = run_episodes(self.envs, jobs, rule=baseline_rule)
            jobs = [
                replace(
                    job,
                    # Its whole environment return: −latency/bound and, for a session it could
                    # not complete, the same incompletion penalty the policy's session pays.
                    baseline=trajectory_pb2.RolloutBaseline(
                        policy=baseline_rule, env_return=float(np.sum(ref.rewards))
                    ),
                )
                for job, ref in zip(jobs, reference, strict=True)
            ]
        _, eps, trajs = self.run(jobs, with_trajectories=True)
        return eps, trajs


class VersionFollower:
    """The actor's subscription to ``PolicyUpdated``: verify, hot-swap, tell the driver."""

    def __init__(self, actor: Actor, bus: Bus, tag: str, artifacts: Path, topic: str) -> None:
        self.actor = actor
        self.artifacts_uri = artifacts.resolve().as_uri() + "/"
        self.loaded: asyncio.Queue[reward_pb2.PolicyUpdated] = asyncio.Queue()
        self.group_id = f"podium-train.actor.{tag}"
        self.consumer = EventConsumer(
            bus,
            [topic],
            self.group_id,
            self._on_policy,
            producer_name=f"podium-train/actor/{tag}",
        )

    async def _on_policy(self, env: envelope_pb2.Envelope, _rec: Record) -> None:
        event = unpack_as(env, reward_pb2.PolicyUpdated)
        if event.model_name != MODEL_NAME or not event.uri.startswith(self.artifacts_uri):
            return  # another model, or another run's learner on a shared broker
        if not await self.actor.holder.on_policy_updated(event):
            err = self.actor.holder.last_error
            if isinstance(err, RefusedAnnouncement) and err.reason == OUT_OF_SEQUENCE:
                return  # a restarted learner re-announcing a version already served
            raise PodiumError(
                f"actor rejected policy v{event.version}: {self.actor.holder.last_error}"
            )
        await self.loaded.put(event)

    async def wait_version(self, version: int, timeout_s: float | None) -> reward_pb2.PolicyUpdated:
        """Wait until the actor serves ``version``; its announcement (with the learner's
        figures)."""
        while True:
            event = await asyncio.wait_for(self.loaded.get(), timeout=timeout_s)
            if event.version == version:
                return event


async def publish_trajectories(
    publisher: EventPublisher, topic: str, trajs: list[trajectory_pb2.Trajectory]
) -> None:
    """One ``Trajectory`` event per session, keyed by session (the orchestrator's contract)."""
    for traj in trajs:
        await publisher.publish(topic, traj, key=traj.session_id)


__all__ = ["Actor", "VersionFollower", "publish_trajectories"]
