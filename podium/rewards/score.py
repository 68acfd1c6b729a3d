"""``score(trajectory, config, progress)``: the whole reward as one pure function.

total = Σ_k weight_k(progress) · raw_k − Σ_j penalty_j

where k runs over the parts of every form with a positive mix weight (``parl.*``,
``multi_objective.*``, ``multi_stage.*``; weight_k already includes the form's mix weight) and
j over the six detectors. ``components`` reports weight_k · raw_k, so the total is also
Σ components − Σ penalties. The result depends on nothing but the three arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podium.policy.versions import policy_version_number
from podium.rewards import components as C
from podium.rewards import detectors as D
from podium.rewards.config import STAGES, RewardConfig, reward_version
from podium.rewards.credit import Blame, CreditEntry, assign_credit, find_blame
from podium.rewards.facts import InvalidTrajectoryError, extract_facts
from podium.rewards.schedules import schedule_value
from podium.v1 import reward_pb2, trajectory_pb2


@dataclass(frozen=True, slots=True)
class ScoreBreakdown:
    """A reward with every part that makes it up."""

    total: float
    """Σ components − Σ penalties."""
    components: Mapping[str, float]
    """Weighted components, ``form.part`` → weight · raw."""
    penalties: Mapping[str, float]
    """Detector name → penalty (>= 0), all six always present."""
    credit: tuple[CreditEntry, ...]
    """Attribution to executions, subtasks, stages and penalties."""
    reward_version: str
    """Version of config + scoring code."""
    schedule_step: int
    """Progress the schedules were evaluated at (whole learner updates)."""
    raw: Mapping[str, float]
    """Unweighted component values, same keys as ``components``."""
    weights: Mapping[str, float]
    """Effective weight of each component at this progress (mix included)."""
    findings: tuple[D.Finding, ...]
    """What each detector measured."""
    blame: Blame | None
    """Responsible subtask and stage when the session failed."""

    def to_json_dict(self) -> dict[str, Any]:
        """The public breakdown: exactly total, components, penalties, credit, reward_version."""
        return {
            "total": self.total,
            "components": dict(self.components),
            "penalties": dict(self.penalties),
            "credit": [
                {
                    "execution_id": c.execution_id,
                    "subtask_id": c.subtask_id,
                    "agent": c.agent,
                    "stage": c.stage,
                    "share": c.share,
                    "reason": c.reason,
                }
                for c in self.credit
            ],
            "reward_version": self.reward_version,
        }

    def to_proto(self, trajectory: trajectory_pb2.Trajectory) -> reward_pb2.ScoredTrajectory:
        """The ``ScoredTrajectory`` event carrying ``trajectory`` and this breakdown."""
        msg = reward_pb2.ScoredTrajectory(
            total=self.total,
            reward_version=self.reward_version,
            schedule_step=self.schedule_step,
        )
        msg.trajectory.CopyFrom(trajectory)
        msg.components.update(self.components)
        msg.penalties.update(self.penalties)
        for c in self.credit:
            msg.credit.add(
                execution_id=c.execution_id,
                subtask_id=c.subtask_id,
                agent=c.agent,
                stage=c.stage,
                share=c.share,
                reason=c.reason,
            )
        return msg


def component_weights(
    config: RewardConfig, progress: float, present_stages: tuple[str, ...]
) -> dict[str, float]:
    """Effective weight of every component at ``progress`` (mix weight included).

    Stage weights are renormalised over the stages the task has, so a task without a design
    stage can still reach the full multi-stage reward.
    """
    w: dict[str, float] = {}
    mix = config.mix
    if mix.parl > 0:
        w["parl.parallel"] = mix.parl * schedule_value(config.parl.lambda1, progress)
        w["parl.finish"] = mix.parl * schedule_value(config.parl.lambda2, progress)
        w["parl.perf"] = mix.parl * config.parl.perf
    if mix.multi_objective > 0:
        mo = config.multi_objective
        w["multi_objective.completion"] = mix.multi_objective * schedule_value(
            mo.completion, progress
        )
        w["multi_objective.efficiency"] = mix.multi_objective * schedule_value(
            mo.efficiency, progress
        )
        w["multi_objective.quality"] = mix.multi_objective * schedule_value(mo.quality, progress)
    if mix.multi_stage > 0:
        total = math.fsum(getattr(config.multi_stage, s) for s in present_stages)
        for s in present_stages:
            share = getattr(config.multi_stage, s) / total if total > 0 else 0.0
            w[f"multi_stage.{s}"] = mix.multi_stage * share
    return w


def score(
    trajectory: trajectory_pb2.Trajectory, config: RewardConfig, progress: float
) -> ScoreBreakdown:
    """Score one trajectory.

    ``progress`` is the number of learner updates done (>= 0, fractional allowed): annealing
    schedules are evaluated at it. Raises :class:`InvalidTrajectoryError` (a
    ``ProcessingError``) naming the field when the trajectory cannot be scored.
    """
    if not math.isfinite(progress) or progress < 0:
        raise InvalidTrajectoryError(f"progress: must be a finite number >= 0, got {progress}")
    if trajectory.env == "context":
        # The context environment has its own reward (Context-1 shape and detectors); the
        # import is here because that module builds on ScoreBreakdown, defined above.
        from podium.rewards.context import context_breakdown

        return context_breakdown(
            trajectory, config.version or reward_version(config), progress, config.context
        )
    facts = extract_facts(trajectory, config.multi_stage)
    stages = C.stage_scores(facts)
    weights = component_weights(config, progress, tuple(s for s in STAGES if s in stages))
    raw_all = {
        "parl.parallel": lambda: C.r_parallel(trajectory, facts),
        "parl.finish": lambda: C.r_finish(trajectory),
        "parl.perf": lambda: C.r_perf(facts),
        "multi_objective.completion": lambda: C.completion(facts),
        "multi_objective.efficiency": lambda: C.efficiency(trajectory, facts),
        "multi_objective.quality": lambda: C.quality(facts),
    }
    raw: dict[str, float] = {}
    for key in weights:
        raw[key] = (
            stages[key.split(".", 1)[1]] if key.startswith("multi_stage.") else raw_all[key]()
        )
    components = {k: weights[k] * raw[k] for k in weights}
    dcfg = config.detectors
    findings = (
        D.fake_parallelism(trajectory, dcfg.fake_parallelism),
        D.tool_abuse(trajectory, dcfg.tool_abuse),
        D.fabricated_result(trajectory, facts, dcfg.fabricated_result),
        D.trivial_tests(trajectory, dcfg.trivial_tests),
        D.broken_tool_calls(trajectory, dcfg.broken_tool_calls),
        D.avoidance(facts, dcfg.avoidance),
    )
    penalties = {f.name: f.penalty for f in findings}
    total = math.fsum(components.values()) - math.fsum(penalties.values())
    blame = find_blame(trajectory, facts)
    stage_weights = {s: _normalised_stage_weight(config, s, stages) for s in stages}
    credit = assign_credit(trajectory, facts, stages, stage_weights, findings, blame)
    return ScoreBreakdown(
        total=total,
        components=components,
        penalties=penalties,
        credit=credit,
        reward_version=config.version or reward_version(config),
        schedule_step=int(progress),
        raw=raw,
        weights=weights,
        findings=findings,
        blame=blame,
    )


def _normalised_stage_weight(
    config: RewardConfig, stage: str, present: Mapping[str, float]
) -> float:
    """Stage weight renormalised over the stages present (used for stage credit)."""
    total = math.fsum(getattr(config.multi_stage, s) for s in present)
    return getattr(config.multi_stage, stage) / total if total > 0 else 0.0


def progress_from_policy_version(policy_version: str, per_version: float) -> float:
    """Training progress implied by the acting policy's version: its last integer × per_version.

    ``"12"``, ``"v12"`` and ``"orchestrator:12"`` are all version 12; a version without a
    number (the rule engine, ``"cpls"``) is progress 0. Deriving progress from the trajectory
    itself keeps live scoring and later re-scoring identical. A malformed version (not
    printable ASCII, say ``"²"``) raises :class:`~podium.errors.DecodeError`
    (:func:`podium.policy.versions.policy_version_number`, the one parser).
    """
    return policy_version_number(policy_version) * per_version
