"""The rollout suite's candidate policies: real learned versions, cloned from rule engines the
way ``podium train`` starts (behaviour cloning, :func:`learner_svc.algorithms.swarm.
behaviour_cloning`), saved as safetensors with their sha256 and announced as signed
``PolicyUpdated`` events, exactly what a learner publishes.

* **good**: a clone of cpls (it ties cpls: about 97% action agreement);
* **weak** / **weak2**: clones of ``greedy`` (two seeds, so two distinct versions): greedy
  sends api work to the fast but unreliable agent and is measurably worse than cpls;
* **sabotaged**: a clone of ``sequential``, which serialises everything.

Versions are numbered in the order a learner would publish them (a consumer admits only a
newer version than the one it last admitted), weakest first. Each is built once per test
session (seconds on one core) and published per scenario onto that scenario's broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from learner_svc.algorithms.swarm import SwarmPPOConfig, behaviour_cloning
from podium import topics
from podium.bus.consumer import EventPublisher
from podium.envs.swarm import EnvConfig, SwarmEnv, TaskSpec, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.policy.agent import SwarmAgent
from podium.policy.rollout import Job, run_episodes
from podium.policy.signing import KeyPair, SigningKey, generate_key_pair
from podium.policy.swarm import MODEL_NAME, save_policy, swarm_policy_updated
from podium.v1 import reward_pb2

MAX_SUBTASKS = 16
"""Slots of every candidate's network (the suite's tasks have at most 10 subtasks)."""


def suite_tasks() -> list[TaskSpec]:
    """The tasks the suite's sessions run (and the candidates were cloned on): small random
    DAGs of 5-10 subtasks over every kind, so a session lasts a fraction of a second."""
    return generate_suite(12, seed=5, sizes=(5, 10))


@dataclass(frozen=True)
class Candidate:
    """One learned version: what it clones, its number and its signed announcement."""

    name: str
    """``good``, ``weak``, ``weak2`` or ``sabotaged``."""
    rule: str
    """The rule engine it clones."""
    version: int
    """Its version number (publication order)."""
    announcement: reward_pb2.PolicyUpdated
    """The signed ``PolicyUpdated`` (uri, sha256, signature)."""
    accuracy: float
    """Behaviour-cloning accuracy on its demonstrations (the last epoch)."""

    @property
    def label(self) -> str:
        """The version string of the rollout state ("3")."""
        return str(self.version)


SPECS: tuple[tuple[str, str, int, int, int], ...] = (
    # name, rule, version, seed, epochs
    ("weak", "greedy", 1, 1, 6),
    ("weak2", "greedy", 2, 2, 6),
    ("good", "cpls", 3, 0, 15),
    ("sabotaged", "sequential", 4, 0, 6),
)
"""What is cloned, in publication order."""


def _clone(envs: Sequence[SwarmEnv], rule: str, seed: int, epochs: int) -> tuple[SwarmAgent, float]:
    """A fresh network cloned from ``rule`` on 6 demonstrations per task; its last accuracy."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    agent = SwarmAgent(envs[0].layout)
    jobs = [Job(t, int(rng.integers(1 << 31))) for t in suite_tasks() * 6]
    demos, _ = run_episodes(envs, jobs, rule=rule)
    history = behaviour_cloning(agent, demos, SwarmPPOConfig(), rng, epochs=epochs)
    return agent, history[-1]["bc_accuracy"]


def build_candidates(root: Path) -> tuple[KeyPair, dict[str, Candidate]]:
    """A signing key pair under ``root/keys`` and every candidate of :data:`SPECS` saved under
    ``root/artifacts`` and signed with it."""
    keys = generate_key_pair(root / "keys")
    signer = SigningKey.load(keys.private_path)
    envs = [
        SwarmEnv(suite_tasks(), default_pool(), EnvConfig(max_subtasks=MAX_SUBTASKS))
        for _ in range(16)
    ]
    agents = tuple(envs[0].layout.agents)
    out = {}
    for name, rule, version, seed, epochs in SPECS:
        agent, accuracy = _clone(envs, rule, seed, epochs)
        ref = save_policy(
            agent.net, root / "artifacts", version, agents, max_subtasks=str(MAX_SUBTASKS)
        )
        event = signer.sign(swarm_policy_updated(ref, metrics={"bc_accuracy": accuracy}))
        out[name] = Candidate(name, rule, version, event, accuracy)
    return keys, out


async def announce(publisher: EventPublisher, *candidates: Candidate) -> None:
    """Publish the candidates' signed announcements on the policy topic, oldest version first
    (as a learner does)."""
    for c in sorted(candidates, key=lambda c: c.version):
        await publisher.publish(topics.POLICY_UPDATES, c.announcement, key=MODEL_NAME)
