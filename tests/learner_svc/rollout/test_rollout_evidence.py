"""The human-review sample of canary sessions (learner_svc/rollout/evidence.py)."""

from __future__ import annotations

import uuid

from learner_svc.rollout.evidence import review_sampled
from podium.rollout.routing import bucket

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
