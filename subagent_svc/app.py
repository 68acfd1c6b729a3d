"""The sub-agent worker: SubtaskAssigned in, SubtaskResult out.

Each execution is simulated with the swarm environment's sampling function
(:meth:`podium.envs.swarm.pool.SubagentPool.sample`), seeded by the assignment, so a given
assignment yields the same duration and outcome here, in the in-process simulator and on a
replay. The worker sees nothing but the assignment's :class:`ExecutionContext` (its subtask
and its dependencies' outputs) and hands back only a short task-relevant output, never a
trace of what it did: that is the context sharding the architecture asks for.

That is the ``simulated`` runner, each agent's default. An agent whose pool-spec entry says
``runner: plugin`` is executed by its Python plug-in, one whose entry says ``runner: external``
is left to an outside worker (:mod:`subagent_svc.runners`, docs/subagent-contract.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from podium import topics
from podium.bus.base import Bus, Record, TopicSpec
from podium.bus.consumer import EventConsumer, EventPublisher
from podium.codec import unpack_as
from podium.envs.swarm.drift import DriftingPool, DriftSchedule, load_drift
from podium.envs.swarm.pool import SubagentPool, merge_work_factor
from podium.envs.swarm.spec import (
    RUNNER_EXTERNAL,
    RUNNER_SIMULATED,
    PoolSpec,
    default_pool,
    load_pool,
)
from podium.envs.swarm.state import MERGE_SUFFIX
from podium.errors import ConfigError, SpecError
from podium.metrics import record_subagent_execution
from podium.service import ServiceShell, default_instance_name
from podium.subagents.reference import context_digest
from podium.v1 import envelope_pb2, subtask_pb2
from subagent_svc.config import SubagentConfig
from subagent_svc.runners import load_plugins, run_plugin, runners_of

_log = logging.getLogger(__name__)

SERVICE = "subagent_svc"
"""Service name (OpenTelemetry ``service.name``, default instance prefix)."""

_RESULT_NS = uuid.UUID("6f1c1c9e-2b7a-4bd4-9a55-3d1f0d3c8a01")
"""Namespace of result event ids: uuid5(ns, execution id). A redelivered assignment that is
executed again yields the *same* event id, so the orchestrator's dedupe drops the copy."""


def result_event_id(execution_id: str) -> str:
    """Event id of the result of ``execution_id`` (stable across re-executions)."""
    return str(uuid.uuid5(_RESULT_NS, execution_id))


def load_pool_spec(path: str) -> PoolSpec:
    """The pool named by ``path``, or the shipped default when empty."""
    return load_pool(Path(path)) if path else default_pool()


def drifting_pool(
    base: SubagentPool, config: SubagentConfig, pool_drift: DriftSchedule | None = None
) -> DriftingPool:
    """The true pool over time: ``base`` (the pool's true profiles) under ``config``'s drift
    scenario, else the pool file's own ``drift:`` (``pool_drift``); a bad scenario (unknown
    name, invalid file, an agent or kind the pool lacks) is a :class:`ConfigError` naming
    ``PODIUM_SUBAGENT_DRIFT``."""
    try:
        schedule = load_drift(config.drift) if config.drift or pool_drift is None else pool_drift
        origin = time.time() if config.drift_origin is None else config.drift_origin
        pool = DriftingPool(base, schedule, origin)
    except SpecError as exc:
        raise ConfigError(f"PODIUM_SUBAGENT_DRIFT={config.drift!r}: {exc}") from exc
    if schedule.changes:
        _log.info(
            "drift scenario %r: %d change(s) from origin %.3f",
            schedule.name,
            len(schedule.changes),
            origin,
        )
    return pool


def output_digest(assigned: subtask_pb2.SubtaskAssigned) -> str:
    """Short digest of exactly what the execution was given
    (:func:`podium.subagents.reference.context_digest`, the digest the ``context-digest``
    plug-in and the Go external worker compute too).

    The simulated output is derived from the context alone, so two executions with the same
    context agree, and a dependent's output changes when a dependency's output does.
    """
    return context_digest(assigned.context)


def published_at(envelope: envelope_pb2.Envelope) -> float | None:
    """When the envelope's event was published (Unix seconds), or None when it says not."""
    if not envelope.HasField("produced_at"):
        return None
    return envelope.produced_at.ToNanoseconds() / 1e9


def execute(
    pool: SubagentPool, assigned: subtask_pb2.SubtaskAssigned, merge_factor: float = 1.0
) -> subtask_pb2.SubtaskResult:
    """Simulate one execution: a pure function of the pool and the assignment.

    ``merge_factor``: how many times more work a merge (``<id>#merge``) really is than the
    orchestrator planned it (:func:`~podium.envs.swarm.pool.merge_work_factor`), as the
    simulator draws it.

    An assignment the pool cannot run (unknown agent, agent without that kind, work <= 0)
    comes back as a MALFORMED result naming the problem: the orchestrator is waiting for
    this execution, so an error it can see beats a silent drop or a dead letter it cannot.
    """
    ctx = assigned.context
    work = ctx.subtask.work
    base = subtask_pb2.SubtaskResult(
        session_id=assigned.session_id,
        execution_id=assigned.execution_id,
        subtask_id=assigned.subtask_id,
        agent=assigned.agent,
        start_time=assigned.sim_time,
        end_time=assigned.sim_time,
        runner=RUNNER_SIMULATED,
    )
    base.context.CopyFrom(assigned.context)
    problem = ""
    if assigned.agent not in pool.agent_index:
        problem = f"unknown agent {assigned.agent!r} (pool: {', '.join(pool.agent_names)})"
    elif not pool.can_do(assigned.agent, assigned.kind):
        problem = f"agent {assigned.agent!r} cannot do kind {assigned.kind!r}"
    elif not work > 0:
        problem = f"subtask {assigned.subtask_id!r} has work {work!r}; expected > 0"
    if problem:
        base.outcome = subtask_pb2.OUTCOME_MALFORMED
        base.error = problem
        return base
    true_work = work * merge_factor if assigned.subtask_id.endswith(MERGE_SUFFIX) else work
    sample = pool.sample(assigned.agent, assigned.kind, true_work, int(assigned.seed))
    digest = output_digest(assigned)
    base.end_time = assigned.sim_time + sample.duration
    base.tool_calls.append(
        subtask_pb2.ToolCall(
            name=f"{assigned.kind}.run",
            arguments_json=f'{{"subtask": "{assigned.subtask_id}", "work": {work:.6g}}}',
            ok=sample.success,
            result_digest=digest,
        )
    )
    if sample.success:
        base.outcome = subtask_pb2.OUTCOME_SUCCESS
        base.verified = True
        base.output = f"{assigned.kind}:{assigned.subtask_id}:{digest}"
    else:
        base.outcome = subtask_pb2.OUTCOME_FAILURE
        base.error = f"{assigned.agent} failed {assigned.subtask_id} (attempt {assigned.attempt})"
    return base


@dataclass
class SubagentStats:
    """What this worker did (for logs, the demo and tests)."""

    executions: int = 0
    """Assignments executed."""
    succeeded: int = 0
    """Executions that succeeded."""
    external: int = 0
    """Assignments left to an external worker (``runner: external`` agents)."""
    results: list[subtask_pb2.SubtaskResult] = field(default_factory=list)
    """Recent results, newest last (bounded by ``keep``)."""
    keep: int = 1000
    """How many recent results to keep."""

    def add(self, result: subtask_pb2.SubtaskResult) -> None:
        self.executions += 1
        self.succeeded += result.outcome == subtask_pb2.OUTCOME_SUCCESS
        self.results.append(result)
        if len(self.results) > self.keep:
            del self.results[: len(self.results) - self.keep]


class SubagentApp:
    """One sub-agent worker process (or embedded task): a member of the worker group."""

    name = SERVICE

    def __init__(
        self,
        config: SubagentConfig,
        bus: Bus,
        *,
        tracer_provider: TracerProvider | None = None,
        pool: PoolSpec | None = None,
    ) -> None:
        self.config = config
        self.bus = bus
        self.instance = config.instance or default_instance_name(SERVICE)
        try:
            spec = pool if pool is not None else load_pool_spec(config.pool_spec)
        except Exception as exc:  # SpecError and file errors: name the setting
            raise ConfigError(f"PODIUM_POOL_SPEC={config.pool_spec!r}: {exc}") from exc
        self.pool = SubagentPool(spec.advertised())
        """The advertised pool (what ``PODIUM_POOL_SPEC`` says, and the orchestrator plans
        for)."""
        truth = SubagentPool(spec.true_spec()) if spec.has_truth else self.pool
        self.true_pool = drifting_pool(truth, config, spec.drift)
        """The pool executions are sampled from: the pool file's true profiles (``true:``,
        else the advertised ones) under the drift scenario (``PODIUM_SUBAGENT_DRIFT``, else the
        file's ``drift:``; :mod:`podium.envs.swarm.drift`)."""
        self.runners = runners_of(spec)
        """Each agent's runner (``runner:`` in the pool spec)."""
        self.plugins = load_plugins(self.runners)
        """The loaded plug-in of every ``runner: plugin`` agent, by agent name."""
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(SERVICE)
        self.stats = SubagentStats()
        self.publisher = EventPublisher(bus, producer_name=self.instance)
        self.shell = ServiceShell(SERVICE, shutdown_timeout_s=config.shutdown_timeout_s)
        """Runs the consumers and stops them gracefully (:class:`podium.service.ServiceShell`)."""
        self.consumers = [self.shell.add(self._member(i)) for i in range(config.concurrency)]
        """This process's members of the worker group (``PODIUM_SUBAGENT_CONCURRENCY``): each
        consumes the partitions it is given, so executions on different partitions run at
        once, on the same loaded plug-ins."""
        self.consumer = self.consumers[0]
        """The first member (the only one by default)."""

    def _member(self, index: int) -> EventConsumer:
        """Member ``index`` of the worker group (a client id of its own when there are more)."""
        return EventConsumer(
            self.bus,
            [topics.SUBTASKS_ASSIGNED],
            self.config.group_id,
            self._handle,
            producer_name=self.instance,
            max_batch=self.config.batch_max,
            partitions=self.config.topic_partitions,
            client_id=f"{self.instance}#{index}" if self.config.concurrency > 1 else "",
        )

    async def start(self) -> None:
        """Create the result topic, join the worker group and start consuming."""
        # Topics it writes to are created here too: a broker may not auto-create them.
        await self.bus.create_topics(
            [TopicSpec(topics.SUBTASK_RESULTS, self.config.topic_partitions)]
        )
        await self.shell.start()

    async def stop(self) -> None:
        """Stop fetching, finish and commit the batch in hand, leave the group, then close the
        plug-ins (after the last execution that may use them)."""
        await self.shell.stop()
        plugins, self.plugins = self.plugins, {}
        for name, agent in plugins.items():
            try:
                await agent.close()
            except Exception:  # one plug-in failing to close must not keep the others open
                _log.exception("closing the plug-in of agent %r failed", name)

    async def wait(self) -> None:
        """Return when consuming has ended; raise if the consumer crashed."""
        await self.shell.wait()

    async def _handle(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        assigned = unpack_as(envelope, subtask_pb2.SubtaskAssigned)
        runner = self.runners.get(assigned.agent)
        if runner is not None and runner.kind == RUNNER_EXTERNAL:
            # Its external worker reads this topic in a group of its own: committing past
            # the record here loses nothing, and executing it would do the work twice.
            self.stats.external += 1
            _log.debug(
                "%s %s left to external %s",
                assigned.session_id,
                assigned.subtask_id,
                assigned.agent,
            )
            return
        with self._tracer.start_as_current_span(
            f"execute {assigned.subtask_id}",
            attributes={
                "podium.session_id": assigned.session_id,
                "podium.execution_id": assigned.execution_id,
                "podium.agent": assigned.agent,
                "podium.kind": assigned.kind,
            },
        ) as span:
            result = await self._execute(assigned, published_at(envelope))
            span.set_attribute("podium.outcome", subtask_pb2.Outcome.Name(result.outcome))
            span.set_attribute("podium.sim_duration", result.end_time - result.start_time)
            await self.publisher.publish(
                topics.SUBTASK_RESULTS,
                result,
                key=assigned.session_id,
                event_id=result_event_id(assigned.execution_id),
                idempotency_key=assigned.execution_id,
            )
        self.stats.add(result)
        outcome = subtask_pb2.Outcome.Name(result.outcome).removeprefix("OUTCOME_").lower()
        record_subagent_execution(SERVICE, agent=assigned.agent, outcome=outcome)
        _log.debug(
            "%s %s on %s (%s): %s [%.2f, %.2f]",
            assigned.session_id,
            assigned.subtask_id,
            assigned.agent,
            result.runner,
            subtask_pb2.Outcome.Name(result.outcome),
            result.start_time,
            result.end_time,
        )

    async def _execute(
        self, assigned: subtask_pb2.SubtaskAssigned, published: float | None
    ) -> subtask_pb2.SubtaskResult:
        """The result of one assignment by its agent's runner, stamped with the wall-clock
        span and this worker's name (an agent the pool lacks is simulated, which reports it
        MALFORMED)."""
        plugin = self.plugins.get(assigned.agent)
        if plugin is not None:
            result = await run_plugin(plugin, assigned, published)
            result.context.CopyFrom(assigned.context)
        else:
            wall_start = time.time()
            pool = self.true_pool.at(wall_start)
            merge_factor = merge_work_factor(self.pool.spec, pool.spec)
            result = execute(pool, assigned, merge_factor)
            duration = result.end_time - result.start_time
            if self.config.time_scale > 0 and duration > 0:
                # Pacing only: the outcome was fixed by the seed before the sleep.
                await asyncio.sleep(duration * self.config.time_scale)
            result.wall_start = wall_start
            result.wall_end = time.time()
        result.executor = self.instance
        return result
