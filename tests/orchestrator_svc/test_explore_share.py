"""The exploration share (``PODIUM_EXPLORE_SHARE``): a fixed share of live-arm sessions decided
by a learned version sample their actions whoever submitted them, chosen from a hash of the
session id independent of the rollout's routing buckets, and recorded as sampled, so the
learner trains on live traffic with no ``trainer`` client. No broker: the in-process bus."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from signing_helpers import key_pair
from test_learned_policy import (
    announce,
    fresh_policy,
    learned_orchestrator,
    run_session,
    tasks,
    wait_version,
)

from learner_svc.algorithms.swarm import is_on_policy_sample
from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from orchestrator_svc.learned import (
    EXPLORE_BUCKETS,
    LearnedPolicySource,
    SessionLearnedPolicy,
    explore_bucket,
    explores,
)
from podium.bus import InProcBus
from podium.config import from_env
from podium.errors import ConfigError
from podium.policy.signing import KeyPair, TrustedKeys
from podium.rollout.routing import bucket
from podium.v1 import task_pb2

IDS = [f"session-{i}" for i in range(8000)]


def _within(observed: int, n: int, share: float) -> bool:
    """``observed`` of ``n`` within five standard errors of ``share``."""
    sd = math.sqrt(n * share * (1 - share))
    return abs(observed - n * share) <= 5 * sd


def test_the_share_is_a_stable_hash_of_the_session_id() -> None:
    assert not any(explores(s, 0.0) for s in IDS)
    assert all(explores(s, 1.0) for s in IDS)
    chosen = [s for s in IDS if explores(s, 0.2)]
    assert _within(len(chosen), len(IDS), 0.2)
    # The same answer every time (every replica, a replay, a twin) and nested: a session
    # exploring at 20% explores at 50% too.
    assert chosen == [s for s in IDS if explores(s, 0.2)]
    assert all(explores(s, 0.5) for s in chosen)
    assert all(0 <= explore_bucket(s) < EXPLORE_BUCKETS for s in IDS[:100])


def test_the_share_is_independent_of_the_rollout_buckets() -> None:
    """The baseline arm is the lowest routing buckets: an unsalted hash would put every
    exploring session there (decided by the rule engine) and nothing would explore."""
    low = [s for s in IDS if bucket(s) < 2000]
    assert _within(sum(explores(s, 0.2) for s in low), len(low), 0.2)


def _source(share: float, keys: KeyPair) -> LearnedPolicySource:
    return LearnedPolicySource(
        ("a",), trusted=TrustedKeys.load(str(keys.public_path)), explore_share=share
    )


def test_users_sessions_sample_in_the_share_on_the_live_arm_only(tmp_path: Path) -> None:
    keys = key_pair(tmp_path / "keys")
    source = _source(0.3, keys)
    users = [task_pb2.TaskSubmitted(session_id=s, submitted_by="grpc:ide") for s in IDS[:2000]]
    sampled = [u for u in users if source.samples(u)]
    assert _within(len(sampled), len(users), 0.3)
    assert all(explores(u.session_id, 0.3) for u in sampled)
    # Canary and baseline sessions never explore; a trainer's always samples.
    assert not any(source.samples(u, explore=False) for u in users)
    trainer = task_pb2.TaskSubmitted(session_id=IDS[0], submitted_by="trainer:t")
    assert source.samples(trainer, explore=False)
    # The default (0) keeps every user session greedy.
    assert not any(_source(0.0, keys).samples(u) for u in users)


def test_the_setting_is_read_and_checked() -> None:
    env = {"PODIUM_BUS": "kafka://127.0.0.1:9"}
    assert from_env(OrchestratorConfig, env).explore_share == 0.0
    assert from_env(OrchestratorConfig, {**env, "PODIUM_EXPLORE_SHARE": "0.05"}).explore_share == (
        0.05
    )
    for bad in ("1.5", "-0.1", "some"):
        with pytest.raises(ConfigError, match="PODIUM_EXPLORE_SHARE"):
            from_env(OrchestratorConfig, {**env, "PODIUM_EXPLORE_SHARE": bad})


@pytest.fixture
async def exploring(tmp_path: Path) -> AsyncIterator[tuple[InProcBus, OrchestratorApp, KeyPair]]:
    keys = key_pair(tmp_path / "keys")
    async with learned_orchestrator(keys, "ex", explore_share=0.5) as (bus, orch):
        yield bus, orch, keys


async def test_exploring_user_sessions_are_recorded_as_samples_the_learner_takes(
    exploring: tuple[InProcBus, OrchestratorApp, KeyPair], tmp_path: Path
) -> None:
    bus, orch, keys = exploring
    ref, _ = fresh_policy(tmp_path / "artifacts", 1, seed=4)
    await announce(bus, ref, keys)
    await wait_version(orch, 1)
    task = tasks()[0]
    seen: dict[bool, int] = {True: 0, False: 0}
    # Session ids are random: run until both kinds have been seen (each has even odds, so
    # forty sessions of one kind only would be a broken share, not bad luck).
    for seed in range(300, 340):
        if seen[True] >= 3 and seen[False] >= 3:
            break
        traj = await run_session(bus, orch, task, seed, "grpc:ide")
        assert traj.policy_version == "1"
        explored = explores(traj.session_id, 0.5)
        seen[explored] += 1
        assert traj.labels["actions"] == ("sampled" if explored else "argmax")
        assert is_on_policy_sample(dict(traj.labels), traj.policy_version) is explored
    assert seen[True] >= 3 and seen[False] >= 3, seen
    # The session's policy says the same as its trajectory.
    assert orch.learned is not None
    submitted = task_pb2.TaskSubmitted(session_id=IDS[1], submitted_by="grpc:ide")
    policy = orch.learned.for_session(submitted)
    assert isinstance(policy, SessionLearnedPolicy)
    assert policy.sample is explores(IDS[1], 0.5)
    canary = orch.learned.for_session(submitted, "1", explore=False)
    assert isinstance(canary, SessionLearnedPolicy) and canary.sample is False
