"""The orchestrator's statistics store: fed by the sessions run through it (its own group on
the trajectory topic), read by every new session's environment and by cpls-online."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

import orchestrator_svc.app as app_module
from orchestrator_svc.app import OrchestratorApp
from orchestrator_svc.config import OrchestratorConfig
from orchestrator_svc.session import Session
from podium import topics
from podium.bus import InProcBus
from podium.bus.consumer import EventPublisher
from podium.config import from_env
from podium.envs.swarm.baselines import CplsOnlinePolicy
from podium.envs.swarm.spec import default_pool, default_tasks
from podium.envs.swarm.trajectory import task_to_proto
from podium.errors import ConfigError
from podium.observed import AgentStats
from podium.v1 import task_pb2, trajectory_pb2
from subagent_svc.app import SubagentApp
from subagent_svc.config import SubagentConfig

BUS = {"PODIUM_BUS": "kafka://127.0.0.1:9092"}


def test_settings_default_on_and_are_checked() -> None:
    cfg = from_env(OrchestratorConfig, BUS)
    assert cfg.agent_stats is True
    assert (cfg.agent_stats_half_life, cfg.agent_stats_prior_weight) == (200.0, 5.0)
    off = from_env(
        OrchestratorConfig,
        {
            **BUS,
            "PODIUM_AGENT_STATS": "off",
            "PODIUM_AGENT_STATS_HALF_LIFE": "50",
            "PODIUM_AGENT_STATS_PRIOR_WEIGHT": "2.5",
        },
    )
    assert (off.agent_stats, off.agent_stats_half_life, off.agent_stats_prior_weight) == (
        False,
        50.0,
        2.5,
    )
    for var in ("PODIUM_AGENT_STATS_HALF_LIFE", "PODIUM_AGENT_STATS_PRIOR_WEIGHT"):
        with pytest.raises(ConfigError, match=var):
            from_env(OrchestratorConfig, {**BUS, var: "0"})
    with pytest.raises(ConfigError, match="PODIUM_AGENT_STATS_HALF_LIFE"):
        OrchestratorConfig(bus_url="embedded", agent_stats_half_life=float("nan"))


async def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def services(
    inproc_bus: InProcBus, request: pytest.FixtureRequest
) -> AsyncIterator[OrchestratorApp]:
    """An orchestrator (its config overridden by the test's indirect parameter) and one
    sub-agent worker on the in-process bus."""
    overrides = getattr(request, "param", {})
    orch = OrchestratorApp(
        OrchestratorConfig(
            bus_url="embedded",
            group_id="stats.orchestrator",
            session_timeout_s=30.0,
            shutdown_timeout_s=5.0,
            **overrides,
        ),
        inproc_bus,
        serve_grpc=False,
    )
    worker = SubagentApp(
        SubagentConfig(bus_url="embedded", group_id="stats.subagent", shutdown_timeout_s=5.0),
        inproc_bus,
    )
    await worker.start()
    await orch.start()
    try:
        yield orch
    finally:
        await orch.stop()
        await worker.stop()


async def _run_sessions(
    orch: OrchestratorApp, n: int, task: str = "diamond-10"
) -> list[trajectory_pb2.Trajectory]:
    """``n`` sessions of ``task``, one after the other, each started once the store (if any)
    has recorded the ones before it; their trajectories."""
    spec = next(t for t in default_tasks() if t.name == task)
    publisher = EventPublisher(orch.bus, producer_name="test")
    out = []
    for seed in range(1, n + 1):
        sid = str(uuid.uuid4())
        await publisher.publish(
            topics.TASKS,
            task_pb2.TaskSubmitted(session_id=sid, task=task_to_proto(spec), seed=seed),
            key=sid,
        )
        await _wait_for(
            lambda s=sid: (h := orch.session(s)) is not None and h.trajectory is not None,  # type: ignore[misc]
            f"session {sid}",
        )
        handle = orch.session(sid)
        assert handle is not None and handle.trajectory is not None
        out.append(handle.trajectory)
        if (follower := orch.stats_follower) is not None:
            await _wait_for(lambda k=seed: follower.trajectories >= k, f"{seed} recorded")  # type: ignore[misc]
    return out


@pytest.mark.parametrize("services", [{"policy": "cpls-online"}], indirect=True)
async def test_the_store_fills_from_the_sessions_and_each_session_reads_it(
    services: OrchestratorApp, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    orch = services
    sessions: list[Session] = []

    class Recorded(Session):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            sessions.append(self)

    monkeypatch.setattr(app_module, "Session", Recorded)
    assert orch.stats is not None and orch.stats_follower is not None
    with caplog.at_level(logging.WARNING):
        trajs = await _run_sessions(orch, 3)
    assert orch.stats_follower.trajectories == 3

    direct = AgentStats()
    for t in trajs:
        direct.record_trajectory(t, split_overhead=default_pool().split_overhead)
    stats = orch.stats
    assert stats.version == direct.version == sum(len(t.executions) for t in trajs)
    assert stats.pairs() == direct.pairs()
    for agent, kind in direct.pairs():
        assert stats.observed(agent, kind) == pytest.approx(direct.observed(agent, kind))

    # Every session's environment reads the orchestrator's store and never feeds it (the
    # follower does: each execution is counted once).
    assert len(sessions) == 3
    assert all(s.env.stats is stats and not s.env.config.feed_stats for s in sessions)
    # cpls-online planned the later sessions on the estimates of the earlier ones.
    policy = orch.policy
    assert isinstance(policy, CplsOnlinePolicy)
    assert trajs[0].policy_version == "rules:cpls-online"
    last = policy.estimated(sessions[-1].env.state)
    assert last is not None
    assert any(p != q for p, q in zip(last.spec.agents, default_pool().agents, strict=True))
    assert not [r for r in caplog.records if "no statistics store" in r.message]


@pytest.mark.parametrize("services", [{"agent_stats": False}], indirect=True)
async def test_off_means_no_store_no_follower(services: OrchestratorApp) -> None:
    orch = services
    assert orch.stats is None and orch.stats_follower is None
    assert not any(".stats." in g for g in orch._own_groups())
    (traj,) = await _run_sessions(orch, 1)
    assert traj.executions
