"""The orchestrator service: task intake, sessions, trajectories.

Three consumers and one gRPC server, built from ``(config, bus)``:

* ``<group>.tasks`` on ``TaskSubmitted``: each event opens a session (at most
  ``max_sessions`` at once; beyond that the handler waits, which is backpressure on the topic).
  Tasks arrive from SubmitTask or straight from a training driver; both take this one path.
* ``<group>.results`` on ``SubtaskResult``: routed to the running session by session id;
  results of sessions this process does not run (stale runs) are logged and skipped.
* ``<group>.scores`` on ``ScoredTrajectory``: attaches the reward breakdown to the session
  so GetSession can show it.

Delivery: a TaskSubmitted is committed once its session has *started*, not when it ends, so
that many sessions run at once; a crash loses the runs in flight (their TaskSubmitted stays
in the log for replay, and sessions are deterministic given their seed). Results are keyed
by session, and one orchestrator replica per results partition is assumed for now: a
replica only routes results to sessions it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from orchestrator_svc.config import OrchestratorConfig
from orchestrator_svc.grpc_api import GrpcServer, task_message
from orchestrator_svc.policy import SchedulingPolicy, make_policy
from orchestrator_svc.session import Session, SessionHandle, SessionSettings
from orchestrator_svc.specs import validate_task
from podium import topics
from podium.bus.base import Bus, Record, TopicSpec
from podium.bus.consumer import EventConsumer, EventPublisher, Handler
from podium.codec import unpack_as
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import PoolSpec, TaskSpec, default_pool, load_pool, parse_task
from podium.envs.swarm.trajectory import task_to_proto
from podium.errors import ConfigError, ProcessingError, SpecError
from podium.service import ServiceShell, default_instance_name
from podium.serving.endpoint import parse_backend
from podium.telemetry import TracingServerInterceptor
from podium.v1 import envelope_pb2, reward_pb2, session_service_pb2, subtask_pb2, task_pb2

if TYPE_CHECKING:
    from orchestrator_svc.learned import LearnedPolicySource
    from podium.serving.backends import ServedPolicy

_log = logging.getLogger(__name__)

LEARNED = "learned"
"""``PODIUM_POLICY`` value selecting the learned policy."""

SERVICE = "orchestrator_svc"
"""Service name (OpenTelemetry ``service.name``, default instance prefix)."""


def _probe_task(pool: PoolSpec) -> TaskSpec:
    """A one-subtask task of ``pool``: the environment layout depends on the pool only."""
    if not pool.kinds:
        raise ConfigError(f"pool {pool.name!r} names no subtask kinds")
    return parse_task(
        {"name": "layout", "subtasks": [{"id": "a", "kind": pool.kinds[0], "work": 1.0}]}
    )


def _pool_spec(config: OrchestratorConfig, pool: PoolSpec | None) -> PoolSpec:
    """``pool`` if given, else the pool ``PODIUM_POOL_SPEC`` names (default: the shipped one)."""
    if pool is not None:
        return pool
    try:
        return load_pool(config.pool_spec) if config.pool_spec else default_pool()
    except SpecError as exc:
        raise ConfigError(f"PODIUM_POOL_SPEC={config.pool_spec!r}: {exc}") from exc


class OrchestratorApp:
    """The orchestrator process (or embedded task)."""

    name = SERVICE

    def __init__(
        self,
        config: OrchestratorConfig,
        bus: Bus,
        *,
        tracer_provider: TracerProvider | None = None,
        pool: PoolSpec | None = None,
        policy: SchedulingPolicy | None = None,
        serve_grpc: bool = True,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        """``serve_grpc=False`` runs the bus side only (embedded training drivers);
        ``on_event(session_id, line)`` receives human-readable progress lines."""
        self.config = config
        self.bus = bus
        self.instance = config.instance or default_instance_name(SERVICE)
        self.pool_spec = _pool_spec(config, pool)
        self.pool = SubagentPool(self.pool_spec)
        self.learned: LearnedPolicySource | None = None
        """The learned policy's versions (``PODIUM_POLICY=learned``), else None."""
        self.policy = self._scheduling_policy(policy)
        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer = provider.get_tracer(SERVICE)
        self.on_event = on_event
        self.publisher = EventPublisher(bus, producer_name=self.instance)
        self.settings = SessionSettings(
            producer=self.instance,
            result_timeout_s=config.session_timeout_s,
            max_decisions=config.max_decisions,
        )
        self.shell = ServiceShell(SERVICE, shutdown_timeout_s=config.shutdown_timeout_s)
        """Runs the consumers and stops them within one deadline (:mod:`podium.service`)."""
        self._add_consumers()
        self.serve_grpc = serve_grpc
        # Built in start(): a grpc.aio server binds to the event loop it is created in.
        self.grpc: GrpcServer | None = None
        self.handles: OrderedDict[str, SessionHandle] = OrderedDict()
        self.running: dict[str, Session] = {}
        self._by_request: dict[str, str] = {}
        self._slots = asyncio.Semaphore(config.max_sessions)
        self._session_tasks: set[asyncio.Task[None]] = set()
        self.sessions_finished = 0

    def _scheduling_policy(self, policy: SchedulingPolicy | None) -> SchedulingPolicy:
        """``policy`` if given; else the learned policy's cold start (``PODIUM_POLICY=learned``,
        which also sets :attr:`learned`), else the rule engine ``PODIUM_POLICY`` names."""
        if policy is not None:
            return policy
        if self.config.policy != LEARNED:
            return make_policy(self.config.policy)
        # Imported here: torch and the policy network are only needed in this mode.
        import torch

        from orchestrator_svc.learned import LearnedPolicySource

        # Decisions are single small forward passes: one thread keeps their latency low
        # and leaves the other cores to the services beside this one.
        torch.set_num_threads(1)
        self.learned = LearnedPolicySource(
            tuple(self.pool.agent_names),
            default_max_subtasks=self.config.policy_max_subtasks,
            sample_prefixes=self.config.policy_sample_from,
            backend=self._served_backend(self.config),
        )
        return self.learned.cold_start

    def _consumer(
        self, topic: str, group_id: str, handler: Handler, *, max_batch: int = 100
    ) -> EventConsumer:
        """A consumer of ``topic`` in ``group_id``, added to the shell (started in this order)."""
        return self.shell.add(
            EventConsumer(
                self.bus,
                [topic],
                group_id,
                handler,
                max_batch=max_batch,
                producer_name=self.instance,
                partitions=self.config.topic_partitions,
            )
        )

    def _add_consumers(self) -> None:
        """The consumers, in start order: results and scores before intake, so that the first
        session's results already have a consumer when its subtasks go out."""
        group = self.config.group_id
        self.results_consumer = self._consumer(
            topics.SUBTASK_RESULTS, f"{group}.results", self._on_result
        )
        self.scores_consumer = self._consumer(
            topics.SCORED_TRAJECTORIES, f"{group}.scores", self._on_score
        )
        # Every replica loads every version, so each has its own group on the policy topic.
        self.policy_consumer = (
            self._consumer(
                topics.POLICY_UPDATES, f"{group}.policy.{self.instance}", self._on_policy
            )
            if self.learned is not None
            else None
        )
        self.tasks_consumer = self._consumer(
            topics.TASKS, f"{group}.tasks", self._on_task, max_batch=16
        )

    def _served_backend(self, config: OrchestratorConfig) -> ServedPolicy | None:
        """The KServe-V2 client when ``PODIUM_POLICY_BACKEND=v2://...``, else None (torch)."""
        address = parse_backend(config.policy_backend)
        if address is None:
            return None
        from podium.policy.swarm import MODEL_NAME, layout_signature
        from podium.serving.backends import ServedPolicy

        # The tensor sizes every served version must accept, from this pool's environment
        # layout; ServedPolicy checks each request against them before sending it.
        probe = SwarmEnv([_probe_task(self.pool_spec)], self.pool, EnvConfig(max_subtasks=1))
        signature = layout_signature(probe.layout)
        return ServedPolicy(address, MODEL_NAME, signature, timeout_s=config.serving_timeout_s)

    @property
    def grpc_port(self) -> int:
        """Port the SessionService is bound to (0 before start or without gRPC)."""
        return self.grpc.port if self.grpc is not None else 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Check the policy server (served backend), create the topics this service writes,
        start the consumers, then open gRPC intake."""
        backend = self.learned.backend if self.learned is not None else None
        if backend is not None:
            await self._await_server(backend)
        p = self.config.topic_partitions
        await self.bus.create_topics(
            [
                TopicSpec(t, p)
                for t in (topics.SUBTASKS_ASSIGNED, topics.TRAJECTORIES, topics.FEEDBACK)
            ]
        )
        await self.shell.start()
        if self.serve_grpc:
            self.grpc = GrpcServer(
                self,
                host=self.config.grpc_host,
                port=self.config.grpc_port,
                max_message_bytes=self.config.grpc_max_message_bytes,
                interceptor=TracingServerInterceptor(self.tracer),
            )
            port = await self.grpc.start()
            _log.info("%s: SessionService on %s:%d", self.instance, self.config.grpc_host, port)

    async def _await_server(self, backend: ServedPolicy) -> None:
        """Fail start-up, naming the setting, if the policy server does not answer ready. No
        model needs to be loaded yet: cpls decides until the first PolicyUpdated."""
        deadline = asyncio.get_running_loop().time() + self.config.serving_ready_timeout_s
        while not await asyncio.to_thread(backend.server_ready):
            if asyncio.get_running_loop().time() >= deadline:
                backend.close()
                raise ProcessingError(
                    f"PODIUM_POLICY_BACKEND={self.config.policy_backend}: no ready KServe-V2 "
                    f"server after {self.config.serving_ready_timeout_s:g} s",
                    retriable=True,
                )
            await asyncio.sleep(0.2)
        _log.info("%s: policy decisions on %s", self.instance, self.config.policy_backend)

    async def stop(self) -> None:
        """Graceful: stop intake (gRPC NOT_SERVING, no new tasks), let running sessions finish
        within the shutdown timeout, then stop the result and score consumers."""
        # One deadline for the whole shutdown, so it is bounded by PODIUM_SHUTDOWN_TIMEOUT_S
        # (plus a floor per phase to commit what is in hand), not by a sum of per-phase waits.
        deadline = self.shell.deadline()
        if self.grpc is not None:
            await self.grpc.set_serving(False)
        await self.shell.stop(self.tasks_consumer, deadline=deadline)
        await self._drain_sessions(deadline.left(0.0))
        # Results were still consumed while sessions drained; now the rest may stop.
        await self.shell.stop(deadline=deadline)
        if self.grpc is not None:
            await self.grpc.stop(grace_s=min(deadline.left(), 5.0))
        if self.learned is not None and self.learned.backend is not None:
            self.learned.backend.close()

    async def _drain_sessions(self, timeout_s: float) -> None:
        """Let running sessions finish for up to ``timeout_s``, then cancel the rest (their
        TaskSubmitted stays in the log; a session is deterministic given its seed)."""
        if not self._session_tasks:
            return
        _, pending = await asyncio.wait(set(self._session_tasks), timeout=timeout_s)
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def wait(self) -> None:
        """Return when the consumers have ended; raise if one crashed."""
        await self.shell.wait()

    # ------------------------------------------------------------------ SessionBackend

    async def submit(
        self, request: session_service_pb2.SubmitTaskRequest, submitted_by: str
    ) -> str:
        """Validate, register and publish a task; returns the session id."""
        if request.client_request_id and request.client_request_id in self._by_request:
            return self._by_request[request.client_request_id]
        task = validate_task(
            self.pool_spec, message=task_message(request), text=request.task_spec_text
        )
        session_id = str(uuid.uuid4())
        message = task_to_proto(task)
        submitted = task_pb2.TaskSubmitted(
            session_id=session_id, task=message, submitted_by=submitted_by, seed=request.seed
        )
        submitted.submitted_at.FromDatetime(datetime.now(UTC))
        self._register(SessionHandle(session_id=session_id, task=message))
        if request.client_request_id:
            self._by_request[request.client_request_id] = session_id
        await self.publisher.publish(
            topics.TASKS,
            submitted,
            key=session_id,
            idempotency_key=request.client_request_id or session_id,
        )
        return session_id

    def session(self, session_id: str) -> SessionHandle | None:
        return self.handles.get(session_id)

    async def feedback(self, feedback: reward_pb2.Feedback) -> str:
        published = await self.publisher.publish(topics.FEEDBACK, feedback, key=feedback.session_id)
        return published.envelope.event_id

    def _register(self, handle: SessionHandle) -> SessionHandle:
        existing = self.handles.get(handle.session_id)
        if existing is not None:
            return existing
        self.handles[handle.session_id] = handle
        # Forget the oldest finished sessions beyond the retention limit.
        while len(self.handles) > self.config.keep_sessions:
            oldest_id, oldest = next(iter(self.handles.items()))
            if not oldest.finished:
                break
            del self.handles[oldest_id]
        return handle

    # ------------------------------------------------------------------ consumers

    async def _on_task(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        submitted = unpack_as(envelope, task_pb2.TaskSubmitted)
        sid = submitted.session_id
        if not sid:
            raise ProcessingError(f"TaskSubmitted {envelope.event_id} has no session_id")
        if sid in self.running or (sid in self.handles and self.handles[sid].finished):
            _log.info("session %s already run here; skipping redelivered TaskSubmitted", sid)
            return
        try:
            task = validate_task(self.pool_spec, message=submitted.task)
        except SpecError as exc:
            # Not retriable: EventConsumer dead-letters it with the reason in the headers.
            handle = self.handles.get(sid)
            if handle is not None:
                handle.state = session_service_pb2.SESSION_STATE_FAILED
            raise ProcessingError(f"session {sid}: invalid task ({exc.field}): {exc}") from exc
        handle = self._register(SessionHandle(session_id=sid, task=submitted.task))
        await self._slots.acquire()  # backpressure: hold the batch until a slot frees up
        session = Session(
            submitted,
            task,
            self.pool,
            # A learned session is pinned to the version serving now (see learned.py).
            self.learned.for_session(submitted) if self.learned is not None else self.policy,
            self.publisher,
            handle,
            self.settings,
            self.tracer,
            on_event=self.on_event,
        )
        self.running[sid] = session
        task_ = asyncio.create_task(self._run(session), name=f"session {sid}")
        self._session_tasks.add(task_)
        task_.add_done_callback(self._session_tasks.discard)

    async def _run(self, session: Session) -> None:
        try:
            await session.run()
            self.sessions_finished += 1
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("session %s crashed", session.session_id)
            if not session.handle.finished:
                session.handle.state = session_service_pb2.SESSION_STATE_FAILED
        finally:
            self.running.pop(session.session_id, None)
            self._slots.release()

    async def _on_result(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        result = unpack_as(envelope, subtask_pb2.SubtaskResult)
        session = self.running.get(result.session_id)
        if session is None or not await session.on_result(result):
            _log.info(
                "skipping result %s of session %s: not awaited here (stale run or duplicate)",
                result.execution_id,
                result.session_id,
            )

    async def _on_policy(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        assert self.learned is not None
        # A rejected version is logged by the source and the previous one keeps serving; the
        # event is still consumed (retrying a corrupt file would not make it load).
        await self.learned.on_policy_updated(unpack_as(envelope, reward_pb2.PolicyUpdated))

    async def _on_score(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        scored = unpack_as(envelope, reward_pb2.ScoredTrajectory)
        handle = self.handles.get(scored.trajectory.session_id)
        if handle is not None and handle.result is not None:
            handle.result.score.CopyFrom(scored)
