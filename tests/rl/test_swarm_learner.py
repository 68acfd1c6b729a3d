"""learner_svc in swarm mode on the in-process bus: trains on on-policy scored trajectories,
skips rule-engine and argmax sessions, drops stale ones (η), starts from given weights as
version 0, publishes and announces each version, and resumes from its checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from learner_svc.config import LearnerConfig
from learner_svc.swarm import SwarmLearner, swarm_layout
from podium import codec, topics
from podium.bus import InProcBus
from podium.bus.consumer import EventPublisher
from podium.config import from_env
from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.errors import ConfigError
from podium.policy.artifacts import load_weights
from podium.train.agent import SwarmAgent
from podium.train.policy import MODEL_NAME, save_policy
from podium.train.rollout import Job, run_episodes
from podium.v1 import reward_pb2, trajectory_pb2


def config(tmp_path: Path, init: str = "", **kw: object) -> LearnerConfig:
    values: dict[str, object] = {
        "bus_url": "embedded",
        "mode": "swarm",
        "group_id": "sl.learner",
        "artifacts_dir": str(tmp_path / "artifacts"),
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "init": init,
        "batch_trajectories": 6,
        "max_policy_lag": 0,
    }
    values.update(kw)
    return LearnerConfig(**values)  # type: ignore[arg-type]


def trajectories(
    agent: SwarmAgent, n: int, version: str, actions: str
) -> list[trajectory_pb2.Trajectory]:
    tasks = generate_suite(6, seed=5, sizes=(4, 8))
    envs = [SwarmEnv(tasks, default_pool(), EnvConfig(max_subtasks=64, invalid_action="raise"))]
    _, trajs = run_episodes(
        envs,
        [Job(tasks[i % len(tasks)], 10 + i) for i in range(n)],
        agent=agent,
        generator=torch.Generator().manual_seed(0),
        with_trajectories=True,
    )
    for i, t in enumerate(trajs):
        t.policy_version = version
        t.session_id = t.trajectory_id = f"{version}-{actions}-{i}"
        t.labels["actions"] = actions
    return trajs


async def publish(bus: InProcBus, trajs: list[trajectory_pb2.Trajectory]) -> None:
    pub = EventPublisher(bus, producer_name="reward-test")
    for t in trajs:
        scored = reward_pb2.ScoredTrajectory(trajectory=t, total=0.5, reward_version="test")
        await pub.publish(topics.SCORED_TRAJECTORIES, scored, key=t.session_id)


async def test_trains_publishes_skips_drops_and_resumes(tmp_path: Path) -> None:
    layout = swarm_layout(default_pool(), 64)
    torch.manual_seed(9)
    init_agent = SwarmAgent(layout)
    init = save_policy(
        init_agent.net, tmp_path / "init", 0, tuple(layout.agents), max_subtasks="64"
    )
    bus = InProcBus()
    await bus.start()
    announced: list[reward_pb2.PolicyUpdated] = []
    sub = bus.subscriber([topics.POLICY_UPDATES], "sl.watch")
    await sub.start()
    try:
        learner = SwarmLearner(config(tmp_path, init=str(init.path)), bus)
        stop = asyncio.Event()
        task = asyncio.create_task(learner.run(stop))
        # Off-policy (argmax, rules) first, then 6 on-policy samples of version 0: one update.
        await publish(bus, trajectories(init_agent, 2, "0", "argmax"))
        await publish(bus, trajectories(init_agent, 1, "rules:cpls", "sampled"))
        await publish(bus, trajectories(init_agent, 6, "0", "sampled"))
        async with learner.updated:
            await asyncio.wait_for(
                learner.updated.wait_for(lambda: learner.state.policy_version >= 1), 30
            )
        # η = 0: more version-0 samples are now stale and dropped, never trained on.
        await publish(bus, trajectories(init_agent, 3, "0", "sampled"))
        for _ in range(100):
            if learner.state.dropped_stale == 3:
                break
            await asyncio.sleep(0.05)
        stop.set()
        state = await asyncio.wait_for(task, 10)
        assert (state.step, state.policy_version, state.trained) == (1, 1, 6)
        assert (state.skipped_off_policy, state.dropped_stale) == (3, 3)
        for record in await sub.fetch(50, 0.5):
            announced.append(codec.decode_event(record.value, reward_pb2.PolicyUpdated)[1])
        assert [(e.model_name, e.version) for e in announced] == [(MODEL_NAME, 0), (MODEL_NAME, 1)]
        assert announced[1].metrics["ratio_to_bound"] > 1.0
        v0 = load_weights(Path(announced[0].uri.removeprefix("file://")), announced[0].sha256)
        v1 = load_weights(Path(announced[1].uri.removeprefix("file://")), announced[1].sha256)
        init_w = load_weights(init.path)
        # Version 0 is exactly the given starting weights; version 1 moved away from them.
        assert all(torch.equal(v0.tensors[k], init_w.tensors[k]) for k in init_w.tensors)
        assert any(not torch.equal(v1.tensors[k], init_w.tensors[k]) for k in init_w.tensors)
        assert v1.metadata["max_subtasks"] == "64"

        # A restarted learner resumes from its checkpoint (not from the init weights).
        again = SwarmLearner(config(tmp_path, init=str(init.path)), bus)
        assert (again.state.step, again.state.policy_version) == (1, 1)
        assert all(torch.equal(again.agent.net.state_dict()[k], v1.tensors[k]) for k in v1.tensors)
    finally:
        await sub.stop()
        await bus.stop()


def test_swarm_mode_config_errors_name_the_variables(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="PODIUM_LEARNER_ARTIFACTS and PODIUM_LEARNER_CHECKPOINT_DIR"
    ):
        from_env(
            LearnerConfig, {"PODIUM_BUS": "kafka://127.0.0.1:9092", "PODIUM_LEARNER_MODE": "swarm"}
        )
    with pytest.raises(ConfigError, match="PODIUM_LEARNER_MODE"):
        from_env(
            LearnerConfig, {"PODIUM_BUS": "kafka://127.0.0.1:9092", "PODIUM_LEARNER_MODE": "ppo"}
        )
    with pytest.raises(ConfigError, match="PODIUM_LEARNER_INIT"):
        SwarmLearner(config(tmp_path, init=str(tmp_path / "missing.safetensors")), InProcBus())
