"""The sub-agent worker: SubtaskAssigned in, SubtaskResult out.

Each execution is simulated with the swarm environment's sampling function
(:meth:`podium.envs.swarm.pool.SubagentPool.sample`), seeded by the assignment, so a given
assignment yields the same duration and outcome here, in the in-process simulator and on a
replay. The worker sees nothing but the assignment's :class:`ExecutionContext` (its subtask
and its dependencies' outputs) and hands back only a short task-relevant output, never a
trace of what it did: that is the context sharding the architecture asks for.
"""

from __future__ import annotations

import asyncio
import hashlib
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
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import PoolSpec, default_pool, load_pool
from podium.errors import ConfigError, SpecError
from podium.metrics import record_subagent_execution
from podium.service import ServiceShell, default_instance_name
from podium.v1 import envelope_pb2, subtask_pb2
from subagent_svc.config import SubagentConfig

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
    """Short digest of exactly what the execution was given.

    The simulated output is derived from the context alone, so two executions with the same
    context agree, and a dependent's output changes when a dependency's output does.
    """
    h = hashlib.sha256()
    h.update(assigned.context.subtask.SerializeToString(deterministic=True))
    for dep in assigned.context.dependency_results:
        h.update(dep.subtask_id.encode())
        h.update(b"\0")
        h.update(dep.output.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def execute(pool: SubagentPool, assigned: subtask_pb2.SubtaskAssigned) -> subtask_pb2.SubtaskResult:
    """Simulate one execution: a pure function of the pool and the assignment.

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
    )
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
    sample = pool.sample(assigned.agent, assigned.kind, work, int(assigned.seed))
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
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(SERVICE)
        self.stats = SubagentStats()
        self.publisher = EventPublisher(bus, producer_name=self.instance)
        self.shell = ServiceShell(SERVICE, shutdown_timeout_s=config.shutdown_timeout_s)
        """Runs the consumer and stops it gracefully (:class:`podium.service.ServiceShell`)."""
        self.consumer = self.shell.add(
            EventConsumer(
                bus,
                [topics.SUBTASKS_ASSIGNED],
                config.group_id,
                self._handle,
                producer_name=self.instance,
                max_batch=config.batch_max,
                partitions=config.topic_partitions,
            )
        )

    async def start(self) -> None:
        """Create the result topic, join the worker group and start consuming."""
        # Topics it writes to are created here too: a broker may not auto-create them.
        await self.bus.create_topics(
            [TopicSpec(topics.SUBTASK_RESULTS, self.config.topic_partitions)]
        )
        await self.shell.start()

    async def stop(self) -> None:
        """Stop fetching, finish and commit the batch in hand, leave the group."""
        await self.shell.stop()

    async def wait(self) -> None:
        """Return when consuming has ended; raise if the consumer crashed."""
        await self.shell.wait()

    async def _handle(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        assigned = unpack_as(envelope, subtask_pb2.SubtaskAssigned)
        with self._tracer.start_as_current_span(
            f"execute {assigned.subtask_id}",
            attributes={
                "podium.session_id": assigned.session_id,
                "podium.execution_id": assigned.execution_id,
                "podium.agent": assigned.agent,
                "podium.kind": assigned.kind,
            },
        ) as span:
            result = execute(self.true_pool.at(time.time()), assigned)
            duration = result.end_time - result.start_time
            if self.config.time_scale > 0 and duration > 0:
                # Pacing only: the outcome was fixed by the seed before the sleep.
                await asyncio.sleep(duration * self.config.time_scale)
            span.set_attribute("podium.outcome", subtask_pb2.Outcome.Name(result.outcome))
            span.set_attribute("podium.sim_duration", duration)
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
            "%s %s on %s: %s [%.2f, %.2f]",
            assigned.session_id,
            assigned.subtask_id,
            assigned.agent,
            subtask_pb2.Outcome.Name(result.outcome),
            result.start_time,
            result.end_time,
        )
