"""Guardrail metrics of one scored session: the numbers the canary and baseline arms are
compared on (:mod:`podium.rollout.stats`). Every metric is "higher is worse"."""

from __future__ import annotations

import math

from podium.rewards.detectors import DETECTORS
from podium.v1 import reward_pb2, subtask_pb2

LATENCY_RATIO_CAP = 4.0
"""latency / lower bound charged to a session that did not complete, and the most any
session counts for: an incomplete session never delivered, so its time to a result is
unbounded; the cap keeps one such session (or one pathological timeout) from dominating the
arm's mean while still charging it more than any normal session (cpls runs at about 1.1-1.5)."""

END_REASON_LABEL = "end_reason"
"""Trajectory label the orchestrator sets when a session ends abnormally (timeout, crash,
invalid task, truncation, loop)."""

DETECTOR_PREFIX = "detector:"
"""Prefix of a detector's firing metric: ``"detector:<name>"``."""


def _failed(scored: reward_pb2.ScoredTrajectory) -> bool:
    """An incomplete session that ended abnormally or achieved nothing: loop detection (or a
    decision-limit truncation, which the trajectory records as a loop), an ``end_reason``
    label (timeout, crash, invalid task), or no execution that succeeded. A completed
    session never failed; an incomplete one that did some work and stopped by itself (e.g.
    avoidance) is incomplete but not failed."""
    t = scored.trajectory
    if t.completed:
        return False
    succeeded = any(ex.outcome == subtask_pb2.OUTCOME_SUCCESS for ex in t.executions)
    return t.loop_detected or bool(t.labels.get(END_REASON_LABEL)) or not succeeded


def latency_ratio(scored: reward_pb2.ScoredTrajectory) -> float:
    """latency / lower bound, at most :data:`LATENCY_RATIO_CAP`; the cap itself for an
    incomplete session or one without a positive bound and latency to compare."""
    t = scored.trajectory
    if not t.completed or t.lower_bound <= 0 or not math.isfinite(t.latency):
        return LATENCY_RATIO_CAP
    return min(max(t.latency / t.lower_bound, 0.0), LATENCY_RATIO_CAP)


def p99(values: list[float]) -> float:
    """The 99th percentile by nearest rank (an observed value; 0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = math.ceil(0.99 * len(ordered))
    return ordered[max(rank, 1) - 1]


def session_metrics(scored: reward_pb2.ScoredTrajectory) -> dict[str, float]:
    """The guardrail metrics of one scored session.

    * ``incomplete``: 1 when not every subtask succeeded (``not trajectory.completed``);
    * ``failed``: 1 when the session failed outright (see :func:`_failed`);
    * ``latency_ratio``: :func:`latency_ratio`;
    * ``decision_ms_p99``: p99 of the measured ``Decision.decide_ms`` (decisions with 0 were
      not measured and are left out, as are non-finite ones; 0 when none was measured);
    * ``detector:<name>``: 1 when that anti-hacking detector fired (penalty > 0), for every
      detector podium.rewards knows and every penalty in the breakdown (absent: 0).
    """
    t = scored.trajectory
    out = {
        "incomplete": 0.0 if t.completed else 1.0,
        "failed": 1.0 if _failed(scored) else 0.0,
        "latency_ratio": latency_ratio(scored),
        "decision_ms_p99": p99([d.decide_ms for d in t.decisions if 0 < d.decide_ms < math.inf]),
    }
    for name in (*DETECTORS, *sorted(set(scored.penalties) - set(DETECTORS))):
        out[DETECTOR_PREFIX + name] = 1.0 if scored.penalties.get(name, 0.0) > 0 else 0.0
    return out


__all__ = [
    "DETECTOR_PREFIX",
    "END_REASON_LABEL",
    "LATENCY_RATIO_CAP",
    "latency_ratio",
    "p99",
    "session_metrics",
]
