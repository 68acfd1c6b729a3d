"""The controller's side of twins: which versions may be candidates, and running their twins.

:class:`Candidates` follows the policy-updates topic and keeps the announcements that verify
(:mod:`podium.policy.signing`): only those, and rule engines (``rules:<name>``), can walk the
path. :class:`TwinRunner` builds each version's twin policy once and runs paired twins
(:mod:`podium.rollout.twins`) off the event loop, in lock-step batches, on the sub-agents as
the controller's statistics store observed them (a snapshot taken when the twins start: the
store's estimated pool, which every policy reads too), or on the pool spec without a store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence

from podium.bus.base import Record
from podium.codec import unpack_as
from podium.envs.swarm.baselines import BASELINES
from podium.envs.swarm.spec import PoolSpec
from podium.errors import PodiumError
from podium.observed import AgentStats
from podium.policy.signing import TrustedKeys, verify_announcement
from podium.policy.swarm import MODEL_NAME
from podium.policy.versions import is_version_number
from podium.rollout.twins import TwinEvaluator, TwinPolicy, twin_case, twin_policy
from podium.v1 import envelope_pb2, reward_pb2, trajectory_pb2

_log = logging.getLogger(__name__)

RULE_PREFIX = "rules:"
"""Versions that name a rule engine."""


def rule_known(version: str) -> bool:
    """Whether ``version`` is ``rules:<name>`` of a rule engine the environment has."""
    return version.startswith(RULE_PREFIX) and version[len(RULE_PREFIX) :] in BASELINES


class Candidates:
    """Verified announcements by version (the handler of a policy-updates consumer)."""

    def __init__(self, trusted: TrustedKeys | None) -> None:
        self.trusted = trusted
        self.verified: dict[str, reward_pb2.PolicyUpdated] = {}
        self.refused = 0
        """Announcements that did not verify (logged, never candidates)."""

    async def on_event(self, env: envelope_pb2.Envelope, _record: Record) -> None:
        """Keep ``env``'s announcement if it verifies; an unverifiable one is logged once."""
        event = unpack_as(env, reward_pb2.PolicyUpdated)
        if event.model_name != MODEL_NAME:
            return
        try:
            verify_announcement(event, self.trusted, None)
        except PodiumError as exc:
            self.refused += 1
            _log.warning("rollout: announcement of version %d refused: %s", event.version, exc)
            return
        self.verified[str(event.version)] = event

    def newest_after(self, live: str, tried: Collection[str] = ()) -> str | None:
        """The newest verified version newer than ``live`` (any, when live is a rule engine)
        and not among ``tried``."""
        floor = int(live) if is_version_number(live) else -1
        newer = [int(v) for v in self.verified if int(v) > floor and v not in tried]
        return str(max(newer)) if newer else None

    def check(self, version: str) -> str | None:
        """None if ``version`` can be a candidate, else why not."""
        if version.startswith(RULE_PREFIX):
            return None if rule_known(version) else f"no rule engine {version!r}"
        if not is_version_number(version):
            return f"{version!r} is neither a decimal version nor rules:<name>"
        if version not in self.verified:
            return f"no verified announcement of version {version} (yet)"
        return None


class TwinRunner:
    """Paired twins of recorded sessions, candidate against incumbent."""

    def __init__(self, pool: PoolSpec, candidates: Candidates, *, batch: int = 32) -> None:
        self.pool = pool
        """The pool spec the sessions ran on (what policies read; ``PODIUM_POOL_SPEC``)."""
        self.batch = batch
        self.evaluator = TwinEvaluator(pool, batch=batch)
        """Twins without a store: outcomes from the pool spec."""
        self.candidates = candidates
        self._policies: dict[str, TwinPolicy] = {}

    def evaluator_for(self, stats: AgentStats | None) -> TwinEvaluator:
        """Twins that read ``stats`` and draw outcomes from its estimated pool (the pool spec's
        evaluator when None). ``stats`` is read while the twins run: hand over a snapshot."""
        if stats is None:
            return self.evaluator
        return TwinEvaluator(self.pool, batch=self.batch, stats=stats)

    def policy(self, version: str) -> TwinPolicy:
        """The twin policy of ``version`` (built once; raises ArtifactError /
        RefusedAnnouncement / PodiumError with the reason when it cannot be)."""
        policy = self._policies.get(version)
        if policy is None:
            why = self.candidates.check(version)
            if why is not None:
                raise PodiumError(why)
            announcement = self.candidates.verified.get(version)
            policy = twin_policy(version, announcement, self.candidates.trusted)
            self._policies[version] = policy
        return policy

    def paired_now(
        self,
        candidate: str,
        incumbent: str,
        trajectories: Sequence[trajectory_pb2.Trajectory],
        stats: AgentStats | None = None,
    ) -> list[float | None]:
        """Per trajectory: candidate return - incumbent return on its twin (on the sub-agents
        as ``stats`` observed them, see :meth:`evaluator_for`), or None when it has no twin
        (no task or seed recorded). Blocking: call through :meth:`paired`."""
        cases = [twin_case(t) for t in trajectories]
        runnable = [c for c in cases if c is not None]
        if not runnable:
            return [None] * len(cases)
        evaluator = self.evaluator_for(stats)
        diffs = iter(evaluator.paired(self.policy(candidate), self.policy(incumbent), runnable))
        return [None if c is None else float(next(diffs)) for c in cases]

    async def paired(
        self,
        candidate: str,
        incumbent: str,
        trajectories: Sequence[trajectory_pb2.Trajectory],
        stats: AgentStats | None = None,
    ) -> list[float | None]:
        """:meth:`paired_now` in a worker thread, so the event loop (commands, heartbeats)
        goes on while the twins run; on a snapshot of ``stats`` taken now (the loop may feed
        the store meanwhile, and a store is not thread-safe)."""
        snapshot = None if stats is None else stats.copy()
        return await asyncio.to_thread(
            self.paired_now, candidate, incumbent, trajectories, snapshot
        )
