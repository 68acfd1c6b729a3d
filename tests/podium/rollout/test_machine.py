"""The rollout state machine: the whole path, failures, rollbacks, pause, overrides,
conflicts, and the bookkeeping every step must keep (seq, times, writer, epoch)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from podium.errors import ConfigError, RolloutConflict
from podium.rollout import (
    RolloutSettings,
    advance,
    can_advance,
    claim,
    initial_state,
    offline_checked,
    pause,
    propose,
    resume,
    rollback,
    route,
    shadow_done,
    stage_name,
)
from podium.rollout.machine import Step
from podium.v1 import rollout_pb2, trajectory_pb2

R = rollout_pb2
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SETTINGS = RolloutSettings(stage_min_s=0.0)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def evidence(summary: str = "", **figures: float) -> rollout_pb2.Evidence:
    ev = rollout_pb2.Evidence(summary=summary)
    ev.figures.update(figures)
    return ev


def check_step(before: rollout_pb2.RolloutState, step: Step, kind: int, now: datetime) -> None:
    """What every step keeps: seq + 1, times, writer and epoch copied, a full transition."""
    after, tr = step
    assert after.seq == before.seq + 1
    assert after.changed_at.ToDatetime(tzinfo=UTC) == now
    assert tr.kind == kind and tr.seq == after.seq
    assert tr.state == after and tr.previous == before
    assert tr.at.ToDatetime(tzinfo=UTC) == now
    assert tr.reason == after.reason and after.reason
    if kind != R.TRANSITION_KIND_WRITER_CLAIMED:
        assert after.writer == before.writer and after.writer_epoch == before.writer_epoch
    moved = (after.stage, after.canary_percent) != (before.stage, before.canary_percent)
    started = after.stage_started_at.ToDatetime(tzinfo=UTC)
    assert started == (now if moved else before.stage_started_at.ToDatetime(tzinfo=UTC))


def walk_to_staged(state: rollout_pb2.RolloutState, version: str = "3") -> rollout_pb2.RolloutState:
    state, _ = propose(state, version, "cycle end", "controller", at(1))
    state, _ = offline_checked(state, True, evidence("offline ok"), at(2))
    state, _ = shadow_done(state, True, evidence("kept its advantage"), at(3))
    return state


def fresh() -> rollout_pb2.RolloutState:
    return initial_state(SETTINGS, T0, "ctl-a")


def test_initial_state() -> None:
    s = fresh()
    assert (s.seq, s.writer_epoch, s.cycle) == (1, 1, 1)
    assert s.stage == R.ROLLOUT_STAGE_IDLE and s.live_version == "rules:cpls"
    assert s.previous_version == "" and s.candidate_version == "" and not s.paused
    assert s.baseline_bp == 500 and s.review_sample_bp == 100 and s.writer == "ctl-a"
    assert s.cycle_started_at.ToDatetime(tzinfo=UTC) == T0
    assert stage_name(s) == "idle"


def test_the_whole_path_to_promotion() -> None:
    s0 = fresh()
    step = propose(s0, "3", "cycle 1 candidate", "controller", at(1))
    check_step(s0, step, R.TRANSITION_KIND_CANDIDATE_PROPOSED, at(1))
    s1 = step[0]
    assert s1.stage == R.ROLLOUT_STAGE_OFFLINE_CHECK and s1.candidate_version == "3"
    assert s1.rollout_id == "1:3" and stage_name(s1) == "offline"

    step = offline_checked(s1, True, evidence("paired mean +0.1", paired_mean=0.1), at(2))
    check_step(s1, step, R.TRANSITION_KIND_OFFLINE_PASSED, at(2))
    s2 = step[0]
    assert s2.stage == R.ROLLOUT_STAGE_SHADOW and stage_name(s2) == "shadow"
    assert step[1].evidence.figures["paired_mean"] == 0.1

    step = shadow_done(s2, True, evidence("kept its advantage over 500"), at(3))
    check_step(s2, step, R.TRANSITION_KIND_SHADOW_PASSED, at(3))
    s = step[0]
    assert s.stage == R.ROLLOUT_STAGE_STAGED and s.canary_percent == 1
    assert stage_name(s) == "canary 1%"

    for i, pct in enumerate((5, 20, 100)):
        before = s
        step = advance(s, evidence("guardrails clean"), at(4 + i))
        check_step(before, step, R.TRANSITION_KIND_STAGE_ADVANCED, at(4 + i))
        s = step[0]
        assert s.canary_percent == pct and s.candidate_version == "3"

    before = s
    step = advance(s, evidence("guardrails clean at 100%"), at(10))
    check_step(before, step, R.TRANSITION_KIND_PROMOTED, at(10))
    p = step[0]
    assert p.stage == R.ROLLOUT_STAGE_IDLE and p.canary_percent == 0
    assert p.live_version == "3" and p.previous_version == "rules:cpls"
    assert p.candidate_version == "" and p.rollout_id == ""
    assert p.cycle == 2 and p.cycle_started_at.ToDatetime(tzinfo=UTC) == at(10)
    # Every new session now runs 3, the baseline share the old live version.
    roles = {route(f"s{i}", p).role: route(f"s{i}", p).version for i in range(3000)}
    assert roles == {
        trajectory_pb2.ARM_ROLE_LIVE: "3",
        trajectory_pb2.ARM_ROLE_BASELINE: "rules:cpls",
    }

    # The next cycle walks from the new live version.
    q, _ = propose(p, "4", "cycle 2 candidate", "controller", at(11))
    assert q.rollout_id == "2:4"


def test_offline_failure_rejects_the_candidate() -> None:
    s, _ = propose(fresh(), "3", "", "controller", at(1))
    step = offline_checked(s, False, evidence("paired mean -0.4"), at(2))
    check_step(s, step, R.TRANSITION_KIND_OFFLINE_FAILED, at(2))
    f = step[0]
    assert f.stage == R.ROLLOUT_STAGE_IDLE and f.candidate_version == "" and f.rollout_id == ""
    assert f.live_version == "rules:cpls" and f.reason == "paired mean -0.4"


def test_shadow_failure_rejects_the_candidate() -> None:
    s, _ = propose(fresh(), "3", "", "controller", at(1))
    s, _ = offline_checked(s, True, None, at(2))
    step = shadow_done(s, False, evidence("worse: mSPRT"), at(3))
    check_step(s, step, R.TRANSITION_KIND_SHADOW_FAILED, at(3))
    assert step[0].stage == R.ROLLOUT_STAGE_IDLE and step[0].candidate_version == ""
    assert step[0].live_version == "rules:cpls"


@pytest.mark.parametrize("pct", [1, 5, 20, 100])
def test_rollback_from_each_stage(pct: int) -> None:
    s = walk_to_staged(fresh())
    while s.canary_percent < pct:
        s, _ = advance(s, None, at(5))
    step = rollback(
        s, "guardrail incomplete breached", evidence("incomplete +25%"), at(6), "controller"
    )
    check_step(s, step, R.TRANSITION_KIND_ROLLED_BACK, at(6))
    r = step[0]
    assert r.stage == R.ROLLOUT_STAGE_IDLE and r.candidate_version == "" and r.canary_percent == 0
    assert r.live_version == "rules:cpls" and r.reason == "guardrail incomplete breached"
    # At once: no session routes to the candidate any more.
    assert all(route(f"s{i}", r).version != "3" for i in range(2000))


@pytest.mark.parametrize("stage", ["offline", "shadow"])
def test_rollback_before_traffic(stage: str) -> None:
    s, _ = propose(fresh(), "3", "", "controller", at(1))
    if stage == "shadow":
        s, _ = offline_checked(s, True, None, at(2))
    r, tr = rollback(s, "operator said so", None, at(3), "operator:alice")
    assert r.stage == R.ROLLOUT_STAGE_IDLE and r.candidate_version == ""
    assert tr.actor == "operator:alice"


def test_rollback_of_the_last_promotion_and_nothing_more() -> None:
    s = walk_to_staged(fresh())
    for _ in range(4):
        s, _ = advance(s, None, at(5))
    assert s.live_version == "3"
    step = rollback(s, "drift hurt 3", None, at(7), "operator:bob")
    check_step(s, step, R.TRANSITION_KIND_ROLLED_BACK, at(7))
    u = step[0]
    assert u.live_version == "rules:cpls" and u.previous_version == "" and u.cycle == s.cycle
    with pytest.raises(RolloutConflict, match="rollback") as exc:
        rollback(u, "again", None, at(8), "operator:bob")
    assert exc.value.state == "idle" and exc.value.command == "rollback"
    assert not exc.value.retriable


def test_pause_and_resume() -> None:
    s = walk_to_staged(fresh())
    step = pause(s, "investigating", "operator:alice", at(5))
    check_step(s, step, R.TRANSITION_KIND_PAUSED, at(5))
    p = step[0]
    assert p.paused and p.canary_percent == s.canary_percent  # routing stays as it is
    assert not can_advance(p, SETTINGS, 10_000, at(100))
    with pytest.raises(RolloutConflict, match="paused"):
        advance(p, None, at(6))
    with pytest.raises(RolloutConflict, match="already paused"):
        pause(p, "", "operator:alice", at(6))
    # A rollback still applies while paused (protective steps are never held).
    assert rollback(p, "breach", None, at(6), "controller")[0].stage == R.ROLLOUT_STAGE_IDLE
    step = resume(p, "fine", "operator:alice", at(7))
    check_step(p, step, R.TRANSITION_KIND_RESUMED, at(7))
    assert not step[0].paused
    with pytest.raises(RolloutConflict, match="not paused"):
        resume(step[0], "", "operator:alice", at(8))


def test_paused_holds_automatic_passes_but_not_failures() -> None:
    s, _ = propose(fresh(), "3", "", "controller", at(1))
    s, _ = pause(s, "hold", "operator:a", at(2))
    with pytest.raises(RolloutConflict, match="paused"):
        offline_checked(s, True, None, at(3))
    assert offline_checked(s, False, None, at(3))[0].stage == R.ROLLOUT_STAGE_IDLE
    s, _ = advance(s, None, at(3), actor="operator:a", override=True)  # into shadow
    with pytest.raises(RolloutConflict, match="paused"):
        shadow_done(s, True, None, at(4))
    assert shadow_done(s, False, None, at(4))[0].stage == R.ROLLOUT_STAGE_IDLE


def test_overrides_skip_verdicts_and_say_so() -> None:
    s, _ = propose(fresh(), "3", "", "controller", at(1))
    with pytest.raises(RolloutConflict, match="verdict"):
        advance(s, None, at(2))
    step = advance(s, evidence("offline skipped"), at(2), actor="operator:alice", override=True)
    check_step(s, step, R.TRANSITION_KIND_OPERATOR_PROMOTED, at(2))
    s = step[0]
    assert s.stage == R.ROLLOUT_STAGE_SHADOW
    ev = step[1].evidence
    assert (
        ev.figures["override"] == 1.0
        and "override" in ev.summary
        and "operator:alice" in ev.summary
    )
    assert step[1].actor == "operator:alice"
    s, tr = advance(s, None, at(3), actor="operator:alice", override=True)
    assert s.stage == R.ROLLOUT_STAGE_STAGED and s.canary_percent == 1
    assert tr.kind == R.TRANSITION_KIND_OPERATOR_PROMOTED
    s, tr = advance(s, None, at(4), actor="operator:alice", override=True)
    assert s.canary_percent == 5 and tr.kind == R.TRANSITION_KIND_OPERATOR_PROMOTED
    # Overrides work while paused too.
    s, _ = pause(s, "", "operator:alice", at(5))
    s, tr = advance(s, None, at(6), actor="operator:alice", override=True)
    assert s.canary_percent == 20 and s.paused


def test_conflicts_name_the_state_and_the_command() -> None:
    idle = fresh()
    with pytest.raises(RolloutConflict, match=r"advance: .*idle") as exc:
        advance(idle, None, at(1))
    assert exc.value.command == "advance" and exc.value.state == "idle"
    with pytest.raises(RolloutConflict, match="offline verdict"):
        offline_checked(idle, True, None, at(1))
    with pytest.raises(RolloutConflict, match="shadow verdict"):
        shadow_done(idle, True, None, at(1))
    with pytest.raises(RolloutConflict, match="already live"):
        propose(idle, "rules:cpls", "", "operator:a", at(1))
    for bad in ("", "rules:", "v7", "-1", "²"):
        with pytest.raises(RolloutConflict, match="propose"):
            propose(idle, bad, "", "operator:a", at(1))
    staged = walk_to_staged(idle)
    with pytest.raises(RolloutConflict, match=r"propose: .*canary 1%") as exc:
        propose(staged, "4", "", "operator:a", at(5))
    assert exc.value.state == "canary 1%"


def test_seq_strictly_increases_and_claim_bumps_the_epoch() -> None:
    s = fresh()
    seqs = [s.seq]
    s, tr = claim(s, "ctl-b", at(1))
    assert tr.kind == R.TRANSITION_KIND_WRITER_CLAIMED and tr.actor == "ctl-b"
    assert s.writer == "ctl-b" and s.writer_epoch == 2
    seqs.append(s.seq)
    s = walk_to_staged(s)
    seqs.append(s.seq)
    s, _ = pause(s, "", "operator:a", at(4))
    seqs.append(s.seq)
    s, _ = resume(s, "", "operator:a", at(5))
    seqs.append(s.seq)
    for _ in range(4):
        s, _ = advance(s, None, at(6))
        seqs.append(s.seq)
    assert s.writer == "ctl-b" and s.writer_epoch == 2  # copied by every step
    s, _ = claim(s, "ctl-c", at(7))
    assert s.writer_epoch == 3 and s.seq > seqs[-1]
    assert seqs == sorted(set(seqs))


def test_can_advance_needs_sessions_and_time() -> None:
    settings = RolloutSettings(stage_min_sessions=200, stage_min_s=3600.0)
    s = walk_to_staged(fresh())  # the stage began at(3)
    assert not can_advance(s, settings, 199, at(3 + 120))
    assert not can_advance(s, settings, 500, at(3 + 59))
    assert can_advance(s, settings, 200, at(3 + 60))
    assert not can_advance(fresh(), settings, 10_000, at(1000))
    s, _ = advance(s, None, at(70))  # the next stage's clock starts over
    assert not can_advance(s, settings, 500, at(100))
    assert can_advance(s, settings, 500, at(130))


def test_settings_validation_names_the_field() -> None:
    for bp in (499, 1001, 0):
        with pytest.raises(ConfigError, match=r"baseline_bp.*\[500, 1000\]"):
            RolloutSettings(baseline_bp=bp)
    RolloutSettings(baseline_bp=500)
    RolloutSettings(baseline_bp=1000)
    with pytest.raises(ConfigError, match="stages"):
        RolloutSettings(stages=(1, 5, 20))
    with pytest.raises(ConfigError, match="stages"):
        RolloutSettings(stages=(5, 1, 100))
    with pytest.raises(ConfigError, match="review_sample_bp"):
        RolloutSettings(review_sample_bp=20_000)
    with pytest.raises(ConfigError, match="cold_start"):
        RolloutSettings(cold_start="7")
    with pytest.raises(ConfigError, match="cycle_s"):
        RolloutSettings(cycle_s=0)


def test_custom_stages() -> None:
    stages = (10, 50, 100)
    s, _ = propose(fresh(), "3", "", "controller", at(1))
    s, _ = offline_checked(s, True, None, at(2))
    s, _ = shadow_done(s, True, None, at(3), stages=stages)
    assert s.canary_percent == 10
    s, _ = advance(s, None, at(4), stages=stages)
    assert s.canary_percent == 50
