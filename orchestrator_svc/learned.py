"""The learned scheduling policy inside the orchestrator: loaded versions, cold start, and
the training tensors every learned session records.

:class:`LearnedPolicySource` holds a :class:`~podium.policy.holder.PolicyHolder` of swarm
policies (built by :func:`podium.policy.swarm.build_swarm_policy`) and is fed by the
orchestrator's ``PolicyUpdated`` consumer. The holder admits versions (signed, newer) and
keeps the newest; the source also keeps every verified version a rollout may route to (the
ones the rollout state names, :meth:`LearnedPolicySource.pin`, plus the newest few: bounded).
It hands each *session* a policy for the version its arm names
(:meth:`LearnedPolicySource.for_session`; :mod:`orchestrator_svc.arms` chooses it):

* a rule engine for ``"rules:<name>"`` (the cold start is cpls: decisions and trajectory say
  ``policy_version = "rules:cpls"``);
* a :class:`SessionLearnedPolicy` pinned to that version's snapshot. A state change or a new
  version therefore never touches a decision, nor a session, in flight: they finish on the
  version they started with (one version per trajectory, so the learner's policy lag is
  well defined) and sessions started after it get what the rollout routes them to.

Without a version (``PODIUM_ROLLOUT=latest``: training drivers, demos) a session gets the
newest loaded version, cpls before any.

A version decides on the session's pool whatever it is: the network reads agents by their
features (:mod:`podium.policy.network`), so a version trained on another pool, or before agents
were added or renamed, loads and serves (its training pool is logged, never checked).

Training sessions (``TaskSubmitted.submitted_by`` starting with one of the configured
prefixes, ``trainer`` by default) *sample* from the policy, so PPO sees the exploration its
log-probabilities describe; so does the exploration share of live-arm sessions
(``PODIUM_EXPLORE_SHARE``, :func:`explores`: a hash of the session id, so the learner learns
from live traffic with no trainer client); every other session (live gRPC traffic,
evaluation, canary and baseline arms) takes the argmax. With ``PODIUM_SCOUT=on`` an argmax
session also *scouts* (:class:`ScoutedSessionPolicy`, :mod:`podium.envs.swarm.scouting`): a
start the network chooses goes to an agent the statistics store has hardly seen where the
schedule's slack absorbs it, so an agent better than it advertises gets found; sampled
sessions never scout (their actions must be the network's own for PPO). Each learned session records, per decision, exactly what the embedded trainer records
(:func:`podium.policy.rollout.run_episodes`), with the same
:class:`~podium.policy.decisions.EpisodeRecorder`: the observation trimmed to the task's
subtasks, the trimmed action mask, the action in the trimmed layout, log π(a|s) and V(s). The
session's trajectory gets them as a :class:`~orchestrator_svc.policy.TrainingRecord`, so a
trajectory from this service and one from the embedded path are byte-identical for the same
session.

Where the network runs is ``PODIUM_POLICY_BACKEND``: ``local`` (above), or ``v2://HOST:PORT``,
a KServe-V2 server: the source then has a :class:`~podium.serving.backends.ServedPolicy`, a
version goes live only once the server has loaded its verified ONNX export
(:meth:`LearnedPolicySource.on_policy_updated`), and sessions get a
:class:`SessionServedPolicy`, which decides as the local one does from the server's logits but
follows the server's version from decision to decision (see its docstring; docs/serving.md).
The server serves one version (the newest loaded), so with a served backend a rollout route
to ``rules:<name>`` is honoured but a route to any learned version runs on the server's
version (the trajectory and its arm record the version that decided).

Either way a version is admitted only from a signed announcement
(:mod:`podium.policy.signing`): hashed, signed by a key in ``PODIUM_POLICY_TRUSTED_KEYS`` over
model, version and hashes, and newer than the serving version. A refused announcement is
logged with its reason, the previous version keeps serving, and the event is consumed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from numpy.typing import NDArray

from orchestrator_svc.policy import TrainingRecord
from podium.envs.swarm import EnvConfig, PolicyStep, Rng, SchedulingPolicy, SwarmEnv, baselines
from podium.envs.swarm.observation import ObservationLayout
from podium.envs.swarm.scouting import ScoutConfig, Scouting
from podium.envs.swarm.trajectory import ACTIONS_LABEL, ARGMAX, SAMPLED
from podium.errors import ArtifactError, ProcessingError
from podium.policy.agent import ActResult, SwarmAgent, guard_mask
from podium.policy.artifacts import LoadedWeights, load_weights, path_from_uri
from podium.policy.decisions import EpisodeRecorder
from podium.policy.holder import PolicyHolder, Served
from podium.policy.network import SwarmPolicyNet
from podium.policy.signing import OUT_OF_SEQUENCE, RefusedAnnouncement, TrustedKeys
from podium.policy.swarm import MODEL_NAME, build_swarm_policy
from podium.policy.versions import is_version_number
from podium.serving.contract import PolicyInputs, PolicyOutputs
from podium.v1 import reward_pb2, task_pb2

if TYPE_CHECKING:
    from podium.serving.backends import PolicyBackend, ServedPolicy

_log = logging.getLogger(__name__)

COLD_START_RULE = "cpls"
"""Rule engine that decides until the first learned version has loaded."""
RULES_PREFIX = "rules:"
"""How a rule engine is named as a version (``"rules:cpls"``)."""
KEEP_NEWEST = 3
"""Loaded versions kept for routing beyond those the rollout state names (a candidate
proposed soon after it loaded is still there; memory stays bounded)."""
MAX_SUBTASKS_KEY = "max_subtasks"
"""Policy metadata key: the environment's slot count S the policy was trained with (the
running-table features are scaled by it, so sessions must use the same S)."""


EXPLORE_BUCKETS = 10_000
"""Resolution of the exploration share: one bucket is 0.01% of sessions."""


def explore_bucket(session_id: str) -> int:
    """The session's exploration bucket in ``[0, EXPLORE_BUCKETS)``: sha256 of a salted
    session id, so it is independent of the rollout's routing bucket (the baseline arm is
    the lowest routing buckets: an unsalted hash would make exploring sessions baseline ones,
    decided by the rule engine, and nothing would explore)."""
    digest = hashlib.sha256(b"explore\0" + session_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % EXPLORE_BUCKETS


def explores(session_id: str, share: float) -> bool:
    """Whether the session is in the exploration share ``share`` (0 to 1): the same answer
    on every replica, in a replay and for a twin of the session."""
    return explore_bucket(session_id) < round(share * EXPLORE_BUCKETS)


@dataclass(frozen=True, slots=True)
class SwarmPolicy:
    """One loaded version: the network, the pool it was trained on and its slot count."""

    net: SwarmPolicyNet
    """The network (eval mode; never mutated after loading)."""
    agents: tuple[str, ...]
    """Agent names of the pool it was trained on (for logs and reports; it runs on any)."""
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
        self._recorder: EpisodeRecorder | None = None

    def env_config(self, n_subtasks: int) -> EnvConfig:
        """The environment configuration the policy was trained with (the embedded trainer's:
        S slots, the default step limit 50·n + 100, invalid actions raise)."""
        return EnvConfig(
            max_subtasks=max(self.served.policy.max_subtasks, n_subtasks), invalid_action="raise"
        )

    def _bind(self, env: SwarmEnv) -> SwarmAgent:
        """The version's network bound to the session's layout (its pool, whatever it is)."""
        if self._agent is None:
            self._agent = SwarmAgent(env.layout, net=self.served.policy.net)
            self._recorder = EpisodeRecorder(env.layout, env.codec, len(env.task.subtasks))
        return self._agent

    def _observe(
        self, env: SwarmEnv
    ) -> tuple[SwarmAgent, NDArray[np.float32], NDArray[np.bool_], int]:
        """(agent, observation batch [1, size], guarded mask batch [1, A], subtask count)."""
        agent = self._bind(env)
        # The embedded trainer's guarded mask: never a start that loop detection would end on.
        mask = guard_mask(env.state, env.action_masks(), env.codec)
        # A writable float32 copy: the environment's observation is a read-only view.
        return (
            agent,
            np.array(env.observation(), dtype=np.float32)[None, :],
            mask[None, :],
            len(env.task.subtasks),
        )

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        """The policy's decision (sampled from the session's own generator; ``rng`` unused)."""
        agent, obs_b, mask_b, n = self._observe(env)
        res = agent.act(obs_b, mask_b, n, greedy=not self.sample, generator=self.generator)
        return self._record(obs_b[0], mask_b[0], res)

    def _record(
        self, obs: NDArray[np.float32], mask: NDArray[np.bool_], res: ActResult
    ) -> PolicyStep:
        """Record one decision's training tensors; return it as a :class:`PolicyStep`."""
        assert self._recorder is not None  # bound by _observe
        step = PolicyStep(int(res.actions[0]), float(res.log_probs[0]), float(res.values[0]))
        self._recorder.record(obs, mask, step.action, step.log_prob, step.value)
        return step

    def training_record(self, rewards: Sequence[float]) -> TrainingRecord:
        """The recorded decisions for the session's trajectory (see the module docstring)."""
        recorder = self._recorder
        if recorder is None or len(recorder) == 0 or len(recorder) != len(rewards):
            # A session that ended before its first decision (or mid-way through one) has
            # nothing consistent to train on; it keeps its summary only.
            return TrainingRecord(self._trajectory_version())
        return TrainingRecord(
            self._trajectory_version(),
            labels={ACTIONS_LABEL: SAMPLED if self.sample else ARGMAX},
            data=recorder.decision_data(rewards),
        )

    def _trajectory_version(self) -> str:
        """The version the trajectory is attributed to: the pinned one."""
        return self.version


SCOUTED_LABEL = "scouted"
"""Trajectory label of a scouting session: how many of its decisions the scout changed."""


class ScoutedSessionPolicy(Scouting):
    """A session's argmax learned policy with scouting (``PODIUM_SCOUT=on``): the network
    decides (:attr:`session_policy`, local or served) and :class:`Scouting` may send a start
    to an untried agent where the slack allows.

    A changed decision is the rule layer's, not the network's, so a session with any carries
    no training tensors (its recorded actions would not be the ones taken) and the label
    :data:`SCOUTED_LABEL`; the learner never trains on argmax sessions anyway, and the
    decisions' versions stay the network's."""

    def __init__(self, policy: SessionLearnedPolicy, config: ScoutConfig) -> None:
        super().__init__(policy, config)
        self.session_policy = policy

    def env_config(self, n_subtasks: int) -> EnvConfig:
        """The wrapped policy's (:meth:`SessionLearnedPolicy.env_config`)."""
        return self.session_policy.env_config(n_subtasks)

    def training_record(self, rewards: Sequence[float]) -> TrainingRecord:
        """The wrapped policy's record; without tensors once a decision was scouted."""
        record = self.session_policy.training_record(rewards)
        if not self.scouted:
            return record
        labels = {**record.labels, SCOUTED_LABEL: str(self.scouted)}
        return TrainingRecord(record.policy_version, labels=labels)


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
        return agent.policy_inputs(obs, mask, n)

    def _choose(self, agent: SwarmAgent, out: PolicyOutputs, n: int) -> ActResult:
        if not is_version_number(out.version):
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

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        agent, obs_b, mask_b, n = self._observe(env)
        out = self._forward(self._inputs(agent, obs_b, mask_b, n))
        return self._record(obs_b[0], mask_b[0], self._choose(agent, out, n))

    async def act_async(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        # The environment is read on the event loop; only the network call runs in a thread.
        agent, obs_b, mask_b, n = self._observe(env)
        out = await asyncio.to_thread(self._forward, self._inputs(agent, obs_b, mask_b, n))
        return self._record(obs_b[0], mask_b[0], self._choose(agent, out, n))

    def _trajectory_version(self) -> str:
        """The oldest version that decided in the session (see the class docstring)."""
        return str(min(self.versions)) if self.versions else self.version

    def training_record(self, rewards: Sequence[float]) -> TrainingRecord:
        record = super().training_record(rewards)
        if len(set(self.versions)) <= 1:
            return record
        several = ",".join(str(v) for v in sorted(set(self.versions)))
        return replace(record, labels={"policy_versions": several, **record.labels})


class LearnedPolicySource:
    """The orchestrator's learned policy: versions from ``PolicyUpdated``, rule engines, and
    the version each session runs (see the module docstring)."""

    def __init__(
        self,
        agents: tuple[str, ...],
        *,
        default_max_subtasks: int = 64,
        trusted: TrustedKeys,
        sample_prefixes: tuple[str, ...] = ("trainer",),
        explore_share: float = 0.0,
        backend: ServedPolicy | None = None,
        keep_newest: int = KEEP_NEWEST,
        scout: ScoutConfig | None = None,
    ) -> None:
        """``trusted``: the keys announcements must be signed by (``PODIUM_POLICY_TRUSTED_KEYS``,
        :meth:`TrustedKeys.load`). ``backend`` None: decisions run in this process (torch);
        else on that server. ``keep_newest``: loaded versions kept beyond the pinned ones.
        ``scout``: argmax sessions scout with it (``PODIUM_SCOUT=on``); None: none does."""
        self.agents = agents
        """This orchestrator's pool (versions trained on another one are accepted: logged)."""
        self.default_max_subtasks = default_max_subtasks
        self.sample_prefixes = sample_prefixes
        self.explore_share = explore_share
        """Share of live-arm sessions that sample whoever submitted them (:func:`explores`)."""
        self.backend = backend
        """The served backend (``PODIUM_POLICY_BACKEND=v2://...``), None for local torch."""
        self.scout = scout
        """How argmax sessions scout (:class:`ScoutedSessionPolicy`); None: they do not."""
        self.cold_start: SchedulingPolicy = baselines.make_policy(COLD_START_RULE)
        self.holder: PolicyHolder[SwarmPolicy] = PolicyHolder(self._build, trusted)
        self.keep_newest = keep_newest
        self.loaded: dict[int, Served[SwarmPolicy]] = {}
        """Every verified version kept for routing, by version (pinned and newest few)."""
        self.pinned: frozenset[int] = frozenset()
        """Versions the applied rollout state names (live, previous, candidate): never dropped."""
        self._rules: dict[str, SchedulingPolicy] = {self.cold_start.version: self.cold_start}

    def _remember(self, served: Served[SwarmPolicy]) -> None:
        """Keep ``served`` for routing; drop the oldest unpinned versions beyond the bound."""
        self.loaded[served.version] = served
        self._prune()

    def _prune(self) -> None:
        newest = sorted(self.loaded, reverse=True)[: self.keep_newest]
        for version in [v for v in self.loaded if v not in self.pinned and v not in newest]:
            del self.loaded[version]

    def pin(self, versions: Iterable[str]) -> None:
        """Keep the learned ``versions`` (decimal strings; rule engines are ignored) loaded
        while a rollout may route to them; the previous pins are released."""
        self.pinned = frozenset(int(v) for v in versions if is_version_number(v))
        self._prune()

    def rule(self, version: str) -> SchedulingPolicy | None:
        """The rule engine ``"rules:<name>"`` names (shared: rule engines keep no session
        state), None if ``version`` is not one."""
        if version not in self._rules:
            name = version.removeprefix(RULES_PREFIX)
            if not version.startswith(RULES_PREFIX) or name not in baselines.BASELINES:
                return None
            self._rules[version] = baselines.make_policy(name)
        return self._rules[version]

    def available(self, version: str) -> bool:
        """Whether a session routed to ``version`` can run on it here: a known rule engine, or
        a learned version loaded (served backend: any, the server runs its newest)."""
        if not is_version_number(version):
            return self.rule(version) is not None
        if self.backend is not None:
            return self.holder.version is not None
        return int(version) in self.loaded

    def _build(self, weights: LoadedWeights) -> SwarmPolicy:
        net, agents = build_swarm_policy(weights)
        if agents != self.agents:
            _log.info(
                "%s: trained on agents %s, deciding on this orchestrator's pool %s",
                weights.path,
                list(agents),
                list(self.agents),
            )
        raw = weights.metadata.get(MAX_SUBTASKS_KEY, "")
        if raw and not is_version_number(raw):
            raise ArtifactError(
                f"{weights.path}: metadata {MAX_SUBTASKS_KEY}={raw!r} is not a count"
            )
        max_subtasks = int(raw) if raw else self.default_max_subtasks
        # Refused here, at load, so the previous version keeps serving: a network whose input
        # widths are not those of the observation its sessions will read (any pool's).
        probe = ObservationLayout(
            max_subtasks=max(max_subtasks, 1),
            agents=self.agents,
            running_rows=EnvConfig().max_running_obs,
        )
        try:
            SwarmAgent(probe, net=net)
        except ArtifactError as exc:
            raise ArtifactError(f"{weights.path}: {exc}") from None
        return SwarmPolicy(net, agents, max_subtasks)

    @property
    def version(self) -> int | None:
        """Newest loaded learned version (None before any has loaded). What serves a session
        is what its route names (:meth:`for_session`); under ``PODIUM_ROLLOUT=latest``, this."""
        return self.holder.version

    def samples(self, submitted: task_pb2.TaskSubmitted, *, explore: bool = True) -> bool:
        """Whether this session samples actions (training) rather than taking the argmax: its
        submitter is a trainer, or (``explore``: it runs on the live arm) it is in the
        exploration share."""
        if submitted.submitted_by.startswith(self.sample_prefixes):
            return True
        return explore and explores(submitted.session_id, self.explore_share)

    def for_session(
        self, submitted: task_pb2.TaskSubmitted, version: str | None = None, *, explore: bool = True
    ) -> SchedulingPolicy:
        """The policy that runs this session on ``version`` (see the module docstring; check
        :meth:`available` first: a version not loaded here raises ProcessingError). None: the
        newest loaded version, cpls before any (``PODIUM_ROLLOUT=latest``). ``explore``: the
        session may be in the exploration share (False for canary and baseline arms)."""
        if version is None:
            if self.holder.version is None:
                return self.cold_start
            served = self.holder.current()
        elif (rule := self.rule(version)) is not None:
            return rule
        elif self.backend is not None and self.holder.version is not None:
            served = self.holder.current()  # the server runs its newest (module docstring)
        elif is_version_number(version) and int(version) in self.loaded:
            served = self.loaded[int(version)]
        else:
            raise ProcessingError(f"{MODEL_NAME} version {version!r} is not loaded here")
        # Seeded sessions sample reproducibly; unseeded ones get fresh randomness.
        seed = int(submitted.seed) or random.SystemRandom().getrandbits(63)
        sample = self.samples(submitted, explore=explore)
        policy = (
            SessionServedPolicy(served, self.backend, sample=sample, seed=seed)
            if self.backend is not None
            else SessionLearnedPolicy(served, sample=sample, seed=seed)
        )
        if self.scout is None or sample:
            return policy
        return ScoutedSessionPolicy(policy, self.scout)

    async def on_policy_updated(self, event: reward_pb2.PolicyUpdated) -> bool:
        """Load an announced version (other models' events are ignored: False)."""
        if event.model_name != MODEL_NAME:
            return False
        if self.backend is not None:
            return await self._go_live_served(event, self.backend)
        if await self.holder.on_policy_updated(event):
            self._remember(self.holder.current())
            _log.info("loaded %s v%d (%s)", MODEL_NAME, event.version, event.uri)
            return True
        self._log_refusal(event)
        return False

    def _log_refusal(self, event: reward_pb2.PolicyUpdated) -> None:
        """One line naming why ``event`` was refused and which version keeps serving.

        A re-announcement of the serving version (a restarted learner) is routine (info); an
        older version is worth a warning; anything else (unsigned, forged, hashless, a file
        that does not match its signed hash) is an error an operator must look at.
        """
        err = self.holder.last_error
        serving = self.holder.version
        keeps = f"v{serving} keeps serving" if serving is not None else "cpls keeps deciding"
        if isinstance(err, RefusedAnnouncement):
            why = str(err)  # already "refused <model> v<N>: <reason>"
        else:
            why = f"refused {MODEL_NAME} v{event.version}: {err}"
        level = logging.ERROR
        if isinstance(err, RefusedAnnouncement) and err.reason == OUT_OF_SEQUENCE:
            level = logging.INFO if event.version == serving else logging.WARNING
        _log.log(level, "%s; %s", why, keeps)

    async def _go_live_served(self, event: reward_pb2.PolicyUpdated, backend: ServedPolicy) -> bool:
        """Served backend: make ``event``'s version live on the server, then for new sessions.

        Everything that can reject the version happens before anything changes: the weights
        file is verified and its metadata checked (the network, S: the featurisation sessions
        use),
        the ONNX file is checked against the signed ``onnx_sha256``, and the server loads it
        through the repository API (a load that fails leaves the previous version serving).
        Only then do new sessions get the new snapshot. A retriable server error (unavailable,
        deadline) is raised, so the consumer retries the event; a rejected version is logged,
        kept in ``holder.last_error``, and the event consumed.
        """
        version = int(event.version)
        try:
            self.holder.admit(event)  # signed, hashed, newer: before any file is touched
            if not event.onnx_uri or not event.onnx_sha256:
                raise ArtifactError(
                    f"{MODEL_NAME} v{version} was announced without an ONNX export (onnx_uri / "
                    "onnx_sha256 empty), which a served backend needs; set "
                    "PODIUM_MODEL_REPOSITORY for the learner"
                )
            # The signed hash, never the sidecar (admit() refused an empty one).
            weights = await asyncio.to_thread(load_weights, path_from_uri(event.uri), event.sha256)
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
            self._log_refusal(event)
            return False
        self._remember(
            self.holder.publish(Served(version, policy, weights.sha256, str(weights.path)))
        )
        _log.info("serving %s v%s on %s (%s)", MODEL_NAME, live, backend.url, event.onnx_uri)
        return True
