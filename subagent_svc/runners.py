"""The runners of subagent_svc: who executes an assignment, chosen per agent by the pool spec.

* ``simulated`` (the default): :func:`subagent_svc.app.execute` samples the outcome from the
  agent's profile, a pure function of the pool and the assignment.
* ``plugin``: a :class:`podium.subagents.SubAgent` loaded by entry-point name runs the real
  work; :func:`run_plugin` times it on the wall clock and turns its report into a result.
* ``external``: a process outside Podium executes it (docs/subagent-contract.md); this worker
  commits past the assignment without executing it, since the external worker reads the same
  topic in a consumer group of its own.

Every result records the exact context it was given, the wall-clock start and end, who
executed it and the runner (``SubtaskResult.context``, ``wall_start``, ``wall_end``,
``executor``, ``runner``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from podium.envs.swarm.spec import RUNNER_PLUGIN, AgentRunner, PoolSpec
from podium.errors import ConfigError, PluginError, PodiumError
from podium.subagents import ExecutionReport, ExecutionRequest, SubAgent, load_subagent
from podium.v1 import subtask_pb2

_log = logging.getLogger(__name__)


def runners_of(pool: PoolSpec) -> dict[str, AgentRunner]:
    """Each agent's runner, by agent name."""
    return {agent.name: agent.runner for agent in pool.agents}


def load_plugins(
    runners: Mapping[str, AgentRunner], setting: str = "PODIUM_POOL_SPEC"
) -> dict[str, SubAgent]:
    """A sub-agent for every ``runner: plugin`` agent, by agent name; a plug-in that cannot be
    loaded is a :class:`ConfigError` naming ``setting``, the agent and the plug-in (the worker
    must not start and drop that agent's assignments). Factories are synchronous and run in
    pool order; a failure ends the process's start, so those built before it are not closed
    (factories should acquire nothing that outlives the process before their first call)."""
    loaded: dict[str, SubAgent] = {}
    for name, runner in runners.items():
        if runner.kind != RUNNER_PLUGIN:
            continue
        try:
            loaded[name] = load_subagent(runner.plugin, runner.options)
        except PluginError as exc:
            raise ConfigError(f"{setting}: agent {name!r}: {exc}") from exc
    return loaded


def execution_request(assigned: subtask_pb2.SubtaskAssigned) -> ExecutionRequest:
    """What a plug-in is given: the assignment's identity and its context, nothing else."""
    ctx = assigned.context
    return ExecutionRequest(
        session_id=assigned.session_id,
        execution_id=assigned.execution_id,
        subtask_id=assigned.subtask_id,
        kind=assigned.kind,
        agent=assigned.agent,
        attempt=assigned.attempt,
        description=ctx.subtask.description,
        dependency_outputs={d.subtask_id: d.output for d in ctx.dependency_results},
        context=ctx,
    )


def plugin_result(
    assigned: subtask_pb2.SubtaskAssigned,
    report: ExecutionReport,
    wall_start: float,
    wall_end: float,
    queued_s: float = 0.0,
) -> subtask_pb2.SubtaskResult:
    """The result of a plug-in execution. Its simulated span is its real one (one simulated
    time unit = one second): it starts ``queued_s`` (the wall-clock seconds the assignment
    waited between its publication and its execution) after the assignment's simulated time
    and lasts its wall-clock seconds. So the orchestrator's clock sees real latency, waiting
    included: executions that were meant to run side by side but ran one after another on a
    busy worker end one after another, and the critical path is the real one."""
    start = assigned.sim_time + max(0.0, queued_s)
    result = subtask_pb2.SubtaskResult(
        session_id=assigned.session_id,
        execution_id=assigned.execution_id,
        subtask_id=assigned.subtask_id,
        agent=assigned.agent,
        start_time=start,
        end_time=start + max(0.0, wall_end - wall_start),
        outcome=subtask_pb2.OUTCOME_SUCCESS if report.success else subtask_pb2.OUTCOME_FAILURE,
        output=report.output,
        error=report.error,
        wall_start=wall_start,
        wall_end=wall_end,
        runner=RUNNER_PLUGIN,
    )
    if not report.success and not report.error:
        result.error = f"{assigned.agent} reported failure of {assigned.subtask_id}"
    for call in report.tool_calls:
        result.tool_calls.append(
            subtask_pb2.ToolCall(
                name=call.name,
                arguments_json=call.arguments_json,
                ok=call.ok,
                result_digest=call.result_digest,
                started_at=call.started_at,
                ended_at=call.ended_at,
            )
        )
    return result


async def run_plugin(
    agent: SubAgent, assigned: subtask_pb2.SubtaskAssigned, published_at: float | None = None
) -> subtask_pb2.SubtaskResult:
    """Run one assignment on a plug-in, timed on the wall clock (``published_at``: when the
    assignment was published, Unix seconds, for the time it waited; :func:`plugin_result`).

    A retriable error (e.g. an index server that is down) propagates, so the consumer retries
    the assignment and finally dead-letters it: nothing is lost and no failure is invented.
    Any other exception means the plug-in itself broke on this input: it comes back as a
    MALFORMED result naming the error, because the orchestrator is waiting for this execution.
    """
    request = execution_request(assigned)
    wall_start = time.time()
    try:
        report = await agent.execute(request)
    except PodiumError as exc:
        if exc.retriable:
            raise
        report, problem = None, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a third-party plug-in's bug must not kill the worker
        _log.exception("plug-in of agent %r failed on %s", assigned.agent, assigned.execution_id)
        report, problem = None, f"{type(exc).__name__}: {exc}"
    wall_end = time.time()
    queued = wall_start - published_at if published_at is not None else 0.0
    if report is None:
        failed = ExecutionReport(success=False, output="")
        result = plugin_result(assigned, failed, wall_start, wall_end, queued)
        result.outcome = subtask_pb2.OUTCOME_MALFORMED
        result.error = f"plug-in of agent {assigned.agent!r} raised {problem}"
        return result
    return plugin_result(assigned, report, wall_start, wall_end, queued)
