"""Helpers of the rollout controller tests: settings with compressed time, and a stand-in for
the orchestrator's traffic that routes sessions exactly as replicas do
(:func:`podium.rollout.route`), runs each on its arm's rule engine in the real simulator under
the session seed (the same machinery twins use, so a twin reproduces its session), and
publishes its Trajectory (with its executions: what a statistics store records) and
ScoredTrajectory the way orchestrator_svc and reward_svc do. ``true_pool``: the sub-agents
behave otherwise than the pool spec says (a drift), as subagent_svc makes them."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from learner_svc.rollout.app import RolloutApp
from learner_svc.rollout.config import ControllerSettings
from podium import codec
from podium.bus import Bus
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.spec import PoolSpec, default_pool
from podium.envs.swarm.trajectory import task_to_proto
from podium.rollout import advance, pause, propose, resume, route
from podium.rollout.twins import TwinCase, TwinEvaluator, rule_twin
from podium.v1 import reward_pb2, rollout_pb2, trajectory_pb2

K = rollout_pb2.TransitionKind


def settings(unique: Callable[[str], str], **overrides: Any) -> ControllerSettings:
    """Test settings: compressed time, small windows, topics of the test's own."""
    base: dict[str, Any] = {
        "stage_min_sessions": 5,
        "stage_min_s": 0.0,
        "shadow_window": 20,
        "shadow_min_sessions": 5,
        "shadow_max_sessions": 400,
        "guardrail_min_sessions": 5,
        "offline_sessions": 10,
        "cycle_s": 1e9,
        "tick_s": 0.05,
        "review_sample_bp": 10000,  # every canary session at 20%: the test is deterministic
        "group_id": f"rollout.{unique('group')}",
        "topic": unique("rollout"),
        "in_topic": unique("scored"),
        "trajectories_topic": unique("trajectories"),
        "policy_topic": unique("policy"),
        "grpc_host": "127.0.0.1",
        "grpc_port": 0,
    }
    base.update(overrides)
    return ControllerSettings(**base)


def app(settings: ControllerSettings, bus: Bus, name: str = "a", **kw: Any) -> RolloutApp:
    """A controller app (no gRPC unless asked)."""
    kw.setdefault("serve_grpc", False)
    return RolloutApp(settings, bus, instance=f"rollout-test-{name}", shutdown_timeout_s=10, **kw)


async def until(check: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    """Wait for ``check()`` to hold."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)


@dataclass
class Traffic:
    """Sessions routed by a rollout state and published as scored trajectories."""

    bus: Bus
    settings: ControllerSettings
    pool: PoolSpec = field(default_factory=default_pool)
    n_subtasks: int = 6
    sent: int = 0
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    true_pool: PoolSpec | None = None

    def __post_init__(self) -> None:
        self.evaluator = TwinEvaluator(self.pool, batch=64, true_pool=self.true_pool)

    def sessions(
        self, state: rollout_pb2.RolloutState | None, count: int
    ) -> list[reward_pb2.ScoredTrajectory]:
        """``count`` new sessions under ``state``, each run by its arm's version."""
        ids = [f"{self.tag}-{self.sent + i}" for i in range(count)]
        self.sent += count
        routes = {sid: route(sid, state, cold_start=self.settings.cold_start) for sid in ids}
        cases = {sid: self._case(sid, i) for i, sid in enumerate(ids, start=self.sent)}
        by_version: dict[str, list[str]] = {}
        for sid, r in routes.items():
            by_version.setdefault(r.version, []).append(sid)
        out: dict[str, reward_pb2.ScoredTrajectory] = {}
        for version, sids in by_version.items():
            ran = self.evaluator.trajectories(rule_twin(version), [cases[s] for s in sids])
            for sid, o in zip(sids, ran, strict=True):
                traj = trajectory_pb2.Trajectory(
                    trajectory_id=sid,
                    session_id=sid,
                    env="swarm",
                    task=task_to_proto(cases[sid].task),
                    latency=o.latency,
                    lower_bound=o.lower_bound,
                    completed=o.completed,
                    policy_version=version,
                    arm=routes[sid].arm(),
                    agents=o.agents,
                    executions=o.executions,
                )
                traj.labels["seed"] = str(cases[sid].seed)
                traj.labels["arm"] = routes[sid].label
                total = math.fsum(d.env_reward for d in o.decisions)
                out[sid] = reward_pb2.ScoredTrajectory(trajectory=traj, total=total)
        return [out[s] for s in ids]

    def _case(self, sid: str, i: int) -> TwinCase:
        shape = ("fanout", "diamond", "layered")[i % 3]
        seed = 1000 + i
        task = generate_task(shape, self.n_subtasks, seed, name=f"t{i}")
        return TwinCase(sid, task, seed)

    async def publish(
        self, state: rollout_pb2.RolloutState | None, count: int, *, recorded: bool = True
    ) -> list[reward_pb2.ScoredTrajectory]:
        """Run ``count`` sessions and publish them (trajectories too when ``recorded``)."""
        scored = await asyncio.to_thread(self.sessions, state, count)
        for s in scored:
            sid = s.trajectory.session_id
            if recorded:
                _, raw = codec.encode_event(s.trajectory, producer="test-orchestrator", key=sid)
                await self.bus.publish(self.settings.trajectories_topic, raw, key=sid)
            _, raw = codec.encode_event(s, producer="test-reward", key=sid)
            await self.bus.publish(self.settings.in_topic, raw, key=sid)
        return scored


def proposing(version: str) -> Callable[[rollout_pb2.RolloutState, datetime], Any]:
    def apply(state: rollout_pb2.RolloutState, now: datetime) -> Any:
        return propose(state, version, "test proposal", "operator:test", now)

    return apply


def pausing(state: rollout_pb2.RolloutState, now: datetime) -> Any:
    return pause(state, "test: hold automatic steps", "operator:test", now)


def resuming(state: rollout_pb2.RolloutState, now: datetime) -> Any:
    return resume(state, "test: go on", "operator:test", now)


def overriding(state: rollout_pb2.RolloutState, now: datetime) -> Any:
    return advance(state, None, now, actor="operator:test", override=True)


def kinds(transitions: Any) -> list[int]:
    """Kinds of ``transitions``, in order."""
    return [t.kind for t in transitions]
