"""Credit assignment: which executions, subtasks and stages earned or lost the reward.

Subtask-level shares split the completion evenly over required subtasks: each done subtask
contributes +1/n (shared by its successful executions), each subtask not done −1/n (shared by
its failed executions; a subtask-level entry when it was never attempted or never merged). So
the positive shares sum to the completion fraction and the negative ones to −(1 − completion).
Stage entries give each stage's weighted contribution (positive when the stage is complete,
its weighted shortfall otherwise), and every penalty is charged to the executions that
committed the hack.

When the session fails, the *responsible* subtask is the first failed one (in dependency
order) that failed by itself — its dependencies were done — preferring one on the critical
path; its stage is the responsible stage, and their reasons say so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from podium.rewards.detectors import Finding
from podium.rewards.facts import SUCCESS, TrajectoryFacts, base_subtask_id
from podium.v1 import subtask_pb2, trajectory_pb2

CreditKind = Literal["execution", "subtask", "stage", "penalty"]


@dataclass(frozen=True, slots=True)
class CreditEntry:
    """One line of attribution (maps onto ``podium.v1.Credit``)."""

    kind: CreditKind
    """What is credited: an execution, a subtask, a stage or a penalty."""
    share: float
    """Signed share of the reward attributed here."""
    reason: str
    """Why, in words."""
    execution_id: str = ""
    """Execution credited (empty for subtask and stage entries)."""
    subtask_id: str = ""
    """Subtask (or chunk) concerned."""
    agent: str = ""
    """Sub-agent kind that ran the execution."""
    stage: str = ""
    """Stage the subtask belongs to."""


@dataclass(frozen=True, slots=True)
class Blame:
    """Who is responsible when a session fails."""

    subtask_id: str
    """The first subtask that failed by itself, critical path first."""
    stage: str
    """Its stage."""
    on_critical_path: bool
    """Whether it lies on the critical path."""
    execution_ids: tuple[str, ...]
    """Its failed executions (empty if it was never attempted)."""


def _outcome_name(outcome: subtask_pb2.Outcome.ValueType) -> str:
    return subtask_pb2.Outcome.Name(outcome).removeprefix("OUTCOME_").lower()


def find_blame(traj: trajectory_pb2.Trajectory, facts: TrajectoryFacts) -> Blame | None:
    """The responsible subtask and stage of a failed session, or None when all are done."""
    failed_self = [
        s
        for s in facts.required
        if s not in facts.done and all(d in facts.done for d in facts.deps[s])
    ]
    if not failed_self:
        return None
    critical = [s for s in failed_self if s in facts.critical]
    chosen = (critical or failed_self)[0]
    execs = tuple(
        e.execution_id
        for e in traj.executions
        if base_subtask_id(e.subtask_id) == chosen and e.outcome != SUCCESS
    )
    return Blame(chosen, facts.stage_of[chosen], chosen in facts.critical, execs)


def assign_credit(
    traj: trajectory_pb2.Trajectory,
    facts: TrajectoryFacts,
    stage_scores: Mapping[str, float],
    stage_weights: Mapping[str, float],
    findings: Sequence[Finding],
    blame: Blame | None,
) -> tuple[CreditEntry, ...]:
    """Credit entries: executions in order, then subtasks, stages and penalties."""
    n = len(facts.required)
    by_subtask: dict[str, list[trajectory_pb2.Execution]] = defaultdict(list)
    for ex in traj.executions:
        by_subtask[base_subtask_id(ex.subtask_id)].append(ex)
    entries: list[CreditEntry] = []
    blamed = blame.subtask_id if blame else ""
    for ex in traj.executions:
        base = base_subtask_id(ex.subtask_id)
        common = {"execution_id": ex.execution_id, "subtask_id": ex.subtask_id, "agent": ex.agent}
        if base not in facts.stage_of:
            entries.append(
                CreditEntry("execution", 0.0, "not a subtask of the task", stage=ex.stage, **common)
            )
            continue
        stage = facts.stage_of[base]
        where = "on" if base in facts.critical else "off"
        siblings = by_subtask[base]
        if base in facts.done:
            if ex.outcome == SUCCESS:
                k = sum(1 for e in siblings if e.outcome == SUCCESS)
                share, reason = 1.0 / (n * k), f"completed its subtask ({where} the critical path)"
            else:
                share = 0.0
                reason = f"{_outcome_name(ex.outcome)} attempt, recovered by a later success"
        elif ex.outcome == SUCCESS:
            share, reason = 0.0, "chunk succeeded but its subtask never completed"
        else:
            k = sum(1 for e in siblings if e.outcome != SUCCESS)
            share = -1.0 / (n * k)
            reason = f"{_outcome_name(ex.outcome)} {where} the critical path"
            if base == blamed:
                reason += f"; responsible for the session failure (stage {stage})"
        entries.append(CreditEntry("execution", share, reason, stage=stage, **common))
    for s in facts.required:
        if s in facts.done or any(e.outcome != SUCCESS for e in by_subtask[s]):
            continue
        missing = [d for d in facts.deps[s] if d not in facts.done]
        if missing:
            reason = f"blocked: dependency {missing[0]!r} never completed"
        elif s in facts.attempted:
            reason = "split chunks ran but were never merged"
        else:
            reason = "never attempted"
        if s == blamed:
            reason += f"; responsible for the session failure (stage {facts.stage_of[s]})"
        entries.append(
            CreditEntry("subtask", -1.0 / n, reason, subtask_id=s, stage=facts.stage_of[s])
        )
    for stage, value in stage_scores.items():
        w = stage_weights.get(stage, 0.0)
        members = [s for s in facts.required if facts.stage_of[s] == stage]
        done = sum(1 for s in members if s in facts.done)
        share = w * value if value >= 1.0 else -w * (1.0 - value)
        reason = f"stage {stage}: {done}/{len(members)} subtasks done"
        if blame and blame.stage == stage:
            reason += f"; responsible for the session failure (subtask {blame.subtask_id!r})"
        entries.append(CreditEntry("stage", share, reason, stage=stage))
    for f in findings:
        if not f.triggered:
            continue
        ids = f.execution_ids
        if ids:
            agent_of = {e.execution_id: e for e in traj.executions}
            for eid in ids:
                ex = agent_of[eid]
                entries.append(
                    CreditEntry(
                        "penalty",
                        -f.penalty / len(ids),
                        f"{f.name}: {f.detail}",
                        execution_id=eid,
                        subtask_id=ex.subtask_id,
                        agent=ex.agent,
                        stage=facts.stage_of.get(base_subtask_id(ex.subtask_id), ex.stage),
                    )
                )
        else:
            entries.append(CreditEntry("penalty", -f.penalty, f"{f.name}: {f.detail}"))
    return tuple(entries)
