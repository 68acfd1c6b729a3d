"""``PODIUM_POLICY_BACKEND`` without a server: the setting's checks, the served session policy's
plumbing (featurisation, choice, recording) against the local one with an in-process backend,
and what the orchestrator refuses before it would ever ask a server to load a version.

The same paths against a real KServe-V2 server: tests/serving/test_orchestrator_served.py.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import torch
from signing_helpers import key_pair, signed, trusted

from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from orchestrator_svc.learned import (
    LearnedPolicySource,
    SessionLearnedPolicy,
    SessionServedPolicy,
    SwarmPolicy,
)
from orchestrator_svc.policy import PolicyStep
from podium.bus import InProcBus
from podium.config import from_env
from podium.envs.swarm import EnvConfig, SwarmEnv, TaskSpec, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.errors import ArtifactError, ConfigError, ProcessingError
from podium.policy.agent import SwarmAgent
from podium.policy.holder import Served
from podium.policy.swarm import (
    MODEL_NAME,
    export_swarm_policy,
    save_policy,
    serving_signature,
    swarm_policy_updated,
)
from podium.serving.backends import LocalPolicy, ServedPolicy
from podium.v1 import reward_pb2

BUS = {"PODIUM_BUS": "kafka://127.0.0.1:9092"}


def test_backend_setting_is_checked_and_names_the_variables() -> None:
    cfg = from_env(
        OrchestratorConfig,
        {**BUS, "PODIUM_POLICY": "learned", "PODIUM_POLICY_BACKEND": "v2://triton:8001"},
    )
    assert cfg.policy_backend == "v2://triton:8001"
    assert from_env(OrchestratorConfig, BUS).policy_backend == "local"
    for bad in ("grpc://triton:8001", "v2://triton", "v2://:8001", "v2://h:70000", "torch"):
        with pytest.raises(ConfigError, match="PODIUM_POLICY_BACKEND"):
            from_env(
                OrchestratorConfig,
                {**BUS, "PODIUM_POLICY": "learned", "PODIUM_POLICY_BACKEND": bad},
            )
    # A served backend runs the learned policy; with a rule engine it would be ignored.
    with pytest.raises(ConfigError, match="PODIUM_POLICY=learned"):
        from_env(OrchestratorConfig, {**BUS, "PODIUM_POLICY_BACKEND": "v2://triton:8001"})
    # Configs built in code are checked too.
    with pytest.raises(ConfigError, match="PODIUM_POLICY_BACKEND"):
        OrchestratorConfig(bus_url="embedded", policy="learned", policy_backend="nope")
    with pytest.raises(ConfigError, match="PODIUM_SERVING_TIMEOUT_S"):
        from_env(OrchestratorConfig, {**BUS, "PODIUM_SERVING_TIMEOUT_S": "0"})


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_start_fails_naming_the_backend_when_no_server_answers(tmp_path: Path) -> None:
    bus = InProcBus()
    await bus.start()
    backend = f"v2://127.0.0.1:{closed_port()}"
    orch = OrchestratorApp(
        OrchestratorConfig(
            bus_url="embedded",
            policy="learned",
            policy_trusted_keys=str(key_pair(tmp_path).public_path),
            policy_backend=backend,
            serving_ready_timeout_s=0.5,
        ),
        bus,
        serve_grpc=False,
    )
    try:
        with pytest.raises(ProcessingError, match=f"PODIUM_POLICY_BACKEND={backend}") as info:
            await orch.start()
        assert info.value.retriable  # the server may just not be up yet: a restart may fix it
    finally:
        await bus.stop()


def tasks() -> list[TaskSpec]:
    return generate_suite(4, seed=8, sizes=(5, 10))


def fresh_agent(seed: int) -> SwarmAgent:
    torch.manual_seed(seed)
    return SwarmAgent(SwarmEnv(tasks(), default_pool(), EnvConfig(max_subtasks=64)).layout)


def play(
    policy: SessionLearnedPolicy, task: TaskSpec, seed: int, *, use_async: bool = False
) -> list[PolicyStep]:
    """One simulated session of ``task`` decided by ``policy``."""
    env = SwarmEnv([task], default_pool(), policy.env_config(len(task.subtasks)))
    env.reset(seed=seed, options={"task": task})
    steps: list[PolicyStep] = []
    done = False
    while not done:
        if use_async:
            assert isinstance(policy, SessionServedPolicy)
            step = asyncio.run(policy.act_async(env))
        else:
            step = policy.act(env)
        steps.append(step)
        _, _, terminated, truncated, _ = env.step(step.action)
        done = terminated or truncated
    return steps


@pytest.mark.parametrize("sample", [False, True])
def test_served_session_policy_decides_as_the_local_one_given_the_same_logits(
    sample: bool,
) -> None:
    """With an in-process backend computing the same logits, the served session policy's
    featurisation, choice and sampling reproduce the local policy's decisions exactly."""
    agent = fresh_agent(3)
    agents = tuple(agent.layout.agents)
    snapshot = Served(7, SwarmPolicy(agent.net, agents, 64), sha256="", source="")
    backend = LocalPolicy(agent.net, serving_signature(agent.net), version="7")
    for i, task in enumerate(tasks()):
        local = SessionLearnedPolicy(snapshot, sample=sample, seed=100 + i)
        served = SessionServedPolicy(snapshot, backend, sample=sample, seed=100 + i)
        want = play(local, task, seed=i)
        got = play(served, task, seed=i, use_async=i % 2 == 1)
        assert got == want and len(got) > 3
        assert served.versions == [7] * len(got)
        # The same recorded training data (observations, masks, actions, log-probs, values).
        rewards = [0.0] * len(got)
        assert served.training_record(rewards).data == local.training_record(rewards).data


def test_a_server_reporting_no_version_number_is_an_error() -> None:
    agent = fresh_agent(4)
    snapshot = Served(1, SwarmPolicy(agent.net, tuple(agent.layout.agents), 64), "", "")
    backend = LocalPolicy(agent.net, serving_signature(agent.net), version="latest")
    policy = SessionServedPolicy(snapshot, backend, sample=False, seed=1)
    with pytest.raises(ProcessingError, match="model version 'latest'"):
        play(policy, tasks()[0], seed=0)


async def test_versions_a_served_backend_cannot_run_are_refused_before_the_server(
    tmp_path: Path,
) -> None:
    """No ONNX export, a tampered one: refused (previous version keeps serving) without a
    server call; a good one with the server unreachable: a retriable error, event retried."""
    agent = fresh_agent(5)
    agents = tuple(agent.layout.agents)
    backend = ServedPolicy(
        f"127.0.0.1:{closed_port()}", MODEL_NAME, serving_signature(agent.net), timeout_s=1.0
    )
    pair = key_pair(tmp_path / "keys")
    source = LearnedPolicySource(agents, trusted=trusted(pair), backend=backend)
    try:
        ref = save_policy(agent.net, tmp_path / "artifacts", 1, agents, max_subtasks="64")
        assert not await source.on_policy_updated(signed(swarm_policy_updated(ref), pair))
        assert "without an ONNX export" in str(source.holder.last_error)
        assert "PODIUM_MODEL_REPOSITORY" in str(source.holder.last_error)

        exported = export_swarm_policy(agent.net, tmp_path / "repo", 1)
        event = signed(swarm_policy_updated(ref, exported), pair)
        # Unsigned, or altered after signing: refused before any file or server is touched.
        unsigned = swarm_policy_updated(ref, exported)
        assert not await source.on_policy_updated(unsigned)
        assert "unsigned" in str(source.holder.last_error)
        altered = reward_pb2.PolicyUpdated()
        altered.CopyFrom(event)
        altered.onnx_sha256 = "0" * 64
        assert not await source.on_policy_updated(altered)
        assert "does not verify" in str(source.holder.last_error)
        # Signed, but the file does not hash to what was signed: refused as well.
        tampered = reward_pb2.PolicyUpdated()
        tampered.CopyFrom(event)
        tampered.onnx_sha256 = "0" * 64
        assert not await source.on_policy_updated(signed(tampered, pair))
        assert "sha256 mismatch" in str(source.holder.last_error)
        assert str(exported.path) in str(source.holder.last_error)

        # Weights tampered with (their announced hash no longer matches): refused as well.
        bad_weights = reward_pb2.PolicyUpdated()
        bad_weights.CopyFrom(event)
        bad_weights.sha256 = "1" * 64
        assert not await source.on_policy_updated(signed(bad_weights, pair))
        assert "sha256 mismatch" in str(source.holder.last_error)
        assert source.version is None  # still the cold-start rule engine

        with pytest.raises(ArtifactError) as info:
            await source.on_policy_updated(event)
        assert info.value.retriable and "UNAVAILABLE" in str(info.value)
        assert source.version is None
    finally:
        backend.close()
