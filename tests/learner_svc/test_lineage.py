"""The learner's lineage against rollout transitions made by the real state machine
(:mod:`podium.rollout.machine`): which transitions reset the learner to the live version, and
how policy lag is measured along the lineage."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from learner_svc.lineage import Lineage, follow, rejected_version, reset_target
from podium.rollout import (
    RolloutSettings,
    advance,
    initial_state,
    offline_checked,
    propose,
    rollback,
    shadow_done,
)
from podium.v1 import rollout_pb2

NOW = datetime(2026, 12, 1, tzinfo=UTC)

Step = tuple[rollout_pb2.RolloutState, rollout_pb2.RolloutTransition]


class Registry:
    """The rollout state and every transition so far, as the controller writes them."""

    def __init__(self) -> None:
        self.state = initial_state(RolloutSettings(), NOW, "test")
        self.transitions: list[rollout_pb2.RolloutTransition] = []

    def do(self, step: Callable[..., Step], *args: object, **kw: object) -> None:
        self.state, transition = step(self.state, *args, **kw)
        self.transitions.append(transition)

    def promote(self, version: str) -> None:
        """``version`` walks offline -> shadow -> 1, 5, 20, 100% -> live."""
        self.do(propose, version, "", "controller", NOW)
        self.do(offline_checked, True, None, NOW)
        self.do(shadow_done, True, None, NOW)
        for _ in range(4):
            self.do(advance, None, NOW)
        assert self.state.live_version == version


def test_cold_start_never_resets() -> None:
    """While the rule engine is live, rejected candidates leave the lineage alone (it came
    from behaviour cloning of that rule engine)."""
    reg = Registry()
    reg.do(propose, "4", "", "controller", NOW)
    reg.do(offline_checked, False, None, NOW)
    assert rejected_version(reg.transitions[-1]) == 4
    out = follow(Lineage(version=6), 0, reg.transitions)
    assert out.resets == () and out.lineage == Lineage(version=6)
    assert out.seq == reg.state.seq


def test_promotion_of_an_ancestor_keeps_training() -> None:
    reg = Registry()
    reg.promote("3")
    out = follow(Lineage(version=7), 0, reg.transitions)
    assert out.resets == () and out.lineage == Lineage(version=7)


def test_shadow_failure_resets_to_the_live_version() -> None:
    """Live 3, the learner at 9 proposes 8; 8 fails shadow: the work since 3 is rejected, the
    learner restarts from 3 and its next version is 10 (numbers never reused)."""
    reg = Registry()
    reg.promote("3")
    reg.do(propose, "8", "", "controller", NOW)
    reg.do(offline_checked, True, None, NOW)
    reg.do(shadow_done, False, None, NOW)
    out = follow(Lineage(version=9), 0, reg.transitions)
    assert out.resets == ((reg.state.seq, 3),)
    assert out.reasons == ("a later version of this lineage was rejected",)
    assert out.lineage == Lineage(version=9, reset_from=3, reset_at=9)
    assert out.lineage.contains(3) and not out.lineage.contains(8)
    # Applied once: following the same transitions again changes nothing.
    again = follow(out.lineage, out.seq, reg.transitions)
    assert again.resets == () and again.lineage == out.lineage


def test_rollback_of_a_stage_and_undo_of_a_promotion() -> None:
    reg = Registry()
    reg.promote("3")
    reg.do(propose, "5", "", "controller", NOW)
    reg.do(offline_checked, True, None, NOW)
    reg.do(shadow_done, True, None, NOW)
    reg.do(rollback, "guardrail", None, NOW, "controller")  # canary 5 rolled back: live 3
    assert rejected_version(reg.transitions[-1]) == 5
    out = follow(Lineage(version=6), 0, reg.transitions)
    assert out.resets[-1][1] == 3 and out.lineage == Lineage(6, 3, 6)
    # The learner (now 3, 7, 8) gets 8 promoted; an operator undoes it: live 3 again.
    lineage = Lineage(8, 3, 6)
    reg.promote("8")
    seq = reg.state.seq
    reg.do(rollback, "operator", None, NOW, "operator:alice")
    assert rejected_version(reg.transitions[-1]) == 8 and reg.state.live_version == "3"
    undone = follow(lineage, seq, reg.transitions)
    assert undone.resets == ((reg.state.seq, 3),)
    assert undone.lineage == Lineage(8, 3, 8)


def test_rejecting_an_older_version_does_not_reset() -> None:
    """An operator proposes version 1, older than live 3: its failure says nothing about the
    learner's work after 3."""
    reg = Registry()
    reg.promote("3")
    reg.do(propose, "1", "", "operator:alice", NOW)
    reg.do(offline_checked, False, None, NOW)
    out = follow(Lineage(version=6), 0, reg.transitions)
    assert out.resets == ()


def test_a_live_version_off_the_lineage_resets_and_keeps_numbers_monotonic() -> None:
    """After a reset to 3 (at 9) the learner's lineage is 3, 10, ...; live 5 (of the
    abandoned lineage) is not in it: reset to 5. A live version above the learner's own (a
    lost checkpoint) moves its numbering past it."""
    reg = Registry()
    reg.promote("5")
    lineage = Lineage(9, 3, 9)
    assert reset_target(reg.transitions[-1], lineage) == 5
    ahead = follow(Lineage(version=2), 0, reg.transitions)
    assert ahead.lineage == Lineage(5, 5, 5)
    assert ahead.lineage.lag(5) == 0 and ahead.lineage.reset_to(5) == Lineage(5, 5, 5)
    assert ahead.reasons == ("the live version 5 is not of this learner's lineage",)


def test_lag_along_the_lineage() -> None:
    fresh = Lineage(version=4)
    assert [fresh.lag(v) for v in (4, 2, 0, 7)] == [0, 2, 4, 0]
    reset = Lineage(version=11, reset_from=3, reset_at=9)  # 3, 10, 11
    assert [reset.lag(v) for v in (11, 10, 3)] == [0, 1, 2]
    # Versions of the abandoned lineage (and the rule engine's 0) are off it: stale.
    assert [reset.lag(v) for v in (9, 8, 4, 0)] == [None] * 4
    assert reset.contains(3) and reset.contains(10) and not reset.contains(12)
