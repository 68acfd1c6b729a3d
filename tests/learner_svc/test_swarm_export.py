"""The learner's ONNX export into the Triton model repository (``PODIUM_MODEL_REPOSITORY``):
each published version >= 1 lands in ``<repo>/swarm_policy/<version>/model.onnx`` and its
``PolicyUpdated`` names it (``onnx_uri``, ``onnx_sha256``); re-publishing a version after a
restart reuses the same file; a different network under an existing version is refused; the
embedded trainer's versions are exported the same way."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from learner_svc.algorithms.swarm import SwarmPPO, SwarmSample, SwarmSettings, swarm_layout
from learner_svc.loop import LearningLoop, LoopConfig
from podium import codec, topics
from podium.bus import InProcBus
from podium.bus.consumer import EventPublisher
from podium.config import from_env
from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.errors import ArtifactError
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import load_weights, path_from_uri, sha256_file
from podium.policy.rollout import Job, run_episodes
from podium.policy.signing import TrustedKeys, ensure_key_pair
from podium.policy.swarm import (
    MODEL_NAME,
    build_swarm_policy,
    export_swarm_policy,
    serving_signature,
)
from podium.serving.contract import random_inputs
from podium.serving.export import onnx_session, torch_forward
from podium.v1 import reward_pb2


def learner(tmp_path: Path, bus: InProcBus) -> LearningLoop[SwarmSample]:
    settings = SwarmSettings(
        artifacts_dir=str(tmp_path / "artifacts"),
        model_repository=str(tmp_path / "models"),
        signing_key=str(ensure_key_pair(tmp_path / "keys").private_path),
    )
    loop = LoopConfig(
        checkpoint_dir=tmp_path / "ckpt",
        group_id="sx.learner",
        batch_trajectories=4,
        max_policy_lag=5,
    )
    return LearningLoop(loop, SwarmPPO.from_settings(settings), bus)


async def publish_samples(bus: InProcBus, agent: SwarmAgent, n: int) -> None:
    """``n`` on-policy (sampled) scored trajectories of version 0."""
    tasks = generate_suite(4, seed=6, sizes=(4, 7))
    envs = [SwarmEnv(tasks, default_pool(), EnvConfig(max_subtasks=64, invalid_action="raise"))]
    _, trajs = run_episodes(
        envs,
        [Job(tasks[i % len(tasks)], 30 + i) for i in range(n)],
        agent=agent,
        generator=torch.Generator().manual_seed(1),
        with_trajectories=True,
    )
    pub = EventPublisher(bus, producer_name="reward-test")
    for i, t in enumerate(trajs):
        t.policy_version = "0"
        t.session_id = t.trajectory_id = f"x-{i}"
        t.labels["actions"] = "sampled"
        scored = reward_pb2.ScoredTrajectory(trajectory=t, total=0.2, reward_version="test")
        await pub.publish(topics.SCORED_TRAJECTORIES, scored, key=t.session_id)


def assert_onnx_is_the_version(event: reward_pb2.PolicyUpdated, repository: Path) -> None:
    """The announced ONNX file is in the repository's layout, hashes as announced (and as its
    sidecar says), and computes what the announced weights compute."""
    path = path_from_uri(event.onnx_uri)
    assert path == (repository / MODEL_NAME / str(event.version) / "model.onnx").resolve()
    assert sha256_file(path) == event.onnx_sha256
    assert path.with_name("model.onnx.sha256").read_text().split()[0] == event.onnx_sha256
    net, _ = build_swarm_policy(load_weights(path_from_uri(event.uri), event.sha256))
    inputs = random_inputs(serving_signature(net), 4, 9, np.random.default_rng(0))
    got = onnx_session(path).run(None, inputs.arrays())
    for g, w in zip(got, torch_forward(net, inputs), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)


async def test_learner_exports_each_published_version_and_announces_it(tmp_path: Path) -> None:
    layout = swarm_layout(default_pool(), 64)
    torch.manual_seed(2)
    behaviour = SwarmAgent(layout)
    bus = InProcBus()
    await bus.start()
    watch = bus.subscriber([topics.POLICY_UPDATES], "sx.watch")
    await watch.start()
    repository = tmp_path / "models"
    try:
        loop = learner(tmp_path, bus)
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop=stop))
        await publish_samples(bus, behaviour, 4)
        async with loop.updated:
            await asyncio.wait_for(
                loop.updated.wait_for(lambda: loop.state.policy_version >= 1), 60
            )
        stop.set()
        await asyncio.wait_for(task, 30)
        events = [
            codec.decode_event(r.value, reward_pb2.PolicyUpdated)[1]
            for r in await watch.fetch(10, 0.5)
        ]
        assert [e.version for e in events] == [0, 1]
        # Version 0 (the starting weights) is not exported: Triton versions start at 1.
        assert events[0].onnx_uri == events[0].onnx_sha256 == ""
        assert not (repository / MODEL_NAME / "0").exists()
        assert_onnx_is_the_version(events[1], repository)
        # Signed with the learner's key over model, version, weights and ONNX hashes.
        trusted = TrustedKeys.load(str(ensure_key_pair(tmp_path / "keys").public_path))
        for event in events:
            trusted.verify(event)
        assert (repository / MODEL_NAME / "config.pbtxt").is_file()

        # A restarted learner re-announces version 1 from its checkpoint: same ONNX file.
        again = learner(tmp_path, bus)
        stop = asyncio.Event()
        stop.set()  # announce, then stop at once
        await asyncio.wait_for(again.run(stop=stop), 30)
        (re_announced,) = [
            codec.decode_event(r.value, reward_pb2.PolicyUpdated)[1]
            for r in await watch.fetch(10, 0.5)
        ]
        assert re_announced.version == 1
        assert re_announced.onnx_uri == events[1].onnx_uri
        assert re_announced.onnx_sha256 == events[1].onnx_sha256
        trusted.verify(re_announced)
    finally:
        await watch.stop()
        await bus.stop()


def test_export_is_idempotent_for_the_same_weights_and_immutable_otherwise(
    tmp_path: Path,
) -> None:
    layout = swarm_layout(default_pool(), 64)
    torch.manual_seed(3)
    net = SwarmAgent(layout).net
    first = export_swarm_policy(net, tmp_path, 2)
    assert first.path == (tmp_path / MODEL_NAME / "2" / "model.onnx").resolve()
    again = export_swarm_policy(net, tmp_path, 2)
    assert (again.path, again.sha256) == (first.path, first.sha256)
    torch.manual_seed(4)
    other = SwarmAgent(layout).net
    with pytest.raises(ArtifactError, match="already exists with other weights"):
        export_swarm_policy(other, tmp_path, 2)
    # A file whose bytes no longer match their sidecar is never taken for the version.
    first.path.write_bytes(first.path.read_bytes() + b"\0")
    with pytest.raises(ArtifactError, match=r"do not match model\.onnx\.sha256"):
        export_swarm_policy(net, tmp_path, 2)
    with pytest.raises(ArtifactError, match="must be >= 1"):
        export_swarm_policy(net, tmp_path, 0)


def test_model_repository_setting_is_off_by_default() -> None:
    env = {"PODIUM_LEARNER_ARTIFACTS": "/artifacts"}
    assert from_env(SwarmSettings, env).model_repository == ""
    cfg = from_env(SwarmSettings, {**env, "PODIUM_MODEL_REPOSITORY": "/models"})
    assert cfg.model_repository == "/models"
