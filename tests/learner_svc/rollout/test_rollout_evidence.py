"""The human-review sample of canary sessions, and the statistics store in the checkpoint
(learner_svc/rollout/evidence.py)."""

from __future__ import annotations

import logging
import uuid

import pytest

from learner_svc.rollout.evidence import (
    Evidence,
    review_sampled,
    stats_bytes,
    stats_from_checkpoint,
)
from podium.observed import AgentStats
from podium.rollout import RolloutSettings
from podium.rollout.routing import bucket
from podium.v1 import rollout_pb2, subtask_pb2, trajectory_pb2

IDS = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"review-sample-{i}")) for i in range(20_000)]


def test_review_sample_share_matches_its_basis_points() -> None:
    for bp in (100, 250, 1000):
        share = sum(review_sampled(sid, bp) for sid in IDS) / len(IDS)
        assert abs(share - bp / 10_000) < 0.005, (bp, share)
    assert not any(review_sampled(sid, 0) for sid in IDS)
    assert all(review_sampled(sid, 10_000) for sid in IDS)


def test_review_sample_is_independent_of_the_routing_bucket() -> None:
    # Canary sessions occupy a band of routing buckets; an unsalted sample of the same hash
    # would take none (or all) of them.
    canary = [sid for sid in IDS if 500 <= bucket(sid) < 2500]
    share = sum(review_sampled(sid, 1000) for sid in canary) / len(canary)
    assert 0.07 < share < 0.13, share


IDLE_STATE = rollout_pb2.RolloutState(seq=3, writer_epoch=2)


def observed() -> AgentStats:
    store = AgentStats(half_life=50.0, prior_weight=2.0)
    store.record("backend", "api", 2.0, 9.5, True)
    store.record("backend", "api", 1.0, 6.0, False)
    store.record("qa", "test", 1.5, 1.2, True)
    return store


def test_the_store_round_trips_through_the_checkpoint_and_copies_independently() -> None:
    ev = Evidence.fresh(RolloutSettings(), observed())
    cp = ev.to_checkpoint(IDLE_STATE)
    assert cp.agent_stats == stats_bytes(ev.stats)
    back = Evidence.from_checkpoint(
        RolloutSettings(), cp, IDLE_STATE, AgentStats(half_life=50.0, prior_weight=2.0)
    )
    assert back.stats is not None and ev.stats is not None
    assert back.stats.to_dict() == ev.stats.to_dict()  # floats exact through JSON
    copy = ev.copy(IDLE_STATE)
    assert copy.stats is not None
    copy.stats.record("qa", "test", 1.0, 1.0, True)
    assert copy.stats.version == ev.stats.version + 1  # the original untouched
    # Off: nothing written, nothing restored, whatever the checkpoint holds.
    assert Evidence.fresh(RolloutSettings()).to_checkpoint(IDLE_STATE).agent_stats == b""
    assert Evidence.from_checkpoint(RolloutSettings(), cp, IDLE_STATE).stats is None


def test_the_settings_now_win_and_the_sums_carry_over() -> None:
    cp = rollout_pb2.ControllerCheckpoint(seq=3, agent_stats=stats_bytes(observed()))
    restored = stats_from_checkpoint(cp, AgentStats(half_life=400.0, prior_weight=8.0))
    assert restored is not None
    assert (restored.half_life, restored.prior_weight) == (400.0, 8.0)
    assert restored.to_dict()["pairs"] == observed().to_dict()["pairs"]
    assert restored.version == 3


@pytest.mark.parametrize(
    "raw", [b"\xff\xfe", b"{not json", b"[]", b'{"format": 99, "pairs": []}'], ids=str
)
def test_an_unreadable_store_starts_over_and_says_so(
    raw: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    cp = rollout_pb2.ControllerCheckpoint(seq=7, agent_stats=raw)
    with caplog.at_level(logging.ERROR):
        restored = stats_from_checkpoint(cp, AgentStats(half_life=30.0))
    assert restored is not None and restored.version == 0 and restored.pairs() == []
    assert restored.half_life == 30.0
    assert "agent stats (seq 7) are unreadable" in caplog.text


def test_a_trajectory_that_does_not_fit_its_task_is_logged_and_not_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ev = Evidence.fresh(RolloutSettings(), AgentStats())
    bad = trajectory_pb2.Trajectory(trajectory_id="t-bad")
    bad.executions.add(
        subtask_id="nowhere", agent="backend", outcome=subtask_pb2.OUTCOME_SUCCESS, end_time=1.0
    )
    with caplog.at_level(logging.WARNING):
        assert ev.record_executions(bad, 0.15) is None
    assert "'t-bad' not recorded in the agent stats" in caplog.text
    assert ev.stats is not None and ev.stats.version == 0
    assert Evidence.fresh(RolloutSettings()).record_executions(bad, 0.15) == 0  # off
