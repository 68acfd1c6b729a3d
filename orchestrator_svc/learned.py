"""The learned scheduling policy inside the orchestrator: hot-swapped versions, cold start, and
the training tensors every learned session records.

:class:`LearnedPolicySource` holds a :class:`~podium.policy.holder.PolicyHolder` of swarm
policies (built by :func:`podium.train.policy.build_swarm_policy`) and is fed by the
orchestrator's ``PolicyUpdated`` consumer. It hands each *session* a policy:

* before any version has loaded, the cold-start rule engine (cpls), whose decisions and
  trajectory say ``policy_version = "rules:cpls"``;
* afterwards a :class:`SessionLearnedPolicy` pinned to the snapshot serving when the session
  starts. A swap therefore never touches a decision, nor a session, in flight: they finish on
  the version they started with (one version per trajectory, so the learner's policy lag is
  well defined) and sessions started after the swap use the new one.

Training sessions (``TaskSubmitted.submitted_by`` starting with one of the configured
prefixes, ``trainer`` by default) *sample* from the policy, so PPO sees the exploration its
log-probabilities describe; every other session (live gRPC traffic, evaluation) takes the
argmax. Each learned session records, per decision, exactly what the embedded trainer records
(:func:`podium.train.rollout.run_episodes`): the observation trimmed to the task's subtasks,
the trimmed action mask, the action in the trimmed layout, log π(a|s) and V(s). The trajectory
gets them through :func:`podium.train.episodes.episode_to_decisions`, so a trajectory from
this service and one from the embedded path are byte-identical for the same session.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from orchestrator_svc.policy import PolicyStep, RulePolicy, SchedulingPolicy
from podium.envs.swarm import baselines
from podium.envs.swarm.simulator.env import EnvConfig, SwarmEnv
from podium.errors import ArtifactError
from podium.policy.artifacts import LoadedWeights
from podium.policy.holder import PolicyHolder, Served
from podium.policy.network import SwarmPolicyNet
from podium.train.agent import SwarmAgent, guard_mask
from podium.train.episodes import Episode, episode_to_decisions
from podium.train.policy import MODEL_NAME, build_swarm_policy
from podium.v1 import reward_pb2, task_pb2, trajectory_pb2

_log = logging.getLogger(__name__)

COLD_START_RULE = "cpls"
"""Rule engine that decides until the first learned version has loaded."""
MAX_SUBTASKS_KEY = "max_subtasks"
"""Policy metadata key: the environment's slot count S the policy was trained with (the
running-table features are scaled by it, so sessions must use the same S)."""


@dataclass(frozen=True, slots=True)
class SwarmPolicy:
    """One loaded version: the network, its pool's agents and its environment layout."""

    net: SwarmPolicyNet
    """The network (eval mode; never mutated after loading)."""
    agents: tuple[str, ...]
    """Agent names of the pool it was trained for, in action order."""
    max_subtasks: int
    """Slot count S of the environment it was trained with."""


class SessionLearnedPolicy:
    """A learned version pinned to one session; records the session's training tensors."""

    name = "learned"

    def __init__(self, served: Served[SwarmPolicy], *, sample: bool, seed: int) -> None:
        self.served = served
        self.version = str(served.version)
        self.sample = sample
        # Sampling is seeded by the session seed: a replayed session samples the same actions.
        self.generator = torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
        self._agent: SwarmAgent | None = None
        self._rec: dict[str, list[NDArray[np.generic] | float | int]] = {
            k: [] for k in ("slots", "globals", "masks", "actions", "log_probs", "values")
        }

    def env_config(self, n_subtasks: int) -> EnvConfig:
        """The environment configuration the policy was trained with (the embedded trainer's:
        S slots, the default step limit 50·n + 100, invalid actions raise)."""
        return EnvConfig(
            max_subtasks=max(self.served.policy.max_subtasks, n_subtasks), invalid_action="raise"
        )

    def _bind(self, env: SwarmEnv) -> SwarmAgent:
        if self._agent is None:
            policy = self.served.policy
            if tuple(env.layout.agents) != policy.agents:
                raise ArtifactError(
                    f"policy v{self.served.version} was trained for agents {list(policy.agents)}, "
                    f"the pool has {list(env.layout.agents)}"
                )
            self._agent = SwarmAgent(env.layout, net=policy.net)
        return self._agent

    def act(self, env: SwarmEnv, obs: NDArray[np.float32]) -> PolicyStep:
        agent = self._bind(env)
        layout = env.layout
        n = len(env.task.subtasks)
        S, F = layout.max_subtasks, layout.slot_features
        per_slot = len(layout.agents) * 3
        # The embedded trainer's guarded mask: never a start that loop detection would end on.
        mask = guard_mask(env.state, env.action_masks(), env.codec)
        res = agent.act(
            np.array(obs, dtype=np.float32)[None, :],
            mask[None, :],
            n,
            greedy=not self.sample,
            generator=self.generator,
        )
        a = int(res.actions[0])
        # The same trimming as podium.train.rollout.run_episodes (padding slots carry nothing).
        rec = self._rec
        rec["slots"].append(obs[: S * F].reshape(S, F)[:n].copy())
        rec["globals"].append(obs[S * F :].copy())
        rec["masks"].append(np.concatenate([mask[: n * per_slot], mask[-2:]]))
        rec["actions"].append(a if a < S * per_slot else n * per_slot + (a - S * per_slot))
        rec["log_probs"].append(float(res.log_probs[0]))
        rec["values"].append(float(res.values[0]))
        return PolicyStep(a, float(res.log_probs[0]), float(res.values[0]))

    def write_training_tensors(self, traj: trajectory_pb2.Trajectory) -> None:
        """Put the recorded tensors into ``traj``'s decisions (see the module docstring)."""
        rec = self._rec
        steps = len(rec["actions"])
        if steps == 0 or steps != len(traj.decisions):
            # A session that ended before its first decision (or mid-way through one) has
            # nothing consistent to train on; it keeps its summary only.
            return
        traj.labels["actions"] = "sampled" if self.sample else "argmax"
        episode = Episode(
            n=len(traj.task.subtasks),
            slots=np.stack(rec["slots"]),  # type: ignore[arg-type]
            globals_=np.stack(rec["globals"]),  # type: ignore[arg-type]
            masks=np.stack(rec["masks"]),  # type: ignore[arg-type]
            actions=np.asarray(rec["actions"], dtype=np.int64),
            log_probs=np.asarray(rec["log_probs"], dtype=np.float32),
            values=np.asarray(rec["values"], dtype=np.float32),
            rewards=np.array([d.env_reward for d in traj.decisions], dtype=np.float32),
            terminated=traj.completed or traj.loop_detected,
            policy_version=self.served.version,
        )
        episode_to_decisions(episode, traj)


class LearnedPolicySource:
    """The orchestrator's learned policy: versions from ``PolicyUpdated``, cpls until then."""

    def __init__(
        self,
        agents: tuple[str, ...],
        *,
        default_max_subtasks: int = 64,
        sample_prefixes: tuple[str, ...] = ("trainer",),
    ) -> None:
        self.agents = agents
        self.default_max_subtasks = default_max_subtasks
        self.sample_prefixes = sample_prefixes
        self.cold_start: SchedulingPolicy = RulePolicy(baselines.make_policy(COLD_START_RULE))
        self.holder: PolicyHolder[SwarmPolicy] = PolicyHolder(self._build)

    def _build(self, weights: LoadedWeights) -> SwarmPolicy:
        net, agents = build_swarm_policy(weights)
        if agents != self.agents:
            # Refused at load time, so the previous version keeps serving.
            raise ArtifactError(
                f"{weights.path}: trained for agents {list(agents)}, this orchestrator's pool "
                f"has {list(self.agents)}"
            )
        raw = weights.metadata.get(MAX_SUBTASKS_KEY, "")
        if raw and not raw.isdigit():
            raise ArtifactError(
                f"{weights.path}: metadata {MAX_SUBTASKS_KEY}={raw!r} is not a count"
            )
        return SwarmPolicy(net, agents, int(raw) if raw else self.default_max_subtasks)

    @property
    def version(self) -> int | None:
        """Serving learned version (None while the cold-start rule engine decides)."""
        return self.holder.version

    def samples(self, submitted: task_pb2.TaskSubmitted) -> bool:
        """Whether this session samples actions (training) rather than taking the argmax."""
        return submitted.submitted_by.startswith(self.sample_prefixes)

    def for_session(self, submitted: task_pb2.TaskSubmitted) -> SchedulingPolicy:
        """The policy that runs this session (see the module docstring)."""
        if self.holder.version is None:
            return self.cold_start
        # Seeded sessions sample reproducibly; unseeded ones get fresh randomness.
        seed = int(submitted.seed) or random.SystemRandom().getrandbits(63)
        return SessionLearnedPolicy(
            self.holder.current(), sample=self.samples(submitted), seed=seed
        )

    async def on_policy_updated(self, event: reward_pb2.PolicyUpdated) -> bool:
        """Load an announced version (other models' events are ignored: False)."""
        if event.model_name != MODEL_NAME:
            return False
        if await self.holder.on_policy_updated(event):
            _log.info("serving %s v%d (%s)", MODEL_NAME, event.version, event.uri)
            return True
        if self.holder.version is not None and event.version <= self.holder.version:
            return False  # a late or duplicate announcement: nothing to do
        _log.error("rejected %s v%d: %s", MODEL_NAME, event.version, self.holder.last_error)
        return False
