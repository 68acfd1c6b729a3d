"""Routing: stable buckets, traffic shares on target, nested canaries, the baseline arm."""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter

import pytest

from podium.rollout import BUCKETS, Route, bucket, route, target_shares
from podium.v1 import rollout_pb2, trajectory_pb2

LIVE = trajectory_pb2.ARM_ROLE_LIVE
CANARY = trajectory_pb2.ARM_ROLE_CANARY
BASELINE = trajectory_pb2.ARM_ROLE_BASELINE
NS = uuid.UUID("6ba7b811-9dad-11d1-80b4-00c04fd430c8")  # the URL namespace of RFC 4122
SESSIONS = [str(uuid.uuid5(NS, f"podium-session-{i}")) for i in range(10_000)]


def staged(percent: int, baseline_bp: int = 500, previous: str = "6") -> rollout_pb2.RolloutState:
    return rollout_pb2.RolloutState(
        seq=9,
        writer_epoch=2,
        live_version="7",
        previous_version=previous,
        candidate_version="8",
        stage=rollout_pb2.ROLLOUT_STAGE_STAGED,
        canary_percent=percent,
        baseline_bp=baseline_bp,
    )


def test_bucket_is_the_documented_hash_and_pinned() -> None:
    # Pinned values: every replica, every release, every language must agree on them.
    assert bucket("session-1") == 1320
    assert bucket("") == 1652
    sid = "0f9c2b1e-7a44-4c55-9a53-1c1e0c3f6d10"
    slow = int(hashlib.sha256(sid.encode()).hexdigest()[:16], 16) % BUCKETS
    assert bucket(sid) == slow
    assert all(0 <= bucket(s) < BUCKETS for s in SESSIONS[:500])


def test_no_state_is_the_cold_start() -> None:
    r = route("abc", None)
    assert r == Route("rules:cpls", LIVE, bucket("abc"), 0)
    assert route("abc", None, cold_start="rules:greedy").version == "rules:greedy"
    assert target_shares(None) == {LIVE: 1.0}


@pytest.mark.parametrize("baseline_bp", [500, 1000])
@pytest.mark.parametrize("percent", [1, 5, 20, 100])
def test_observed_shares_within_1_5_points_of_target(percent: int, baseline_bp: int) -> None:
    state = staged(percent, baseline_bp)
    counts = Counter(route(s, state).role for s in SESSIONS)
    target = target_shares(state)
    assert sum(target.values()) == pytest.approx(1.0)
    assert target[BASELINE] == pytest.approx(baseline_bp / BUCKETS)
    assert target[CANARY] == pytest.approx(min(percent / 100, 1 - baseline_bp / BUCKETS))
    for role, share in target.items():
        observed = counts[role] / len(SESSIONS)
        assert abs(observed - share) <= 0.015, (role, observed, share)


def test_canaries_nest_as_the_stage_grows() -> None:
    canary_at = {
        p: {s for s in SESSIONS if route(s, staged(p)).role == CANARY} for p in (1, 5, 20, 100)
    }
    assert canary_at[1] and canary_at[1] < canary_at[5] < canary_at[20] < canary_at[100]
    # The baseline never moves: the same sessions at every stage and when idle.
    idle = staged(0)
    idle.stage = rollout_pb2.ROLLOUT_STAGE_IDLE
    baseline = {s for s in SESSIONS if route(s, idle).role == BASELINE}
    for p in (1, 5, 20, 100):
        assert {s for s in SESSIONS if route(s, staged(p)).role == BASELINE} == baseline


def test_arms_run_their_versions() -> None:
    state = staged(20)
    by_role = {route(s, state).role: route(s, state) for s in SESSIONS[:2000]}
    assert by_role[BASELINE].version == "6"
    assert by_role[CANARY].version == "8"
    assert by_role[LIVE].version == "7"
    assert {r.seq for r in by_role.values()} == {9}


def test_baseline_runs_live_when_there_is_no_previous_version() -> None:
    state = staged(5, previous="")
    baseline = [route(s, state) for s in SESSIONS if route(s, state).role == BASELINE]
    assert baseline and {r.version for r in baseline} == {"7"}


def test_no_canary_unless_staged() -> None:
    for stage in (
        rollout_pb2.ROLLOUT_STAGE_IDLE,
        rollout_pb2.ROLLOUT_STAGE_OFFLINE_CHECK,
        rollout_pb2.ROLLOUT_STAGE_SHADOW,
    ):
        state = staged(20)
        state.stage = stage
        roles = {route(s, state).role for s in SESSIONS[:3000]}
        assert roles == {LIVE, BASELINE}
        assert target_shares(state)[CANARY] == 0.0


def test_route_arm_and_label() -> None:
    r = route(SESSIONS[0], staged(100))
    arm = r.arm()
    assert arm.policy_version == r.version and arm.role == r.role
    assert arm.rollout_seq == 9 and arm.bucket == r.bucket
    assert Route("7", CANARY, 1, 2).label == "canary:7"
    assert Route("rules:cpls", LIVE, 1, 0).label == "live:rules:cpls"
    assert Route("6", BASELINE, 1, 2).label == "baseline:6"
