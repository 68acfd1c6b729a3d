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

Where the network runs is ``PODIUM_POLICY_BACKEND``: ``local`` (above), or ``v2://HOST:PORT``,
a KServe-V2 server: the source then has a :class:`~podium.serving.backends.ServedPolicy`, a
version goes live only once the server has loaded its verified ONNX export
(:meth:`LearnedPolicySource.on_policy_updated`), and sessions get a
:class:`SessionServedPolicy`, which decides as the local one does from the server's logits but
follows the server's version from decision to decision (see its docstring; docs/serving.md).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from numpy.typing import NDArray

from orchestrator_svc.policy import PolicyStep, RulePolicy, SchedulingPolicy
from podium.envs.swarm import baselines
from podium.envs.swarm.simulator.env import EnvConfig, SwarmEnv
from podium.errors import ArtifactError, ProcessingError
from podium.policy.artifacts import LoadedWeights, load_weights, path_from_uri
from podium.policy.holder import PolicyHolder, Served
from podium.policy.network import SwarmPolicyNet
from podium.serving.contract import PolicyInputs, PolicyOutputs
from podium.train.agent import ActResult, SwarmAgent, guard_mask
from podium.train.episodes import Episode, episode_to_decisions
from podium.train.policy import MODEL_NAME, build_swarm_policy
from podium.v1 import reward_pb2, task_pb2, trajectory_pb2

if TYPE_CHECKING:
    from podium.serving.backends import PolicyBackend, ServedPolicy

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

    def _observe(
        self, env: SwarmEnv, obs: NDArray[np.float32]
    ) -> tuple[SwarmAgent, NDArray[np.float32], NDArray[np.bool_], int]:
        """(agent, observation batch [1, size], guarded mask batch [1, A], subtask count)."""
        agent = self._bind(env)
        # The embedded trainer's guarded mask: never a start that loop detection would end on.
        mask = guard_mask(env.state, env.action_masks(), env.codec)
        # A writable float32 copy: the environment's observation is a read-only view.
        return (
            agent,
            np.array(obs, dtype=np.float32)[None, :],
            mask[None, :],
            len(env.task.subtasks),
        )

    def act(self, env: SwarmEnv, obs: NDArray[np.float32]) -> PolicyStep:
        agent, obs_b, mask_b, n = self._observe(env, obs)
        res = agent.act(obs_b, mask_b, n, greedy=not self.sample, generator=self.generator)
        return self._record(env, obs, mask_b[0], res)

    def _record(
        self, env: SwarmEnv, obs: NDArray[np.float32], mask: NDArray[np.bool_], res: ActResult
    ) -> PolicyStep:
        """Record one decision's training tensors; return it as a :class:`PolicyStep`."""
        layout = env.layout
        n = len(env.task.subtasks)
        S, F = layout.max_subtasks, layout.slot_features
        per_slot = len(layout.agents) * 3
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
            policy_version=self._trajectory_version(),
        )
        episode_to_decisions(episode, traj)

    def _trajectory_version(self) -> int:
        """The version the trajectory is attributed to: the pinned one."""
        return self.served.version


class SessionServedPolicy(SessionLearnedPolicy):
    """A session's learned policy whose network runs on a KServe-V2 server.

    The same featurisation (:meth:`SwarmAgent.inputs` on the guarded mask), the same choice
    from the logits (:meth:`SwarmAgent.select`, with the session's seeded generator) and the
    same recording as :class:`SessionLearnedPolicy`; only the forward pass is a
    ``ModelInfer`` call through :class:`~podium.serving.backends.ServedPolicy`. Given the same
    weights and seed it therefore takes the same actions as local torch (the served logits
    match within 1e-4).

    The server serves one version of the model (the newest loaded), so unlike the local
    backend a swap reaches sessions in flight at their next decision. Each decision carries the
    version the server reports having computed it with; the trajectory carries the *oldest*
    version that decided in it (its staleness for the learner's η bound; each decision's
    log-probability is the acting version's own) and, when several did, the label
    ``policy_versions``.
    """

    def __init__(
        self,
        served: Served[SwarmPolicy],
        backend: PolicyBackend,
        *,
        sample: bool,
        seed: int,
        retries: int = 2,
    ) -> None:
        super().__init__(served, sample=sample, seed=seed)
        self.backend = backend
        self.retries = retries
        """Extra attempts after a retriable failure (server briefly unavailable)."""
        self.versions: list[int] = []
        """Version that computed each decision, in order."""

    def _forward(self, inputs: PolicyInputs) -> PolicyOutputs:
        """One decision on the server; retriable failures are retried with a short backoff."""
        for attempt in range(self.retries + 1):
            try:
                return self.backend.decide(inputs)
            except ProcessingError as exc:
                if not exc.retriable or attempt == self.retries:
                    raise
                _log.warning("policy server: %s; retrying", exc)
                time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    def _inputs(
        self, agent: SwarmAgent, obs: NDArray[np.float32], mask: NDArray[np.bool_], n: int
    ) -> PolicyInputs:
        # Exactly the tensors local torch would get (SwarmAgent.inputs), as numpy arrays.
        features, present, globals_, trimmed = (t.numpy() for t in agent.inputs(obs, mask, n))
        return PolicyInputs(features, present, globals_, trimmed)

    def _choose(self, agent: SwarmAgent, out: PolicyOutputs, n: int) -> ActResult:
        if not out.version.isdigit():
            raise ProcessingError(
                f"policy server answered with model version {out.version!r}, not a number"
            )
        version = int(out.version)
        self.versions.append(version)
        self.version = out.version  # stamped on the decision being made
        return agent.select(
            # Copies: the client's arrays are read-only views of the response buffer.
            torch.tensor(out.logits),
            torch.tensor(out.value),
            n,
            greedy=not self.sample,
            generator=self.generator,
        )

    def act(self, env: SwarmEnv, obs: NDArray[np.float32]) -> PolicyStep:
        agent, obs_b, mask_b, n = self._observe(env, obs)
        out = self._forward(self._inputs(agent, obs_b, mask_b, n))
        return self._record(env, obs, mask_b[0], self._choose(agent, out, n))

    async def act_async(self, env: SwarmEnv, obs: NDArray[np.float32]) -> PolicyStep:
        # The environment is read on the event loop; only the network call runs in a thread.
        agent, obs_b, mask_b, n = self._observe(env, obs)
        out = await asyncio.to_thread(self._forward, self._inputs(agent, obs_b, mask_b, n))
        return self._record(env, obs, mask_b[0], self._choose(agent, out, n))

    def _trajectory_version(self) -> int:
        """The oldest version that decided in the session (see the class docstring)."""
        return min(self.versions) if self.versions else self.served.version

    def write_training_tensors(self, traj: trajectory_pb2.Trajectory) -> None:
        if self.versions:
            traj.policy_version = str(min(self.versions))
            if len(set(self.versions)) > 1:
                traj.labels["policy_versions"] = ",".join(
                    str(v) for v in sorted(set(self.versions))
                )
        super().write_training_tensors(traj)


class LearnedPolicySource:
    """The orchestrator's learned policy: versions from ``PolicyUpdated``, cpls until then."""

    def __init__(
        self,
        agents: tuple[str, ...],
        *,
        default_max_subtasks: int = 64,
        sample_prefixes: tuple[str, ...] = ("trainer",),
        backend: ServedPolicy | None = None,
    ) -> None:
        """``backend`` None: decisions run in this process (torch); else on that server."""
        self.agents = agents
        self.default_max_subtasks = default_max_subtasks
        self.sample_prefixes = sample_prefixes
        self.backend = backend
        """The served backend (``PODIUM_POLICY_BACKEND=v2://...``), None for local torch."""
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
        if self.backend is not None:
            return SessionServedPolicy(
                self.holder.current(), self.backend, sample=self.samples(submitted), seed=seed
            )
        return SessionLearnedPolicy(
            self.holder.current(), sample=self.samples(submitted), seed=seed
        )

    async def on_policy_updated(self, event: reward_pb2.PolicyUpdated) -> bool:
        """Load an announced version (other models' events are ignored: False)."""
        if event.model_name != MODEL_NAME:
            return False
        if self.backend is not None:
            return await self._go_live_served(event, self.backend)
        if await self.holder.on_policy_updated(event):
            _log.info("serving %s v%d (%s)", MODEL_NAME, event.version, event.uri)
            return True
        if self.holder.version is not None and event.version <= self.holder.version:
            return False  # a late or duplicate announcement: nothing to do
        _log.error("rejected %s v%d: %s", MODEL_NAME, event.version, self.holder.last_error)
        return False

    async def _go_live_served(self, event: reward_pb2.PolicyUpdated, backend: ServedPolicy) -> bool:
        """Served backend: make ``event``'s version live on the server, then for new sessions.

        Everything that can reject the version happens before anything changes: the weights
        file is verified and its metadata checked (agents, S: the featurisation sessions use),
        the ONNX file is checked against the announced ``onnx_sha256``, and the server loads it
        through the repository API (a load that fails leaves the previous version serving).
        Only then do new sessions get the new snapshot. A retriable server error (unavailable,
        deadline) is raised, so the consumer retries the event; a rejected version is logged,
        kept in ``holder.last_error``, and the event consumed.
        """
        version = int(event.version)
        current = self.holder.version
        if current is not None and version <= current:
            return False  # a late or duplicate announcement: nothing to do
        try:
            if not event.onnx_uri or not event.onnx_sha256:
                raise ArtifactError(
                    f"{MODEL_NAME} v{version} was announced without an ONNX export (onnx_uri / "
                    "onnx_sha256 empty), which a served backend needs; set "
                    "PODIUM_MODEL_REPOSITORY for the learner"
                )
            weights = await asyncio.to_thread(
                load_weights, path_from_uri(event.uri), event.sha256 or None
            )
            try:
                policy = self._build(weights)
            except ArtifactError:
                raise
            except Exception as exc:  # as PolicyHolder.load: a bad file, not a crash
                raise ArtifactError(
                    f"{weights.path}: v{version} could not be built: {exc}"
                ) from exc
            live = await asyncio.to_thread(backend.on_policy_updated, event)
        except ArtifactError as exc:
            if exc.retriable:
                raise
            self.holder.last_error = exc
            _log.error("rejected %s v%d: %s", MODEL_NAME, version, exc)
            return False
        self.holder.publish(Served(version, policy, weights.sha256, str(weights.path)))
        _log.info("serving %s v%s on %s (%s)", MODEL_NAME, live, backend.url, event.onnx_uri)
        return True
