"""Cycles: the controller proposes the learner's newest verified version at a cycle boundary,
never a forged or unsigned one, and never the same one twice by itself; a learned candidate
replays recorded sessions as twins in the offline check."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rollout_helpers import (
    K,
    Traffic,
    app,
    overriding,
    pausing,
    proposing,
    resuming,
    settings,
    until,
)
from signing_helpers import key_pair, signed

from podium import codec
from podium.bus import InProcBus
from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool, default_tasks
from podium.policy.agent import SwarmAgent
from podium.policy.signing import announcement_event_id
from podium.policy.swarm import save_policy, swarm_policy_updated
from podium.v1 import reward_pb2, rollout_pb2

CYCLE_S = 3600.0
IDLE = rollout_pb2.ROLLOUT_STAGE_IDLE


def untrained(root: Path, version: int) -> reward_pb2.PolicyUpdated:
    """A fresh (untrained) network published as ``version``: a poor candidate."""
    pool = default_pool()
    env = SwarmEnv(default_tasks(pool)[:1], pool, EnvConfig(max_subtasks=32))
    agent = SwarmAgent(env.layout, d_model=32)
    ref = save_policy(agent.net, root, version, tuple(env.layout.agents), max_subtasks="32")
    return swarm_policy_updated(ref)


class Clock:
    """Compressed time: the test moves it."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def test_cycle_proposes_the_newest_verified_version_once(
    inproc_bus: InProcBus, unique: Callable[[str], str], tmp_path: Path
) -> None:
    keys, forger = key_pair(tmp_path / "keys"), key_pair(tmp_path / "forger", "evil")
    s = settings(unique, cycle_s=CYCLE_S, trusted_keys=str(keys.public_path))
    clock = Clock()
    a = app(s, inproc_bus, clock=clock)
    await a.start()
    try:
        c = a.controller
        await until(lambda: c.writer, what="the writer role")
        await Traffic(inproc_bus, s).publish(c.state, 10)  # recorded live sessions (cpls)
        await until(lambda: c.stats.absorbed >= 10)
        announcements = [
            signed(untrained(tmp_path / "art", 3), keys),
            untrained(tmp_path / "art", 4),  # unsigned
            signed(untrained(tmp_path / "art", 5), forger),  # signed by an untrusted key
        ]
        for event in announcements:
            _, raw = codec.encode_event(
                event, producer="learner", event_id=announcement_event_id(event)
            )
            await inproc_bus.publish(s.policy_topic, raw, key="swarm_policy")
        await until(lambda: a.candidates.refused == 2 and "3" in a.candidates.verified)
        clock.advance(CYCLE_S / 2)
        await asyncio.sleep(20 * s.tick_s)  # a few ticks: nothing is due yet
        assert len(c.registry.transitions) == 1
        clock.advance(CYCLE_S / 2)
        await until(
            lambda: len(c.registry.transitions) >= 3 and c.state.stage == IDLE,
            timeout_s=120,
            what="the proposal and its offline check",
        )
        proposed, offline = list(c.registry.transitions)[1:3]
        clock.advance(2 * CYCLE_S)  # a cycle later: v3 was tried, nothing else is newer
        await asyncio.sleep(20 * s.tick_s)
    finally:
        await a.stop()
    assert proposed.kind == K.TRANSITION_KIND_CANDIDATE_PROPOSED
    assert proposed.state.candidate_version == "3" and proposed.actor == "controller"
    assert offline.kind == K.TRANSITION_KIND_OFFLINE_FAILED, offline.evidence.summary
    assert offline.evidence.figures["sessions"] == 10
    assert offline.evidence.figures["candidate_ran"] == 1.0
    assert offline.evidence.figures["paired_mean"] < 0, "an untrained net is worse than cpls"
    assert len(c.registry.transitions) == 3, "a rejected version is not re-proposed by itself"
    assert c.state.live_version == "rules:cpls"


async def test_a_candidate_whose_artifact_vanished_fails_with_the_reason(
    inproc_bus: InProcBus, unique: Callable[[str], str], tmp_path: Path
) -> None:
    keys = key_pair(tmp_path / "keys")
    s = settings(unique, trusted_keys=str(keys.public_path))
    a = app(s, inproc_bus)
    await a.start()
    try:
        c = a.controller
        await until(lambda: c.writer, what="the writer role")
        event = signed(untrained(tmp_path / "art", 3), keys)
        _, raw = codec.encode_event(
            event, producer="learner", event_id=announcement_event_id(event)
        )
        await inproc_bus.publish(s.policy_topic, raw, key="swarm_policy")
        await until(lambda: "3" in a.candidates.verified)
        for f in (tmp_path / "art").rglob("*.safetensors"):
            f.unlink()  # the weights are gone (or were never readable here)
        await c.command("pause", pausing)
        await c.command("propose", proposing("3"))
        await c.command("promote", overriding)  # past the offline check, by hand
        await c.command("resume", resuming)
        await Traffic(inproc_bus, s).publish(c.state, 5)
        await until(lambda: c.state.stage == IDLE, what="shadow to fail")
        failed = list(c.registry.transitions)[-1]
    finally:
        await a.stop()
    assert failed.kind == K.TRANSITION_KIND_SHADOW_FAILED
    assert "cannot run its twins" in failed.evidence.summary
    assert "3" in failed.evidence.summary or "weights" in failed.evidence.summary
