"""Scheduling policies as the orchestrator sees them: observation + mask in, one action out.

The orchestrator hosts the swarm environment (:class:`podium.envs.swarm.simulator.SwarmEnv`)
for every session, so a policy gets exactly the observation, action mask and action encoding
it was trained on; only the executor behind the environment differs (the bus instead of the
simulator, see :mod:`orchestrator_svc.session`). A policy is anything with ``name``,
``version`` and ``act(env, obs) -> PolicyStep``.

Rule engines (cpls for cold start, and the baselines a learned policy is compared with)
come from :mod:`podium.envs.swarm.baselines`, wrapped by :class:`RulePolicy`; a learned
policy implements the same protocol and returns its log-probability and value too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm import baselines
from podium.envs.swarm.baselines import RuleEngine
from podium.envs.swarm.simulator.env import EnvConfig, SwarmEnv
from podium.v1 import trajectory_pb2


@dataclass(frozen=True, slots=True)
class PolicyStep:
    """One decision of a policy, with what the learner needs to train on it."""

    action: int
    """Flat action index in the environment's action space."""
    log_prob: float = 0.0
    """log π(a|s) under the acting policy (0 for deterministic rule engines)."""
    value: float = 0.0
    """V(s) under the acting policy (0 when the policy has no critic)."""


class SchedulingPolicy(Protocol):
    """What the orchestrator needs from a policy."""

    name: str
    """Short name, e.g. ``"cpls"``."""
    version: str
    """Version stamped on every decision (rule engines: ``"rules:<name>"``)."""

    def act(self, env: SwarmEnv, obs: NDArray[np.float32]) -> PolicyStep:
        """Choose a valid action for the environment's current state."""
        ...


@runtime_checkable
class TrainingPolicy(Protocol):
    """A policy whose sessions feed the learner (:mod:`orchestrator_svc.learned`): it runs on
    the environment configuration it was trained with and writes the decisions' training
    tensors into the session's trajectory."""

    name: str
    version: str

    def act(self, env: SwarmEnv, obs: NDArray[np.float32]) -> PolicyStep: ...

    def env_config(self, n_subtasks: int) -> EnvConfig:
        """The environment configuration for a task of ``n_subtasks`` subtasks."""
        ...

    def write_training_tensors(self, traj: trajectory_pb2.Trajectory) -> None:
        """Fill ``traj``'s decisions with what the learner trains on."""
        ...


@runtime_checkable
class RemotePolicy(Protocol):
    """A policy whose decisions are computed elsewhere (a KServe-V2 server): the session awaits
    :meth:`act_async`, so one session's network round trip never blocks the others."""

    name: str
    version: str

    def act(self, env: SwarmEnv, obs: NDArray[np.float32]) -> PolicyStep: ...

    async def act_async(self, env: SwarmEnv, obs: NDArray[np.float32]) -> PolicyStep:
        """:meth:`act` with the remote call off the event loop."""
        ...


class RulePolicy:
    """A rule engine of :mod:`podium.envs.swarm.baselines` as a :class:`SchedulingPolicy`."""

    def __init__(self, engine: RuleEngine) -> None:
        self.engine = engine
        self.name = engine.name
        self.version = f"rules:{engine.name}"

    def act(self, env: SwarmEnv, obs: NDArray[np.float32]) -> PolicyStep:
        # Rule engines are deterministic: log π(a|s) = 0 and they have no critic.
        return PolicyStep(int(self.engine.act(env)))


def make_policy(name: str) -> SchedulingPolicy:
    """The rule engine called ``name`` (cpls, greedy, sequential, random); unknown names
    raise :class:`~podium.errors.ConfigError` listing the known ones."""
    return RulePolicy(baselines.make_policy(name))
