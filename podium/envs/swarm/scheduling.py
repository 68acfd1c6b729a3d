"""What every scheduling policy is: one decision for an environment's current state.

The rule engines (:mod:`podium.envs.swarm.baselines`), a trained network
(``podium.policy.swarm.LearnedPolicy``) and the orchestrator service's per-session policies
(``orchestrator_svc.learned``) all implement :class:`SchedulingPolicy`, so the benchmark, the
rollouts and the orchestrator drive any of them through one loop::

    step = policy.act(env, rng)
    env.step(step.action)

A policy reads what it needs from the environment: the state (rule engines), the encoded
observation and the action mask (networks). It returns a :class:`PolicyStep`: the action and,
for a stochastic policy, what the learner needs to train on it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from podium.envs.swarm.env import SwarmEnv

Rng = random.Random | np.random.Generator | None
"""Randomness a policy may draw from. Deterministic policies ignore it; policies that carry
their own seeded generator (the orchestrator's per-session ones) use that instead."""


@dataclass(frozen=True, slots=True)
class PolicyStep:
    """One decision of a policy, with what the learner needs to train on it."""

    action: int
    """Flat action index in the environment's action space (valid under its mask)."""
    log_prob: float = 0.0
    """log π(a|s) under the acting policy (0 for deterministic rule engines)."""
    value: float = 0.0
    """V(s) under the acting policy (0 when the policy has no critic)."""


class SchedulingPolicy(Protocol):
    """A scheduling policy: the next decision for an environment's current state."""

    @property
    def name(self) -> str:
        """Short name, e.g. ``"cpls"`` or ``"learned"``."""
        ...

    @property
    def version(self) -> str:
        """Version stamped on every decision it makes (rule engines: ``"rules:<name>"``)."""
        ...

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        """The next decision for ``env``'s current state (its action valid under the mask)."""
        ...
