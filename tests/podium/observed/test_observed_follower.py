"""StatsFollower on both buses: trajectories in, a store fed; poison records skipped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from kafka_helpers import kafka_test_config

from podium.bus import KafkaBus
from podium.bus.base import Bus, TopicSpec
from podium.bus.consumer import EventPublisher
from podium.envs.swarm import EnvConfig, SwarmEnv, default_tasks, make_policy
from podium.envs.swarm.trajectory import episode_trajectory
from podium.observed import AgentStats
from podium.observed.follower import StatsFollower
from podium.v1 import reward_pb2, trajectory_pb2


def _trajectories(n: int) -> list[trajectory_pb2.Trajectory]:
    env = SwarmEnv(default_tasks(), config=EnvConfig(rule_advice=False))
    cpls = make_policy("cpls")
    out = []
    for seed in range(n):
        env.reset(seed=seed, options={"task": "diamond-10"})
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(cpls.act(env).action)
            done = term or trunc
        out.append(episode_trajectory(env, trajectory_id=f"t{seed}"))
    return out


async def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_the_follower_feeds_the_store_and_skips_poison(
    bus: Bus, unique: Callable[[str], str]
) -> None:
    topic = unique("trajectories")
    await bus.create_topics([TopicSpec(topic, 2)])
    trajs = _trajectories(4)
    broken = trajectory_pb2.Trajectory()
    broken.CopyFrom(trajs[0])
    broken.trajectory_id = "broken"
    broken.executions[2].subtask_id = "no-such-subtask"
    publisher = EventPublisher(bus, producer_name="test")
    await publisher.publish(topic, trajs[0], key="t0")
    await bus.publish(topic, b"\x00not an envelope", key="junk")  # undecodable
    await publisher.publish(topic, broken, key="t0")  # decodes, fits no task
    await publisher.publish(topic, reward_pb2.Feedback(session_id="x"), key="t1")  # wrong type
    for t in trajs[1:]:
        await publisher.publish(topic, t, key=t.trajectory_id)

    stats = AgentStats()
    follower = StatsFollower(bus, unique("orch.stats"), stats, topic=topic, split_overhead=0.15)
    await follower.start()
    task = asyncio.create_task(follower.run())
    try:
        await _wait_for(lambda: follower.trajectories == 4, "four trajectories recorded")
        await _wait_for(lambda: follower.skipped == 3, "three poison records skipped")
    finally:
        await follower.stop()
        await task
    assert task.exception() is None  # poison is never fatal

    direct = AgentStats()
    for t in trajs:
        direct.record_trajectory(t, split_overhead=0.15)
    assert follower.executions == sum(len(t.executions) for t in trajs)
    # Across partitions the order may differ from publication order: compare what does not
    # depend on it (a pair's decayed count depends only on how many it recorded).
    assert stats.version == direct.version
    assert stats.pairs() == direct.pairs()
    for agent, kind in direct.pairs():
        assert abs(stats.observed(agent, kind) - direct.observed(agent, kind)) < 1e-9


@pytest.mark.kafka
async def test_a_follower_started_late_warms_from_the_newest_trajectories(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    """A replica started after sessions ran records the newest ``warm_records`` of each
    partition before it follows, and only those (a restart after a drift plans on what the
    sub-agents have been doing). Kafka only: warming is for a group positioned at the end,
    which the in-process bus has no way to do (its new groups read from the start)."""
    bus = KafkaBus(kafka_test_config(kafka_bootstrap, client_id="stats-warm"))
    await bus.start()
    try:
        await _warm_and_follow(bus, unique)
    finally:
        await bus.stop()


async def _warm_and_follow(bus: KafkaBus, unique: Callable[[str], str]) -> None:
    topic = unique("trajectories")
    await bus.create_topics([TopicSpec(topic, 1)])
    trajs = _trajectories(5)
    publisher = EventPublisher(bus, producer_name="test")
    for t in trajs:
        await publisher.publish(topic, t, key=t.trajectory_id)
    group = unique("orch.stats")
    await bus.position_groups_at_end({group: [topic]})
    stats = AgentStats()
    follower = StatsFollower(bus, group, stats, topic=topic, split_overhead=0.15, warm_records=3)
    await follower.start()
    task = asyncio.create_task(follower.run())
    try:
        assert follower.trajectories == 3  # warmed before start() returns
        later = _trajectories(6)[5]
        await publisher.publish(topic, later, key="t5")
        await _wait_for(lambda: follower.trajectories == 4, "the next trajectory followed")
    finally:
        await follower.stop()
        await task
    direct = AgentStats()
    for t in [*trajs[2:], later]:
        direct.record_trajectory(t, split_overhead=0.15)
    assert stats.pairs() == direct.pairs()
    for agent, kind in direct.pairs():
        assert abs(stats.observed(agent, kind) - direct.observed(agent, kind)) < 1e-9
