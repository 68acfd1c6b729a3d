"""What the learning loop asks of a learning algorithm: decode, update, publish.

The loop (:mod:`learner_svc.loop`) owns everything about the stream — offsets, the policy-lag
bound, dead letters, checkpoints, commits, announcements — and is written once. An algorithm
owns its model and the math: how one scored trajectory becomes a training sample, what one
update on a batch of samples does, and how a version of its weights is written. Two live here:
:class:`learner_svc.algorithms.ppo.GenericPPO` (a flat actor-critic, any observation vector)
and :class:`learner_svc.algorithms.swarm.SwarmPPO` (the orchestrator's swarm policy).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import torch

from learner_svc.lineage import Lineage
from podium.policy.signing import SigningKey
from podium.policy.versions import policy_version_number
from podium.v1 import reward_pb2

SampleT = TypeVar("SampleT")


def version_number(policy_version: str) -> int:
    """The last integer in a policy version string (``"orchestrator:12"`` -> 12); 0 if none.

    Strict and total (:func:`podium.policy.versions.policy_version_number`): ASCII digits
    only; anything else (``"²"``, a control character, 19+ digits) raises a
    :class:`~podium.errors.DecodeError` naming the problem, which the loop dead-letters.
    """
    return policy_version_number(policy_version)


def policy_lag(current_version: int, behaviour_version: str) -> int:
    """Versions between the acting policy and the learner's current one (never negative), on
    a lineage that never reset (the loop measures along its own: :class:`Lineage`);
    :class:`~podium.errors.DecodeError` when ``behaviour_version`` is malformed."""
    lag = Lineage(current_version).lag(version_number(behaviour_version))
    assert lag is not None  # every version >= 0 is on a lineage that never reset
    return lag


class Algorithm(Protocol[SampleT]):
    """A learning algorithm driven by :class:`learner_svc.loop.LearningLoop`.

    ``model``, ``optimizer`` and ``generator`` are what a checkpoint saves and restores; the
    loop calls :meth:`update` in a worker thread (an update takes seconds on a loaded CPU and
    a blocked event loop would miss the consumer's heartbeats), everything else on the loop.
    """

    model_name: str
    """Name of the model in the artifact repository and in ``PolicyUpdated``."""
    model: torch.nn.Module
    """The network whose weights are published."""
    optimizer: torch.optim.Optimizer
    """Its optimizer (checkpointed with it)."""
    generator: torch.Generator
    """Random state checkpointed with the weights."""
    signer: SigningKey
    """The key its announcements are signed with; its public half verifies the announcement
    of a version the learner resets to (:mod:`learner_svc.lineage`)."""

    def decode(self, scored: reward_pb2.ScoredTrajectory, lag: int) -> SampleT | None:
        """One scored trajectory as a training sample; None when it is not for training
        (e.g. a rule engine's session: counted as off-policy and committed). Raises
        :class:`~podium.errors.DecodeError` or :class:`~podium.errors.ProcessingError` naming
        the problem when it is malformed (the loop dead-letters it)."""
        ...

    def sample_id(self, sample: SampleT) -> str:
        """The trajectory id of a sample (what the ledger of trained ids records)."""
        ...

    def update(self, batch: list[SampleT], step: int) -> dict[str, float]:
        """One update on ``batch``; ``step`` is the number of updates before it. Returns the
        figures to log and announce. Must depend on nothing but the batch, ``step`` and the
        checkpointed state, so a restarted learner repeats it exactly."""
        ...

    def publish(
        self, version: int, step: int, metrics: dict[str, float]
    ) -> reward_pb2.PolicyUpdated:
        """Write the current weights as ``version`` (identical bytes after a crash are a no-op,
        different ones an :class:`~podium.errors.ArtifactError`) and return the announcement."""
        ...


__all__ = ["Algorithm", "SampleT", "policy_lag", "version_number"]
