"""Kafka topic names: the event flow of ARCHITECTURE.md, one constant per topic."""

from __future__ import annotations

from typing import Final

TASKS: Final = "podium.tasks.v1"
"""TaskSubmitted: a session was opened (orchestrator_svc)."""
SUBTASKS_ASSIGNED: Final = "podium.subtasks.assigned.v1"
"""SubtaskAssigned: work for sub-agents, keyed by execution id so a session's parallel work spreads over workers (orchestrator_svc -> subagent_svc)."""
SUBTASK_RESULTS: Final = "podium.subtasks.results.v1"
"""SubtaskResult: finished executions (subagent_svc -> orchestrator_svc)."""
TRAJECTORIES: Final = "podium.trajectories.v1"
"""Trajectory: one per session (orchestrator_svc -> reward_svc)."""
SCORED_TRAJECTORIES: Final = "podium.trajectories.scored.v1"
"""ScoredTrajectory: reward breakdowns (reward_svc -> learner_svc)."""
POLICY_UPDATES: Final = "podium.policy.updates.v1"
"""PolicyUpdated: a new policy version (learner_svc -> orchestrator_svc)."""
FEEDBACK: Final = "podium.feedback.v1"
"""Feedback: user feedback on sessions (orchestrator_svc)."""
ORCHESTRATOR_SESSIONS: Final = "podium.orchestrator.sessions.v1"
"""SessionDone ledger (compacted, key: session id; raw protobuf, no envelope): written with each
session's Trajectory in one transaction, read on partition take-over (orchestrator_svc). Not in :data:`ALL`, whose topics carry envelopes."""

ROLLOUT: Final = "podium.rollout.v1"
"""The rollout registry (compacted): RolloutState under key ``state``, every RolloutTransition
under ``transition:<seq>``, the controller's ControllerCheckpoint under ``checkpoint``. One
fenced writer (the rollout controller, learner_svc in ``rollout`` mode); every orchestrator
replica applies the state."""
REVIEWS: Final = "podium.reviews.v1"
"""ReviewEvent: sensitive subtasks held for human review and their decisions (orchestrator_svc
replicas, through any replica's ReviewService)."""

DLQ_SUFFIX: Final = ".dlq"
"""Dead-letter topic of topic T is T + DLQ_SUFFIX."""

ALL: Final = (
    TASKS,
    SUBTASKS_ASSIGNED,
    SUBTASK_RESULTS,
    TRAJECTORIES,
    SCORED_TRAJECTORIES,
    POLICY_UPDATES,
    FEEDBACK,
    ROLLOUT,
    REVIEWS,
)


def dead_letter(topic: str) -> str:
    """Name of the dead-letter topic for ``topic``."""
    return topic + DLQ_SUFFIX
