"""``podium demo``: one task through all four services on the in-process bus.

The four services run as asyncio tasks in this process, exactly as they run as separate
processes against Kafka, only with :class:`~podium.bus.InProcBus` between them:

    SubmitTask (gRPC, loopback) -> orchestrator_svc -> SubtaskAssigned -> subagent_svc (xN)
    -> SubtaskResult -> orchestrator_svc -> Trajectory -> reward_svc -> ScoredTrajectory
    -> learner_svc

The demo is a real client of the orchestrator: it submits the task and streams the session
over gRPC on 127.0.0.1, then prints what each service did.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import grpc
import grpc.aio

from learner_svc.app import LearnerApp
from learner_svc.config import LearnerConfig
from orchestrator_svc.app import OrchestratorApp
from orchestrator_svc.config import OrchestratorConfig
from podium import topics
from podium.bus import InProcBus
from podium.bus.base import Bus
from podium.envs.swarm.spec import PoolSpec, default_pool, default_tasks_dir, load_pool
from podium.errors import PodiumError
from podium.rewards import default_config
from podium.service import start_metrics
from podium.telemetry import client_interceptors
from podium.v1 import (
    reward_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    subtask_pb2,
    trajectory_pb2,
)
from reward_svc.app import RewardApp
from reward_svc.config import RewardServiceConfig
from subagent_svc.app import SubagentApp
from subagent_svc.config import SubagentConfig

DEFAULT_TASK = "login-system.yaml"
"""The article's example task, shipped in ``podium/data/tasks``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task",
        type=Path,
        default=None,
        help=f"task spec file (JSON/YAML); default: the shipped {DEFAULT_TASK}",
    )
    parser.add_argument(
        "--pool", type=Path, default=None, help="pool spec file; default: the shipped pool"
    )
    parser.add_argument(
        "--policy",
        default="cpls",
        help="scheduling policy of the orchestrator: cpls, greedy, sequential (default cpls)",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the session (default 7)")
    parser.add_argument(
        "--workers", type=int, default=2, help="sub-agent worker members in the group (default 2)"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="give up after this many seconds (default 30)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the services' Prometheus metrics on this port (/metrics); default 0: none",
    )
    parser.add_argument(
        "--metrics-linger",
        type=float,
        default=0.0,
        help="keep the metrics endpoint up this many seconds after the run (default 0)",
    )


def run(args: argparse.Namespace) -> int:
    """The demo, with the embedded services' metrics served on ``--metrics-port`` (one
    endpoint: the four services share this process's meter provider, each labelled by its
    ``service``) from before the services start until ``--metrics-linger`` after the run."""
    if not 0 <= args.metrics_port <= 65535 or args.metrics_linger < 0:
        print(
            "podium demo: --metrics-port must be in 0..65535, --metrics-linger >= 0",
            file=sys.stderr,
        )
        return 2
    try:
        metrics = start_metrics("podium", args.metrics_port) if args.metrics_port else None
    except OSError as exc:
        print(f"podium demo: --metrics-port {args.metrics_port}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        return _run(args)
    finally:
        if metrics is not None:
            print(
                f"metrics: http://127.0.0.1:{metrics.port}/metrics "
                f"(for {args.metrics_linger:g} s more)",
                file=sys.stderr,
            )
            time.sleep(args.metrics_linger)
            metrics.stop()


def _run(args: argparse.Namespace) -> int:
    if args.workers < 1:
        print("podium demo: --workers must be >= 1", file=sys.stderr)
        return 2
    task_path: Path = args.task or (default_tasks_dir() / DEFAULT_TASK)
    try:
        text = task_path.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"podium demo: cannot read task file {task_path}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(
            asyncio.wait_for(
                run_demo(
                    text,
                    pool_path=args.pool,
                    policy=args.policy,
                    seed=args.seed,
                    workers=args.workers,
                ),
                args.timeout,
            )
        )
    except TimeoutError:
        print(f"podium demo: no result within {args.timeout:g}s", file=sys.stderr)
        return 1
    except PodiumError as exc:
        print(f"podium demo: {exc}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        print(f"podium demo: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    report.print(sys.stdout)
    return 0 if report.completed else 1


@dataclass
class DemoReport:
    """What each service did, collected while the demo ran."""

    task_name: str = ""
    pool_line: str = ""
    session_id: str = ""
    decisions: list[str] = field(default_factory=list)
    executions: list[tuple[str, subtask_pb2.SubtaskResult]] = field(default_factory=list)
    workers: dict[str, int] = field(default_factory=dict)
    result: session_service_pb2.SessionResult | None = None
    trajectory: trajectory_pb2.Trajectory | None = None
    scored: reward_pb2.ScoredTrajectory | None = None
    learner_line: str = ""
    stream_events: int = 0
    wall_s: float = 0.0

    @property
    def completed(self) -> bool:
        return self.result is not None and self.result.state == (
            session_service_pb2.SESSION_STATE_SUCCEEDED
        )

    def print(self, out: TextIO) -> None:
        w = out.write
        w("Podium demo: one task through the four services on the in-process bus\n")
        w(f"  task {self.task_name} · {self.pool_line} · session {self.session_id}\n\n")
        w("[orchestrator_svc] decisions (simulated time t; each decision costs main_step_cost)\n")
        for line in self.decisions:
            w(f"  {line}\n")
        w("\n[subagent_svc] executions (each saw only its subtask + dependency outputs)\n")
        w(f"  {'unit':<12} {'agent':<20} {'start':>6} {'end':>6}  {'outcome':<8} worker\n")
        for worker, ex in sorted(self.executions, key=lambda x: (x[1].start_time, x[1].subtask_id)):
            outcome = subtask_pb2.Outcome.Name(ex.outcome).removeprefix("OUTCOME_").lower()
            w(
                f"  {ex.subtask_id:<12} {ex.agent:<20} {ex.start_time:6.2f} {ex.end_time:6.2f}"
                f"  {outcome:<8} {worker}\n"
            )
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.workers.items()))
        w(f"  executions per worker (one consumer group): {counts}\n")
        if self.trajectory is not None and self.result is not None:
            t, r = self.trajectory, self.result
            w("\n[orchestrator_svc] trajectory published\n")
            w(
                f"  {'completed' if t.completed else 'NOT completed'}"
                f" {r.completed_subtasks}/{r.total_subtasks} subtasks · latency {t.latency:.2f}"
                f" vs lower bound {t.lower_bound:.2f} (x{t.latency / t.lower_bound:.2f})"
                f" · {len(t.decisions)} decisions · {len(t.executions)} executions"
                f" · peak parallelism {r.peak_parallelism} · policy {t.policy_version}\n"
            )
            w(f"  streamed to the gRPC client: {self.stream_events} events\n")
        if self.scored is not None:
            s = self.scored
            w(f"\n[reward_svc] scored with reward {s.reward_version}: total {s.total:+.4f}\n")
            for name, value in sorted(s.components.items()):
                w(f"  component {name:<32} {value:+.4f}\n")
            for name, value in sorted(s.penalties.items()):
                w(f"  penalty   {name:<32} {-value:+.4f}\n")
            top = sorted(s.credit, key=lambda c: -abs(c.share))[:3]
            for c in top:
                who = c.subtask_id or c.stage or c.execution_id or "?"
                w(f"  credit    {who:<32} {c.share:+.4f}  {c.reason}\n")
        w(f"\n[learner_svc] {self.learner_line or 'received nothing'}\n")
        w(f"\ndone in {self.wall_s:.2f}s wall time\n")


@dataclass
class _Services:
    """The four services of the demo, on one in-process bus."""

    orchestrator: OrchestratorApp
    subagents: list[SubagentApp]
    reward: RewardApp
    learner: LearnerApp

    @classmethod
    def build(
        cls, bus: Bus, pool: PoolSpec, policy: str, workers: int, report: DemoReport
    ) -> _Services:
        return cls(
            orchestrator=OrchestratorApp(
                OrchestratorConfig(
                    bus_url="inproc://", grpc_host="127.0.0.1", grpc_port=0, policy=policy
                ),
                bus,
                pool=pool,
                on_event=lambda _sid, line: report.decisions.append(line),
            ),
            subagents=[
                SubagentApp(
                    SubagentConfig(bus_url="inproc://", instance=f"subagent-{i + 1}"),
                    bus,
                    pool=pool,
                )
                for i in range(workers)
            ],
            reward=RewardApp(
                RewardServiceConfig(bus_url="inproc://", instance="reward-1"),
                default_config(),
                bus,
            ),
            learner=LearnerApp(LearnerConfig(bus_url="inproc://"), bus),
        )

    async def start(self) -> None:
        """Downstream first, so nothing the orchestrator emits waits for a consumer."""
        await self.learner.start()
        await self.reward.start()
        for s in self.subagents:
            await s.start()
        await self.orchestrator.start()

    async def stop(self) -> None:
        """Upstream first, so each service drains what the one before it sent."""
        await self.orchestrator.stop()
        for s in self.subagents:
            await s.stop()
        await self.reward.stop()
        await self.learner.stop()


async def _session(
    services: _Services, task_text: str, seed: int, report: DemoReport
) -> session_service_pb2.GetSessionResponse:
    """Submit the task over gRPC, stream the session to its end, fetch its summary."""
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{services.orchestrator.grpc_port}", interceptors=client_interceptors()
    ) as channel:
        stub = session_service_pb2_grpc.SessionServiceStub(channel)  # type: ignore[no-untyped-call]
        submitted = await stub.SubmitTask(
            session_service_pb2.SubmitTaskRequest(task_spec_text=task_text, seed=seed),
            timeout=10,
        )
        report.session_id = submitted.session_id
        async for event in stub.StreamSession(
            session_service_pb2.StreamSessionRequest(session_id=submitted.session_id),
            timeout=60,
        ):
            report.stream_events += 1
            if event.HasField("result"):
                report.result = event.result
        await services.learner.wait_for(1, timeout_s=10)
        final: session_service_pb2.GetSessionResponse = await stub.GetSession(
            session_service_pb2.GetSessionRequest(session_id=submitted.session_id), timeout=10
        )
        return final


def _collect(services: _Services, report: DemoReport, task_name: str) -> None:
    """What each service did for the session."""
    handle = services.orchestrator.session(report.session_id)
    report.trajectory = handle.trajectory if handle is not None else None
    report.task_name = task_name
    for s in services.subagents:
        mine = [r for r in s.stats.results if r.session_id == report.session_id]
        report.workers[s.instance] = len(mine)
        report.executions.extend((s.instance, r) for r in mine)
    st = services.learner.stats
    report.scored = st.last
    report.learner_line = (
        f"received {st.received} scored trajectory(ies) from {topics.SCORED_TRAJECTORIES}:"
        f" session {st.last.trajectory.session_id if st.last else '-'},"
        f" total reward {st.mean_reward:+.4f}, acting policy"
        f" {', '.join(sorted(st.by_policy))}"
    )


async def run_demo(
    task_text: str,
    *,
    pool_path: Path | None = None,
    policy: str = "cpls",
    seed: int = 7,
    workers: int = 2,
) -> DemoReport:
    """Run the four services on one in-process bus, send one task over gRPC, collect a report."""
    started = time.perf_counter()
    report = DemoReport()
    pool = load_pool(pool_path) if pool_path is not None else default_pool()
    report.pool_line = (
        f"pool {pool.name} ({len(pool.agents)} agents, max_parallel {pool.max_parallel})"
        f" · policy {policy} · seed {seed}"
    )
    bus = InProcBus()
    await bus.start()
    services = _Services.build(bus, pool, policy, workers, report)
    try:
        await services.start()
        final = await _session(services, task_text, seed, report)
        _collect(services, report, final.task.name)
    finally:
        await services.stop()
        await bus.stop()
    report.wall_s = time.perf_counter() - started
    return report
