"""The orchestrator service: task intake, sessions, trajectories.

Workers on a :class:`~podium.service.ServiceShell` and one gRPC server, built from
``(config, bus)``:

* ``<group>.tasks``: the :class:`~orchestrator_svc.intake.TaskIntake` on ``TaskSubmitted``,
  a per-partition transactional member. Each event opens a session (at most ``max_sessions``
  at once; beyond that nothing more is fetched, which is backpressure on the topic). Replicas
  share the tasks partitions: a session belongs to the replica owning its partition. Its
  TaskSubmitted is committed only together with its Trajectory and its ledger entry, so a
  crashed or fenced replica loses nothing and publishes nothing: the next owner re-runs its
  unfinished sessions and skips the finished ones (:mod:`orchestrator_svc.intake`).
* ``<group>.results.<instance>`` on ``SubtaskResult``: every replica reads every result in
  a group of its own (positioned at the end on start) and routes it to the session it runs,
  by session id; results of sessions run elsewhere or of earlier runs (another run id) are
  skipped. Chosen over co-partitioning results with tasks because group assignments of two
  topics cannot be kept aligned through rebalances; the price is that each replica reads the
  (small) results of all.
* ``<group>.ledger.<instance>``: the session ledger, followed so a replica ends the streams
  of sessions it accepted but another replica ran (:mod:`orchestrator_svc.ledger`).
* ``<group>.scores.<instance>`` on ``ScoredTrajectory``: attaches the reward breakdown to
  the session so GetSession can show it.
* ``<group>.rollout.<instance>`` (learned policy, ``PODIUM_ROLLOUT=controlled``): the rollout
  state, read whole before intake opens and followed live; each session runs the version its
  arm names, chosen when it starts (:mod:`orchestrator_svc.arms`).
* ``<group>.stats.<instance>`` (``PODIUM_AGENT_STATS=on``) on ``Trajectory``: every session of
  every replica recorded into this replica's statistics store (:mod:`podium.observed`), which
  each new session's environment reads (estimates of the agents; ``cpls-online``).

``client_request_id`` is an idempotency key: the session id is its uuid5, so a retry on any
replica after any restart names the same session, and its owner runs it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from orchestrator_svc.arms import RolloutFollower, effective_route
from orchestrator_svc.config import CONTROLLED, SERVICE, OrchestratorConfig
from orchestrator_svc.fit import fit_trajectory
from orchestrator_svc.grpc_api import GrpcServer, task_message
from orchestrator_svc.intake import Output, PartitionLost, TaskIntake
from orchestrator_svc.ledger import LEDGER, LedgerFollower
from orchestrator_svc.policy import SchedulingPolicy, make_policy
from orchestrator_svc.review import ReviewGate, ReviewServicer, ReviewSettings
from orchestrator_svc.session import (
    Session,
    SessionHandle,
    SessionSettings,
    failed_result,
    failed_trajectory,
)
from orchestrator_svc.specs import validate_task
from podium import topics
from podium.bus import KafkaBus, read_committed
from podium.bus.base import TP, Bus, Record, TopicSpec
from podium.bus.consumer import EventConsumer, EventPublisher, Handler, encode_record
from podium.codec import unpack_as
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.scouting import ScoutConfig
from podium.envs.swarm.spec import PoolSpec, TaskSpec, default_pool, load_pool, parse_task
from podium.envs.swarm.trajectory import task_to_proto
from podium.errors import AdmissionError, ConfigError, ProcessingError, SpecError
from podium.metrics import record_session
from podium.observed import AgentStats
from podium.observed.follower import StatsFollower
from podium.rollout.routing import Route, bucket
from podium.service import ServiceShell, default_instance_name
from podium.serving.endpoint import parse_backend
from podium.telemetry import server_interceptor
from podium.v1 import (
    envelope_pb2,
    orchestrator_pb2,
    reward_pb2,
    rollout_pb2,
    session_service_pb2,
    subtask_pb2,
    task_pb2,
    trajectory_pb2,
)

if TYPE_CHECKING:
    from orchestrator_svc.learned import LearnedPolicySource
    from podium.serving.backends import ServedPolicy

_log = logging.getLogger(__name__)

LEARNED = "learned"
"""``PODIUM_POLICY`` value selecting the learned policy."""
LIVE = trajectory_pb2.ARM_ROLE_LIVE

REQUEST_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "podium:orchestrator:client_request_id")
"""uuid5 namespace of session ids derived from ``client_request_id``."""


def session_id_for(client_request_id: str) -> str:
    """The session id of a SubmitTask: the uuid5 of ``client_request_id`` (the same on every
    replica, before and after any restart, so a retry names the same session), else random."""
    if client_request_id:
        return str(uuid.uuid5(REQUEST_NAMESPACE, client_request_id))
    return str(uuid.uuid4())


def handed_over(instance: str) -> session_service_pb2.SessionResult:
    """The terminal stream message of a session this replica stopped before it ended: it is
    not lost (its TaskSubmitted stays uncommitted), the next owner of its partition runs it."""
    return session_service_pb2.SessionResult(
        state=session_service_pb2.SESSION_STATE_PENDING,
        summary=(
            f"{instance} stopped before the session ended here; the next owner of its tasks "
            "partition runs it: GetSession on another replica, or SubmitTask again with the "
            "same client_request_id"
        ),
    )


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
        self.stats = (
            AgentStats(
                half_life=config.agent_stats_half_life,
                prior_weight=config.agent_stats_prior_weight,
            )
            if config.agent_stats
            else None
        )
        """What the sub-agents did in recent sessions (``PODIUM_AGENT_STATS``), fed by
        :attr:`stats_follower` and read by every session's environment; None when off."""
        self.learned: LearnedPolicySource | None = None
        """The learned policy's versions (``PODIUM_POLICY=learned``), else None."""
        self.policy = self._scheduling_policy(policy)
        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer_provider = provider
        self.tracer = provider.get_tracer(SERVICE)
        self.on_event = on_event
        self.publisher = EventPublisher(bus, producer_name=self.instance)
        self.settings = SessionSettings(
            producer=self.instance,
            result_timeout_s=config.session_timeout_s,
            max_decisions=config.max_decisions,
            assignment_partitions=config.topic_partitions,
        )
        self.shell = ServiceShell(SERVICE, shutdown_timeout_s=config.shutdown_timeout_s)
        """Runs the consumers and stops them within one deadline (:mod:`podium.service`)."""
        self.handles: OrderedDict[str, SessionHandle] = OrderedDict()
        self.running: dict[str, Session] = {}
        self._open: set[str] = set()
        """Sessions accepted by this replica's SubmitTask, maybe not ended (admission)."""
        self._session_tasks: dict[asyncio.Task[None], TP] = {}
        self._slot_freed = asyncio.Event()
        self.sessions_finished = 0
        self.review = (
            ReviewGate(
                self.publisher,
                ReviewSettings(self.instance, deadline_s=config.review_deadline_s),
            )
            if config.review_on
            else None
        )
        """The human review gate of sensitive subtasks (``PODIUM_REVIEW``), else None."""
        self._add_consumers()
        self.serve_grpc = serve_grpc
        # Built in start(): a grpc.aio server binds to the event loop it is created in.
        self.grpc: GrpcServer | None = None

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
        from podium.policy.signing import TrustedKeys

        # Decisions are single small forward passes: one thread keeps their latency low
        # and leaves the other cores to the services beside this one.
        torch.set_num_threads(1)
        self.learned = LearnedPolicySource(
            tuple(self.pool.agent_names),
            # ConfigError naming PODIUM_POLICY_TRUSTED_KEYS when unset: fails start-up.
            trusted=TrustedKeys.load(self.config.policy_trusted_keys),
            default_max_subtasks=self.config.policy_max_subtasks,
            sample_prefixes=self.config.policy_sample_from,
            explore_share=self.config.explore_share,
            backend=self._served_backend(self.config),
            scout=ScoutConfig() if self.config.scout else None,
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

    def _own_groups(self) -> dict[str, list[str]]:
        """This replica's own groups (every replica reads all of these topics), by topic."""
        group, me = self.config.group_id, self.instance
        own = {
            f"{group}.results.{me}": [topics.SUBTASK_RESULTS],
            f"{group}.scores.{me}": [topics.SCORED_TRAJECTORIES],
            f"{group}.ledger.{me}": [LEDGER],
        }
        if self.stats is not None:
            own[self._stats_group] = [topics.TRAJECTORIES]
        return own

    @property
    def _stats_group(self) -> str:
        return f"{self.config.group_id}.stats.{self.instance}"

    def _add_consumers(self) -> None:
        """The consumers, in start order: results, scores and the ledger before intake, so
        that the first session's results already have a consumer when its subtasks go out."""
        group = self.config.group_id
        results, scores, ledger, *_ = self._own_groups()
        self.results_consumer = self._consumer(topics.SUBTASK_RESULTS, results, self._on_result)
        self.scores_consumer = self._consumer(topics.SCORED_TRAJECTORIES, scores, self._on_score)
        self.ledger = self.shell.add(LedgerFollower(self.bus, ledger, group, self._on_ledger))
        # The store's merge work is this pool's split overhead (trajectories do not carry it).
        self.stats_follower = (
            self.shell.add(
                StatsFollower(
                    self.bus,
                    self._stats_group,
                    self.stats,
                    split_overhead=self.pool_spec.split_overhead,
                    # Only a Kafka group is positioned at the end (see start()); an
                    # in-process one reads its topic from the start anyway.
                    warm_records=self.config.agent_stats_warm
                    if isinstance(self.bus, KafkaBus)
                    else 0,
                )
            )
            if self.stats is not None
            else None
        )
        """Feeds :attr:`stats` from the trajectory topic (``PODIUM_AGENT_STATS=on``)."""
        # Before the policy consumer (the versions the state names are kept as they load) and
        # before intake: start() returns caught up, so the first session routes right.
        self.rollout = (
            self.shell.add(
                RolloutFollower(
                    self.bus,
                    f"{group}.rollout.{self.instance}",
                    topic=self.config.rollout_topic,
                    cold_start=self.policy.version,
                    on_state=self._on_rollout,
                )
            )
            if self.learned is not None and self.config.rollout == CONTROLLED
            else None
        )
        """The rollout state's follower (learned policy, ``PODIUM_ROLLOUT=controlled``)."""
        # Every replica loads every version, so each has its own group on the policy topic.
        self.policy_consumer = (
            self._consumer(
                topics.POLICY_UPDATES, f"{group}.policy.{self.instance}", self._on_policy
            )
            if self.learned is not None
            else None
        )
        # Every replica follows every review (any replica lists and decides any hold).
        self.review_consumer = (
            self._consumer(topics.REVIEWS, self._review_group, self.review.on_event)
            if self.review is not None
            else None
        )
        self.intake = self.shell.add(
            TaskIntake(self.bus, self, deployment=group, instance=self.instance)
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
        start the consumers (the rollout follower returns caught up with the rollout state),
        then open gRPC intake."""
        backend = self.learned.backend if self.learned is not None else None
        if backend is not None:
            await self._await_server(backend)
        p = self.config.topic_partitions
        written = (topics.SUBTASKS_ASSIGNED, topics.TRAJECTORIES, topics.FEEDBACK, LEDGER)
        read = (
            topics.TASKS,
            topics.dead_letter(topics.TASKS),
            topics.SUBTASK_RESULTS,
            topics.SCORED_TRAJECTORIES,
        )
        # The ledger is state keyed by session id: compaction keeps each session's last entry.
        compact = (("cleanup.policy", "compact"),)
        specs = [TopicSpec(t, p, config=compact if t == LEDGER else ()) for t in written + read]
        if self.rollout is not None:
            # The controller's state log (if absent): one writer, one ordered partition.
            specs.append(TopicSpec(self.config.rollout_topic, 1, config=compact))
        if self.review is not None:
            # State keyed by review id: compaction keeps each review's decision.
            specs.append(TopicSpec(topics.REVIEWS, p, config=compact))
        await self.bus.create_topics(specs)
        if isinstance(self.bus, KafkaBus):
            # Groups of this replica alone start at the end: results of runs before this
            # process are stale (sessions re-run with a fresh run id), scores and ledger
            # entries of them concern no handle here.
            await self.bus.position_groups_at_end(self._own_groups())
        await self._load_reviews()
        await self.shell.start()
        if self.serve_grpc:
            self.grpc = GrpcServer(
                self,
                self.config,
                pool=self.pool_spec,
                interceptor=server_interceptor(self.tracer_provider),
                review=ReviewServicer(self.review) if self.review is not None else None,
            )
            port = await self.grpc.start()
            _log.info("%s: SessionService on %s:%d", self.instance, self.config.grpc_host, port)

    @property
    def _review_group(self) -> str:
        return f"{self.config.group_id}.reviews.{self.instance}"

    async def _load_reviews(self) -> None:
        """Position the review follower at the end, then read the reviews' history: what is
        pending is listed here at once; what is published in between is read twice, which
        applying is indifferent to (the first decision of a review wins)."""
        if self.review is None:
            return
        if isinstance(self.bus, KafkaBus):
            await self.bus.position_groups_at_end({self._review_group: [topics.REVIEWS]})
        self.review.load(await read_committed(self.bus, topics.REVIEWS))

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
        and commit within the shutdown timeout, leave the tasks group (sessions still running
        are cancelled: their TaskSubmitted stays uncommitted for the next owner), stop the
        other consumers, and end every stream still open with a terminal message."""
        # One deadline for the whole shutdown, so it is bounded by PODIUM_SHUTDOWN_TIMEOUT_S
        # (plus a floor per phase to commit what is in hand), not by a sum of per-phase waits.
        deadline = self.shell.deadline()
        if self.grpc is not None:
            await self.grpc.set_serving(False)
        await self.shell.stop(self.intake, deadline=deadline)
        await self._drain_sessions(deadline.left(0.0))
        await self.intake.close()
        # Results were still consumed while sessions drained; now the rest may stop.
        await self.shell.stop(deadline=deadline)
        await self._end_streams()
        if self.grpc is not None:
            await self.grpc.stop(grace_s=min(deadline.left(), 5.0))
        if self.learned is not None and self.learned.backend is not None:
            self.learned.backend.close()
        if self.review is not None:
            await self.review.close()

    async def _drain_sessions(self, timeout_s: float) -> None:
        """Let running sessions finish for up to ``timeout_s``, then cancel the rest (their
        TaskSubmitted stays uncommitted; a session is deterministic given its seed)."""
        if not self._session_tasks:
            return
        _, pending = await asyncio.wait(set(self._session_tasks), timeout=timeout_s)
        await self._cancel(pending)

    async def _end_streams(self) -> None:
        """Every stream still open here ends with :func:`handed_over`."""
        for handle in list(self.handles.values()):
            if not handle.finished:
                await handle.finish(handed_over(self.instance))

    async def wait(self) -> None:
        """Return when the consumers have ended; raise if one crashed."""
        await self.shell.wait()

    # ------------------------------------------------------------------ SessionBackend

    async def submit(
        self, request: session_service_pb2.SubmitTaskRequest, submitted_by: str
    ) -> str:
        """Validate, register and publish a task; returns the session id.

        A ``client_request_id`` seen before returns its session (see :func:`session_id_for`).
        Raises :class:`AdmissionError` (``PODIUM_MAX_OPEN_SESSIONS``) when this replica has
        that many sessions accepted and not ended. If publishing fails, nothing is left
        behind: the handle is removed, so a retry starts clean.
        """
        session_id = session_id_for(request.client_request_id)
        if session_id in self.handles:
            return session_id
        self._admit()
        task = validate_task(
            self.pool_spec, message=task_message(request), text=request.task_spec_text
        )
        message = task_to_proto(task)
        submitted = task_pb2.TaskSubmitted(
            session_id=session_id, task=message, submitted_by=submitted_by, seed=request.seed
        )
        submitted.submitted_at.FromDatetime(datetime.now(UTC))
        self._register(
            SessionHandle(session_id=session_id, task=message, submitted_by=submitted_by)
        )
        self._open.add(session_id)
        try:
            await self.publisher.publish(
                topics.TASKS,
                submitted,
                key=session_id,
                idempotency_key=request.client_request_id or session_id,
            )
        except BaseException:  # cancelled by the client's deadline included
            self._forget(session_id)
            raise
        return session_id

    def _admit(self) -> None:
        """Raise :class:`AdmissionError` if this replica is at its open-session limit."""
        self._open = {
            s for s in self._open if (h := self.handles.get(s)) is not None and not h.finished
        }
        limit = self.config.max_open_sessions
        if len(self._open) >= limit:
            raise AdmissionError(
                f"{len(self._open)} sessions open on {self.instance}: at the limit "
                f"PODIUM_MAX_OPEN_SESSIONS={limit}; retry when sessions have ended",
                limit="PODIUM_MAX_OPEN_SESSIONS",
            )

    def _forget(self, session_id: str) -> None:
        """Drop a session that was never published (its SubmitTask failed)."""
        handle = self.handles.get(session_id)
        if handle is not None and not handle.finished:
            del self.handles[session_id]
        self._open.discard(session_id)

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

    # ------------------------------------------------------------------ SessionRunner

    def free_slots(self) -> int:
        return self.config.max_sessions - len(self._session_tasks)

    async def slot_freed(self, timeout_s: float) -> None:
        self._slot_freed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._slot_freed.wait(), timeout_s)

    def is_running(self, session_id: str) -> bool:
        return session_id in self.running

    async def start_session(self, submitted: task_pb2.TaskSubmitted, record: Record) -> None:
        """Run ``submitted`` in a task of its own; an invalid task ends at once, FAILED, with
        a trajectory, a ledger entry and the TaskSubmitted dead-lettered with the reason."""
        sid = submitted.session_id
        handle = self._register(
            SessionHandle(session_id=sid, task=submitted.task, submitted_by=submitted.submitted_by)
        )
        handle.submitted_by = submitted.submitted_by  # known now if the ledger made the handle
        try:
            task = validate_task(self.pool_spec, message=submitted.task)
        except SpecError as exc:
            await self._end_invalid(submitted, record, handle, exc)
            return
        policy, route = self._session_policy(submitted)
        session = Session(
            submitted,
            task,
            self.pool,
            policy,
            self.publisher,
            handle,
            self.settings,
            self.tracer,
            on_event=self.on_event,
            route=route,
            review=self.review,
            stats=self.stats,
        )
        self.running[sid] = session
        task_ = asyncio.create_task(self._run(session, record), name=f"session {sid}")
        self._session_tasks[task_] = (record.topic, record.partition)
        task_.add_done_callback(self._session_done)

    def _session_policy(self, submitted: task_pb2.TaskSubmitted) -> tuple[SchedulingPolicy, Route]:
        """The policy a new session runs on and its arm, chosen once (sessions in flight keep
        theirs whatever the rollout does next): under ``PODIUM_ROLLOUT=controlled`` the version
        the rollout state routes it to (:mod:`orchestrator_svc.arms`), else the newest loaded
        version, else this replica's rule engine, each as the live arm."""
        sid = submitted.session_id
        if self.learned is None:
            return self.policy, Route(self.policy.version, LIVE, bucket(sid), 0)
        if self.rollout is None:
            policy = self.learned.for_session(submitted)
            return policy, Route(policy.version, LIVE, bucket(sid), 0)
        state = self.rollout.state
        chosen = effective_route(
            self.rollout.route(sid),
            state.live_version if state is not None else "",
            self.learned.available,
            self.policy.version,
        )
        # Only the live arm explores: canary against baseline stays greedy against greedy.
        explore = chosen.role == LIVE
        return self.learned.for_session(submitted, chosen.version, explore=explore), chosen

    def _on_rollout(self, state: rollout_pb2.RolloutState) -> None:
        """A rollout state applied: keep the versions it may route to loaded."""
        assert self.learned is not None
        self.learned.pin((state.live_version, state.previous_version, state.candidate_version))

    def _session_done(self, task: asyncio.Task[None]) -> None:
        self._session_tasks.pop(task, None)
        self._slot_freed.set()

    async def cancel_sessions(self, partitions: frozenset[TP]) -> None:
        """Cancel the sessions of ``partitions`` without publishing (revoked or fenced)."""
        me = asyncio.current_task()
        await self._cancel(
            t for t, tp in self._session_tasks.items() if tp in partitions and t is not me
        )

    async def _cancel(self, tasks: Iterable[asyncio.Task[None]]) -> None:
        chosen = list(tasks)
        for t in chosen:
            t.cancel()
        for t in chosen:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _end_invalid(
        self,
        submitted: task_pb2.TaskSubmitted,
        record: Record,
        handle: SessionHandle,
        exc: SpecError,
    ) -> None:
        sid = submitted.session_id
        error = ProcessingError(f"session {sid}: invalid task ({exc.field}): {exc}")
        trajectory = failed_trajectory(submitted, f"invalid task: {exc}")
        result = failed_result(submitted, f"invalid task ({exc.field}): {exc}")
        outputs = [self.intake.dead_letter(record, error), self._trajectory_output(trajectory)]
        handle.trajectory = trajectory  # before the commit: the ledger follower may end it
        try:
            await self.intake.complete(record, outputs, self._done(sid, "", record, result))
        except PartitionLost:
            handle.trajectory = None
            return
        record_session(SERVICE, succeeded=False)
        await handle.finish(result)

    async def _run(self, session: Session, record: Record) -> None:
        """Run ``session``; publish its trajectory with its ledger entry and offset commit."""
        handle = session.handle
        try:
            trajectory = await session.run()
            result = session.result(trajectory)
            trajectory = self._fit(trajectory)
            done = self._done(session.session_id, session.run_id, record, result)
            # Set before the commit: the ledger follower may end the stream before we do.
            handle.trajectory = trajectory
            await self.intake.complete(record, [self._trajectory_output(trajectory)], done)
        except (PartitionLost, asyncio.CancelledError) as exc:
            # Another replica runs it now (or will); its ledger entry ends this stream.
            if not handle.finished:
                handle.trajectory = None
                handle.state = session_service_pb2.SESSION_STATE_PENDING
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        finally:
            self.running.pop(session.session_id, None)
        self.sessions_finished += 1
        record_session(
            SERVICE, succeeded=result.state == session_service_pb2.SESSION_STATE_SUCCEEDED
        )
        await handle.finish(result)

    def _done(
        self, sid: str, run_id: str, record: Record, result: session_service_pb2.SessionResult
    ) -> orchestrator_pb2.SessionDone:
        return orchestrator_pb2.SessionDone(
            session_id=sid,
            run_id=run_id,
            group_id=self.config.group_id,
            tasks_partition=record.partition,
            tasks_offset=record.offset,
            result=result,
            trajectory_id=sid,
            producer=self.instance,
            submitted_by=handle.submitted_by if (handle := self.handles.get(sid)) else "",
        )

    def _fit(self, trajectory: trajectory_pb2.Trajectory) -> trajectory_pb2.Trajectory:
        """``trajectory`` trimmed so its record (envelope and headers included) fits
        ``PODIUM_MAX_TRAJECTORY_BYTES``."""
        limit = self.config.max_trajectory_bytes
        budget = limit
        for _ in range(3):
            fitted = fit_trajectory(trajectory, budget)
            size = _record_size(self._trajectory_output(fitted))
            if size <= limit:
                break
            budget -= size - limit + 1024
        if fitted is not trajectory:
            _log.warning(
                "session %s: trajectory trimmed to fit %d bytes (%s)",
                trajectory.session_id,
                limit,
                fitted.labels.get("trimmed", ""),
            )
        return fitted

    def _trajectory_output(self, trajectory: trajectory_pb2.Trajectory) -> Output:
        """The Trajectory record, with an event id stable per session so that consumers
        dedupe a re-publication (e.g. a commit retried after an unconfirmed outcome)."""
        sid = trajectory.session_id
        _, value, headers = encode_record(
            trajectory,
            producer=self.instance,
            key=sid,
            idempotency_key=f"trajectory:{sid}",
            event_id=f"trajectory:{sid}",
        )
        return Output(topics.TRAJECTORIES, value, sid, headers)

    # ------------------------------------------------------------------ consumers

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

    async def _on_ledger(self, done: orchestrator_pb2.SessionDone) -> None:
        """A session ended somewhere: end its stream here too (a session run by another
        replica, or one this replica lost to another), and remember its result."""
        handle = self._register(SessionHandle(session_id=done.session_id, task=task_pb2.TaskSpec()))
        if not handle.submitted_by:
            handle.submitted_by = done.submitted_by
        await handle.finish(done.result)

    async def _on_score(self, envelope: envelope_pb2.Envelope, record: Record) -> None:
        scored = unpack_as(envelope, reward_pb2.ScoredTrajectory)
        handle = self.handles.get(scored.trajectory.session_id)
        if handle is not None and handle.result is not None:
            handle.result.score.CopyFrom(scored)


def _record_size(out: Output) -> int:
    """Bytes a record takes against the broker's limit: value, key and headers."""
    return len(out.value) + len(out.key.encode()) + sum(len(k) + len(v) for k, v in out.headers)
