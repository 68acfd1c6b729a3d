"""The rollout controller: the one fenced writer of the rollout registry.

It reads the scored trajectories through a :class:`~podium.bus.TransactionalMember` (group and
transactional-id prefix ``rollout``) and writes ONLY while it holds every partition of that
topic: two live controllers then never both write (while they share the partitions neither
does), and a zombie that still believes it holds them is fenced per partition by the
transactional ids its successor claimed. Each time it comes to hold them all it re-reads the
registry (the state, its transitions, the checkpoint) and writes WRITER_CLAIMED (epoch + 1).

One transaction per input partition batch: the records are absorbed into the evidence (shadow
twins, guardrails, stage counts), and the transitions they cause, the new state and the new
:class:`~podium.v1.rollout_pb2.ControllerCheckpoint` (absorbed offsets per partition and every
accumulator) are committed together with the partition's offsets. A restart (kill -9
included) resumes from the checkpoint: records below the absorbed offsets are skipped, so no
session counts twice and no step is taken twice. Operator commands and timer steps (a cycle's
proposal, the offline check, a stage's period) are written in a transaction of one held
partition that commits no offset; commands are queued and applied by the writer loop, between
batches, so everything that changes the state happens in one place, in order.

Automatic steps: IDLE at a cycle boundary proposes the newest verified version newer than
the live one and never proposed before (at most one automatic proposal per cycle period; an
operator may propose any version again); OFFLINE_CHECK replays the twins of the newest recorded live sessions;
SHADOW compares candidate and incumbent on the twin of every scored live session; STAGED feeds
canary and baseline sessions to the guardrails, rolls back at the first breach and advances
once a stage has served its period. A pause holds every step forward (proposals, verdicts
that pass, stage advances; shadow comparisons are not counted while paused) but never a
guardrail rollback or a failing verdict: safety is not paused.

The statistics store of the sub-agents (``PODIUM_ROLLOUT_AGENT_STATS``) is part of the
evidence: every scored trajectory absorbed (any arm, any stage, paused or not: they all ran
on the real sub-agents) feeds it once, in the batch's transaction, so a restart neither loses
nor double-counts an execution; twins (shadow, the offline check) run on a snapshot of the
store as committed before the batch: outcomes drawn from its estimated pool, every policy
reading it (:mod:`learner_svc.rollout.twins`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from learner_svc.rollout.config import ControllerSettings
from learner_svc.rollout.evidence import (
    CHECKPOINT_KEY,
    SHADOW,
    STAGED,
    STATE_KEY,
    Evidence,
    Registry,
    load_registry,
    newest_first,
    review_sampled,
    tp_key,
    transition_key,
)
from learner_svc.rollout.twins import TwinRunner
from podium import codec
from podium.bus import Bus, InProcBus, KafkaBus, read_committed, read_tail
from podium.bus.base import TP, PartitionTransaction, Record, TopicSpec, TransactionFencedError
from podium.errors import BusError, ConfigError, DecodeError, PodiumError, RolloutConflict
from podium.observed import AgentStats
from podium.rollout import (
    advance,
    can_advance,
    claim,
    initial_state,
    offline_checked,
    propose,
    rollback,
    session_metrics,
    shadow_done,
    stage_name,
)
from podium.v1 import reward_pb2, rollout_pb2, trajectory_pb2

_log = logging.getLogger(__name__)

R = trajectory_pb2.ArmRole
SERVED_ROLES = frozenset({R.ARM_ROLE_LIVE, R.ARM_ROLE_BASELINE, R.ARM_ROLE_CANARY})
"""Roles of sessions that served users: the ones compared in shadow and the offline check
(never twins, never training drivers' sessions without an arm)."""
WRITER_WAIT_S = 5.0
"""How long a command (or GetStatus) waits for this controller to be the writer before it is
answered UNAVAILABLE."""
REVIEW_PERCENT = 20
"""The stage whose canary sessions are sampled for human review."""
IDLE = rollout_pb2.ROLLOUT_STAGE_IDLE
OFFLINE = rollout_pb2.ROLLOUT_STAGE_OFFLINE_CHECK

Clock = Callable[[], datetime]
Command = Callable[[rollout_pb2.RolloutState, datetime], "Step"]
Step = tuple[rollout_pb2.RolloutState, rollout_pb2.RolloutTransition]


def utc_now() -> datetime:
    """The wall clock, in UTC."""
    return datetime.now(UTC)


class NotWriter(PodiumError):
    """This controller does not hold every input partition (another controller writes, or a
    rebalance is under way): commands go to the writer. Retriable."""

    retriable = True


@dataclass
class Pending:
    """An operator command waiting for the writer loop."""

    name: str
    apply: Command
    rollout_id: str
    done: asyncio.Future[rollout_pb2.RolloutTransition]


@dataclass
class ControllerStats:
    """What the controller did (for logs and tests)."""

    absorbed: int = 0
    """Scored trajectories absorbed into the evidence (counted once their transaction has
    committed)."""
    skipped_redelivered: int = 0
    """Records below the checkpoint's absorbed offset (already counted before a restart)."""
    skipped_duplicate: int = 0
    """Trajectories whose id was counted already."""
    undecodable: int = 0
    """Records that are not a ScoredTrajectory (logged, skipped)."""
    no_twin: int = 0
    """Shadow sessions without a twin (no task or seed recorded)."""
    executions: int = 0
    """Executions recorded into the statistics store (counted once committed)."""
    unrecorded: int = 0
    """Trajectories absorbed whose executions could not be recorded in the store (logged)."""
    claims: int = 0
    """Times this controller claimed the writer role."""
    fenced: int = 0
    """Times a write was fenced or failed and the registry had to be re-read."""
    transitions: list[int] = field(default_factory=list)
    """Kinds of the transitions this controller wrote, in order."""

    def fed(self, recorded: int | None) -> None:
        """Count what :meth:`Evidence.record_executions` returned for one trajectory."""
        if recorded is None:
            self.unrecorded += 1
        else:
            self.executions += recorded


def scored_of(record: Record) -> reward_pb2.ScoredTrajectory | None:
    """The scored trajectory in ``record``, or None if it is not one (logged)."""
    try:
        return codec.decode_event(record.value, reward_pb2.ScoredTrajectory)[1]
    except DecodeError as exc:
        _log.warning(
            "rollout: %s[%d]@%d skipped: %s", record.topic, record.partition, record.offset, exc
        )
        return None


def trajectory_of(record: Record) -> trajectory_pb2.Trajectory | None:
    """The trajectory in ``record``, or None if it is not one."""
    try:
        return codec.decode_event(record.value, trajectory_pb2.Trajectory)[1]
    except DecodeError:
        return None


def _finite(d: float | None) -> float | None:
    return d if d is not None and math.isfinite(d) else None


async def partition_count(bus: Bus, topic: str) -> int:
    """How many partitions ``topic`` has (0 if it does not exist yet)."""
    if isinstance(bus, KafkaBus):
        return len(await bus.partitions(topic, wait_s=5.0))
    if isinstance(bus, InProcBus):
        return bus.partitions_for(topic)
    raise PodiumError(f"the rollout controller needs a Kafka or in-process bus, not {bus!r}")


def offline_evidence(
    diffs: Sequence[float], wanted: int, tolerance: float
) -> tuple[bool, rollout_pb2.Evidence]:
    """The offline check's verdict on the paired differences of the replayed sessions.

    Passes when the paired mean is >= -``tolerance``. Fewer recorded sessions than ``wanted``
    (a young deployment) pass on what there is, and the evidence says how many there were;
    none at all pass with nothing checked (shadow still judges every live session).
    """
    n = len(diffs)
    mean = math.fsum(diffs) / n if n else 0.0
    passed = mean >= -tolerance
    ev = rollout_pb2.Evidence()
    ev.figures.update(
        {
            "sessions": float(n),
            "wanted": float(wanted),
            "paired_mean": mean,
            "tolerance": tolerance,
            "candidate_ran": 1.0,
        }
    )
    if n == 0:
        ev.summary = "offline check: no recorded live sessions to replay; passed unchecked"
    else:
        short = f" (only {n} of {wanted} recorded)" if n < wanted else ""
        verdict = "passed" if passed else "failed"
        ev.summary = (
            f"offline check {verdict}: paired mean {mean:+.4g} over {n} twins{short}, "
            f"tolerance {tolerance:g}"
        )
    return passed, ev


def status_evidence(evidence: Evidence, state: rollout_pb2.RolloutState) -> rollout_pb2.Evidence:
    """The current stage's evidence so far (GetStatus)."""
    ev = rollout_pb2.Evidence(summary=stage_name(state))
    if evidence.shadow is not None:
        total = evidence.shadow.total
        ev.figures.update(
            {
                "sessions": float(total.n),
                "mean": total.mean,
                "window": float(len(evidence.shadow.window)),
                "restarts": float(evidence.shadow.restarts),
            }
        )
    if evidence.guardrails is not None:
        ev.guardrails.extend(evidence.guardrails.readings())
        ev.figures["stage_sessions"] = float(evidence.stage_sessions)
    if evidence.stats is not None:  # every execution it ever recorded (its version)
        ev.figures["agent_stats_executions"] = float(evidence.stats.version)
    return ev


class RolloutController:
    """The writer loop (see the module docstring). A :class:`~podium.service.Worker`."""

    def __init__(
        self,
        settings: ControllerSettings,
        bus: Bus,
        runner: TwinRunner,
        *,
        instance: str,
        clock: Clock = utc_now,
    ) -> None:
        self.settings = settings
        self.rules = settings.rollout_settings()
        self.bus = bus
        self.runner = runner
        self.instance = instance
        self.clock = clock
        self.member = bus.transactional_member(
            [settings.in_topic], settings.group_id, settings.group_id, client_id=instance
        )
        self.member.on_rebalance(assigned=self._assigned, revoked=self._revoked)
        self.split_overhead = runner.pool.split_overhead
        """The pool's merge overhead: the work of a merge the store records."""
        self.registry = Registry()
        self.evidence = Evidence.fresh(self.rules, self._empty_store())
        self.stats = ControllerStats()
        self._is_writer = asyncio.Event()
        self._partitions = 0
        self._reload = True
        self._commands: asyncio.Queue[Pending] = asyncio.Queue()
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()

    @property
    def group_id(self) -> str:
        return self.settings.group_id

    def _empty_store(self) -> AgentStats | None:
        """An empty statistics store with the settings' half-life and prior weight (None:
        ``PODIUM_ROLLOUT_AGENT_STATS=off``)."""
        return self.settings.new_agent_stats() if self.settings.agent_stats else None

    @property
    def writer(self) -> bool:
        """Whether this controller holds every input partition and has claimed the writer role."""
        return self._is_writer.is_set()

    @writer.setter
    def writer(self, value: bool) -> None:
        if value:
            self._is_writer.set()
        else:
            self._is_writer.clear()

    @property
    def state(self) -> rollout_pb2.RolloutState | None:
        """The newest state this controller knows (written or read)."""
        return self.registry.state

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the topics it needs (the registry compacted, one partition so its records
        stay in order), read the registry, and join the group."""
        compact = (("cleanup.policy", "compact"),)
        rf = self.bus.replication_factor
        await self.bus.create_topics(
            [
                TopicSpec(self.settings.topic, partitions=1, replication_factor=rf, config=compact),
                TopicSpec(self.settings.in_topic, replication_factor=rf),
                TopicSpec(self.settings.trajectories_topic, replication_factor=rf),
            ]
        )
        await self._check_registry_topic()
        self._adopt(load_registry(await read_committed(self.bus, self.settings.topic)))
        await self.member.start()

    async def _check_registry_topic(self) -> None:
        """Refuse a registry topic someone else created with several partitions: its states
        and transitions would lose their one order (replicas apply by seq, but transitions
        and checkpoints would be read back out of order)."""
        if not isinstance(self.bus, KafkaBus):
            return
        found = await self.bus.partitions(self.settings.topic, wait_s=10.0)
        if len(found) != 1:
            raise ConfigError(
                f"PODIUM_ROLLOUT_TOPIC={self.settings.topic}: the rollout registry must have "
                f"exactly one partition (it has {len(found)}); delete it and let the controller "
                "create it (compacted, one partition)"
            )

    async def run(self) -> None:
        """The writer loop, until :meth:`stop`."""
        try:
            while not self._stopping.is_set():
                await self.step()
        finally:
            self._fail_commands(NotWriter("the rollout controller is stopping"))
            self._stopped.set()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the batch in hand, then leave the group."""
        self._stopping.set()
        try:
            await asyncio.wait_for(self._stopped.wait(), timeout=timeout_s)
        except TimeoutError:
            _log.warning("rollout: the writer loop did not stop within %.1fs", timeout_s)
        await self.member.stop()

    # -- commands ----------------------------------------------------------------------------

    async def command(
        self, name: str, apply: Command, rollout_id: str = ""
    ) -> rollout_pb2.RolloutTransition:
        """Have the writer apply ``apply`` to the state and write its transition; returns the
        transition. Raises :class:`RolloutConflict` when it does not apply (or ``rollout_id``
        is stale), :class:`NotWriter` when this controller is not the writer."""
        if not await self.wait_writer(WRITER_WAIT_S):
            raise NotWriter(f"{self.instance} is not the rollout writer now; try again shortly")
        done: asyncio.Future[rollout_pb2.RolloutTransition] = (
            asyncio.get_running_loop().create_future()
        )
        await self._commands.put(Pending(name, apply, rollout_id, done))
        return await done

    async def wait_writer(self, timeout_s: float) -> bool:
        """Whether this controller is the writer, waiting up to ``timeout_s`` for it to
        become so (a start, a take-over or a rebalance takes a moment)."""
        if not self.writer:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._is_writer.wait(), timeout_s)
        return self.writer

    def _fail_commands(self, exc: BaseException) -> None:
        while not self._commands.empty():
            pending = self._commands.get_nowait()
            if not pending.done.done():
                pending.done.set_exception(exc)

    # -- rebalance ---------------------------------------------------------------------------

    async def _assigned(self, tps: frozenset[TP]) -> None:
        self._reload = True  # whoever wrote meanwhile: re-read before writing again

    async def _revoked(self, tps: frozenset[TP]) -> None:
        if tps:
            self.writer = False

    async def _holds_all(self) -> bool:
        held = {p for t, p in self.member.assignment() if t == self.settings.in_topic}
        if self._partitions == 0 or any(p >= self._partitions for p in held):
            # First look, or the topic grew: every partition must be held, the new ones too.
            self._partitions = await partition_count(self.bus, self.settings.in_topic)
        return self._partitions > 0 and held == set(range(self._partitions))

    async def _ensure_writer(self) -> bool:
        """Whether this controller may write now; claims the role when it just came to hold
        every input partition (re-reading the registry first)."""
        if not await self._holds_all():
            if self.writer:
                _log.info("rollout: %s no longer holds every input partition", self.instance)
            self.writer = False
            return False
        if self.writer and not self._reload:
            return True
        self._reload = False
        self._adopt(load_registry(await read_committed(self.bus, self.settings.topic)))
        now = self.clock()
        state = self.registry.state or initial_state(self.rules, now, self.instance)
        await self._write(self._first_tp(), [claim(state, self.instance, now)[1]], self.evidence)
        self.writer = True
        self.stats.claims += 1
        _log.info(
            "rollout: %s is the writer (epoch %d, %s)",
            self.instance,
            self.registry.state.writer_epoch if self.registry.state else 0,
            stage_name(self.registry.state) if self.registry.state else "-",
        )
        return True

    def _adopt(self, registry: Registry) -> None:
        """Take ``registry`` as the truth: its state, and the evidence of its checkpoint when
        the checkpoint belongs to that state (else only its absorbed offsets)."""
        self.registry = registry
        cp, state = registry.checkpoint, registry.state
        store = self._empty_store()
        if cp is None or state is None:
            self.evidence = Evidence.fresh(self.rules, store)
            return
        self.evidence = Evidence.from_checkpoint(self.rules, cp, state, store)
        if cp.seq != state.seq:
            _log.warning(
                "rollout: checkpoint of seq %d under state %d: evidence restarted",
                cp.seq,
                state.seq,
            )
            # The store describes the sub-agents, not the rollout: it carries over.
            fresh = Evidence.fresh(self.rules, self.evidence.stats)
            fresh.absorbed = dict(cp.absorbed)
            fresh.enter(rollout_pb2.RolloutState(), state)
            self.evidence = fresh

    def _first_tp(self) -> TP:
        return min(self.member.assignment())

    # -- the loop ----------------------------------------------------------------------------

    async def step(self) -> None:
        """One round: fetch, absorb (if the writer), apply commands, take timer steps."""
        records = await self.member.fetch(max_records=500, timeout_s=self.settings.tick_s)
        try:
            if not await self._ensure_writer():
                if records:
                    await self.member.rewind(records)
                    await asyncio.sleep(self.settings.tick_s)
                self._fail_commands(NotWriter(f"{self.instance} is not the rollout writer now"))
                return
            await self._absorb(records)
            await self._apply_commands()
            await self._timers()
        except BusError as exc:
            await self._lost_write(exc, records)

    async def _lost_write(self, exc: BusError, records: Sequence[Record]) -> None:
        """A write failed (fenced, revoked, broker): drop what is in hand, re-read the
        registry before writing again; the records come back from the last commit."""
        self.stats.fenced += 1
        self.writer = False
        self._reload = True
        level = logging.WARNING if isinstance(exc, TransactionFencedError) else logging.INFO
        _log.log(level, "rollout: write failed (%s); re-reading the registry", exc)
        self._fail_commands(NotWriter(f"write failed: {exc}"))
        if records:
            await self.member.rewind(records)
        self._adopt(load_registry(await read_committed(self.bus, self.settings.topic)))

    async def _write(
        self,
        tp: TP,
        transitions: Sequence[rollout_pb2.RolloutTransition],
        evidence: Evidence,
        records: Sequence[Record] = (),
    ) -> None:
        """One transaction of ``tp``: the transitions (and the states they produced), the
        checkpoint of ``evidence`` and the offsets after ``records``; adopted once committed."""
        state = transitions[-1].state if transitions else self.registry.state
        assert state is not None
        txn = await self.member.begin(tp)
        try:
            await self._publish(txn, transitions, evidence.to_checkpoint(state))
            await txn.commit(records)
        except BaseException:
            await txn.abort()
            raise
        for t in transitions:
            self.registry.record(t)
            self.stats.transitions.append(t.kind)
            _log.info(
                "rollout: %s -> %s (%s)",
                rollout_pb2.TransitionKind.Name(t.kind),
                stage_name(t.state),
                t.reason,
            )
        self.evidence = evidence

    async def _publish(
        self,
        txn: PartitionTransaction,
        transitions: Sequence[rollout_pb2.RolloutTransition],
        checkpoint: rollout_pb2.ControllerCheckpoint,
    ) -> None:
        topic, producer = self.settings.topic, self.instance
        for t in transitions:
            key = transition_key(t.seq)
            await txn.publish(topic, codec.encode_event(t, producer=producer, key=key)[1], key=key)
            await txn.publish(
                topic,
                codec.encode_event(t.state, producer=producer, key=STATE_KEY)[1],
                key=STATE_KEY,
            )
        await txn.publish(
            topic,
            codec.encode_event(checkpoint, producer=producer, key=CHECKPOINT_KEY)[1],
            key=CHECKPOINT_KEY,
        )

    # -- absorbing scored trajectories ---------------------------------------------------------

    async def _absorb(self, records: Sequence[Record]) -> None:
        by_tp: dict[TP, list[Record]] = {}
        for r in records:
            by_tp.setdefault((r.topic, r.partition), []).append(r)
        for tp, recs in sorted(by_tp.items()):
            await self._absorb_partition(tp, recs)

    async def _absorb_partition(self, tp: TP, records: list[Record]) -> None:
        """Absorb one partition's batch in one transaction (see the module docstring)."""
        state = self.registry.state
        assert state is not None
        ev = self.evidence.copy(state)
        key = tp_key(*tp)
        fresh = [r for r in records if r.offset >= ev.absorbed.get(key, 0)]
        self.stats.skipped_redelivered += len(records) - len(fresh)
        scored = [s for s in map(scored_of, fresh) if s is not None]
        self.stats.undecodable += len(fresh) - len(scored)
        transitions: list[rollout_pb2.RolloutTransition] = []
        diffs, error = await self._shadow_diffs(state, scored)
        if error is not None:  # the candidate cannot run its twins: it fails shadow
            failed = rollout_pb2.Evidence(summary=f"candidate cannot run its twins: {error}")
            step = shadow_done(state, False, failed, self.clock(), stages=self.rules.stages)
            ev.enter(state, step[0])
            state = step[0]
            transitions.append(step[1])
        absorbed, fed = 0, ControllerStats()
        for i, s in enumerate(scored):
            if ev.seen(s.trajectory.trajectory_id):
                self.stats.skipped_duplicate += 1
                continue
            absorbed += 1
            fed.fed(ev.record_executions(s.trajectory, self.split_overhead))
            observed = self._observe(state, ev, s, diffs[i] if i < len(diffs) else None)
            if observed is not None:
                ev.enter(state, observed[0])
                state = observed[0]
                transitions.append(observed[1])
        ev.absorbed[key] = max(r.offset for r in records) + 1
        await self._write(tp, transitions, ev, records)
        self.stats.absorbed += absorbed  # counted once committed
        self.stats.executions += fed.executions
        self.stats.unrecorded += fed.unrecorded

    async def _shadow_diffs(
        self, state: rollout_pb2.RolloutState, scored: Sequence[reward_pb2.ScoredTrajectory]
    ) -> tuple[list[float | None], str | None]:
        """Paired twin differences of the batch's served sessions while in SHADOW (nothing
        to compute otherwise), and why the candidate cannot run its twins if it cannot (a
        missing or tampered artifact: not retriable; a retriable failure raises, and the batch
        is fetched again)."""
        if state.stage != SHADOW or state.paused or not scored:
            return [], None
        trajs = [s.trajectory if s.trajectory.arm.role in SERVED_ROLES else None for s in scored]
        wanted = [t for t in trajs if t is not None]
        try:
            # The store as committed before this batch (self.evidence, not the batch's copy).
            out = await self.runner.paired(
                state.candidate_version, state.live_version, wanted, self.evidence.stats
            )
        except PodiumError as exc:
            if exc.retriable:
                raise
            return [], str(exc)
        it = iter(out)
        # A non-finite difference (a twin that never ended) is no comparison at all.
        diffs = [None if t is None else _finite(next(it)) for t in trajs]
        self.stats.no_twin += sum(
            1 for t, d in zip(trajs, diffs, strict=True) if t is not None and d is None
        )
        return diffs, None

    def _observe(
        self,
        state: rollout_pb2.RolloutState,
        ev: Evidence,
        scored: reward_pb2.ScoredTrajectory,
        diff: float | None,
    ) -> Step | None:
        """Count one scored session in the evidence; the step it causes, if any."""
        arm = scored.trajectory.arm
        if arm.role == R.ARM_ROLE_UNSPECIFIED or arm.role not in SERVED_ROLES:
            return None
        ev.count_arm(arm)
        now = self.clock()
        if state.stage == SHADOW:
            return self._shadow_step(state, ev, diff, now)
        if state.stage == STAGED:
            return self._staged_step(state, ev, scored, now)
        return None

    def _shadow_step(
        self, state: rollout_pb2.RolloutState, ev: Evidence, diff: float | None, now: datetime
    ) -> Step | None:
        if diff is None or ev.shadow is None or state.paused:
            return None
        verdict = ev.shadow.add(diff)
        if verdict.passed or verdict.failed:
            return shadow_done(
                state, verdict.passed, verdict.evidence(), now, stages=self.rules.stages
            )
        return None

    def _staged_step(
        self,
        state: rollout_pb2.RolloutState,
        ev: Evidence,
        scored: reward_pb2.ScoredTrajectory,
        now: datetime,
    ) -> Step | None:
        arm = scored.trajectory.arm
        canary = arm.role == R.ARM_ROLE_CANARY
        if ev.guardrails is None or (canary and arm.policy_version != state.candidate_version):
            return None
        if arm.role not in (R.ARM_ROLE_CANARY, R.ARM_ROLE_BASELINE):
            return None
        ev.guardrails.add(arm.role, session_metrics(scored))
        if canary:
            ev.stage_sessions += 1
            sid = scored.trajectory.session_id
            if state.canary_percent == REVIEW_PERCENT and review_sampled(
                sid, state.review_sample_bp
            ):
                ev.review_queue.append(sid)
        breached = ev.guardrails.breached()
        if breached:
            names = ", ".join(g.name for g in breached)
            evidence = self._stage_evidence(state, ev, f"guardrail breached: {names}")
            return rollback(state, f"guardrail breached: {names}", evidence, now, "controller")
        return self._advance_step(state, ev, now)

    def _stage_evidence(
        self, state: rollout_pb2.RolloutState, ev: Evidence, summary: str
    ) -> rollout_pb2.Evidence:
        out = rollout_pb2.Evidence(summary=summary)
        out.figures["stage_sessions"] = float(ev.stage_sessions)
        out.figures["canary_percent"] = float(state.canary_percent)
        if ev.guardrails is not None:
            out.guardrails.extend(ev.guardrails.readings())
        return out

    def _advance_step(
        self, state: rollout_pb2.RolloutState, ev: Evidence, now: datetime
    ) -> Step | None:
        if not can_advance(state, self.rules, ev.stage_sessions, now):
            return None
        summary = (
            f"{state.candidate_version} served {ev.stage_sessions} canary sessions at "
            f"{state.canary_percent}% with no guardrail breached"
        )
        return advance(
            state, self._stage_evidence(state, ev, summary), now, stages=self.rules.stages
        )

    # -- commands and timers -------------------------------------------------------------------

    async def _apply_commands(self) -> None:
        while not self._commands.empty():
            pending = self._commands.get_nowait()
            state = self.registry.state
            assert state is not None
            try:
                if pending.rollout_id and pending.rollout_id != state.rollout_id:
                    raise RolloutConflict(
                        f"{pending.name}: stale command for rollout {pending.rollout_id!r}; the "
                        f"rollout now is {state.rollout_id or 'none'} ({stage_name(state)})",
                        state=stage_name(state),
                        command=pending.name,
                    )
                step = pending.apply(state, self.clock())
            except RolloutConflict as exc:
                pending.done.set_exception(exc)
                continue
            try:
                await self._write_step(step)
            except BaseException as exc:
                pending.done.set_exception(exc)
                raise
            pending.done.set_result(step[1])

    async def _write_step(self, step: Step) -> None:
        """Write one command or timer step (no offsets) in a transaction of a held partition."""
        before = self.registry.state
        assert before is not None
        ev = self.evidence.copy(before)
        ev.enter(before, step[0])
        await self._write(self._first_tp(), [step[1]], ev)

    async def _timers(self) -> None:
        state = self.registry.state
        assert state is not None
        now = self.clock()
        step: Step | None = None
        if state.stage == IDLE and not state.paused:
            step = self._cycle_step(state, now)
        elif state.stage == OFFLINE and not state.paused:
            step = await self._offline_step(state, now)
        elif state.stage == STAGED:
            step = self._advance_step(state, self.evidence, now)
        if step is not None:
            await self._write_step(step)

    def _cycle_step(self, state: rollout_pb2.RolloutState, now: datetime) -> Step | None:
        """At a cycle boundary, propose the newest verified version newer than the live one
        that was never proposed before (a rejected candidate is not re-proposed by itself),
        at most one automatic proposal per cycle period."""
        started = state.cycle_started_at.ToDatetime(tzinfo=UTC)
        if (now - started).total_seconds() < self.rules.cycle_s:
            return None
        last = max(self.registry.proposals.values(), default=-math.inf)
        if now.timestamp() - last < self.rules.cycle_s:
            return None
        version = self.runner.candidates.newest_after(state.live_version, self.registry.proposals)
        if version is None:
            return None
        reason = f"cycle {state.cycle}: newest verified version {version}"
        return propose(state, version, reason, "controller", now)

    async def _offline_step(self, state: rollout_pb2.RolloutState, now: datetime) -> Step:
        """Replay the twins of the newest recorded live sessions, candidate vs live."""
        n = self.rules.offline_sessions
        records = await read_tail(self.bus, self.settings.trajectories_topic, n)
        trajs = [
            t
            for t in map(trajectory_of, newest_first(records, 10 * n + 10))
            if t is not None and t.arm.role in SERVED_ROLES
        ][:n]
        try:
            out = await self.runner.paired(
                state.candidate_version, state.live_version, trajs, self.evidence.stats
            )
        except PodiumError as exc:
            if exc.retriable:
                raise
            ev = rollout_pb2.Evidence(
                summary=f"offline check failed: the candidate did not run: {exc}"
            )
            ev.figures["candidate_ran"] = 0.0
            return offline_checked(state, False, ev, self.clock())
        passed, ev = offline_evidence(
            [d for d in out if d is not None], n, self.rules.offline_tolerance
        )
        # Stamped when decided, not when the check began: the twins take seconds, and the
        # replicas' propagation delay is measured from changed_at.
        return offline_checked(state, passed, ev, self.clock())

    # -- status --------------------------------------------------------------------------------

    def status(self, transitions: int = 20) -> rollout_pb2.GetStatusResponse:
        """The state, the current evidence, recent transitions, arms and the review sample."""
        out = rollout_pb2.GetStatusResponse()
        state = self.registry.state
        if state is not None:
            out.state.CopyFrom(state)
            out.evidence.CopyFrom(status_evidence(self.evidence, state))
        recent = list(self.registry.transitions)[-(transitions or 20) :]
        out.transitions.extend(recent)
        out.arm_sessions.update(self.evidence.arm_sessions)
        out.review_queue.extend(self.evidence.review_queue)
        return out
