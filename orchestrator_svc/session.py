"""One orchestrated session: the swarm environment driven over the bus.

The orchestrator hosts a :class:`~podium.envs.swarm.simulator.SwarmEnv` per session so the
policy sees the observation and mask it was trained on, but swaps the environment's executor
for :class:`BusSimulator`: started executions become ``SubtaskAssigned`` events and their
outcomes come back as ``SubtaskResult`` events from ``subagent_svc``.

**Simulated time needs every running result.** The clock is event-driven: a WAIT jumps to the
next completion, and after every decision the completions already due are delivered. The
orchestrator can only know which running execution finishes first in *simulated* time once
it has the results of *all* running executions (a result still on the wire could end earlier
than every result in hand). So before each decision the session waits until every running
execution has reported. New executions start at the current clock and last a positive time,
so they are never due within the decision that starts them; this is what lets the
environment's synchronous ``step`` run unchanged. With seeds drawn in the same order as the
simulator's, a session over the bus reproduces the simulated session exactly (tested).
The price is one bus round trip per decision.

**Real sub-agents are scheduled as their results arrive.** When no agent of the pool is
simulated (every one a plug-in or an external worker), exact replay means nothing: their
outcomes are real work, and their simulated end is their assignment's clock plus the real
seconds they queued and ran (subagent_svc). Waiting for every running result before each
decision would then run a session's executions one at a time whatever the policy starts.
Such a session decides without waiting; only a WAIT with nothing in hand waits, for the
first result to arrive. A result that arrives after the clock passed its end is delivered
at the next decision (``complete`` keeps the clock monotone). Pools with any simulated agent
keep the exact rule above.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from opentelemetry import trace

from orchestrator_svc.config import SERVICE
from orchestrator_svc.policy import (
    RemotePolicy,
    SchedulingPolicy,
    TrainingPolicy,
    TrainingRecord,
)
from orchestrator_svc.review import (
    APPROVED,
    SESSION_END_REVIEWER,
    ReviewGate,
    review_id_for,
    verdict_name,
)
from podium import topics
from podium.bus.consumer import EventPublisher
from podium.bus.inproc import key_on_partition
from podium.envs.swarm import FINISH, START, WAIT, EnvConfig, PolicyStep, SwarmEnv
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.simulator import SwarmSimulator
from podium.envs.swarm.spec import RUNNER_SIMULATED, TaskSpec
from podium.envs.swarm.state import ExecutionRecord, InvalidActionError, StateConfig
from podium.envs.swarm.trajectory import (
    ENV_NAME,
    BusOutcomes,
    DecisionData,
    decision_message,
    episode_trajectory,
    execution_context,
)
from podium.errors import BusError, PodiumError
from podium.metrics import record_decision, record_live_policy_version
from podium.observed import AgentStats
from podium.policy.decisions import EpisodeRecorder
from podium.rollout.routing import Route
from podium.v1 import review_pb2, subtask_pb2, task_pb2, trajectory_pb2
from podium.v1 import session_service_pb2 as ss_pb2

_log = logging.getLogger(__name__)

__all__ = [
    "ENV_NAME",
    "BusSimulator",
    "Session",
    "SessionHandle",
    "SessionSettings",
    "failed_result",
    "failed_trajectory",
]


class SessionTimeout(PodiumError):
    """Sub-agent results did not arrive within the session timeout."""


# --------------------------------------------------------------------------- executor


class BusSimulator(SwarmSimulator):
    """The simulator's interface, with outcomes supplied by sub-agents over the bus.

    ``start`` derives each execution's seed exactly as :class:`SwarmSimulator` does, but instead of sampling the outcome it queues the execution
    in :attr:`outbox` for the session to publish. :meth:`add_result` feeds outcomes back;
    ``wait`` and ``deliver_due`` then behave as the simulator's, over those outcomes.

    A START of a slot in ``review_slots`` (sensitive subtasks, when the review gate is on)
    that is not approved yet starts nothing: the slot is held
    (:meth:`~podium.envs.swarm.state.SwarmState.hold`) and queued in :attr:`holds` for the
    session to request its review. The decision costs its step as any other; no simulated
    time passes for the review itself.
    """

    def __init__(
        self,
        task: TaskSpec,
        pool: SubagentPool,
        seed: int,
        config: StateConfig | None = None,
        *,
        review_slots: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__(task, pool, seed=seed, config=config)
        self.as_arrived = all(a.runner.kind != RUNNER_SIMULATED for a in pool.spec.agents)
        """No agent is simulated: results are delivered as they arrive (module docstring)."""
        self.review_slots = review_slots
        """Slots whose start needs a human review."""
        self.approved: set[int] = set()
        """Slots of :attr:`review_slots` approved: they start like any other from now on."""
        self.holds: list[tuple[int, int]] = []
        """(slot, agent) of START decisions held for review, not yet requested."""
        self.outbox: list[ExecutionRecord] = []
        """Executions started but not yet published."""
        self.results: dict[int, subtask_pb2.SubtaskResult] = {}
        """Results received, by execution number."""
        self.delivered: list[int] = []
        """Executions whose completion the state has seen, in delivery order."""

    def start(self, slot: int, agent: int, k: int = 1) -> list[ExecutionRecord]:
        if slot in self.review_slots and slot not in self.approved:
            self.state.hold(slot)
            self.holds.append((slot, agent))
            return []
        recs = self.state.start(slot, agent, k)
        for rec in recs:
            # Same seed as SwarmSimulator.start: replays match the simulator.
            self.seeds[rec.id] = self.execution_seed(rec)
            self.outbox.append(rec)
        return recs

    def add_result(self, execution: int, result: subtask_pb2.SubtaskResult) -> bool:
        """Record the outcome of a running execution; False if it is not awaited (duplicate)."""
        if execution in self.results or execution not in self.state.running:
            return False
        self.results[execution] = result
        ok = result.outcome == subtask_pb2.OUTCOME_SUCCESS
        heapq.heappush(self._events, (result.end_time, execution, ok))
        return True

    def missing(self) -> list[int]:
        """Running executions whose result has not arrived."""
        return [e for e in self.state.running if e not in self.results]

    def pending(self) -> list[int]:
        """Running executions whose result has arrived but is not delivered yet."""
        return [e for e in self.state.running if e in self.results]

    def deliver_due(self) -> int:
        ev, st, n = self._events, self.state, 0
        # The invariant of the module docstring: only executions started at this very clock
        # (by the decision being applied) may still lack a result; they cannot be due yet.
        if not self.as_arrived and any(st.running[e].start < st.clock for e in self.missing()):
            raise InvalidActionError("deliver_due() with results of earlier executions missing")
        while ev and ev[0][0] <= st.clock:
            end, eid, ok = heapq.heappop(ev)
            st.complete(eid, ok, end, self.results[eid].output if ok else None)
            self.delivered.append(eid)
            n += 1
        return n


# --------------------------------------------------------------------------- handle


@dataclass
class SessionHandle:
    """What gRPC sees of a session: its state, its event stream and its outcome."""

    session_id: str
    task: task_pb2.TaskSpec
    submitted_by: str = ""
    """Who submitted it (the authenticated principal): the one plugin that may read it."""
    state: int = ss_pb2.SESSION_STATE_PENDING
    events: list[ss_pb2.StreamSessionResponse] = field(default_factory=list)
    result: ss_pb2.SessionResult | None = None
    trajectory: trajectory_pb2.Trajectory | None = None
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def finished(self) -> bool:
        """Whether the session ended (its last event is the result)."""
        return self.result is not None

    async def emit(self, **event: object) -> None:
        """Append one stream event (``decision=``, ``subagent_started=``, ...)."""
        msg = ss_pb2.StreamSessionResponse(session_id=self.session_id, seq=len(self.events))
        for name, value in event.items():
            getattr(msg, name).CopyFrom(value)
        self.events.append(msg)
        async with self._changed:
            self._changed.notify_all()

    async def finish(self, result: ss_pb2.SessionResult) -> None:
        """Record the outcome and emit it as the last event (once: a session may be ended by
        its run and by the ledger entry of that run, whichever comes first)."""
        if self.finished:
            return
        self.result = result
        self.state = result.state
        await self.emit(result=result)

    async def stream(self, start: int = 0) -> AsyncIterator[ss_pb2.StreamSessionResponse]:
        """Every event from ``start`` on, live, until the result has been yielded."""
        i = start
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self.finished:
                return
            async with self._changed:
                await self._changed.wait_for(lambda n=i: len(self.events) > n)  # type: ignore[misc]


# --------------------------------------------------------------------------- session


@dataclass(frozen=True)
class SessionSettings:
    """Per-orchestrator settings a session runs with."""

    producer: str
    """Service instance name (stamped on events)."""
    result_timeout_s: float = 120.0
    """Wall-clock time to wait for the results of running executions."""
    max_decisions: int = 10_000
    """Decisions after which the session is truncated (counted as a loop)."""
    record_tensors: bool = False
    """Put observation tensors and masks into the decisions of rule-engine sessions too
    (behaviour cloning from live traffic); learned sessions always carry them."""
    assignment_partitions: int = 0
    """Partitions of the assignment topic (the orchestrator creates it with this many): a
    session keys each assignment so that its running executions land on the least used of
    them, hence on different sub-agent workers (Kafka's partitioner hashing execution ids
    would put several on one worker, which runs them one after another while others idle).
    0: keyed by the execution id alone."""


def session_env(
    task: TaskSpec,
    pool: SubagentPool,
    policy: SchedulingPolicy,
    settings: SessionSettings,
    stats: AgentStats | None,
) -> SwarmEnv:
    """The environment a session runs on: a learned policy's own layout (the one it was trained
    with), else one sized to the task; reading ``stats`` and never feeding it (the store's
    follower records every session's trajectory, this one's included)."""
    n = len(task.subtasks)
    config = (
        policy.env_config(n)
        if isinstance(policy, TrainingPolicy)
        else EnvConfig(
            max_subtasks=max(64, n), invalid_action="raise", max_steps=settings.max_decisions
        )
    )
    return SwarmEnv([task], pool, replace(config, feed_stats=False), stats=stats)


class Session:
    """Runs one task to its end: decisions, assignments, results, trajectory."""

    def __init__(
        self,
        submitted: task_pb2.TaskSubmitted,
        task: TaskSpec,
        pool: SubagentPool,
        policy: SchedulingPolicy,
        publisher: EventPublisher,
        handle: SessionHandle,
        settings: SessionSettings,
        tracer: trace.Tracer,
        *,
        on_event: Callable[[str, str], None] | None = None,
        route: Route | None = None,
        review: ReviewGate | None = None,
        stats: AgentStats | None = None,
    ) -> None:
        """``route``: the rollout arm the session was routed to when it started (recorded in
        its trajectory with the version that actually decided); None: no arm recorded.
        ``review``: the gate holding sensitive subtasks for a human decision (see
        :mod:`orchestrator_svc.review`); None: sensitive subtasks start like any other.
        ``stats``: the statistics store the session's environment reads (:func:`session_env`)."""
        self.submitted = submitted
        self.session_id = submitted.session_id
        self.task = task
        self.pool = pool
        self.policy = policy
        self.publisher = publisher
        self.handle = handle
        self.settings = settings
        self.tracer = tracer
        self.on_event = on_event
        """Optional ``(session_id, line)`` callback for human-readable progress (the demo)."""
        self.route = route
        self.seed = int(submitted.seed) or random.SystemRandom().getrandbits(63)
        # A run id makes execution ids unique per run, so results left over from an earlier
        # run of the same session (a redelivered TaskSubmitted) are recognised as stale.
        self.run_id = secrets.token_hex(4)
        n = len(task.subtasks)
        self.env = session_env(task, pool, policy, settings, stats)
        self.review = review
        sensitive = frozenset(i for i, s in enumerate(task.subtasks) if s.sensitive)
        self.sim = BusSimulator(
            task,
            pool,
            self.seed,
            StateConfig(loop_retry_limit=self.env.config.loop_retry_limit),
            review_slots=sensitive if review is not None else frozenset(),
        )
        self.reviews: dict[str, trajectory_pb2.ReviewRecord | None] = {}
        """Reviews of this run in request order; None while pending."""
        self._held: dict[str, tuple[int, asyncio.Future[trajectory_pb2.ReviewRecord]]] = {}
        """Pending reviews: review id -> (slot, its decision to come)."""
        self.review_wait_s = 0.0
        """Wall seconds during which at least one subtask was held (closed intervals)."""
        self._held_since = 0.0
        self.assigned: dict[int, subtask_pb2.SubtaskAssigned] = {}
        self.decisions: list[trajectory_pb2.Decision] = []
        """Decisions as streamed; the trajectory repeats them."""
        self.steps: list[PolicyStep] = []
        """The policy's output for each decision."""
        self.versions: list[str] = []
        """Version of the policy that made each decision."""
        self.rewards: list[float] = []
        """The environment's reward for each decision."""
        self.decide_ms: list[float] = []
        """Wall milliseconds the policy took for each decision (the guardrail on decision
        latency reads them from the trajectory)."""
        self.recorder: EpisodeRecorder | None = None
        """Training tensors of a rule-engine session (``record_tensors``)."""
        if settings.record_tensors and not isinstance(policy, TrainingPolicy):
            self.recorder = EpisodeRecorder(self.env.layout, self.env.codec, n)
        self.peak_parallel = 0
        self.end_reason = ""
        self._arrived = asyncio.Condition()
        self._partition_of: dict[int, int] = {}
        """Running executions' assignment partitions (:meth:`_assignment_key`)."""

    # ----------------------------------------------------------------- ids

    def execution_id(self, execution: int) -> str:
        """Public id of execution number ``execution`` of this run."""
        return f"{self.session_id}.{self.run_id}.{execution}"

    def execution_number(self, execution_id: str) -> int | None:
        """Execution number of a public id of this run, else None (stale or foreign)."""
        prefix = f"{self.session_id}.{self.run_id}."
        if not execution_id.startswith(prefix):
            return None
        tail = execution_id[len(prefix) :]
        # Off the bus: '²'.isdigit() is True but int('²') raises; a bare ASCII count or None.
        return int(tail) if tail.isascii() and tail.isdigit() and len(tail) <= 18 else None

    # ----------------------------------------------------------------- results in

    async def on_result(self, result: subtask_pb2.SubtaskResult) -> bool:
        """Feed a SubtaskResult of this session; False if stale or duplicate."""
        number = self.execution_number(result.execution_id)
        if number is None or not self.sim.add_result(number, result):
            return False
        async with self._arrived:
            self._arrived.notify_all()
        return True

    async def _await_running(self, *, first: bool = False) -> None:
        """Wait for every running execution's result, or with ``first`` for one to be in
        hand (a result not yet delivered), when anything is running."""
        sim = self.sim

        def arrived() -> bool:
            return bool(sim.pending()) if first else not sim.missing()

        if not sim.state.running or arrived():
            return
        async with self._arrived:
            try:
                await asyncio.wait_for(
                    self._arrived.wait_for(arrived), self.settings.result_timeout_s
                )
            except TimeoutError:
                ids = ", ".join(self.execution_id(e) for e in self.sim.missing()[:5])
                raise SessionTimeout(
                    f"no result within {self.settings.result_timeout_s:g}s for: {ids}"
                ) from None

    # ----------------------------------------------------------------- reviews

    async def _request_reviews(self) -> None:
        """Ask the gate to review each subtask the last decision held (see BusSimulator)."""
        holds, self.sim.holds = self.sim.holds, []
        if not holds:
            return
        assert self.review is not None  # only a gated BusSimulator holds
        for slot, agent in holds:
            spec = self.task.subtasks[slot]
            pending = review_pb2.PendingReview(
                review_id=review_id_for(self.session_id, self.run_id, spec.id),
                session_id=self.session_id,
                subtask_id=spec.id,
                kind=spec.kind,
                description=spec.description,
                agent=self.pool.agent_names[agent],
                submitted_by=self.submitted.submitted_by,
            )
            decision = await self.review.request(pending)
            if not self._held:
                self._held_since = time.monotonic()
            self._held[pending.review_id] = (slot, decision)
            self.reviews[pending.review_id] = None
            self._say(f"  {spec.id} held for review ({pending.review_id}) on {pending.agent}")

    async def _settle_reviews(self) -> None:
        """Apply the decisions in hand; when no action is possible until one arrives (only
        held subtasks are left), wait for the next, in wall time: the simulated clock stands
        still, so waiting for a human never counts as scheduling latency."""
        self._apply_decisions()
        while self._held and self.env.valid_action_count() == 0:
            waiting = {decision for _, decision in self._held.values()}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            self._apply_decisions()

    def _apply_decisions(self) -> None:
        """Release approved holds (the policy may start them now) and withdraw the others
        (they never run; their dependents never either)."""
        state, changed = self.sim.state, False
        for rid, (slot, decision) in list(self._held.items()):
            if not decision.done():
                continue
            record = decision.result()
            self._finish_review(rid, record)
            if record.verdict == APPROVED:
                self.sim.approved.add(slot)
                state.release(slot)
            else:
                state.withdraw(slot)
            changed = True
            self._say(
                f"  {record.subtask_id} {verdict_name(record.verdict)} by {record.reviewer} "
                f"after {record.wait_s:.1f}s" + (f": {record.reason}" if record.reason else "")
            )
        if changed:
            self.env.refresh()

    def _finish_review(self, review_id: str, record: trajectory_pb2.ReviewRecord) -> None:
        """Record a decided review; close the wait interval when nothing is held any more."""
        self._held.pop(review_id, None)
        self.reviews[review_id] = record
        if not self._held:
            self.review_wait_s += time.monotonic() - self._held_since

    async def _end_reviews(self) -> None:
        """The session ended with subtasks still held (a timeout, a truncation): their
        reviews end as expired, so no replica lists them any more."""
        if not self._held or self.review is None:
            return
        reason = (
            f"session ended before a decision{': ' + self.end_reason if self.end_reason else ''}"
        )
        try:
            records = await self.review.abandon(list(self._held), reason[:2000])
        except Exception:  # the trajectory must still be published
            _log.exception("session %s: could not close its reviews", self.session_id)
            records = []
        for record in records:
            self._finish_review(record.review_id, record)
        for rid in list(self._held):  # not published: still recorded as ended here
            record = trajectory_pb2.ReviewRecord(
                review_id=rid,
                session_id=self.session_id,
                subtask_id=self.task.subtasks[self._held[rid][0]].id,
                verdict=trajectory_pb2.REVIEW_VERDICT_EXPIRED,
                reviewer=SESSION_END_REVIEWER,
                reason=reason,
            )
            self._finish_review(rid, record)

    def _review_summary(self) -> str:
        """``; review: a rejected by bob, b expired`` for the session result, or ""."""
        ended = [
            f"{r.subtask_id} {verdict_name(r.verdict)}"
            + (f" by {r.reviewer}" if r.reviewer else "")
            for r in self.reviews.values()
            if r is not None and r.verdict != APPROVED
        ]
        return f"; review: {', '.join(ended)}" if ended else ""

    # ----------------------------------------------------------------- the loop

    async def run(self) -> trajectory_pb2.Trajectory:
        """Run the session to its end; returns its trajectory (not published: the app
        publishes it with the session's offset commit, see :mod:`orchestrator_svc.intake`).

        Every end gives a trajectory: a timeout or a crash of the session's own code ends it
        as not completed, with the reason in the ``end_reason`` label.
        """
        started_at = datetime.now(UTC)
        truncated = False
        with self.tracer.start_as_current_span(
            "session", attributes={"podium.session_id": self.session_id}
        ):
            try:
                truncated = await self._loop()
            except SessionTimeout as exc:
                self.end_reason = f"timeout: {exc}"
                _log.warning("session %s: %s", self.session_id, exc)
            except Exception as exc:  # a bug or bad data must still end the session
                self.end_reason = f"crashed: {type(exc).__name__}: {exc}"[:2000]
                _log.exception("session %s crashed", self.session_id)
            await self._end_reviews()
            try:
                return self._trajectory(started_at, truncated)
            except Exception as exc:
                _log.exception("session %s: trajectory could not be built", self.session_id)
                reason = f"crashed: {type(exc).__name__}: {exc}"[:2000]
                return failed_trajectory(self.submitted, self.end_reason or reason)

    async def _loop(self) -> bool:
        """Decide until the episode ends; whether it was truncated."""
        self.env.reset(seed=self.seed & 0xFFFFFFFF, options={"task": self.task})
        # Swap the executor: same fresh state, outcomes from the bus (see module doc).
        self.env.use_simulator(self.sim)
        self.handle.state = ss_pb2.SESSION_STATE_RUNNING
        terminated = truncated = False
        while not (terminated or truncated):
            if not self.sim.as_arrived:
                await self._await_running()
            await self._settle_reviews()
            terminated, truncated = await self._decide()
            await self._request_reviews()
        if self.sim.state.loop_detected:
            self.end_reason = self.sim.state.loop_reason
        elif truncated:
            self.end_reason = f"truncated after {len(self.decisions)} decisions"
        return truncated

    async def _decide(self) -> tuple[bool, bool]:
        """One decision: ask the policy, apply it, stream it; (terminated, truncated)."""
        env, state = self.env, self.sim.state
        started = time.perf_counter()
        step = (
            await self.policy.act_async(env)
            if isinstance(self.policy, RemotePolicy)
            else self.policy.act(env)
        )
        decide_ms = (time.perf_counter() - started) * 1000.0
        record_decision(SERVICE, decide_ms / 1000.0)
        if self.recorder is not None:
            self.recorder.record(env.observation(), env.action_masks(), step.action)
        if self.sim.as_arrived and step.action == env.codec.wait:
            await self._await_running(first=True)
        before = len(self.sim.delivered)
        _, reward, terminated, truncated, _ = env.step(step.action)
        self.decide_ms.append(decide_ms)
        self.steps.append(step)
        self.versions.append(self.policy.version)  # a served policy's may change per decision
        record_live_policy_version(SERVICE, self.versions[-1])
        self.rewards.append(float(reward))
        decision = decision_message(
            env,
            len(env.decisions) - 1,
            policy_version=self.versions[-1],
            log_prob=step.log_prob,
            value=step.value,
            env_reward=self.rewards[-1],
        )
        decision.decide_ms = self.decide_ms[-1]
        self.decisions.append(decision)
        await self.handle.emit(decision=decision)
        self._say(self._describe(decision))
        for eid in self.sim.delivered[before:]:
            result = self.sim.results[eid]
            await self.handle.emit(subagent_finished=result)
            self._say(
                f"  t={result.end_time:6.2f}  {result.subtask_id} finished on {result.agent}: "
                f"{subtask_pb2.Outcome.Name(result.outcome).removeprefix('OUTCOME_').lower()}"
            )
        await self._publish_outbox()
        self.peak_parallel = max(self.peak_parallel, len(state.running))
        return terminated, truncated

    async def _publish_outbox(self) -> None:
        state = self.sim.state
        outbox, self.sim.outbox = self.sim.outbox, []
        for rec in outbox:
            unit = rec.unit
            spec = self.task.subtasks[rec.slot]
            # The same isolated context the simulator's trajectories record: the unit's own
            # spec and its dependencies' outputs, nothing else.
            context = execution_context(state, unit, rec.context_units)
            deps = context.dependency_results
            assigned = subtask_pb2.SubtaskAssigned(
                session_id=self.session_id,
                execution_id=self.execution_id(rec.id),
                subtask_id=state.unit_id(unit),
                kind=spec.kind,
                agent=self.pool.agent_names[rec.agent],
                attempt=rec.attempt,
                split_k=rec.split_k,
                context=context,
                sim_time=rec.start,
                seed=self.sim.seeds[rec.id],
            )
            self.assigned[rec.id] = assigned
            # Keyed per execution, not by session (one session's parallel executions must
            # spread over the worker group) nor by agent kind (a handful of agent names hash
            # onto few partitions and leave workers idle; per-kind worker pools would use
            # per-kind topics instead): see _assignment_key.
            await self._publish_assignment(assigned, self._assignment_key(rec.id))
            await self.handle.emit(
                subagent_started=ss_pb2.SubagentStarted(
                    execution_id=assigned.execution_id,
                    subtask_id=assigned.subtask_id,
                    agent=assigned.agent,
                    sim_time=assigned.sim_time,
                )
            )
            self._say(
                f"  t={rec.start:6.2f}  {assigned.subtask_id} -> {assigned.agent} "
                f"(attempt {rec.attempt}, context: {len(deps)} dependency outputs)"
            )

    async def _publish_assignment(self, assigned: subtask_pb2.SubtaskAssigned, key: str) -> None:
        """Publish ``assigned``, retrying transient broker errors for up to the result
        timeout (a broker stall delays the session rather than failing it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.result_timeout_s
        delay = 0.1
        # ``key`` is chosen once: a retry goes to the same partition, where its member
        # dedupes it.
        while True:
            try:
                await self.publisher.publish(
                    topics.SUBTASKS_ASSIGNED,
                    assigned,
                    key=key,
                    idempotency_key=assigned.execution_id,
                    # Stable: a retry after an unconfirmed send is the same event to dedupe.
                    event_id=f"assigned:{assigned.execution_id}",
                )
                return
            except BusError as exc:
                if not exc.retriable or loop.time() + delay > deadline:
                    raise SessionTimeout(
                        f"could not publish {assigned.execution_id}: {exc}"
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _assignment_key(self, execution: int) -> str:
        """The record key of an assignment: its execution id, suffixed so that it lands on
        the partition fewest of this session's running executions are on (the session's
        own rotation breaks ties, so sessions start on different partitions); see
        :attr:`SessionSettings.assignment_partitions`."""
        execution_id = self.execution_id(execution)
        partitions = self.settings.assignment_partitions
        if partitions <= 1:
            return execution_id
        running = self.sim.state.running
        self._partition_of = {e: p for e, p in self._partition_of.items() if e in running}
        load = [0] * partitions
        for partition in self._partition_of.values():
            load[partition] += 1
        rotation = self.seed % partitions
        target = min(range(partitions), key=lambda p: (load[p], (p - rotation) % partitions))
        self._partition_of[execution] = target
        return key_on_partition(execution_id, target, partitions)

    # ----------------------------------------------------------------- output

    def _describe(self, d: trajectory_pb2.Decision) -> str:
        a = d.action
        head = f"decision {d.step:3d} t={d.observation.clock:6.2f}"
        if a.type == START:
            split = f" split k={a.split_k}" if a.split_k > 1 else ""
            return f"{head}  START {a.subtask_id} on {a.agent}{split} ({d.valid_actions} valid)"
        if a.type == WAIT:
            return f"{head}  WAIT ({d.observation.running} running)"
        if a.type == FINISH:
            return f"{head}  FINISH"
        return f"{head}  action {a.index}"

    def _say(self, line: str) -> None:
        if self.on_event is not None:
            self.on_event(self.session_id, line)

    def _trajectory(self, started_at: datetime, truncated: bool) -> trajectory_pb2.Trajectory:
        """The environment's trajectory of this episode, with what only the session knows:
        the policy's outputs per decision, the training tensors, and the bus's view of every
        execution (real ids, outcomes with MALFORMED, tool calls, verification)."""
        record = self._training_record()
        if record.data is not None:
            data = record.data
        elif self.recorder is not None:
            data = self.recorder.decision_data(self.rewards)
        else:
            data = DecisionData(
                log_probs=[s.log_prob for s in self.steps],
                values=[s.value for s in self.steps],
                rewards=self.rewards,
            )
        arm = (
            # What actually decided (a served policy's may differ from the one routed to).
            replace(self.route, version=record.policy_version) if self.route is not None else None
        )
        labels = {
            **({"arm": arm.label} if arm is not None else {}),
            "seed": str(self.seed),
            "run_id": self.run_id,
            "policy": self.policy.name,
            "submitted_by": self.submitted.submitted_by,
            **({"end_reason": self.end_reason} if self.end_reason else {}),
            **record.labels,
        }
        traj = episode_trajectory(
            self.env,
            policy_version=record.policy_version,
            trajectory_id=self.session_id,
            session_id=self.session_id,
            labels=labels,
            data=replace(data, versions=self.versions),
            bus=BusOutcomes(assigned=self.assigned, results=self.sim.results),
            truncated=truncated,
            started_at=started_at,
            ended_at=datetime.now(UTC),
            reviews=[r for r in self.reviews.values() if r is not None],
            review_wait_s=self.review_wait_s,
        )
        # Not strict: a decision the environment refused (a crash) has no entry here.
        for decision, ms in zip(traj.decisions, self.decide_ms, strict=False):
            decision.decide_ms = ms
        if arm is not None:
            traj.arm.CopyFrom(arm.arm())
        return traj

    def _training_record(self) -> TrainingRecord:
        """What the policy adds to the trajectory (a training policy: its version attribution,
        labels and tensors; any other: its version)."""
        if isinstance(self.policy, TrainingPolicy):
            return self.policy.training_record(self.rewards)
        return TrainingRecord(self.policy.version)

    def result(self, traj: trajectory_pb2.Trajectory) -> ss_pb2.SessionResult:
        """The terminal result of the session whose (published) trajectory is ``traj``."""
        state = self.sim.state
        ok = traj.completed
        ratio = traj.latency / traj.lower_bound if traj.lower_bound > 0 else float("nan")
        summary = (
            f"{self.task.name}: {'completed' if ok else 'not completed'} "
            f"{state.done_slots}/{state.num_slots} subtasks in {traj.latency:.2f} "
            f"(lower bound {traj.lower_bound:.2f}, ratio {ratio:.2f}), "
            f"{len(traj.decisions)} decisions, {len(traj.executions)} executions, "
            f"peak parallelism {self.peak_parallel}"
            + (f"; {self.end_reason}" if self.end_reason else "")
            + self._review_summary()
        )
        return ss_pb2.SessionResult(
            state=ss_pb2.SESSION_STATE_SUCCEEDED if ok else ss_pb2.SESSION_STATE_FAILED,
            latency=traj.latency,
            lower_bound=traj.lower_bound,
            completed_subtasks=state.done_slots,
            total_subtasks=state.num_slots,
            loop_detected=traj.loop_detected,
            decisions=len(traj.decisions),
            executions=len(traj.executions),
            peak_parallelism=self.peak_parallel,
            summary=summary,
        )


def failed_trajectory(submitted: task_pb2.TaskSubmitted, reason: str) -> trajectory_pb2.Trajectory:
    """The trajectory of a session that could not run (invalid task) or whose trajectory
    could not be built: no decisions, not completed, ``reason`` as its ``end_reason``."""
    traj = trajectory_pb2.Trajectory(
        trajectory_id=submitted.session_id,
        session_id=submitted.session_id,
        env=ENV_NAME,
        task=submitted.task,
        completed=False,
    )
    traj.labels["end_reason"] = reason
    traj.labels["submitted_by"] = submitted.submitted_by
    now = datetime.now(UTC)
    traj.started_at.FromDatetime(now)
    traj.ended_at.FromDatetime(now)
    return traj


def failed_result(submitted: task_pb2.TaskSubmitted, reason: str) -> ss_pb2.SessionResult:
    """The terminal result of a session that could not run."""
    return ss_pb2.SessionResult(
        state=ss_pb2.SESSION_STATE_FAILED,
        total_subtasks=len(submitted.task.subtasks),
        summary=f"{submitted.task.name or submitted.session_id}: not run: {reason}",
    )
