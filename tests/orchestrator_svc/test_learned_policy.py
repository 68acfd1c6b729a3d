"""orchestrator_svc with ``PODIUM_POLICY=learned`` and ``PODIUM_ROLLOUT=latest``: cold start
on cpls, hot swap from PolicyUpdated events, a rejected version leaves the previous one
serving, sampling for training sessions, and training tensors byte-identical to the embedded
trainer's for the same session (routing by the rollout state: test_arms.py)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from signing_helpers import key_pair, signed, trusted

from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from orchestrator_svc.learned import LearnedPolicySource
from podium import topics
from podium.bus import InProcBus
from podium.bus.consumer import EventPublisher
from podium.envs.swarm import EnvConfig, SwarmEnv, TaskSpec, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.envs.swarm.simulator import SwarmSimulator
from podium.envs.swarm.spec import PoolSpec
from podium.envs.swarm.state import StateConfig
from podium.envs.swarm.trajectory import task_to_proto
from podium.observed import AgentStats
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import ArtifactRef
from podium.policy.decisions import episode_from_trajectory
from podium.policy.network import SwarmPolicyNet
from podium.policy.rollout import Job, run_episodes
from podium.policy.signing import KeyPair
from podium.policy.swarm import MODEL_NAME, save_policy
from podium.v1 import reward_pb2, task_pb2, trajectory_pb2
from subagent_svc import SubagentApp, SubagentConfig


class SeededEnv(SwarmEnv):
    """The simulator seeded the way the orchestrator seeds a session (with the session seed)."""

    session_seed = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        _, info = super().reset(seed=seed, options=options)
        sim = SwarmSimulator(
            self.task,
            self.pool,
            seed=self.session_seed,
            config=StateConfig(loop_retry_limit=self.config.loop_retry_limit),
        )
        return self.use_simulator(sim), info


@pytest.fixture
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    """The learner's key pair; the orchestrator trusts its public half."""
    return key_pair(tmp_path_factory.mktemp("keys"))


@contextlib.asynccontextmanager
async def learned_orchestrator(
    keys: KeyPair, group: str, **settings: Any
) -> AsyncIterator[tuple[InProcBus, OrchestratorApp]]:
    """An orchestrator on ``PODIUM_POLICY=learned`` trusting ``keys``, with a real subagent_svc,
    on a fresh in-process bus; the newest loaded version serves (no rollout controller: hot
    swap). ``settings``: further :class:`OrchestratorConfig` fields."""
    bus = InProcBus()
    await bus.start()
    orch = OrchestratorApp(
        OrchestratorConfig(
            bus_url="embedded",
            group_id=f"{group}.orchestrator",
            policy="learned",
            rollout="latest",
            policy_trusted_keys=str(keys.public_path),
            session_timeout_s=20.0,
            shutdown_timeout_s=5.0,
            **settings,
        ),
        bus,
        serve_grpc=False,
    )
    worker = SubagentApp(
        SubagentConfig(bus_url="embedded", group_id=f"{group}.subagent", shutdown_timeout_s=5.0),
        bus,
    )
    await worker.start()
    await orch.start()
    try:
        yield bus, orch
    finally:
        await orch.stop()
        await worker.stop()
        await bus.stop()


@pytest.fixture
async def learned_stack(keys: KeyPair) -> AsyncIterator[tuple[InProcBus, OrchestratorApp]]:
    async with learned_orchestrator(keys, "lt") as stack:
        yield stack


def tasks() -> list[TaskSpec]:
    return generate_suite(6, seed=3, sizes=(4, 9))


def fresh_policy(root: Path, version: int, seed: int) -> tuple[ArtifactRef, SwarmAgent]:
    env = SwarmEnv(tasks(), default_pool(), EnvConfig(max_subtasks=64))
    torch.manual_seed(seed)
    agent = SwarmAgent(env.layout)
    ref = save_policy(agent.net, root, version, tuple(env.layout.agents), max_subtasks="64")
    return ref, agent


async def announce(
    bus: InProcBus, ref: ArtifactRef, keys: KeyPair, *, sha256: str | None = None
) -> None:
    """The learner's signed announcement of ``ref`` (with ``sha256`` instead of its hash: a
    learner that announced a hash its file does not have)."""
    event = reward_pb2.PolicyUpdated(
        model_name=MODEL_NAME, version=ref.version, uri=ref.uri, sha256=sha256 or ref.sha256
    )
    await publish_event(bus, signed(event, keys))


async def publish_event(bus: InProcBus, event: reward_pb2.PolicyUpdated) -> None:
    """Put ``event`` on the policy topic as it is."""
    await EventPublisher(bus, producer_name="test").publish(
        topics.POLICY_UPDATES, event, key=MODEL_NAME
    )


async def run_session(
    bus: InProcBus, orch: OrchestratorApp, task: TaskSpec, seed: int, submitted_by: str
) -> trajectory_pb2.Trajectory:
    sid = f"s-{submitted_by}-{seed}-{uuid.uuid4().hex[:8]}"
    await EventPublisher(bus, producer_name="test").publish(
        topics.TASKS,
        task_pb2.TaskSubmitted(
            session_id=sid, task=task_to_proto(task), submitted_by=submitted_by, seed=seed
        ),
        key=sid,
    )
    for _ in range(400):
        handle = orch.session(sid)
        if handle is not None and handle.trajectory is not None:
            return handle.trajectory
        await asyncio.sleep(0.025)
    raise AssertionError(f"session {sid} did not finish")


async def wait_version(orch: OrchestratorApp, version: int) -> None:
    assert orch.learned is not None
    for _ in range(200):
        if orch.learned.version == version:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"orchestrator serves {orch.learned.version}, expected {version}")


async def wait_for_store(orch: OrchestratorApp, mirror: AgentStats) -> None:
    """Until the orchestrator's statistics store holds what ``mirror`` does (its follower
    records each session's trajectory shortly after the session ends)."""
    assert orch.stats is not None
    for _ in range(200):
        if orch.stats.to_dict() == mirror.to_dict():
            return
        await asyncio.sleep(0.025)
    raise AssertionError("the orchestrator's statistics store did not record the sessions")


async def test_cold_start_then_hot_swap_and_rejected_versions(
    learned_stack: tuple[InProcBus, OrchestratorApp], keys: KeyPair, tmp_path: Path
) -> None:
    bus, orch = learned_stack
    task = tasks()[0]
    cold = await run_session(bus, orch, task, 5, "grpc:ide")
    assert cold.policy_version == "rules:cpls"
    assert {d.policy_version for d in cold.decisions} == {"rules:cpls"}
    assert not any(d.observation_tensor for d in cold.decisions)

    ref1, _ = fresh_policy(tmp_path, 1, seed=1)
    await announce(bus, ref1, keys)
    await wait_version(orch, 1)
    first = await run_session(bus, orch, task, 5, "grpc:ide")
    assert first.policy_version == "1" and first.labels["actions"] == "argmax"

    # A tampered announcement (wrong sha256) is refused; version 1 keeps serving.
    ref2, _ = fresh_policy(tmp_path, 2, seed=2)
    await announce(bus, ref2, keys, sha256="0" * 64)
    await asyncio.sleep(0.3)
    assert orch.learned is not None and orch.learned.version == 1
    assert "sha256 mismatch" in str(orch.learned.holder.last_error)
    again = await run_session(bus, orch, task, 6, "grpc:ide")
    assert again.policy_version == "1"

    # The genuine announcement of version 2 swaps; a late version-1 event cannot roll back.
    await announce(bus, ref2, keys)
    await wait_version(orch, 2)
    await announce(bus, ref1, keys)
    await asyncio.sleep(0.2)
    assert orch.learned.version == 2
    assert (await run_session(bus, orch, task, 7, "grpc:ide")).policy_version == "2"


async def test_training_sessions_sample_and_match_the_embedded_trainer_bytes(
    learned_stack: tuple[InProcBus, OrchestratorApp], keys: KeyPair, tmp_path: Path
) -> None:
    bus, orch = learned_stack
    ref, agent = fresh_policy(tmp_path, 1, seed=4)
    await announce(bus, ref, keys)
    await wait_version(orch, 1)
    pool = default_pool()
    # The orchestrator's sessions read its statistics store (fed by every session's
    # trajectory), so the embedded side reads a mirror fed the same trajectories, once the
    # orchestrator's store has caught up with them: parity of the estimated columns too.
    assert orch.stats is not None
    mirror = orch.stats.copy()
    for i, task in enumerate(tasks()[:3]):
        seed = 100 + i
        await wait_for_store(orch, mirror)
        served = await run_session(bus, orch, task, seed, "eval:x")
        # The embedded trainer's recording of the same session (argmax, same simulator seed).
        env = SeededEnv(
            [task],
            pool,
            EnvConfig(max_subtasks=64, invalid_action="raise", feed_stats=False),
            stats=mirror.copy(),
        )
        env.session_seed = seed
        mirror.record_trajectory(served)
        _, (embedded,) = run_episodes(
            [env], [Job(task, 0)], agent=agent, greedy=True, with_trajectories=True
        )
        assert len(served.decisions) == len(embedded.decisions) > 0
        for d_s, d_e in zip(served.decisions, embedded.decisions, strict=True):
            assert d_s.action.index == d_e.action.index
            assert d_s.observation_tensor == d_e.observation_tensor
            assert d_s.action_mask == d_e.action_mask
            assert d_s.log_prob == d_e.log_prob and d_s.value == d_e.value
            assert d_s.env_reward == d_e.env_reward
        assert served.latency == pytest.approx(embedded.latency)

    # Training sessions sample: over a few seeds, some action differs from the argmax one,
    # and every trajectory decodes into a learner episode on version 1.
    task = tasks()[1]
    layout = agent.layout
    differs = 0
    for seed in range(200, 206):
        sampled = await run_session(bus, orch, task, seed, "trainer:x")
        greedy = await run_session(bus, orch, task, seed, "eval:y")
        assert sampled.labels["actions"] == "sampled"
        ep = episode_from_trajectory(
            sampled, layout.slot_features, layout.global_token_features, len(layout.agents)
        )
        assert ep.policy_version == 1 and ep.length == len(sampled.decisions)
        assert np.all(ep.log_probs <= 0)
        differs += [d.action.index for d in sampled.decisions] != [
            d.action.index for d in greedy.decisions
        ]
    assert differs > 0


async def test_any_pool_loads_and_a_version_of_other_widths_is_refused(
    keys: KeyPair, tmp_path: Path
) -> None:
    """A version trained on another pool (other names, another size) loads: the network reads
    agents by features. A network whose input widths are not the sessions' observation's is
    refused at load, naming the fix, and the previous version keeps serving."""
    source = LearnedPolicySource(default_pool().agent_names(), trusted=trusted(keys))
    other = SwarmEnv(tasks()[:1], four_agents(), EnvConfig(max_subtasks=64))
    torch.manual_seed(1)
    trained_elsewhere = SwarmAgent(other.layout, d_model=16, layers=1)
    ref = save_policy(trained_elsewhere.net, tmp_path, 1, tuple(other.layout.agents))
    event = reward_pb2.PolicyUpdated(
        model_name=MODEL_NAME, version=1, uri=ref.uri, sha256=ref.sha256
    )
    assert await source.on_policy_updated(signed(event, keys))
    assert source.holder.current().policy.agents == tuple(other.layout.agents)

    cfg = trained_elsewhere.net.config
    wider = SwarmPolicyNet(replace(cfg, pair_features=cfg.pair_features + 1))
    ref2 = save_policy(wider, tmp_path, 2, tuple(other.layout.agents))
    event2 = reward_pb2.PolicyUpdated(
        model_name=MODEL_NAME, version=2, uri=ref2.uri, sha256=ref2.sha256
    )
    assert not await source.on_policy_updated(signed(event2, keys))
    assert source.version == 1
    assert "retrain it for this observation" in str(source.holder.last_error)


def four_agents() -> PoolSpec:
    """A 4-agent pool under names the default pool does not have."""
    base = {a.name: a for a in default_pool().agents}
    picked = ("backend", "infra-specialist", "qa", "generalist")
    agents = tuple(replace(base[n], name=f"other-{n}") for n in picked)
    return replace(default_pool(), name="four", agents=agents)
