"""The rollout state machine, pure: every step takes a ``RolloutState`` and returns the next
state with the ``RolloutTransition`` that records it (its evidence, who, when, the state
before). The controller writes both; nothing here does I/O or reads a clock.

The path of one candidate (one per cycle)::

    IDLE --propose--> OFFLINE_CHECK --offline_checked(pass)--> SHADOW
         --shadow_done(pass)--> STAGED 1% --advance--> 5% --> 20% --> 100%
         --advance--> IDLE with live = candidate, previous = old live, cycle + 1

A failed check, a failed shadow or a rollback sends it back to IDLE with the candidate
cleared (new sessions to the live version at once; sessions in flight keep the arm they
started on). A rollback while IDLE undoes the last promotion (live = previous).

Every step: seq + 1, ``changed_at`` = now, ``stage_started_at`` reset when the stage or the
canary percent changes, writer and epoch copied (only :func:`claim` changes them). A
command that does not apply raises :class:`~podium.errors.RolloutConflict` naming the state
and the command. Pause holds the candidate where it is: no automatic step forward (a pass,
an ``advance`` without override); protective steps (failures, rollbacks) and operator
overrides still apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise

from podium.errors import ConfigError, RolloutConflict
from podium.policy.versions import is_version_number
from podium.rollout.routing import BUCKETS
from podium.rollout.stats import AdvantageRule, GuardrailConfig
from podium.v1 import rollout_pb2

STAGES: tuple[int, ...] = (1, 5, 20, 100)
"""Default canary percents of the staged rollout."""

RULES_PREFIX = "rules:"
"""Prefix of a rule engine's version string (``"rules:cpls"``)."""

CONTROLLER = "controller"
"""Actor of the controller's own transitions (operators are ``"operator:<principal>"``)."""

Step = tuple[rollout_pb2.RolloutState, rollout_pb2.RolloutTransition]
"""A new state and the transition that records it."""

S = rollout_pb2
_NAMES = {
    S.ROLLOUT_STAGE_IDLE: "idle",
    S.ROLLOUT_STAGE_OFFLINE_CHECK: "offline",
    S.ROLLOUT_STAGE_SHADOW: "shadow",
}


@dataclass(frozen=True)
class RolloutSettings:
    """How candidates are rolled out (``PODIUM_ROLLOUT_*`` map onto these 1:1)."""

    stages: tuple[int, ...] = STAGES
    """Canary percents, strictly increasing in [1, 100], the last 100."""
    baseline_bp: int = 500
    """Basis points of sessions kept on the previous live version throughout, in
    [500, 1000] (5-10%): the control group the guardrails compare the canary with."""
    stage_min_sessions: int = 200
    """Canary sessions a stage needs (guardrails clean) before it may advance."""
    stage_min_s: float = 604800.0
    """Seconds a stage lasts at least (a week; compressed time in tests, e.g. 0)."""
    review_sample_bp: int = 100
    """Basis points of canary sessions sent to human review at the 20% stage."""
    cycle_s: float = 259200.0
    """Period of the learning cycle: a new candidate every 72 hours by default."""
    offline_sessions: int = 100
    """Recorded live sessions whose twins the candidate replays in the offline check."""
    offline_tolerance: float = 0.0
    """The offline check passes when the paired mean return difference is >= -tolerance."""
    cold_start: str = "rules:cpls"
    """Live version before any learned version has been promoted (a rule engine)."""
    advantage: AdvantageRule = field(default_factory=AdvantageRule)
    """The shadow test."""
    guardrails: GuardrailConfig = field(default_factory=GuardrailConfig)
    """The staged rollout's guardrail test."""

    def __post_init__(self) -> None:
        problems = _settings_problems(self)
        if problems:
            raise ConfigError("; ".join(f"RolloutSettings.{p}" for p in problems))


def _settings_problems(s: RolloutSettings) -> list[str]:
    """Each invalid field as "<field>: <why>, got <value>" (empty: valid)."""
    out: list[str] = []
    st = tuple(s.stages)
    if not st or st[-1] != 100 or any(not 1 <= p <= 100 for p in st):
        out.append(f"stages: canary percents in [1, 100] ending at 100, got {st}")
    elif any(a >= b for a, b in pairwise(st)):
        out.append(f"stages: must be strictly increasing, got {st}")
    if not 500 <= s.baseline_bp <= 1000:
        out.append(f"baseline_bp: must be in [500, 1000] (5-10%), got {s.baseline_bp}")
    if s.stage_min_sessions < 0:
        out.append(f"stage_min_sessions: must be >= 0, got {s.stage_min_sessions}")
    if not s.stage_min_s >= 0:
        out.append(f"stage_min_s: must be >= 0, got {s.stage_min_s}")
    if not 0 <= s.review_sample_bp <= BUCKETS:
        out.append(f"review_sample_bp: must be in [0, {BUCKETS}], got {s.review_sample_bp}")
    if not s.cycle_s > 0:
        out.append(f"cycle_s: must be > 0, got {s.cycle_s}")
    if s.offline_sessions < 1:
        out.append(f"offline_sessions: must be >= 1, got {s.offline_sessions}")
    if not s.offline_tolerance >= 0:
        out.append(f"offline_tolerance: must be >= 0, got {s.offline_tolerance}")
    if not s.cold_start.startswith(RULES_PREFIX) or s.cold_start == RULES_PREFIX:
        out.append(f"cold_start: must be a rule engine 'rules:<name>', got {s.cold_start!r}")
    return out


# --------------------------------------------------------------------------- helpers


def stage_name(state: rollout_pb2.RolloutState) -> str:
    """The stage in words: "idle", "offline", "shadow", "canary 5%" ("unknown" if unset)."""
    if state.stage == S.ROLLOUT_STAGE_STAGED:
        return f"canary {state.canary_percent}%"
    return _NAMES.get(state.stage, "unknown")


def _conflict(state: rollout_pb2.RolloutState, command: str, why: str) -> RolloutConflict:
    where = stage_name(state) + (" (paused)" if state.paused else "")
    return RolloutConflict(
        f"{command}: not applicable in state {where} (seq {state.seq}): {why}",
        state=stage_name(state),
        command=command,
    )


def _next(
    state: rollout_pb2.RolloutState, now: datetime, reason: str, **changes: object
) -> rollout_pb2.RolloutState:
    """A copy of ``state`` with ``changes``, seq + 1, changed_at = now and the reason."""
    new = rollout_pb2.RolloutState()
    new.CopyFrom(state)
    for name, value in changes.items():
        setattr(new, name, value)
    new.seq = state.seq + 1
    new.reason = reason
    new.changed_at.FromDatetime(now)
    if new.stage != state.stage or new.canary_percent != state.canary_percent:
        new.stage_started_at.FromDatetime(now)
    return new


def _step(
    kind: rollout_pb2.TransitionKind.ValueType,
    before: rollout_pb2.RolloutState,
    after: rollout_pb2.RolloutState,
    evidence: rollout_pb2.Evidence | None,
    actor: str,
    now: datetime,
) -> Step:
    """(after, the transition from before to after)."""
    tr = rollout_pb2.RolloutTransition(seq=after.seq, kind=kind, reason=after.reason, actor=actor)
    tr.state.CopyFrom(after)
    tr.previous.CopyFrom(before)
    if evidence is not None:
        tr.evidence.CopyFrom(evidence)
    tr.at.FromDatetime(now)
    return after, tr


def _with_override(evidence: rollout_pb2.Evidence | None, what: str) -> rollout_pb2.Evidence:
    """The evidence marked as an operator override (figure ``override`` = 1)."""
    ev = rollout_pb2.Evidence()
    if evidence is not None:
        ev.CopyFrom(evidence)
    ev.figures["override"] = 1.0
    ev.summary = f"operator override: {what}" + (f"; {ev.summary}" if ev.summary else "")
    return ev


def _idle(**extra: object) -> dict[str, object]:
    """The fields of a state with no candidate."""
    return {
        "stage": S.ROLLOUT_STAGE_IDLE,
        "candidate_version": "",
        "canary_percent": 0,
        "rollout_id": "",
        **extra,
    }


def _summary(evidence: rollout_pb2.Evidence | None, default: str) -> str:
    return evidence.summary if evidence is not None and evidence.summary else default


def _valid_version(version: str) -> bool:
    rule = version.startswith(RULES_PREFIX) and len(version) > len(RULES_PREFIX)
    return is_version_number(version) or (rule and version.isascii() and version.isprintable())


# --------------------------------------------------------------------------- the steps


def initial_state(
    settings: RolloutSettings, now: datetime, writer: str
) -> rollout_pb2.RolloutState:
    """The first state ever written: IDLE on the cold start (seq 1, epoch 1, cycle 1)."""
    st = rollout_pb2.RolloutState(
        seq=1,
        writer_epoch=1,
        live_version=settings.cold_start,
        stage=S.ROLLOUT_STAGE_IDLE,
        baseline_bp=settings.baseline_bp,
        review_sample_bp=settings.review_sample_bp,
        reason="initial state: cold start",
        writer=writer,
        cycle=1,
    )
    st.changed_at.FromDatetime(now)
    st.cycle_started_at.FromDatetime(now)
    st.stage_started_at.FromDatetime(now)
    return st


def claim(state: rollout_pb2.RolloutState, writer: str, now: datetime) -> Step:
    """``writer`` takes over as the one writer: epoch + 1 (replicas then ignore any state of
    an older epoch, so a stale controller can no longer steer routing)."""
    new = _next(
        state,
        now,
        f"writer {writer} claimed epoch {state.writer_epoch + 1}",
        writer=writer,
        writer_epoch=state.writer_epoch + 1,
    )
    return _step(S.TRANSITION_KIND_WRITER_CLAIMED, state, new, None, writer, now)


def propose(
    state: rollout_pb2.RolloutState, version: str, reason: str, actor: str, now: datetime
) -> Step:
    """IDLE -> OFFLINE_CHECK with ``version`` as the candidate."""
    if state.stage != S.ROLLOUT_STAGE_IDLE:
        raise _conflict(state, "propose", f"candidate {state.candidate_version} is on its way")
    if not _valid_version(version):
        raise _conflict(
            state, "propose", f"version {version[:64]!r} is neither a decimal nor rules:<name>"
        )
    if version == state.live_version:
        raise _conflict(state, "propose", f"version {version} is already live")
    new = _next(
        state,
        now,
        reason or f"candidate {version} proposed",
        stage=S.ROLLOUT_STAGE_OFFLINE_CHECK,
        candidate_version=version,
        canary_percent=0,
        rollout_id=f"{state.cycle}:{version}",
    )
    return _step(S.TRANSITION_KIND_CANDIDATE_PROPOSED, state, new, None, actor, now)


def offline_checked(
    state: rollout_pb2.RolloutState,
    verdict_passed: bool,
    evidence: rollout_pb2.Evidence | None,
    now: datetime,
) -> Step:
    """The offline check's verdict: pass -> SHADOW; fail -> IDLE (candidate rejected)."""
    if state.stage != S.ROLLOUT_STAGE_OFFLINE_CHECK:
        raise _conflict(state, "offline verdict", "no offline check is running")
    if verdict_passed:
        if state.paused:
            raise _conflict(state, "offline verdict", "paused: no automatic step forward")
        new = _next(
            state,
            now,
            _summary(evidence, f"offline check of {state.candidate_version} passed"),
            stage=S.ROLLOUT_STAGE_SHADOW,
        )
        return _step(S.TRANSITION_KIND_OFFLINE_PASSED, state, new, evidence, CONTROLLER, now)
    new = _next(
        state,
        now,
        _summary(evidence, f"offline check of {state.candidate_version} failed"),
        **_idle(),
    )
    return _step(S.TRANSITION_KIND_OFFLINE_FAILED, state, new, evidence, CONTROLLER, now)


def shadow_done(
    state: rollout_pb2.RolloutState,
    passed: bool,
    evidence: rollout_pb2.Evidence | None,
    now: datetime,
    *,
    stages: Sequence[int] = STAGES,
) -> Step:
    """Shadow's verdict: pass -> STAGED at the first stage (1%); fail -> IDLE."""
    if state.stage != S.ROLLOUT_STAGE_SHADOW:
        raise _conflict(state, "shadow verdict", "shadow is not running")
    if passed:
        if state.paused:
            raise _conflict(state, "shadow verdict", "paused: no automatic step forward")
        new = _next(
            state,
            now,
            _summary(evidence, f"{state.candidate_version} kept its advantage in shadow"),
            stage=S.ROLLOUT_STAGE_STAGED,
            canary_percent=stages[0],
        )
        return _step(S.TRANSITION_KIND_SHADOW_PASSED, state, new, evidence, CONTROLLER, now)
    new = _next(
        state,
        now,
        _summary(evidence, f"{state.candidate_version} failed shadow"),
        **_idle(),
    )
    return _step(S.TRANSITION_KIND_SHADOW_FAILED, state, new, evidence, CONTROLLER, now)


def _promote(
    state: rollout_pb2.RolloutState,
    evidence: rollout_pb2.Evidence | None,
    now: datetime,
    actor: str,
) -> Step:
    """STAGED at the last stage -> IDLE with the candidate live and a new cycle."""
    new = _next(
        state,
        now,
        _summary(evidence, f"{state.candidate_version} promoted"),
        **_idle(
            live_version=state.candidate_version,
            previous_version=state.live_version,
            cycle=state.cycle + 1,
        ),
    )
    new.cycle_started_at.FromDatetime(now)
    return _step(S.TRANSITION_KIND_PROMOTED, state, new, evidence, actor, now)


def advance(
    state: rollout_pb2.RolloutState,
    evidence: rollout_pb2.Evidence | None,
    now: datetime,
    *,
    actor: str = CONTROLLER,
    override: bool = False,
    stages: Sequence[int] = STAGES,
) -> Step:
    """One step forward.

    STAGED p -> the next stage (STAGE_ADVANCED, or OPERATOR_PROMOTED with ``override``);
    STAGED at the last stage -> PROMOTED. OFFLINE_CHECK and SHADOW advance only by their
    verdicts, or by an ``override`` (OPERATOR_PROMOTED, the evidence marked "override").
    Without ``override`` a paused rollout does not advance.
    """
    if not override and state.paused:
        raise _conflict(state, "advance", "paused: only an operator override advances")
    ev = _with_override(evidence, f"advanced by {actor}") if override else evidence
    op = S.TRANSITION_KIND_OPERATOR_PROMOTED
    if state.stage in (S.ROLLOUT_STAGE_OFFLINE_CHECK, S.ROLLOUT_STAGE_SHADOW):
        if not override:
            raise _conflict(state, "advance", "this stage advances by its verdict")
        if state.stage == S.ROLLOUT_STAGE_OFFLINE_CHECK:
            new = _next(state, now, _summary(ev, "override"), stage=S.ROLLOUT_STAGE_SHADOW)
        else:
            new = _next(
                state,
                now,
                _summary(ev, "override"),
                stage=S.ROLLOUT_STAGE_STAGED,
                canary_percent=stages[0],
            )
        return _step(op, state, new, ev, actor, now)
    if state.stage != S.ROLLOUT_STAGE_STAGED:
        raise _conflict(state, "advance", "no candidate to advance")
    later = [p for p in stages if p > state.canary_percent]
    if not later:
        return _promote(state, ev, now, actor)
    kind = op if override else S.TRANSITION_KIND_STAGE_ADVANCED
    new = _next(
        state,
        now,
        _summary(ev, f"{state.candidate_version} advanced to {later[0]}%"),
        canary_percent=later[0],
    )
    return _step(kind, state, new, ev, actor, now)


def rollback(
    state: rollout_pb2.RolloutState,
    reason: str,
    evidence: rollout_pb2.Evidence | None,
    now: datetime,
    actor: str,
) -> Step:
    """Back to the previous version, at once (ROLLED_BACK).

    A candidate on its way (offline, shadow, staged) is dropped: IDLE, new sessions to the
    live version. While IDLE with a previous version, the last promotion is undone: live =
    previous, previous cleared (the baseline arm then runs live). Otherwise there is nothing
    to roll back (RolloutConflict).
    """
    if state.stage in (
        S.ROLLOUT_STAGE_OFFLINE_CHECK,
        S.ROLLOUT_STAGE_SHADOW,
        S.ROLLOUT_STAGE_STAGED,
    ):
        new = _next(state, now, reason or f"{state.candidate_version} rolled back", **_idle())
    elif state.stage == S.ROLLOUT_STAGE_IDLE and state.previous_version:
        new = _next(
            state,
            now,
            reason or f"promotion of {state.live_version} undone",
            live_version=state.previous_version,
            previous_version="",
        )
    else:
        raise _conflict(state, "rollback", "no candidate and no previous version")
    return _step(S.TRANSITION_KIND_ROLLED_BACK, state, new, evidence, actor, now)


def pause(state: rollout_pb2.RolloutState, reason: str, actor: str, now: datetime) -> Step:
    """Stop automatic steps forward (routing stays as it is)."""
    if state.paused:
        raise _conflict(state, "pause", "already paused")
    new = _next(state, now, reason or "paused", paused=True)
    return _step(S.TRANSITION_KIND_PAUSED, state, new, None, actor, now)


def resume(state: rollout_pb2.RolloutState, reason: str, actor: str, now: datetime) -> Step:
    """Resume automatic steps."""
    if not state.paused:
        raise _conflict(state, "resume", "not paused")
    new = _next(state, now, reason or "resumed", paused=False)
    return _step(S.TRANSITION_KIND_RESUMED, state, new, None, actor, now)


def can_advance(
    state: rollout_pb2.RolloutState,
    settings: RolloutSettings,
    stage_sessions: int,
    now: datetime,
) -> bool:
    """Whether a STAGED, unpaused rollout has served its stage: at least
    ``stage_min_sessions`` canary sessions and ``stage_min_s`` seconds since the stage began
    (the guardrails' verdict is the controller's to check). False in every other state."""
    if state.stage != S.ROLLOUT_STAGE_STAGED or state.paused:
        return False
    if stage_sessions < settings.stage_min_sessions:
        return False
    began = state.stage_started_at.ToDatetime(tzinfo=now.tzinfo)
    return (now - began).total_seconds() >= settings.stage_min_s


__all__ = [
    "CONTROLLER",
    "RULES_PREFIX",
    "STAGES",
    "RolloutSettings",
    "Step",
    "advance",
    "can_advance",
    "claim",
    "initial_state",
    "offline_checked",
    "pause",
    "propose",
    "resume",
    "rollback",
    "shadow_done",
    "stage_name",
]
