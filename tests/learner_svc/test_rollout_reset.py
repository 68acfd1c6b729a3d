"""The learning loop follows the rollout registry: when the rollout rejects the lineage it
trains (a candidate fails shadow, an operator undoes a promotion) it resets its weights to the
live version's, exactly, loaded from that version's signed announcement; its next version
descends from them; a restart neither misses nor redoes a reset. On both buses (``[kafka]``
against the real broker). The transitions are the real state machine's
(:mod:`podium.rollout.machine`), written as the controller writes them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from loop_helpers import publish_scored, swarm_trajectories

from learner_svc.algorithms.swarm import SwarmPPO, SwarmSample, SwarmSettings, swarm_layout
from learner_svc.config import LearnerConfig, LoopSettings
from learner_svc.loop import LearningLoop, LoopConfig
from podium import codec, topics
from podium.bus import InProcBus, read_committed
from podium.bus.base import Bus, TopicSpec
from podium.bus.consumer import EventPublisher
from podium.config import from_env
from podium.envs.swarm import default_pool
from podium.errors import ArtifactError, ConfigError
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import load_weights, path_from_uri
from podium.policy.signing import ensure_key_pair
from podium.policy.swarm import save_policy
from podium.rollout import (
    RolloutSettings,
    advance,
    initial_state,
    offline_checked,
    pause,
    propose,
    rollback,
    shadow_done,
)
from podium.v1 import reward_pb2, rollout_pb2, trajectory_pb2

MAX_SUBTASKS = 16
BATCH = 3
NOW = datetime(2026, 12, 1, tzinfo=UTC)
Step = tuple[rollout_pb2.RolloutState, rollout_pb2.RolloutTransition]


@dataclass(frozen=True)
class Names:
    scored: str
    policy: str
    rollout: str
    group: str


class Controller:
    """Writes the rollout registry as the controller does: each transition under
    ``transition:<seq>``, the state under ``state``."""

    def __init__(self, bus: Bus, topic: str) -> None:
        self.topic = topic
        self.publisher = EventPublisher(bus, producer_name="rollout-test")
        self.state = initial_state(RolloutSettings(), NOW, "test")

    async def do(self, step: Callable[..., Step], *args: object) -> None:
        self.state, transition = step(self.state, *args)
        await self.publisher.publish(
            self.topic, transition, key=f"transition:{transition.seq:012d}"
        )
        await self.publisher.publish(self.topic, self.state, key="state")

    async def promote(self, version: str) -> None:
        await self.do(propose, version, "", "controller", NOW)
        await self.do(offline_checked, True, None, NOW)
        await self.do(shadow_done, True, None, NOW)
        for _ in range(4):  # 1 -> 5 -> 20 -> 100% -> live
            await self.do(advance, None, NOW)
        assert self.state.live_version == version


def _settings(tmp_path: Path, init: Path) -> SwarmSettings:
    return SwarmSettings(
        artifacts_dir=str(tmp_path / "artifacts"),
        signing_key=str(ensure_key_pair(tmp_path / "keys").private_path),
        init=str(init),
        max_subtasks=MAX_SUBTASKS,
        learning_rate=3e-4,
        learning_rate_end=3e-5,
        critic_warmup_updates=0,
    )


def _learner(tmp_path: Path, bus: Bus, names: Names, init: Path) -> LearningLoop[SwarmSample]:
    config = LoopConfig(
        checkpoint_dir=tmp_path / "ckpt",
        topic=names.scored,
        policy_topic=names.policy,
        rollout_topic=names.rollout,
        group_id=names.group,
        batch_trajectories=BATCH,
        max_policy_lag=100,
        fetch_timeout_s=0.1,
    )
    return LearningLoop(config, SwarmPPO.from_settings(_settings(tmp_path, init)), bus)


class Running:
    """A learner's run task, and waits on its state."""

    started: ClassVar[list[Running]] = []
    """Every run of the test (ended, whatever happens, by :func:`_end_all`)."""

    def __init__(self, loop: LearningLoop[SwarmSample]) -> None:
        self.loop = loop
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(loop.run(stop=self.stop))
        Running.started.append(self)

    async def until(self, what: Callable[[], bool], timeout_s: float = 90.0) -> None:
        async def wait() -> None:
            while not what():
                if self.task.done():
                    self.task.result()  # raises what ended the run
                    raise AssertionError("the learner stopped")
                await asyncio.sleep(0.05)

        await asyncio.wait_for(wait(), timeout_s)

    async def end(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 30)


async def _end_all() -> None:
    runs, Running.started = Running.started, []
    for r in runs:
        r.stop.set()
    await asyncio.wait_for(asyncio.gather(*(r.task for r in runs), return_exceptions=True), 30)


def _trajectories(agent: SwarmAgent, version: str, tag: str) -> list[trajectory_pb2.Trajectory]:
    ids = [f"{tag}-{i}" for i in range(BATCH)]
    return swarm_trajectories(agent, ids, version, max_subtasks=MAX_SUBTASKS, seed0=hash(tag) % 997)


async def _announced(bus: Bus, topic: str, version: int) -> reward_pb2.PolicyUpdated:
    """The announcement of ``version`` (waited for: a version is announced after its
    checkpoint and commit)."""
    for _ in range(400):
        for record in await read_committed(bus, topic):
            event = codec.decode_event(record.value, reward_pb2.PolicyUpdated)[1]
            if event.version == version:
                return event
        await asyncio.sleep(0.05)
    raise AssertionError(f"version {version} was never announced on {topic}")


def _weights(event: reward_pb2.PolicyUpdated) -> dict[str, torch.Tensor]:
    return load_weights(path_from_uri(event.uri), event.sha256).tensors


def _equal(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> bool:
    state = model.state_dict()
    return state.keys() == tensors.keys() and all(torch.equal(state[k], tensors[k]) for k in state)


async def test_rejections_reset_to_the_live_version_and_restarts_keep_it(
    tmp_path: Path, bus: Bus, unique: Callable[[str], str]
) -> None:
    names = Names(unique("scored"), unique("policy"), unique("rollout"), unique("learner"))
    await bus.create_topics([TopicSpec(n, 1) for n in (names.scored, names.policy, names.rollout)])
    layout = swarm_layout(default_pool(), MAX_SUBTASKS)
    torch.manual_seed(11)
    agent = SwarmAgent(layout)
    init = save_policy(
        agent.net, tmp_path / "init", 0, tuple(layout.agents), max_subtasks=str(MAX_SUBTASKS)
    ).path
    controller = Controller(bus, names.rollout)
    try:
        await _walk(tmp_path, bus, names, init, agent, controller)
    finally:
        await _end_all()


async def _walk(
    tmp_path: Path, bus: Bus, names: Names, init: Path, agent: SwarmAgent, controller: Controller
) -> None:
    run = Running(_learner(tmp_path, bus, names, init))
    for v in range(3):  # versions 1, 2, 3, each from samples of the one before
        await publish_scored(bus, names.scored, _trajectories(agent, str(v), f"v{v}"))
        await run.until(lambda v=v: run.loop.state.policy_version == v + 1)
    v1 = _weights(await _announced(bus, names.policy, 1))
    v2 = _weights(await _announced(bus, names.policy, 2))

    # 1 and 2 go live in turn: ancestors of the learner's 3, nothing to do.
    await controller.promote("1")
    await controller.promote("2")
    # The learner's 3 is proposed; two of its sessions wait in the learner's next batch.
    canary = _trajectories(agent, "3", "canary")[:2]
    await publish_scored(bus, names.scored, canary)
    await run.until(lambda: run.loop.state.next_offset(names.scored, 0) == 3 * BATCH + 2)
    assert run.loop.state.dropped_stale == 0
    # 3 fails shadow: back to 2, exactly; the optimizer starts afresh; the sessions of 3 in
    # hand are stale on the new lineage and dropped.
    await controller.do(propose, "3", "", "controller", NOW)
    await controller.do(offline_checked, True, None, NOW)
    await controller.do(shadow_done, False, None, NOW)
    await run.until(lambda: run.loop.state.resets == 1)
    st = run.loop.state
    assert (st.reset_from, st.reset_at, st.policy_version) == (2, 3, 3)
    assert st.rollout_seq == controller.state.seq
    assert _equal(run.loop.algorithm.model, v2)
    assert not run.loop.algorithm.optimizer.state
    assert st.dropped_stale == 2

    # Live traffic (version 2) trains version 4 from 2's weights; a session of the rejected 3
    # is off the lineage now: stale.
    stale = _trajectories(agent, "3", "stale")[:1]
    live = _trajectories(agent, "2", "live")
    await publish_scored(bus, names.scored, stale + live)
    await run.until(lambda: run.loop.state.policy_version == 4)
    assert run.loop.state.dropped_stale == 3
    v4 = await _announced(bus, names.policy, 4)
    assert v4.metrics["lineage_from"] == 2.0
    # Descends from 2: the same update on 2's weights with a fresh optimizer gives 4 exactly
    # (and only the live sessions were in it).
    twin = SwarmPPO.from_settings(_settings(tmp_path, init))
    twin.model.load_state_dict(v2)
    batch = [twin.decode(reward_pb2.ScoredTrajectory(trajectory=t, total=0.5), 0) for t in live]
    twin.update([s for s in batch if s is not None], 3)
    assert _equal(twin.model, _weights(v4))

    # An operator undoes the promotion of 2: live is 1, off the lineage (2, 4): reset to 1.
    await controller.do(rollback, "operator", None, NOW, "operator:test")
    assert controller.state.live_version == "1"
    await run.until(lambda: run.loop.state.resets == 2)
    assert _equal(run.loop.algorithm.model, v1)
    await run.end()

    # Killed before an update recorded that reset: the restarted learner does it again.
    run = Running(_learner(tmp_path, bus, names, init))
    assert run.loop.state.resets == 1 and _equal(run.loop.algorithm.model, _weights(v4))
    await run.until(lambda: run.loop.state.resets == 2)
    assert _equal(run.loop.algorithm.model, v1)
    assert (run.loop.state.reset_from, run.loop.state.reset_at) == (1, 4)
    await publish_scored(bus, names.scored, _trajectories(agent, "1", "after-undo"))
    await run.until(lambda: run.loop.state.policy_version == 5)
    v5 = _weights(await _announced(bus, names.policy, 5))
    await run.end()

    # Restarted after the update that recorded it: no second reset, training goes on from 5.
    run = Running(_learner(tmp_path, bus, names, init))
    assert run.loop.state.resets == 2 and _equal(run.loop.algorithm.model, v5)
    await controller.do(
        pause, "a later transition, to see the learner has read them all", "op", NOW
    )
    await run.until(lambda: run.loop.state.rollout_seq == controller.state.seq)
    assert run.loop.state.resets == 2 and _equal(run.loop.algorithm.model, v5)
    await run.end()


async def test_a_reset_without_a_verified_announcement_stops_the_learner(
    tmp_path: Path, bus: Bus, unique: Callable[[str], str]
) -> None:
    """Live goes to a version nobody announced: the learner refuses to guess, and says which
    version and why."""
    names = Names(unique("scored"), unique("policy"), unique("rollout"), unique("learner"))
    await bus.create_topics([TopicSpec(n, 1) for n in (names.scored, names.policy, names.rollout)])
    layout = swarm_layout(default_pool(), MAX_SUBTASKS)
    init = save_policy(
        SwarmAgent(layout).net, tmp_path / "init", 0, tuple(layout.agents), max_subtasks="16"
    ).path
    controller = Controller(bus, names.rollout)
    await controller.promote("7")  # never announced on names.policy
    run = Running(_learner(tmp_path, bus, names, init))
    try:
        await run.until(lambda: False, timeout_s=60)
    except ArtifactError as exc:
        assert "v7" in str(exc) and "none on the topic" in str(exc)
    else:
        raise AssertionError("the learner trained on without its reset")
    finally:
        await _end_all()
    assert run.loop.state.resets == 0 and run.loop.state.rollout_seq == 0


def test_the_deployed_settings_reach_the_loop(tmp_path: Path) -> None:
    """``PODIUM_LEARNER_ROLLOUT_TOPIC`` turns following on; a bad ``PODIUM_POLICY_TRUSTED_KEYS``
    fails the start, naming the variable (not the first reset, days later)."""
    environ = {
        "PODIUM_LEARNER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "PODIUM_LEARNER_ROLLOUT_TOPIC": topics.ROLLOUT,
        "PODIUM_POLICY_TRUSTED_KEYS": str(tmp_path / "missing.pub"),
    }
    config = from_env(LoopSettings, environ).loop_config(LearnerConfig(bus_url="inproc://"), "l")
    assert config.rollout_topic == topics.ROLLOUT
    assert from_env(LoopSettings, {"PODIUM_LEARNER_CHECKPOINT_DIR": "x"}).rollout_topic == ""
    layout = swarm_layout(default_pool(), MAX_SUBTASKS)
    init = save_policy(SwarmAgent(layout).net, tmp_path / "init", 0, tuple(layout.agents)).path
    with pytest.raises(ConfigError, match=r"PODIUM_POLICY_TRUSTED_KEYS.*missing\.pub"):
        LearningLoop(config, SwarmPPO.from_settings(_settings(tmp_path, init)), InProcBus())
