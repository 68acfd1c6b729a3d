"""Scouting in the orchestrator (``PODIUM_SCOUT=on``): a learned session that takes the argmax
sends a start to an agent the statistics store has hardly seen where the schedule's slack
absorbs it; its trajectory says how many decisions the scout changed and carries no training
tensors (its actions are not all the network's); sampled sessions never scout. No broker:
the in-process bus, with a real subagent_svc."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from signing_helpers import key_pair
from test_learned_policy import (
    announce,
    fresh_policy,
    learned_orchestrator,
    run_session,
    wait_version,
)

from learner_svc.algorithms.swarm import is_on_policy_sample
from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from orchestrator_svc.learned import SCOUTED_LABEL, ScoutedSessionPolicy, SessionLearnedPolicy
from podium.bus import InProcBus
from podium.config import from_env
from podium.envs.swarm import TaskSpec, default_tasks
from podium.errors import ConfigError
from podium.policy.signing import KeyPair
from podium.v1 import task_pb2


def test_the_setting_is_read_and_checked() -> None:
    env = {"PODIUM_BUS": "kafka://127.0.0.1:9"}
    assert from_env(OrchestratorConfig, env).scout is False
    assert from_env(OrchestratorConfig, {**env, "PODIUM_SCOUT": "on"}).scout is True
    with pytest.raises(ConfigError, match="PODIUM_SCOUT"):
        from_env(OrchestratorConfig, {**env, "PODIUM_SCOUT": "sometimes"})


@pytest.fixture
async def scouting(tmp_path: Path) -> AsyncIterator[tuple[InProcBus, OrchestratorApp, KeyPair]]:
    keys = key_pair(tmp_path / "keys")
    async with learned_orchestrator(keys, "sc", scout=True) as (bus, orch):
        yield bus, orch, keys


@pytest.fixture
async def plain(tmp_path: Path) -> AsyncIterator[tuple[InProcBus, OrchestratorApp, KeyPair]]:
    keys = key_pair(tmp_path / "keys")
    async with learned_orchestrator(keys, "sc") as (bus, orch):
        yield bus, orch, keys


async def _serve_a_version(
    bus: InProcBus, orch: OrchestratorApp, keys: KeyPair, tmp_path: Path
) -> None:
    """An untrained version 1, announced and loaded."""
    ref, _ = fresh_policy(tmp_path / "artifacts", 1, seed=4)
    await announce(bus, ref, keys)
    await wait_version(orch, 1)


def _layered() -> list[TaskSpec]:
    """The shipped layered tasks (test subtasks off the critical path, room to scout) of up
    to 45 subtasks. Not the 60-subtask one: its trajectory under an untrained network (about
    880 KB) is so near ``PODIUM_MAX_TRAJECTORY_BYTES`` (900 KiB) that a loaded machine's few
    extra WAIT decisions get it trimmed, tensors first, which these tests would misread."""
    return [t for t in default_tasks() if t.name.startswith("layered") and len(t.subtasks) <= 45]


async def test_argmax_sessions_scout_until_the_store_has_seen_the_agents(
    scouting: tuple[InProcBus, OrchestratorApp, KeyPair], tmp_path: Path
) -> None:
    bus, orch, keys = scouting
    await _serve_a_version(bus, orch, keys, tmp_path)
    assert orch.learned is not None and orch.stats is not None
    submitted = task_pb2.TaskSubmitted(session_id="s-1", submitted_by="grpc:ide")
    assert isinstance(orch.learned.for_session(submitted), ScoutedSessionPolicy)
    trainer = task_pb2.TaskSubmitted(session_id="s-1", submitted_by="trainer:t")
    assert type(orch.learned.for_session(trainer)) is SessionLearnedPolicy

    # A fresh store has seen no agent: the first argmax sessions scout.
    scouted: list[int] = []
    for seed, task in enumerate(_layered() * 2):
        traj = await run_session(bus, orch, task, seed, "grpc:ide")
        assert traj.policy_version == "1" and traj.labels["actions"] == "argmax"
        assert traj.labels["policy"] == "learned+scout"
        assert all(d.policy_version == "1" for d in traj.decisions)
        n = int(traj.labels.get(SCOUTED_LABEL, "0"))
        scouted.append(n)
        # A scouted session's actions are not all the network's: no training tensors.
        recorded = [bool(d.observation_tensor) for d in traj.decisions]
        assert not any(recorded) if n else all(recorded), (n, recorded)
        assert not is_on_policy_sample(dict(traj.labels), traj.policy_version)
    assert scouted[0] >= 1, scouted
    # Every agent a scout tried is now in the store, so scouting dies out.
    assert sum(scouted[len(scouted) // 2 :]) < sum(scouted[: len(scouted) // 2]), scouted

    # Sampled sessions never scout: PPO needs the network's own actions and log-probs.
    for seed in range(50, 53):
        traj = await run_session(bus, orch, _layered()[0], seed, "trainer:t")
        assert traj.labels["actions"] == "sampled" and SCOUTED_LABEL not in traj.labels
        assert all(d.observation_tensor for d in traj.decisions)


async def test_off_by_default_nothing_scouts(
    plain: tuple[InProcBus, OrchestratorApp, KeyPair], tmp_path: Path
) -> None:
    bus, orch, keys = plain
    await _serve_a_version(bus, orch, keys, tmp_path)
    for seed, task in enumerate(_layered()):
        traj = await run_session(bus, orch, task, seed, "grpc:ide")
        assert traj.labels["policy"] == "learned" and SCOUTED_LABEL not in traj.labels
        assert all(d.observation_tensor for d in traj.decisions)
