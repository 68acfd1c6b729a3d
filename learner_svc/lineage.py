"""The learner's lineage and the rollout: back to the live version when its work is rejected.

Every cycle the rollout controller proposes the learner's newest version as the candidate
(:mod:`learner_svc.rollout`). The learner trains one **lineage**: a chain of versions, each
descending from the one before. Before any reset it is ``0, 1, ..., policy_version``; after a
reset to live version ``L`` taken when the learner had published ``N``, it is ``L, N+1, N+2,
...`` (numbers never go back: a reset reuses none). :class:`Lineage` is that chain.

The learner follows the rollout registry (``podium.rollout.v1``, every transition from the
beginning) and **resets** its weights to the live version ``L`` (a decimal version) when

* the transition rejects a version of its lineage that descends from ``L`` (an offline check or
  shadow failed, a staged rollout or a promotion was rolled back): the work since ``L`` was
  rejected, so the next candidate must be trained from ``L`` again; or
* ``L`` is not in its lineage at all (an operator rolled back to an older version, or the
  learner lost its checkpoint): it trains from what users run.

While the live version is a rule engine (``rules:cpls``, the cold start) nothing resets: the
lineage came from behaviour cloning of that rule engine and keeps learning from there.

Everything here is pure except :func:`announced_weights`, which reads the policy-updates topic
to load ``L``'s weights from its signed announcement (verified like an orchestrator does:
:mod:`podium.policy.signing`, weights checked against the announced sha256).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from podium import codec
from podium.bus import read_committed
from podium.bus.base import Bus
from podium.errors import ArtifactError, DecodeError
from podium.policy.artifacts import LoadedWeights, load_weights, path_from_uri
from podium.policy.signing import RefusedAnnouncement, TrustedKeys, verify_announcement
from podium.policy.versions import is_version_number
from podium.v1 import reward_pb2, rollout_pb2

TRANSITION_KEY_PREFIX = b"transition:"
"""Key prefix of the rollout transitions on ``podium.rollout.v1`` (the other keys, ``state``
and ``checkpoint``, carry nothing the learner needs: each transition holds its state)."""

REJECTIONS = frozenset(
    {
        rollout_pb2.TRANSITION_KIND_OFFLINE_FAILED,
        rollout_pb2.TRANSITION_KIND_SHADOW_FAILED,
        rollout_pb2.TRANSITION_KIND_ROLLED_BACK,
    }
)
"""Transitions that reject a version: its offline check or shadow failed, or it was rolled
back (from a stage, or after its promotion)."""


@dataclass(frozen=True, slots=True)
class Lineage:
    """The published versions the learner's current weights descend from, oldest first:
    :attr:`reset_from` (when it reset), then every version above :attr:`reset_at` up to
    :attr:`version`."""

    version: int
    """The learner's latest published version (its ``policy_version``)."""
    reset_from: int = -1
    """The version it last reset to; -1: never reset."""
    reset_at: int = -1
    """Its version when it reset (later versions descend from :attr:`reset_from`); -1: never."""

    def position(self, version: int) -> int | None:
        """Where ``version`` stands in the chain (larger: later), None when it is not an
        ancestor of the current weights. Versions newer than :attr:`version` (not published
        by this learner yet) count as current."""
        if version == self.reset_from:
            return self.reset_at
        return version if version > self.reset_at else None

    def contains(self, version: int) -> bool:
        """Whether ``version`` is one the current weights descend from."""
        return version <= self.version and self.position(version) is not None

    def lag(self, behaviour: int) -> int | None:
        """Versions between ``behaviour`` and the current one along the chain (0 for a newer
        one), None when ``behaviour`` is off it (a version of an abandoned lineage, whose
        samples are then stale whatever their number)."""
        at = self.position(behaviour)
        return None if at is None else max(self.version - at, 0)

    def reset_to(self, live: int) -> Lineage:
        """The lineage after resetting the weights to ``live``: the next version is above both
        the learner's last and ``live`` (monotonic numbers)."""
        at = max(self.version, live)
        return replace(self, version=at, reset_from=live, reset_at=at)


def rejected_version(transition: rollout_pb2.RolloutTransition) -> int | None:
    """The learned version ``transition`` rejects, or None (not a rejection, or a rule
    engine). A rollback from IDLE undoes the last promotion: the rejected version is the live
    one before it; otherwise it is the candidate before it."""
    if transition.kind not in REJECTIONS:
        return None
    before = transition.previous
    name = before.candidate_version
    if not name and transition.kind == rollout_pb2.TRANSITION_KIND_ROLLED_BACK:
        name = before.live_version
    return int(name) if is_version_number(name) else None


def reset_target(transition: rollout_pb2.RolloutTransition, lineage: Lineage) -> int | None:
    """The live version to reset to after ``transition``, or None (keep training).

    None while the live version is a rule engine. Else the live version ``L`` when it is not
    in the lineage, or when ``transition`` rejects a version of the lineage later than ``L``.
    """
    live = transition.state.live_version
    if not is_version_number(live):
        return None
    target = int(live)
    if not lineage.contains(target):
        return target
    rejected = rejected_version(transition)
    if rejected is None or not lineage.contains(rejected):
        return None
    rejected_at, live_at = lineage.position(rejected), lineage.position(target)
    assert rejected_at is not None and live_at is not None  # both contained
    return target if rejected_at > live_at else None


@dataclass(frozen=True, slots=True)
class Followed:
    """What a run of rollout transitions does to the learner."""

    lineage: Lineage
    """The lineage after them."""
    seq: int
    """Seq of the last transition applied."""
    resets: tuple[tuple[int, int], ...] = ()
    """(transition seq, live version) of each reset, in order; the weights end as the last's."""
    reasons: tuple[str, ...] = ()
    """Why each reset happened, in words for the log (same order as :attr:`resets`)."""


def reset_reason(target: int, lineage: Lineage) -> str:
    """Why resetting ``lineage`` to the live version ``target`` (see :func:`reset_target`):
    a rejection of a later version of the lineage, or a live version from elsewhere (another
    learner's, or one made live by ``podium rollout bootstrap``)."""
    if lineage.contains(target):
        return "a later version of this lineage was rejected"
    return f"the live version {target} is not of this learner's lineage"


def follow(
    lineage: Lineage, seq: int, transitions: Iterable[rollout_pb2.RolloutTransition]
) -> Followed:
    """Apply ``transitions`` (in seq order; those at or below ``seq`` were applied before and
    are skipped) to ``lineage``. Pure: the caller loads the last reset's weights once."""
    resets: list[tuple[int, int]] = []
    reasons: list[str] = []
    for transition in sorted(transitions, key=lambda t: t.seq):
        if transition.seq <= seq:
            continue
        seq = transition.seq
        target = reset_target(transition, lineage)
        if target is not None:
            reasons.append(reset_reason(target, lineage))
            lineage = lineage.reset_to(target)
            resets.append((seq, target))
    return Followed(lineage=lineage, seq=seq, resets=tuple(resets), reasons=tuple(reasons))


def decode_transition(
    key: bytes | None, value: bytes | None
) -> rollout_pb2.RolloutTransition | None:
    """The transition a rollout-topic record holds, None for the other keys (``state``,
    ``checkpoint``) and for tombstones; :class:`DecodeError` for a transition that does not
    decode."""
    if key is None or not key.startswith(TRANSITION_KEY_PREFIX) or value is None:
        return None
    _, transition = codec.decode_event(value, rollout_pb2.RolloutTransition)
    return transition


async def announced_weights(
    bus: Bus, topic: str, model_name: str, version: int, trusted: TrustedKeys
) -> LoadedWeights:
    """The weights of ``model_name`` v``version`` from its signed announcement on ``topic``.

    The newest announcement of that version that verifies (signed by a key of ``trusted``
    over model, version and hashes) names the file and its sha256; the bytes must hash to it.
    Raises :class:`ArtifactError` naming the version and why when no announcement verifies
    (none on the topic, or each refused: their reasons are listed) or the file does not.
    """
    refused: list[str] = []
    for record in reversed(await read_committed(bus, topic)):
        try:
            _, event = codec.decode_event(record.value, reward_pb2.PolicyUpdated)
        except DecodeError:
            continue  # someone else's junk on the topic; orchestrators skip it too
        if event.model_name != model_name or event.version != version:
            continue
        try:
            verify_announcement(event, trusted, None)
        except RefusedAnnouncement as exc:
            refused.append(str(exc))
            continue
        return load_weights(path_from_uri(event.uri), event.sha256)
    why = "; ".join(refused) if refused else "none on the topic"
    raise ArtifactError(
        f"cannot reset to {model_name} v{version}: no announcement of it on {topic} verifies "
        f"({why})"
    )


__all__ = [
    "REJECTIONS",
    "TRANSITION_KEY_PREFIX",
    "Followed",
    "Lineage",
    "announced_weights",
    "decode_transition",
    "follow",
    "rejected_version",
    "reset_reason",
    "reset_target",
]
