"""Context episodes through reward_svc, on both buses: scored with the Context-1 reward and
its detectors from the trajectory's evidence; a malformed one dead-lettered, naming the field."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from podium import codec, topics
from podium.bus import Bus
from podium.bus.consumer import DLQ_ERROR
from podium.context.questions import GoldSpan
from podium.rewards import default_config
from podium.rewards.config import ContextRewardConfig
from podium.rewards.context import (
    SEARCH_LOOP,
    ContextEpisode,
    ContextStep,
    context_reward,
    episode_trajectory,
)
from podium.v1 import reward_pb2
from reward_svc.app import RewardApp
from reward_svc.config import RewardServiceConfig

GOLD = (GoldSpan("man2/lseek.2.gz", 382, 471),)


def episode(question: str) -> ContextEpisode:
    search = ContextStep("search", retriever="bm25", form="question", query="lseek header")
    keep = ContextStep(
        "keep",
        chunk_id="man2/lseek.2.gz#2",
        source="man2/lseek.2.gz",
        start=382,
        end=471,
        tokens=40,
    )
    steps = (search, search, keep, ContextStep("finish"))  # the search repeated: a loop
    return ContextEpisode(question, 300, steps, GOLD, wall_s=0.2)


async def test_context_trajectories_are_scored_by_the_context_reward(
    bus: Bus, unique: Callable[[str], str]
) -> None:
    cfg = RewardServiceConfig(
        bus_url="inproc://",
        in_topic=unique("ctx-in"),
        out_topic=unique("ctx-out"),
        group_id=unique("ctx-reward"),
        max_batch=2,
    )
    app = RewardApp(cfg, default_config(), bus)
    good = episode_trajectory(episode("q1"), trajectory_id="t1", policy_version="2")
    bad = episode_trajectory(episode("q2"), trajectory_id="t2")
    bad.labels["context.gold"] = "not json"
    reader = bus.subscriber([cfg.out_topic], unique("reader"))
    dlq = bus.subscriber([topics.dead_letter(cfg.in_topic)], unique("dlq"))
    for sub in (reader, dlq):
        await sub.start()
    await app.start()
    try:
        for traj in (good, bad):
            await bus.publish(cfg.in_topic, codec.encode_event(traj, producer="test")[1], key="k")
        scored: list[reward_pb2.ScoredTrajectory] = []
        dead = []
        for _ in range(200):
            scored += [
                codec.decode_event(r.value, reward_pb2.ScoredTrajectory)[1]
                for r in await reader.fetch(timeout_s=0.05)
            ]
            dead += await dlq.fetch(timeout_s=0.05)
            if scored and dead:
                break
    finally:
        await app.stop()
        for sub in (reader, dlq):
            await sub.stop()
    [msg] = scored
    expected = context_reward(episode("q1"), ContextRewardConfig())
    assert msg.trajectory.trajectory_id == "t1"
    assert msg.total == pytest.approx(expected.total)
    assert msg.components["context.found"] == 1.0
    assert expected.penalties[SEARCH_LOOP] > 0
    assert msg.penalties[SEARCH_LOOP] == pytest.approx(expected.penalties[SEARCH_LOOP])
    assert "+ctx" in msg.reward_version
    [poison] = dead
    assert b"context.gold" in (poison.header(DLQ_ERROR) or b"")
