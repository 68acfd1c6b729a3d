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

A run may mix pools (``--pool-variants``): the actor then holds one set of environments per
pool (pool 0 the user's, each with its own statistics store), and each session runs on the
pool the driver drew for it (:func:`by_pool`: each pool's sessions in lock-step on its own
environments, results in job order). The network reads agents by features, so one served
version acts on every pool; its rollout baseline runs on the same pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
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

    def __init__(
        self,
        envs: list[SwarmEnv],
        seed: int,
        trusted: TrustedKeys | None,
        *,
        more_pools: Sequence[list[SwarmEnv]] = (),
    ) -> None:
        """``envs``: the base pool's environments (pool 0); ``more_pools``: the environments
        of each further pool (pools 1, 2, ...; the training suite's pool variants).
        ``trusted``: the run's public key (announcements signed by anything else, or by
        anything at all when None, are refused)."""
        self.envs = envs
        self.pools: list[list[SwarmEnv]] = [envs, *more_pools]
        self.holder: PolicyHolder[ServedPolicy] = PolicyHolder(build_swarm_policy, trusted)
        self.generator = torch.Generator().manual_seed(seed)

    def agent(self, pool: int = 0) -> tuple[int, SwarmAgent]:
        """The served version and an agent acting with it on pool ``pool``'s environments."""
        served = self.holder.current()
        net, _trained_for = served.policy
        return served.version, SwarmAgent(self.pools[pool][0].layout, net=net)

    def _agents(self) -> tuple[int, Callable[[int], SwarmAgent]]:
        """The served version and agents acting with that one version on any pool: a run
        reads the holder once, so a version landing while it runs (the learner publishes
        while the actor samples ahead) cannot act under the earlier version's label."""
        served = self.holder.current()
        net, _trained_for = served.policy
        return served.version, lambda pool: SwarmAgent(self.pools[pool][0].layout, net=net)

    def run(
        self,
        jobs: list[Job],
        *,
        greedy: bool = False,
        with_trajectories: bool = False,
        pools: Sequence[int] | None = None,
    ) -> tuple[int, list[Episode], list[trajectory_pb2.Trajectory]]:
        """Run ``jobs`` with the served version: (version, episodes, trajectories), in job
        order. ``pools``: the pool of each job (default: all on pool 0)."""
        version, agent_on = self._agents()

        def one_pool(pool: int, mine: list[Job]) -> tuple[list[Episode], list[_Traj]]:
            return run_episodes(
                self.pools[pool],
                mine,
                agent=agent_on(pool),
                greedy=greedy,
                generator=self.generator,
                policy_version=version,
                with_trajectories=with_trajectories,
            )

        eps, trajs = by_pool(jobs, pools, one_pool)
        return version, eps, trajs

    def sample(
        self, jobs: list[Job], baseline_rule: str | None, pools: Sequence[int] | None = None
    ) -> tuple[list[Episode], list[trajectory_pb2.Trajectory]]:
        """Training sessions (sampled actions), each trajectory carrying ``baseline_rule``'s
        return on the same (task, seed, pool) when one is given. ``pools``: as for
        :meth:`run`."""
        if baseline_rule:
            reference, _ = by_pool(
                jobs, pools, lambda p, mine: run_episodes(self.pools[p], mine, rule=baseline_rule)
            )
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
        _, eps, trajs = self.run(jobs, with_trajectories=True, pools=pools)
        return eps, trajs


_Traj = trajectory_pb2.Trajectory


def by_pool(
    jobs: Sequence[Job],
    pools: Sequence[int] | None,
    run: Callable[[int, list[Job]], tuple[list[Episode], list[_Traj]]],
) -> tuple[list[Episode], list[_Traj]]:
    """``run(pool, its jobs)`` once per pool that has jobs (each pool's sessions in lock-step
    on its own environments), the results put back in job order. Trajectories, when ``run``
    returns them, come back for every job or for none."""
    if pools is None:
        return run(0, list(jobs))
    if len(pools) != len(jobs):
        raise ValueError(f"{len(jobs)} jobs but {len(pools)} pool indices")
    eps: list[Episode | None] = [None] * len(jobs)
    trajs: list[_Traj | None] = [None] * len(jobs)
    for pool in sorted(set(pools)):
        idx = [i for i, p in enumerate(pools) if p == pool]
        got, got_trajs = run(pool, [jobs[i] for i in idx])
        for k, i in enumerate(idx):
            eps[i] = got[k]
            if got_trajs:
                trajs[i] = got_trajs[k]
    return [e for e in eps if e is not None], [t for t in trajs if t is not None]


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


__all__ = ["Actor", "VersionFollower", "by_pool", "publish_trajectories"]
