"""Which arm of the rollout serves a session: a stable hash of its session id, read against
the rollout state.

Every orchestrator replica computes the same route for the same (session id, state) with no
coordination: the bucket is a hash of the session id alone, and the state says which bucket
ranges go where. The ranges are laid out so that they *nest*: the baseline range
``[0, baseline_bp)`` never moves, and the canary range starts right after it and only grows
with the stage, so a session that was canary at 1% is canary at 5%, 20% and 100% too (a
user is not bounced between versions as the rollout advances).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from podium.v1 import rollout_pb2, trajectory_pb2

BUCKETS = 10_000
"""Number of hash buckets: one bucket is one basis point (0.01%) of sessions."""

_ROLE_PREFIX = "ARM_ROLE_"


def bucket(session_id: str) -> int:
    """The session's bucket in ``[0, BUCKETS)``: the first 8 bytes of sha256(session id),
    big-endian, modulo :data:`BUCKETS`. A cryptographic hash so that ids chosen by clients
    (sequential, timestamped) still spread uniformly."""
    digest = hashlib.sha256(session_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


@dataclass(frozen=True, slots=True)
class Route:
    """The arm a session runs on, fixed when it starts."""

    version: str
    """Policy version that serves it: a decimal learned version or ``"rules:<name>"``."""
    role: int
    """Its role, a ``trajectory_pb2.ArmRole`` value (LIVE, CANARY or BASELINE)."""
    bucket: int
    """The session's bucket (:func:`bucket`), the routing input."""
    seq: int
    """Seq of the rollout state it was routed under (0: no state yet, cold start)."""

    def arm(self) -> trajectory_pb2.Arm:
        """The ``Arm`` recorded in the session's trajectory."""
        return trajectory_pb2.Arm(
            policy_version=self.version,
            role=trajectory_pb2.ArmRole.ValueType(self.role),
            rollout_seq=self.seq,
            bucket=self.bucket,
        )

    @property
    def label(self) -> str:
        """``"<role>:<version>"``, e.g. ``"canary:7"`` (the ``arm`` trajectory label and the
        key of per-arm session counts)."""
        return f"{role_name(self.role)}:{self.version}"


def role_name(role: int) -> str:
    """``ArmRole`` value as a short lower-case word: ``ARM_ROLE_CANARY`` -> ``"canary"``."""
    name = trajectory_pb2.ArmRole.Name(trajectory_pb2.ArmRole.ValueType(role))
    return name.removeprefix(_ROLE_PREFIX).lower()


def baseline_range(state: rollout_pb2.RolloutState) -> tuple[int, int]:
    """Buckets ``[start, end)`` of the baseline arm (fixed for the state's lifetime)."""
    return 0, min(state.baseline_bp, BUCKETS)


def canary_range(state: rollout_pb2.RolloutState) -> tuple[int, int]:
    """Buckets ``[start, end)`` of the canary arm: right after the baseline range, as wide as
    the stage's percent (capped by what the baseline leaves); empty unless STAGED."""
    start = baseline_range(state)[1]
    if state.stage != rollout_pb2.ROLLOUT_STAGE_STAGED:
        return start, start
    return start, start + min(state.canary_percent * 100, BUCKETS - start)


def route(
    session_id: str,
    state: rollout_pb2.RolloutState | None,
    *,
    cold_start: str = "rules:cpls",
) -> Route:
    """The arm of a new session under ``state``.

    No state yet (no rollout was ever written) routes everything to ``cold_start`` as LIVE
    with seq 0. Otherwise the baseline range runs the previous live version (the live version
    itself when there is no previous one, so the baseline share stays a fixed control group),
    the canary range runs the candidate while STAGED, and every other bucket runs live.
    """
    b = bucket(session_id)
    if state is None:
        return Route(cold_start, trajectory_pb2.ARM_ROLE_LIVE, b, 0)
    lo, hi = baseline_range(state)
    if lo <= b < hi:
        version = state.previous_version or state.live_version
        return Route(version, trajectory_pb2.ARM_ROLE_BASELINE, b, state.seq)
    lo, hi = canary_range(state)
    if lo <= b < hi:
        return Route(state.candidate_version, trajectory_pb2.ARM_ROLE_CANARY, b, state.seq)
    return Route(state.live_version, trajectory_pb2.ARM_ROLE_LIVE, b, state.seq)


def target_shares(state: rollout_pb2.RolloutState | None) -> dict[int, float]:
    """Expected share of sessions per role (ArmRole value -> fraction; they sum to 1).

    Always the three keys LIVE, BASELINE and CANARY (a role with no buckets has 0.0), except
    with no state, where everything is LIVE (``{LIVE: 1.0}``).
    """
    if state is None:
        return {trajectory_pb2.ARM_ROLE_LIVE: 1.0}
    b_lo, b_hi = baseline_range(state)
    c_lo, c_hi = canary_range(state)
    baseline, canary = b_hi - b_lo, c_hi - c_lo
    return {
        trajectory_pb2.ARM_ROLE_LIVE: (BUCKETS - baseline - canary) / BUCKETS,
        trajectory_pb2.ARM_ROLE_BASELINE: baseline / BUCKETS,
        trajectory_pb2.ARM_ROLE_CANARY: canary / BUCKETS,
    }


__all__ = [
    "BUCKETS",
    "Route",
    "baseline_range",
    "bucket",
    "canary_range",
    "role_name",
    "route",
    "target_shares",
]
