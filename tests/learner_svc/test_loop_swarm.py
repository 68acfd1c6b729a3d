"""The learning loop with the swarm algorithm on the in-process bus: trains on on-policy scored
trajectories, skips rule-engine and argmax sessions, drops stale ones (η), starts from given
weights as version 0, publishes and announces each version, resumes from its checkpoint, and
uses the rollout baseline a trajectory carries."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from learner_svc.algorithms.swarm import SwarmPPO, SwarmSample, SwarmSettings, swarm_layout
from learner_svc.config import LearnerConfig, LoopSettings
from learner_svc.loop import LearningLoop, LoopConfig
from podium import codec, topics
from podium.bus import InProcBus
from podium.bus.consumer import EventPublisher
from podium.config import from_env
from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.errors import ConfigError
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import load_weights
from podium.policy.rollout import Job, run_episodes
from podium.policy.signing import ensure_key_pair
from podium.policy.swarm import MODEL_NAME, save_policy
from podium.v1 import reward_pb2, trajectory_pb2


def settings(tmp_path: Path, init: str = "") -> SwarmSettings:
    return SwarmSettings(
        artifacts_dir=str(tmp_path / "artifacts"),
        signing_key=str(ensure_key_pair(tmp_path / "keys").private_path),
        init=init,
        learning_rate=3e-4,
        learning_rate_end=3e-5,
        critic_warmup_updates=0,
    )


def learner(tmp_path: Path, bus: InProcBus, init: str = "") -> LearningLoop[SwarmSample]:
    loop = LoopConfig(
        checkpoint_dir=tmp_path / "ckpt",
        group_id="sl.learner",
        batch_trajectories=6,
        max_policy_lag=0,
    )
    return LearningLoop(loop, SwarmPPO.from_settings(settings(tmp_path, init)), bus)


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
        loop = learner(tmp_path, bus, init=str(init.path))
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop=stop))
        # Off-policy (argmax, rules) first, then 6 on-policy samples of version 0: one update.
        await publish(bus, trajectories(init_agent, 2, "0", "argmax"))
        await publish(bus, trajectories(init_agent, 1, "rules:cpls", "sampled"))
        await publish(bus, trajectories(init_agent, 6, "0", "sampled"))
        async with loop.updated:
            await asyncio.wait_for(
                loop.updated.wait_for(lambda: loop.state.policy_version >= 1), 30
            )
        # η = 0: more version-0 samples are now stale and dropped, never trained on.
        await publish(bus, trajectories(init_agent, 3, "0", "sampled"))
        for _ in range(100):
            if loop.state.dropped_stale == 3:
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
        again = learner(tmp_path, bus, init=str(init.path))
        assert (again.state.step, again.state.policy_version) == (1, 1)
        net = again.algorithm.model
        assert all(torch.equal(net.state_dict()[k], v1.tensors[k]) for k in v1.tensors)
    finally:
        await sub.stop()
        await bus.stop()


def test_swarm_mode_config_errors_name_the_variables(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PODIUM_LEARNER_CHECKPOINT_DIR"):
        from_env(LoopSettings, {})
    with pytest.raises(ConfigError, match="PODIUM_LEARNER_ARTIFACTS"):
        from_env(SwarmSettings, {})
    with pytest.raises(ConfigError, match="PODIUM_LEARNER_MODE"):
        from_env(
            LearnerConfig, {"PODIUM_BUS": "kafka://127.0.0.1:9092", "PODIUM_LEARNER_MODE": "ppo"}
        )
    with pytest.raises(ConfigError, match="PODIUM_LEARNER_INIT"):
        SwarmPPO.from_settings(settings(tmp_path, init=str(tmp_path / "missing.safetensors")))
    # A learner that could not sign would publish versions every orchestrator refuses.
    with pytest.raises(ConfigError, match=r"PODIUM_POLICY_SIGNING_KEY is not set.*keys generate"):
        SwarmPPO.from_settings(replace(settings(tmp_path), signing_key=""))
    with pytest.raises(ConfigError, match=r"PODIUM_POLICY_SIGNING_KEY=.*not an unencrypted PEM"):
        bad = tmp_path / "placeholder.pem"
        bad.write_text("REPLACE-ME")
        SwarmPPO.from_settings(replace(settings(tmp_path), signing_key=str(bad)))


def test_rollout_baseline_is_subtracted_from_the_score(tmp_path: Path) -> None:
    """A trajectory's baseline return enters the update as ``score − baseline``: the same
    batch with a baseline equal to the score trains exactly like a batch scored 0."""
    layout = swarm_layout(default_pool(), 64)
    torch.manual_seed(3)
    agent = SwarmAgent(layout)
    trajs = trajectories(agent, 4, "0", "sampled")

    def decoded(total: float, baseline: float | None) -> list[SwarmSample]:
        algo = SwarmPPO(settings(tmp_path), layout, net=None)
        algo.agent.net.load_state_dict(agent.net.state_dict())
        out = []
        for t in trajs:
            copy = trajectory_pb2.Trajectory()
            copy.CopyFrom(t)
            if baseline is not None:
                copy.baseline.policy = "cpls"
                copy.baseline.env_return = baseline
            scored = reward_pb2.ScoredTrajectory(trajectory=copy, total=total)
            sample = algo.decode(scored, 0)
            assert sample is not None
            out.append(sample)
        return out

    with_baseline = decoded(0.7, 0.7)
    assert all(s.baseline == 0.7 and s.score == 0.7 for s in with_baseline)
    plain = decoded(0.0, None)
    assert all(s.baseline == 0.0 for s in plain)

    def trained(batch: list[SwarmSample]) -> dict[str, torch.Tensor]:
        algo = SwarmPPO(settings(tmp_path), layout, net=None)
        algo.agent.net.load_state_dict(agent.net.state_dict())
        algo.update(batch, 0)
        return {k: v.clone() for k, v in algo.agent.net.state_dict().items()}

    a, b = trained(with_baseline), trained(plain)
    assert all(torch.allclose(a[k], b[k]) for k in a)
    c = trained(decoded(0.7, None))  # the same score without its baseline trains differently
    assert any(not torch.allclose(a[k], c[k]) for k in a)


def test_critic_warmup_leaves_the_policy_as_it_was(tmp_path: Path) -> None:
    """During the warm-up updates only the value head moves: the policy stays as cloned."""
    layout = swarm_layout(default_pool(), 64)
    torch.manual_seed(4)
    agent = SwarmAgent(layout)
    trajs = trajectories(agent, 4, "0", "sampled")
    algo = SwarmPPO(
        SwarmSettings(
            artifacts_dir=str(tmp_path / "a"),
            critic_warmup_updates=1,
            signing_key=settings(tmp_path).signing_key,
        ),
        layout,
        None,
    )
    algo.agent.net.load_state_dict(agent.net.state_dict())
    batch = [
        s
        for s in (
            algo.decode(reward_pb2.ScoredTrajectory(trajectory=t, total=1.0), 0) for t in trajs
        )
        if s is not None
    ]
    before = {k: v.clone() for k, v in algo.agent.net.state_dict().items()}
    stats = algo.update(batch, 0)
    after = algo.agent.net.state_dict()
    assert stats["critic_only"] == 1.0
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith("value_head") for k in moved)
    algo.update(batch, 1)  # past the warm-up: the policy moves too
    assert any(
        not torch.equal(before[k], v)
        for k, v in algo.agent.net.state_dict().items()
        if not k.startswith("value_head")
    )
