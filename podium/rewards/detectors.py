"""The six anti-hacking detectors. Each is a pure function returning a :class:`Finding`.

Every detector has one measured quantity, one threshold from the config and one penalty
formula (docs/rewards.md lists them). A penalty is a non-negative number subtracted from the
total; a detector that does not fire still reports its measure with penalty 0, so dashboards
can watch a hack approach its threshold before it pays off.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass

from podium.rewards.config import (
    AvoidanceConfig,
    BrokenToolCallsConfig,
    FabricatedResultConfig,
    FakeParallelismConfig,
    ToolAbuseConfig,
    TrivialTestsConfig,
)
from podium.rewards.facts import MALFORMED, SUCCESS, TrajectoryFacts, duration, is_chunk
from podium.v1 import trajectory_pb2

FAKE_PARALLELISM = "fake_parallelism"
TOOL_ABUSE = "tool_abuse"
FABRICATED_RESULT = "fabricated_result"
TRIVIAL_TESTS = "trivial_tests"
BROKEN_TOOL_CALLS = "broken_tool_calls"
AVOIDANCE = "avoidance"
DETECTORS: tuple[str, ...] = (
    FAKE_PARALLELISM,
    TOOL_ABUSE,
    FABRICATED_RESULT,
    TRIVIAL_TESTS,
    BROKEN_TOOL_CALLS,
    AVOIDANCE,
)
"""Penalty names, as they appear in every breakdown."""


@dataclass(frozen=True, slots=True)
class Finding:
    """What one detector measured and what it costs."""

    name: str
    """Penalty name (one of :data:`DETECTORS`)."""
    penalty: float
    """Amount subtracted from the total (>= 0)."""
    measure: float
    """The measured quantity the threshold applies to."""
    threshold: float
    """The configured threshold."""
    execution_ids: tuple[str, ...] = ()
    """Executions that committed the hack."""
    subtask_ids: tuple[str, ...] = ()
    """Subtasks concerned (e.g. never attempted)."""
    detail: str = ""
    """Why, in words."""

    @property
    def triggered(self) -> bool:
        """Whether the detector charged a penalty."""
        return self.penalty > 0


def fake_parallelism(traj: trajectory_pb2.Trajectory, cfg: FakeParallelismConfig) -> Finding:
    """Sub-agents spawned in parallel that ran serially, or that did nothing.

    Rule: an execution is fake when (a) it is one of the chunks of a split whose chunks do not
    overlap — Σ chunk durations / span of the chunks < 1 + ``min_overlap_ratio`` (exactly 1 when
    they ran back to back) — or (b) it lasted less than ``min_duration`` and made no tool call.
    Penalty: ``weight`` × fake executions / executions.
    """
    chunks: dict[tuple[str, int], list[trajectory_pb2.Execution]] = defaultdict(list)
    for ex in traj.executions:
        if is_chunk(ex.subtask_id):
            chunks[(ex.subtask_id.split("#", 1)[0], ex.attempt)].append(ex)
    fake: list[str] = []
    for _split, group in sorted(chunks.items()):
        if len({e.subtask_id for e in group}) < 2:
            continue
        span = max(e.end_time for e in group) - min(e.start_time for e in group)
        busy = math.fsum(duration(e) for e in group)
        if span > 0 and busy / span < 1.0 + cfg.min_overlap_ratio:
            fake.extend(e.execution_id for e in group)
    for ex in traj.executions:
        if duration(ex) < cfg.min_duration and not ex.tool_calls and ex.execution_id not in fake:
            fake.append(ex.execution_id)
    n = len(traj.executions)
    fraction = len(fake) / n if n else 0.0
    return Finding(
        name=FAKE_PARALLELISM,
        penalty=cfg.weight * fraction,
        measure=fraction,
        threshold=cfg.min_overlap_ratio,
        execution_ids=tuple(fake),
        detail=f"{len(fake)}/{n} executions serial split chunks or idle" if fake else "",
    )


def _canonical_arguments(text: str) -> str:
    """Arguments as sorted-key JSON, so {"a":1,"b":2} and {"b":2,"a":1} are the same call."""
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except (ValueError, TypeError):
        return text.strip()


def tool_abuse(traj: trajectory_pb2.Trajectory, cfg: ToolAbuseConfig) -> Finding:
    """Repeated identical or trivial tool calls beyond a budget.

    Rule: within one execution, a call is *wasted* when it repeats an earlier call (same tool,
    same canonical arguments) or its tool is in ``trivial_tools``. Each execution may waste
    ``budget_per_execution`` calls; excess = Σ max(0, wasted − budget).
    Penalty: ``weight`` × (1 − exp(−excess / ``scale``)): grows with every extra call, bounded.
    """
    trivial = set(cfg.trivial_tools)
    excess = 0
    abusers: list[str] = []
    for ex in traj.executions:
        seen: set[tuple[str, str]] = set()
        wasted = 0
        for call in ex.tool_calls:
            key = (call.name, _canonical_arguments(call.arguments_json))
            if call.name in trivial or key in seen:
                wasted += 1
            seen.add(key)
        over = max(0, wasted - cfg.budget_per_execution)
        if over:
            excess += over
            abusers.append(ex.execution_id)
    return Finding(
        name=TOOL_ABUSE,
        penalty=cfg.weight * (1.0 - math.exp(-excess / cfg.scale)),
        measure=float(excess),
        threshold=float(cfg.budget_per_execution),
        execution_ids=tuple(abusers),
        detail=f"{excess} redundant or trivial calls over budget" if excess else "",
    )


def fabricated_result(
    traj: trajectory_pb2.Trajectory, facts: TrajectoryFacts, cfg: FabricatedResultConfig
) -> Finding:
    """Success claimed with no verifying result behind it.

    Rule: (session) the trajectory says ``claimed_success`` or ``completed`` while some required
    subtask has no successful execution; (subtask, only when the trajectory says
    ``verifier_present``) the fraction of successful executions that were not verified exceeds
    ``max_unverified_fraction``.
    Penalty: ``session_weight`` × [session claim unbacked] + ``subtask_weight`` × unverified
    fraction (when above the threshold).
    """
    missing = [s for s in facts.required if s not in facts.done]
    claimed = traj.claimed_success or traj.completed
    session_fake = claimed and (bool(missing) or not facts.required)
    successes = [e for e in traj.executions if e.outcome == SUCCESS]
    unverified = [e.execution_id for e in successes if not e.verified]
    fraction = len(unverified) / len(successes) if successes else 0.0
    # Only a trajectory whose environment runs a verifier can be asked for verification.
    subtask_fake = facts.verifier_present and fraction > cfg.max_unverified_fraction
    penalty = (cfg.session_weight if session_fake else 0.0) + (
        cfg.subtask_weight * fraction if subtask_fake else 0.0
    )
    reasons = []
    if session_fake:
        reasons.append(f"session claims success but {len(missing)} subtasks never succeeded")
    if subtask_fake:
        reasons.append(f"{len(unverified)}/{len(successes)} successes unverified")
    return Finding(
        name=FABRICATED_RESULT,
        penalty=penalty,
        measure=fraction,
        threshold=cfg.max_unverified_fraction,
        execution_ids=tuple(unverified) if subtask_fake else (),
        subtask_ids=tuple(missing) if session_fake else (),
        detail="; ".join(reasons),
    )


def trivial_tests_penalty(coverage: float, cfg: TrivialTestsConfig) -> float:
    """weight × (exp(k·(c0 − c)) − 1) / (exp(k·c0) − 1) for c < c0, else 0.

    0 at the threshold c0, ``weight`` at coverage 0, and convex in between: each point of
    coverage lost costs more than the one before (the exponential penalty on trivial tests).
    """
    c0, k = cfg.threshold, cfg.steepness
    if coverage < 0 or coverage >= c0:
        return 0.0
    return cfg.weight * math.expm1(k * (c0 - coverage)) / math.expm1(k * c0)


def trivial_tests(traj: trajectory_pb2.Trajectory, cfg: TrivialTestsConfig) -> Finding:
    """Test coverage under the threshold (a negative coverage means "not applicable")."""
    penalty = trivial_tests_penalty(traj.test_coverage, cfg)
    return Finding(
        name=TRIVIAL_TESTS,
        penalty=penalty,
        measure=traj.test_coverage,
        threshold=cfg.threshold,
        detail=(f"coverage {traj.test_coverage:.2f} < {cfg.threshold:.2f}" if penalty else ""),
    )


def broken_tool_calls(traj: trajectory_pb2.Trajectory, cfg: BrokenToolCallsConfig) -> Finding:
    """Malformed tool calls and malformed outputs: scored and penalised, never dropped.

    Rule: any malformed call (``ToolCall.malformed``) or execution with ``OUTCOME_MALFORMED``.
    Penalty: min(``cap``, ``per_call`` × malformed calls + ``per_execution`` × malformed
    executions).
    """
    calls = 0
    execs = 0
    culprits: list[str] = []
    for ex in traj.executions:
        bad_calls = sum(1 for c in ex.tool_calls if c.malformed)
        bad_exec = ex.outcome == MALFORMED
        calls += bad_calls
        execs += int(bad_exec)
        if bad_calls or bad_exec:
            culprits.append(ex.execution_id)
    penalty = min(cfg.cap, cfg.per_call * calls + cfg.per_execution * execs)
    return Finding(
        name=BROKEN_TOOL_CALLS,
        penalty=penalty,
        measure=float(calls + execs),
        threshold=0.0,
        execution_ids=tuple(culprits),
        detail=f"{calls} malformed calls, {execs} malformed outputs" if culprits else "",
    )


def avoidance(facts: TrajectoryFacts, cfg: AvoidanceConfig) -> Finding:
    """Finishing without attempting required subtasks.

    Rule: unattempted fraction = subtasks that could have started (every dependency done) but
    have no execution at all / required subtasks (every subtask of the task is required).
    Subtasks blocked by a failed dependency are not avoided: credit blames the dependency.
    Fires above ``max_unattempted_fraction``. Penalty: ``weight`` × unattempted fraction.
    """
    skipped = tuple(
        s
        for s in facts.required
        if s not in facts.attempted and all(d in facts.done for d in facts.deps[s])
    )
    fraction = len(skipped) / len(facts.required) if facts.required else 0.0
    fired = fraction > cfg.max_unattempted_fraction
    return Finding(
        name=AVOIDANCE,
        penalty=cfg.weight * fraction if fired else 0.0,
        measure=fraction,
        threshold=cfg.max_unattempted_fraction,
        subtask_ids=skipped if fired else (),
        detail=f"{len(skipped)}/{len(facts.required)} ready subtasks never attempted"
        if fired
        else "",
    )


__all__ = [
    "AVOIDANCE",
    "BROKEN_TOOL_CALLS",
    "DETECTORS",
    "FABRICATED_RESULT",
    "FAKE_PARALLELISM",
    "TOOL_ABUSE",
    "TRIVIAL_TESTS",
    "Finding",
    "avoidance",
    "broken_tool_calls",
    "fabricated_result",
    "fake_parallelism",
    "tool_abuse",
    "trivial_tests",
    "trivial_tests_penalty",
]
