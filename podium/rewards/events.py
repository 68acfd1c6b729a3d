"""Scoring on the wire: trajectory record bytes → scored trajectory record bytes.

The transform step of reward_svc and of ``podium reward rescore`` (it lives in the core so
both can use it: the core never imports a service).

Pure apart from the clock stamped on the envelope: the output event id is derived from the
input event id and the reward version, so the same trajectory scored twice by the same reward
(a redelivery on the in-process bus, a re-score with an unchanged config) yields the same
event id and downstream de-duplication recognises it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from podium import codec
from podium.rewards import RewardConfig, ScoreBreakdown, progress_from_policy_version, score
from podium.v1 import envelope_pb2, reward_pb2, trajectory_pb2

_NAMESPACE = uuid.UUID("6f1d3a52-3c1e-4f0e-9a57-2d1f0b7c8e11")
"""Namespace of scored-event ids (uuid5)."""


@dataclass(frozen=True, slots=True)
class Scored:
    """One transformed record."""

    key: str
    """Partitioning key (the session id), so a session's events stay in order."""
    value: bytes
    """The serialised envelope holding the ScoredTrajectory."""
    event_id: str
    """Its event id."""
    source_event_id: str
    """Event id of the trajectory it scores."""
    breakdown: ScoreBreakdown
    """The reward, for logs and metrics."""


def scored_event_id(source_event_id: str, reward_version: str) -> str:
    """uuid5 of (source event, reward version): stable across retries and replicas."""
    return str(uuid.uuid5(_NAMESPACE, f"{source_event_id}/{reward_version}"))


@dataclass(frozen=True, slots=True)
class ScoredEvent:
    """One trajectory event scored: what to publish, and under which identity."""

    message: reward_pb2.ScoredTrajectory
    """The scored trajectory."""
    key: str
    """Partitioning key (the session id), so a session's events stay in order."""
    event_id: str
    """Its event id (stable: the source event id and the reward version)."""
    occurred_at: datetime | None
    """When the scored session happened (the source event's time)."""
    breakdown: ScoreBreakdown
    """The reward, for logs and metrics."""


def score_envelope(
    env: envelope_pb2.Envelope, config: RewardConfig, *, fixed_progress: float | None = None
) -> ScoredEvent:
    """Score the trajectory in ``env`` at ``fixed_progress`` if given, else at the progress its
    acting policy's version implies, so live scoring and a later re-score agree.

    Raises :class:`~podium.errors.DecodeError` for an event that is not a Trajectory and
    :class:`~podium.rewards.InvalidTrajectoryError` for one that cannot be scored; both are
    non-retriable, and callers dead-letter the record.
    """
    traj = codec.unpack_as(env, trajectory_pb2.Trajectory)
    progress = (
        fixed_progress
        if fixed_progress is not None
        else progress_from_policy_version(traj.policy_version, config.progress_per_policy_version)
    )
    breakdown = score(traj, config, progress)
    return ScoredEvent(
        message=breakdown.to_proto(traj),
        key=traj.session_id or traj.trajectory_id or env.key,
        event_id=scored_event_id(env.event_id, breakdown.reward_version),
        occurred_at=env.occurred_at.ToDatetime(tzinfo=UTC) if env.HasField("occurred_at") else None,
        breakdown=breakdown,
    )


def score_record(
    value: bytes | None,
    config: RewardConfig,
    *,
    producer: str,
    fixed_progress: float | None = None,
) -> Scored:
    """Decode one trajectory record (through :mod:`podium.codec`), score it, encode the result.

    Raises :class:`~podium.errors.DecodeError` for bytes that are not a Trajectory event and
    :class:`~podium.rewards.InvalidTrajectoryError` for a trajectory that cannot be scored;
    both are non-retriable, and callers dead-letter the record.
    """
    env = codec.decode_envelope(value)
    out = score_envelope(env, config, fixed_progress=fixed_progress)
    _, data = codec.encode_event(
        out.message,
        producer=producer,
        key=out.key,
        trace_context=dict(env.trace_context),
        idempotency_key=out.event_id,
        event_id=out.event_id,
        occurred_at=out.occurred_at,
    )
    return Scored(out.key, data, out.event_id, env.event_id, out.breakdown)
