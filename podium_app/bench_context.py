"""Wide-search tasks through the swarm: parallel search sub-agents vs one after another.

The same wide-search tasks (:mod:`podium.context.wide`) run three ways, each timed on the real
wall clock from ``SubmitTask`` to the session's result:

* ``parallel``: orchestrator_svc (``cpls``) schedules every search at once; subagent_svc runs
  them on the real search plug-ins with one group member per search (the assignment topic
  gets as many partitions), executions overlapping: each plug-in sends its searches to its
  worker processes (the shipped pool's ``processes: auto``), so they run on every core
  instead of taking turns under the GIL in this process;
* ``sequential``: the same services and plug-ins, scheduled one subtask at a time (the
  ``sequential`` rule engine): the sub-questions one after another;
* ``direct_s`` (for reference): the same subtasks called one after another on the plug-ins in
  this process, no bus and no orchestrator (:func:`podium.context.wide.run_direct`).

The services run as asyncio tasks on one :class:`~podium.bus.InProcBus`, exactly as
``podium demo`` runs them, and a warm-up task runs first in each, untimed (plug-ins load their
index and the embedding model once per process, and start their worker processes, which is
not a task's latency).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc.aio

from orchestrator_svc.app import OrchestratorApp
from orchestrator_svc.config import OrchestratorConfig
from podium.bus import InProcBus
from podium.context.index import ContextIndex
from podium.context.questions import Question
from podium.context.wide import (
    LEXICAL,
    MERGE,
    SEMANTIC,
    run_direct,
    task_text,
    wide_pool,
    wide_tasks,
)
from podium.envs.swarm.spec import PoolSpec, TaskSpec
from podium.errors import PodiumError
from podium.procpool import resolve_processes
from podium.subagents import load_subagent
from podium.v1 import session_service_pb2, session_service_pb2_grpc
from subagent_svc.app import SubagentApp
from subagent_svc.config import SubagentConfig

Progress = Callable[[str, int, int], None]


class WideSearchFailed(PodiumError):
    """A wide-search session did not succeed (the message says which and how it ended)."""


@dataclass(frozen=True, slots=True)
class SwarmRun:
    """One schedule's sessions."""

    wall_s: list[float]
    """Wall-clock seconds of each task, SubmitTask to result."""
    peak_parallelism: int
    """Most executions that ran at once in any session."""
    executions: int
    """Executions run (all tasks)."""
    execution_ms: float
    """Mean wall-clock milliseconds of one execution (a search or a merge) in the timed tasks:
    beside the tasks' wall clocks, it shows what running side by side cost each one."""
    wall_parallelism: int
    """Most executions whose real wall-clock spans overlapped at one instant (the peak
    parallelism counts what the session had started; this, what really ran at once)."""


async def _submit(port: int, task: TaskSpec, seed: int) -> tuple[float, Any]:
    """Submit ``task`` over gRPC and stream its session to the end; (wall s, SessionResult)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = session_service_pb2_grpc.SessionServiceStub(channel)  # type: ignore[no-untyped-call]
        started = time.perf_counter()
        submitted = await stub.SubmitTask(
            session_service_pb2.SubmitTaskRequest(task_spec_text=task_text(task), seed=seed),
            timeout=30,
        )
        result = None
        async for event in stub.StreamSession(
            session_service_pb2.StreamSessionRequest(session_id=submitted.session_id), timeout=300
        ):
            if event.HasField("result"):
                result = event.result
        wall = time.perf_counter() - started
    if result is None or result.state != session_service_pb2.SESSION_STATE_SUCCEEDED:
        state = "no result" if result is None else result.summary
        raise WideSearchFailed(f"wide-search task {task.name} did not succeed: {state}")
    return wall, result


async def run_swarm(
    pool: PoolSpec,
    tasks: Sequence[TaskSpec],
    policy: str,
    members: int,
    progress: Progress | None = None,
) -> SwarmRun:
    """Run ``tasks`` one by one through orchestrator_svc (``policy``) and one subagent_svc of
    ``members`` group members on an in-process bus; the first task is a warm-up, untimed."""
    bus = InProcBus()
    await bus.start()
    orchestrator = OrchestratorApp(
        OrchestratorConfig(
            bus_url="inproc://",
            grpc_host="127.0.0.1",
            grpc_port=0,
            policy=policy,
            topic_partitions=members,
        ),
        bus,
        pool=pool,
    )
    worker = SubagentApp(
        SubagentConfig(
            bus_url="inproc://",
            instance="wide-worker",
            concurrency=members,
            topic_partitions=members,
        ),
        bus,
        pool=pool,
    )
    walls: list[float] = []
    peak = executions = warm = 0
    try:
        await worker.start()
        await orchestrator.start()
        for i, task in enumerate(tasks):
            wall, result = await _submit(orchestrator.grpc_port, task, seed=i)
            if i == 0:
                warm = len(worker.stats.results)
                continue  # the warm-up
            walls.append(wall)
            peak = max(peak, int(result.peak_parallelism))
            executions += int(result.executions)
            if progress is not None:
                progress(f"wide-search tasks ({policy})", i, len(tasks) - 1)
    finally:
        await orchestrator.stop()
        await worker.stop()
        await bus.stop()
    timed = worker.stats.results[warm:]
    spans = [r.wall_end - r.wall_start for r in timed]
    return SwarmRun(
        walls,
        peak,
        executions,
        1000 * sum(spans) / max(len(spans), 1),
        most_at_once([(r.wall_start, r.wall_end) for r in timed]),
    )


def most_at_once(spans: Sequence[tuple[float, float]]) -> int:
    """Most of the ``(start, end)`` spans open at one instant; a span ending exactly when
    another starts does not overlap it."""
    edges = sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


async def direct_seconds(pool: PoolSpec, tasks: Sequence[TaskSpec]) -> list[float]:
    """Each task's wall seconds run one subtask after another on the plug-ins, no services
    (the first task a warm-up, untimed)."""
    agents = {a.name: load_subagent(a.runner.plugin, a.runner.options) for a in pool.agents}
    by_kind = {kind: a.name for a in pool.agents for kind in a.kinds}
    walls: list[float] = []
    try:
        for i, task in enumerate(tasks):
            started = time.perf_counter()
            await run_direct(task, agents, by_kind)
            if i:
                walls.append(time.perf_counter() - started)
    finally:
        for agent in agents.values():
            await agent.close()
    return walls


def measure_wide(
    index: ContextIndex,
    questions: Sequence[Question],
    width: int,
    count: int,
    k: int,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``count`` wide-search tasks of ``width`` sub-questions (after one warm-up task) run in
    parallel and one after another through the swarm, and directly; the wall clocks (sums over
    the tasks) and the speed-up of parallel over one after another."""
    tasks = wide_tasks(questions, width, count + 1)
    pool = wide_pool(index.path, chroma_url=index.chroma_url, k=k, width=width)
    members = 2 * width
    parallel = asyncio.run(run_swarm(pool, tasks, "cpls", members, progress))
    sequential = asyncio.run(run_swarm(pool, tasks, "sequential", members, progress))
    direct = asyncio.run(direct_seconds(pool, tasks))
    parallel_s, sequential_s = sum(parallel.wall_s), sum(sequential.wall_s)
    return {
        "width": width,
        "tasks": count,
        "searches_per_task": 2 * width,
        "kinds": [LEXICAL, SEMANTIC, MERGE],
        "parallel_s": round(parallel_s, 4),
        "sequential_s": round(sequential_s, 4),
        "direct_s": round(sum(direct), 4),
        "speedup": round(sequential_s / parallel_s, 3) if parallel_s > 0 else 0.0,
        "speedup_vs_direct": round(sum(direct) / parallel_s, 3) if parallel_s > 0 else 0.0,
        "parallel_task_s": [round(w, 4) for w in parallel.wall_s],
        "sequential_task_s": [round(w, 4) for w in sequential.wall_s],
        "execution_ms": {
            "parallel": round(parallel.execution_ms, 2),
            "sequential": round(sequential.execution_ms, 2),
        },
        "peak_parallelism": {
            "parallel": parallel.peak_parallelism,
            "sequential": sequential.peak_parallelism,
        },
        "wall_parallelism": {
            "parallel": parallel.wall_parallelism,
            "sequential": sequential.wall_parallelism,
        },
        "group_members": members,
        "search_processes": search_processes(pool),
    }


def search_processes(pool: PoolSpec) -> dict[str, int]:
    """Worker processes of each search agent of ``pool`` (0: it searches in-process)."""
    return {
        a.name: resolve_processes(a.runner.options.get("processes", "0"))
        for a in pool.agents
        if a.runner.plugin in {"bm25-search", "dense-search"}
    }
