"""Raw reward components, each a pure function of the trajectory's evidence, in [0, 1].

Weights are applied by :mod:`podium.rewards.score`; here every part is unweighted so it can be
read, plotted and compared across tasks on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from podium.rewards.config import STAGES
from podium.rewards.facts import SUCCESS, TrajectoryFacts, duration
from podium.v1 import trajectory_pb2


def effective_parallelism(executions: Sequence[trajectory_pb2.Execution]) -> float:
    """Σ execution durations / span of the executions: the mean number running at once."""
    if not executions:
        return 0.0
    span = max(e.end_time for e in executions) - min(e.start_time for e in executions)
    if span <= 0:
        return 0.0
    return math.fsum(duration(e) for e in executions) / span


def r_parallel(traj: trajectory_pb2.Trajectory, facts: TrajectoryFacts) -> float:
    """PARL's instantiation reward, countering serial collapse.

    clip((P − 1) / (cap − 1), 0, 1) with P the effective parallelism and cap the most that can
    usefully run at once: min(max_parallel, number of subtasks) (the subtask count when the
    cap is unknown). 0 when cap ≤ 1, where no parallelism is possible.
    """
    n = len(facts.required) or len(traj.executions)
    cap = min(facts.max_parallel, n) if facts.max_parallel > 0 else n
    if cap <= 1:
        return 0.0
    p = effective_parallelism(traj.executions)
    return min(max((p - 1.0) / (cap - 1.0), 0.0), 1.0)


def r_finish(traj: trajectory_pb2.Trajectory) -> float:
    """PARL's sub-agent finish rate, countering spurious parallelism: successes / executions."""
    if not traj.executions:
        return 0.0
    return sum(1 for e in traj.executions if e.outcome == SUCCESS) / len(traj.executions)


def completion(facts: TrajectoryFacts) -> float:
    """Fraction of required subtasks done (with evidence). Also PARL's r_perf."""
    if not facts.required:
        return 0.0
    return len(facts.done) / len(facts.required)


def r_perf(facts: TrajectoryFacts) -> float:
    """PARL's task-outcome reward: the evidence-backed completion fraction."""
    return completion(facts)


def latency_ratio(lower_bound: float, latency: float) -> float:
    """clip(lower_bound / latency, 0, 1): 1 at the bound, comparable across tasks."""
    if lower_bound <= 0 or latency <= 0:
        return 0.0
    return min(lower_bound / latency, 1.0)


def efficiency(traj: trajectory_pb2.Trajectory, facts: TrajectoryFacts) -> float:
    """completion × lower_bound / latency.

    Scaling by completion means finishing early without doing the work is never efficient.
    """
    return completion(facts) * latency_ratio(traj.lower_bound, facts.latency)


def quality(facts: TrajectoryFacts) -> float:
    """Fraction of required subtasks done with a verified, stable result.

    With a verifier (``verifier_present``): done and verified. Without one (e.g. the simulated
    swarm), verification cannot be asked for, and quality is output stability: done without
    any failed, malformed or cancelled attempt.
    """
    if not facts.required:
        return 0.0
    good = facts.verified_done if facts.verifier_present else facts.stable_done
    return len(good) / len(facts.required)


def stage_scores(facts: TrajectoryFacts) -> dict[str, float]:
    """Done fraction of each stage that has subtasks (stages without any are absent)."""
    out: dict[str, float] = {}
    for stage in STAGES:
        members = [s for s in facts.required if facts.stage_of[s] == stage]
        if members:
            out[stage] = sum(1 for s in members if s in facts.done) / len(members)
    return out
