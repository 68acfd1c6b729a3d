"""Scheduling policies as the orchestrator sees them.

The orchestrator hosts the swarm environment (:class:`podium.envs.swarm.SwarmEnv`) for every
session, so a policy gets exactly the observation, action mask and action encoding it was
trained on; only the executor behind the environment differs (the bus instead of the
simulator, see :mod:`orchestrator_svc.session`). A policy is a
:class:`podium.envs.swarm.SchedulingPolicy` (``name``, ``version``, ``act(env, rng) ->
PolicyStep``), the one interface of the environment's benchmark and rollouts too.

Rule engines (cpls for cold start, and the baselines a learned policy is compared with) come
from :mod:`podium.envs.swarm.baselines` as they are; a learned policy implements the same
protocol and returns its log-probability and value too. Two optional capabilities extend it:
:class:`TrainingPolicy` (its sessions feed the learner) and :class:`RemotePolicy` (its network
runs on a server).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from podium.envs.swarm import EnvConfig, PolicyStep, Rng, SchedulingPolicy, SwarmEnv, baselines
from podium.envs.swarm.trajectory import DecisionData


@dataclass(frozen=True, slots=True)
class TrainingRecord:
    """What a training policy adds to its session's trajectory."""

    policy_version: str
    """The version the trajectory is attributed to (the learner's staleness measure)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra labels (e.g. ``actions``: ``sampled`` or ``argmax``)."""
    data: DecisionData | None = None
    """Each decision's training data in the learner's encoding (log-probs, values, rewards,
    tensors: what an in-process rollout of the session records); None when the session has
    nothing consistent to train on."""


@runtime_checkable
class TrainingPolicy(Protocol):
    """A policy whose sessions feed the learner (:mod:`orchestrator_svc.learned`): it runs on
    the environment configuration it was trained with and records what the learner trains on
    for the session's trajectory."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep: ...

    def env_config(self, n_subtasks: int) -> EnvConfig:
        """The environment configuration for a task of ``n_subtasks`` subtasks."""
        ...

    def training_record(self, rewards: Sequence[float]) -> TrainingRecord:
        """What the session's trajectory gets from the policy; ``rewards`` are the
        environment's, one per decision of the session."""
        ...


@runtime_checkable
class RemotePolicy(Protocol):
    """A policy whose decisions are computed elsewhere (a KServe-V2 server): the session awaits
    :meth:`act_async`, so one session's network round trip never blocks the others."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep: ...

    async def act_async(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        """:meth:`act` with the remote call off the event loop."""
        ...


def make_policy(name: str) -> SchedulingPolicy:
    """The rule engine called ``name`` (cpls, greedy, sequential, random); unknown names
    raise :class:`~podium.errors.ConfigError` listing the known ones."""
    return baselines.make_policy(name)


__all__ = [
    "PolicyStep",
    "RemotePolicy",
    "SchedulingPolicy",
    "TrainingPolicy",
    "TrainingRecord",
    "make_policy",
]
