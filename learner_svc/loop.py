"""The learning loop: consume → train → checkpoint → commit → publish, exactly once, crash-safe.

This is the one learning loop of Podium: ``python -m learner_svc`` runs it, and so do both
drivers of ``podium train`` (embedded over the in-process bus, distributed over Kafka). The
math is the :class:`~learner_svc.algorithm.Algorithm`'s; the loop owns the stream.

Per batch of ``batch_trajectories`` usable trajectories the loop does, in this order:

1. **train**: one :meth:`Algorithm.update` on the batch (in a worker thread);
2. **checkpoint**: weights, optimizer, RNG, step, policy version, counters and the *consumed
   offsets* (per partition, the first offset not yet accounted for), written atomically
   (:mod:`learner_svc.checkpoint`);
3. **commit** the records to the consumer group;
4. **publish** the new version (:meth:`Algorithm.publish`) and announce it with a
   ``PolicyUpdated`` event whose event id is ``<model>:<version>`` (re-announcements dedupe).

A crash before 2 loses the in-memory update; the records were not committed, so they come
back and are trained on once, by the restarted learner. A crash between 2 and 3 (the case the
crash tests force with a SIGKILL) brings back records the checkpoint already contains: the
restarted learner skips every record below the checkpoint's offset for its partition and
counts it in ``skipped_redelivered``. A crash between 2 and 4 leaves the version unannounced;
on start the loop publishes and announces its checkpoint's version again (identical bytes, so
the immutable-version rule holds). Net effect: every scored trajectory is trained on exactly
once in the lineage of the weights, and the ledger of trained ids proves it.

**Staleness (η).** A trajectory's policy lag is the learner's current policy version minus the
version that acted (the last integer in ``Trajectory.policy_version``; none, e.g. the rule
engine, counts as version 0). Trajectories with lag > ``max_policy_lag`` are **dropped**
(counted in ``dropped_stale``, offsets advanced, never trained on). Within the bound no extra
importance weight is applied: PPO's ratio ``pi_new / pi_behaviour`` is computed against the
behaviour log-probability recorded in each decision, so it already is the importance weight,
and clipping bounds it.

**Poison.** A record that cannot become training data — undecodable bytes, a malformed
``policy_version`` (parsed strictly: ASCII digits only, :mod:`podium.policy.versions`), wrong
shapes or tensors, a NaN or infinity (:func:`check_finite`: one would turn every weight into
NaN), anything :meth:`Algorithm.decode` raises on — goes to the dead-letter topic
with the error in its headers, is counted in ``dead_lettered`` and its offset is accounted for:
one bad record never stops the learner.

**Duplicates.** Upstream is meant to deliver each scored trajectory once, but the learner does
not rely on it: it remembers the trajectory ids of its last ``dedupe_updates`` updates (in the
checkpoint, so across restarts) and those of the batch in hand, and drops a record whose id is
among them (logged, counted in ``skipped_duplicate``, committed, never trained on).

**The rollout** (:mod:`learner_svc.lineage`). With ``rollout_topic`` set the loop also follows
the rollout registry (``podium.rollout.v1``) in a group of its own (``<group>.rollout``), from
its beginning, never committing: the checkpoint's ``rollout_seq`` says which transitions are
already applied. Between fetches it applies new transitions; when one rejects the lineage it is
training (its candidate failed offline or in shadow, was rolled back, or a promotion was
undone) while the live version is a learned one, it **resets**: weights to the live version's,
loaded from that version's signed announcement on the policy topic (verified with the learner's
own public key and ``trusted_keys``, the file checked against the announced sha256), the
optimizer's moments cleared, and trains on from there; versions keep counting up. A reset is
in memory until the next update's checkpoint records it with the lineage (``reset_from``,
``reset_at``, ``resets``, ``rollout_seq``), so a learner that dies before then re-reads the
registry and resets again, and one that restarts after never does it twice. Policy lag is
measured along the lineage: samples of an abandoned lineage are stale.

The learner is one consumer (it scales by data parallelism, not by splitting partitions among
members): a rebalance mid-batch could otherwise hand uncommitted records to another member.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Generic

from learner_svc.algorithm import Algorithm, SampleT, version_number
from learner_svc.checkpoint import LearnerState, load_checkpoint, save_checkpoint
from learner_svc.config import LoopConfig
from learner_svc.lineage import Lineage, announced_weights, decode_transition, follow
from podium import codec
from podium.bus.base import Bus, Record, Subscriber
from podium.bus.consumer import EventPublisher, consume_span, publish_dead_letter
from podium.errors import DecodeError, PodiumError
from podium.metrics import (
    lag_by_topic,
    record_consumer_lag,
    record_dead_letters,
    record_learner_update,
)
from podium.policy.artifacts import load_into
from podium.policy.signing import TRUSTED_KEYS_VAR, TrustedKeys, announcement_event_id
from podium.service import ServiceShell
from podium.v1 import reward_pb2, rollout_pb2

_log = logging.getLogger(__name__)

_DECISION_NUMBERS = ("log_prob", "value", "env_reward")


def check_finite(scored: reward_pb2.ScoredTrajectory) -> None:
    """Raise :class:`DecodeError` naming the first non-finite number a training sample would
    carry: the total, the rollout baseline's return, or a decision's log-probability, value
    or reward. One NaN in a batch turns every weight into NaN, and that version would be
    published to the orchestrators, so such a record is poison even though it decodes."""
    traj = scored.trajectory
    what = f"trajectory {traj.trajectory_id or traj.session_id}"
    if not math.isfinite(scored.total):
        raise DecodeError(f"{what}: total is {scored.total}")
    if not math.isfinite(traj.baseline.env_return):
        raise DecodeError(f"{what}: baseline.env_return is {traj.baseline.env_return}")
    for t, decision in enumerate(traj.decisions):
        for name in _DECISION_NUMBERS:
            value = getattr(decision, name)
            if not math.isfinite(value):
                raise DecodeError(f"{what} decision {t}: {name} is {value}")


class LearningLoop(Generic[SampleT]):
    """Consumes scored trajectories from ``bus``; trains, checkpoints, commits and publishes.

    ``after_checkpoint(step)`` runs right after each checkpoint is written and before the
    commit; it exists for fault injection (the crash tests kill the process there).
    """

    def __init__(
        self,
        config: LoopConfig,
        algorithm: Algorithm[SampleT],
        bus: Bus,
        *,
        after_checkpoint: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self.algorithm = algorithm
        self.bus = bus
        self.after_checkpoint = after_checkpoint
        self.state = LearnerState()
        self.publisher = EventPublisher(bus, producer_name=config.client_id)
        self.updated = asyncio.Condition()
        """Notified after each announced version and each reset (drivers and tests wait on
        it)."""
        self._writer: Any = None
        self._pending: list[SampleT] = []
        """Usable samples not yet trained on."""
        self._pending_versions: list[int] = []
        """The version that acted in each (a reset re-checks their lag on the new lineage)."""
        self._pending_ids: set[str] = set()
        """Their trajectory ids."""
        self._trained_ids: set[str] = set()
        """Trajectory ids of the remembered updates (``state.recent_trained``)."""
        self._handled: list[Record] = []
        """Records accounted for since the last commit."""
        self._idle_since = time.monotonic()
        self._stopping = asyncio.Event()
        # Loaded now, so a bad setting fails the start, naming the variable.
        self._extra_trust = (
            TrustedKeys.load(config.trusted_keys, TRUSTED_KEYS_VAR) if config.trusted_keys else None
        )
        self._restore()

    @property
    def group_id(self) -> str:
        """The learner's consumer group."""
        return self.config.group_id

    async def start(self) -> None:
        """Nothing to do before :meth:`run`: it joins the group itself (a
        :class:`~podium.service.Worker` of the service shell)."""

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Ask :meth:`run` to end after the update in hand (the shell waits for it, up to its
        deadline); an incomplete batch is not committed, so it is redelivered."""
        del timeout_s  # the shell bounds the wait on the run task
        self._stopping.set()

    def _restore(self) -> None:
        ckpt = load_checkpoint(self.config.checkpoint_dir)
        if ckpt is None:
            return
        algo = self.algorithm
        algo.model.load_state_dict(ckpt.model, strict=True)
        algo.optimizer.load_state_dict(ckpt.optimizer)
        algo.generator.set_state(ckpt.rng_state)
        self.state = ckpt.state
        self._trained_ids = self.state.trained_ids()
        _log.info(
            "restored %s: step %d, version %d, %d trained, offsets %s",
            ckpt.path,
            self.state.step,
            self.state.policy_version,
            self.state.trained,
            self.state.offsets,
        )

    # -- the loop ---------------------------------------------------------------------------

    async def run(
        self, *, until_trained: int | None = None, stop: asyncio.Event | None = None
    ) -> LearnerState:
        """Consume until ``until_trained`` trajectories are in the weights, or ``stop`` is set.

        Returns the state as of the last checkpoint. The step that reaches ``until_trained``
        ends the run at once: records fetched with it but not yet handled are left alone
        (uncommitted, so the next run gets them), because accounting for them here would
        change counters and offsets that no checkpoint records.
        """
        cfg = self.config
        stop = stop or self._stopping
        sub = self.bus.subscriber([cfg.topic], cfg.group_id, client_id=cfg.client_id)
        rollout = self._rollout_subscriber()
        await sub.start()
        try:
            if rollout is not None:
                await rollout.start()
            if self._announces_at_start():
                # A crash may have left the current version unannounced; orchestrators that
                # start later, or missed it, catch up. (Right after a reset the weights are the
                # live version's, not this number's, and this number was announced before it.)
                await self._publish_version({})
            while not stop.is_set() and not self._reached(until_trained):
                await self._follow_rollout(rollout)
                await self._consume_once(sub, until_trained)
            return self.state
        finally:
            await sub.stop()
            if rollout is not None:
                await rollout.stop()
            if self._writer is not None:
                self._writer.close()

    async def _consume_once(self, sub: Subscriber, until_trained: int | None) -> None:
        """One fetch: account for each record, update whenever a batch is full."""
        records = await sub.fetch(self.config.fetch_max, self.config.fetch_timeout_s)
        record_consumer_lag(
            self.config.group_id, lag_by_topic(await sub.lag(), (self.config.topic,))
        )
        if not records:
            if self._pending and time.monotonic() - self._idle_since >= self._idle_flush_s:
                await self._step(sub)
            return
        self._idle_since = time.monotonic()
        for record in records:
            self._handled.append(record)
            accepted = await self._accept(record)
            if accepted is not None:
                self._pending.append(accepted[0])
                self._pending_versions.append(accepted[1])
            if len(self._pending) >= self.config.batch_trajectories:
                await self._step(sub)
                if self._reached(until_trained):
                    return  # the rest of this fetch is the next run's (see run())
        if self._handled and not self._pending:
            # Only skipped records in hand: committing them loses nothing (committing past a
            # sample not yet in the weights would).
            await sub.commit(self._handled)
            self._handled = []

    @property
    def _idle_flush_s(self) -> float:
        return self.config.idle_flush_s if self.config.idle_flush_s > 0 else float("inf")

    def _reached(self, until_trained: int | None) -> bool:
        """Whether ``until_trained`` trajectories (None: no bound) are in the weights."""
        return until_trained is not None and self.state.trained >= until_trained

    async def _accept(self, record: Record) -> tuple[SampleT, int] | None:
        """Account for one record; the sample to train on and the version that acted, or None
        (skipped/dropped/DLQ)."""
        st = self.state
        if record.offset < st.next_offset(record.topic, record.partition):
            st.skipped_redelivered += 1  # already inside the restored weights
            return None
        st.offsets.setdefault(record.topic, {})[record.partition] = record.offset + 1
        try:
            envelope, scored = codec.decode_event(record.value, reward_pb2.ScoredTrajectory)
            # In the session's trace, as every other consumer of its events: the learner's
            # part of a session shows in the trace backend beside the services'.
            with consume_span(envelope, record, self.config.group_id):
                accepted = self._sample(scored)
        except Exception as exc:
            # Whatever turning this record into training data raised, it is about the record
            # (decoding is pure): parked for a human, never a crash loop of the learner.
            if not isinstance(exc, PodiumError):
                _log.warning("unexpected %s decoding a record", type(exc).__name__, exc_info=True)
            st.dead_lettered += 1
            await self._dead_letter(record, exc)
            return None
        if accepted is None or self._is_duplicate(record, accepted[0]):
            return None
        return accepted

    def _sample(self, scored: reward_pb2.ScoredTrajectory) -> tuple[SampleT, int] | None:
        """The training sample in ``scored`` and the version that acted, or None when it is
        stale or off-policy (counted).

        Raises whatever makes the record unusable (a malformed
        ``policy_version``, bad tensors, a non-finite number; ``ProcessingError``; or an
        algorithm's surprise).
        """
        st = self.state
        behaviour = version_number(scored.trajectory.policy_version)
        lag = self.lineage.lag(behaviour)
        if lag is None or lag > self.config.max_policy_lag:
            st.dropped_stale += 1
            return None
        sample = self.algorithm.decode(scored, lag)
        if sample is None:
            st.skipped_off_policy += 1
            return None
        check_finite(scored)
        return sample, behaviour

    def _is_duplicate(self, record: Record, sample: SampleT) -> bool:
        """Whether ``sample``'s trajectory was trained on in a remembered update or is in the
        batch in hand (then it is dropped and counted); else it joins the batch's ids."""
        tid = self.algorithm.sample_id(sample)
        if tid not in self._trained_ids and tid not in self._pending_ids:
            self._pending_ids.add(tid)
            return False
        self.state.skipped_duplicate += 1
        _log.warning(
            "dropping %s[%d]@%d: trajectory %s was already %s (skipped_duplicate %d)",
            record.topic,
            record.partition,
            record.offset,
            tid,
            "trained on" if tid in self._trained_ids else "taken into this batch",
            self.state.skipped_duplicate,
        )
        return True

    async def _step(self, sub: Subscriber) -> None:
        """Train on the pending batch, checkpoint, commit what was handled, publish."""
        batch, handled = self._pending, self._handled
        newest = max(self._pending_versions, default=None)
        self._pending, self._handled, self._pending_ids = [], [], set()
        self._pending_versions = []
        st = self.state
        lag = self.lineage.lag(newest) if newest is not None else None
        metrics = await asyncio.to_thread(self.algorithm.update, batch, st.step)
        record_learner_update(LoopApp.name, samples=len(batch), policy_lag=lag)
        st.step += 1
        st.trained += len(batch)
        ids = [self.algorithm.sample_id(s) for s in batch]
        if self.config.keep_ledger:
            st.ledger.extend(ids)
        st.remember_update(ids, self.config.dedupe_updates)
        self._trained_ids = st.trained_ids()
        bumped = st.step % self.config.publish_every == 0
        if bumped:
            st.policy_version += 1
        # Announced with the version: which live version this lineage last restarted from.
        metrics["lineage_from"] = float(st.reset_from)
        algo = self.algorithm
        save_checkpoint(
            self.config.checkpoint_dir,
            st,
            algo.model,
            algo.optimizer,
            algo.generator,
            extra={"model_name": algo.model_name, "group_id": self.config.group_id},
        )
        if self.after_checkpoint is not None:
            self.after_checkpoint(st.step)
        await sub.commit(handled)
        self._log(metrics)
        _log.info(
            "update %d: %d trajectories -> v%d; dropped_stale %d, skipped_off_policy %d, "
            "skipped_duplicate %d, dead_lettered %d, %s",
            st.step,
            len(batch),
            st.policy_version,
            st.dropped_stale,
            st.skipped_off_policy,
            st.skipped_duplicate,
            st.dead_lettered,
            ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())),
        )
        if bumped:
            await self._publish_version(metrics)

    # -- the rollout ---------------------------------------------------------------------------

    @property
    def lineage(self) -> Lineage:
        """The versions the current weights descend from (:mod:`learner_svc.lineage`)."""
        st = self.state
        return Lineage(st.policy_version, st.reset_from, st.reset_at)

    def _rollout_subscriber(self) -> Subscriber | None:
        """The rollout registry's reader: a group of its own that never commits, so every
        start reads the registry from its beginning (None: the rollout is not followed)."""
        cfg = self.config
        if not cfg.rollout_topic:
            return None
        group = f"{cfg.group_id}.rollout"
        return self.bus.subscriber([cfg.rollout_topic], group, client_id=cfg.client_id)

    async def _follow_rollout(self, sub: Subscriber | None) -> None:
        """Apply the rollout transitions that arrived: reset to the live version when they
        reject the lineage (:func:`learner_svc.lineage.follow`). Between updates only, so an
        update never mixes two weights; the next checkpoint records the result."""
        if sub is None:
            return
        transitions = await self._transitions(sub)
        if not transitions:
            return
        st = self.state
        followed = follow(self.lineage, st.rollout_seq, transitions)
        if followed.resets:
            _, live = followed.resets[-1]
            await self._reset_weights(live)  # first: a failure leaves the state as it was
            for (at, version), why in zip(followed.resets, followed.reasons, strict=True):
                _log.warning(
                    "rollout transition %d: %s; weights reset to the live version %d (reset %d)",
                    at,
                    why,
                    version,
                    st.resets + 1,
                )
                st.resets += 1
        st.rollout_seq = followed.seq
        lineage = followed.lineage
        st.policy_version, st.reset_from, st.reset_at = (
            lineage.version,
            lineage.reset_from,
            lineage.reset_at,
        )
        if followed.resets:
            self._drop_stale_pending()
            async with self.updated:
                self.updated.notify_all()

    def _drop_stale_pending(self) -> None:
        """After a reset, drop the samples in hand that are stale on the new lineage (those of
        the rejected versions): counted in ``dropped_stale``, their records committed with the
        next update as any dropped record's are."""
        lineage, max_lag = self.lineage, self.config.max_policy_lag
        kept = [
            (sample, version)
            for sample, version in zip(self._pending, self._pending_versions, strict=True)
            if (lag := lineage.lag(version)) is not None and lag <= max_lag
        ]
        self.state.dropped_stale += len(self._pending) - len(kept)
        self._pending = [sample for sample, _ in kept]
        self._pending_versions = [version for _, version in kept]
        self._pending_ids = {self.algorithm.sample_id(sample) for sample in self._pending}

    async def _transitions(self, sub: Subscriber) -> list[rollout_pb2.RolloutTransition]:
        """The rollout transitions fetched now (without waiting); an undecodable one is
        dead-lettered (the registry's one writer wrote it: a person must look)."""
        out = []
        for record in await sub.fetch(self.config.fetch_max, 0.0):
            try:
                transition = decode_transition(record.key, record.value)
            except DecodeError as exc:
                await self._dead_letter(record, exc, group_id=f"{self.config.group_id}.rollout")
                continue
            if transition is not None:
                out.append(transition)
        return out

    async def _reset_weights(self, version: int) -> None:
        """Load ``version``'s weights from its signed announcement into the model and clear
        the optimizer's moments (they belong to the abandoned lineage). Raises
        :class:`~podium.errors.ArtifactError` naming the version when it cannot: training on
        would grow a lineage the rollout rejected."""
        algo = self.algorithm
        weights = await announced_weights(
            self.bus, self.config.policy_topic, algo.model_name, version, self._trusted()
        )
        load_into(algo.model, weights)
        algo.optimizer.state.clear()

    def _trusted(self) -> TrustedKeys:
        """Whose announcements a reset accepts: the learner's own key, plus ``trusted_keys``
        (a key being rotated out signed the older versions)."""
        own = TrustedKeys.of(self.algorithm.signer.private_key.public_key())
        if self._extra_trust is None:
            return own
        return TrustedKeys({**self._extra_trust.keys, **own.keys})

    def _announces_at_start(self) -> bool:
        """Whether start-up (re)announces the checkpoint's version: not right after a reset
        (see :meth:`run`), and not the starting weights (version 0) of a learner that follows
        a rollout. Such a learner learns from the versions the rollout makes live (it resets
        to the live one); its version 0 was trained on nothing, cannot be a Triton version
        (they start at 1, so it is never exported) and, announced, would be a candidate the
        controller proposes. ``podium train`` (no rollout) serves version 0 to its actor."""
        st = self.state
        if st.policy_version <= st.reset_at:
            return False
        if st.policy_version == 0 and self.config.rollout_topic:
            _log.info(
                "version 0 (the starting weights) not announced: following the rollout, the "
                "learner learns from the live version"
            )
            return False
        return True

    # -- publishing and logging ---------------------------------------------------------------

    async def _publish_version(self, metrics: dict[str, float]) -> None:
        """Write the current weights as ``state.policy_version`` and announce them."""
        st, algo = self.state, self.algorithm
        # In a worker thread: an ONNX export and its check take about a second.
        event = await asyncio.to_thread(algo.publish, st.policy_version, st.step, metrics)
        await self.publisher.publish(
            self.config.policy_topic,
            event,
            key=algo.model_name,
            # Unguessable without the signing key, so junk cannot take a version's id first.
            event_id=announcement_event_id(event),
        )
        _log.info("published %s v%d (%s)", algo.model_name, st.policy_version, event.uri)
        async with self.updated:
            self.updated.notify_all()

    def _log(self, metrics: dict[str, float]) -> None:
        if self.config.log_dir is None:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.config.log_dir))
        step = self.state.step
        for key, value in metrics.items():
            self._writer.add_scalar(f"learner/{key}", value, step)
        self._writer.add_scalar("learner/policy_version", self.state.policy_version, step)
        self._writer.add_scalar("learner/dropped_stale", self.state.dropped_stale, step)
        self._writer.add_scalar("learner/skipped_duplicate", self.state.skipped_duplicate, step)
        self._writer.add_scalar("learner/dead_lettered", self.state.dead_lettered, step)
        self._writer.add_scalar("learner/resets", self.state.resets, step)

    async def _dead_letter(
        self, record: Record, exc: Exception, *, group_id: str | None = None
    ) -> None:
        _log.error(
            "dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, exc
        )
        group = group_id or self.config.group_id
        await publish_dead_letter(
            self.bus, record, exc, group_id=group, producer=self.publisher.producer_name
        )
        record_dead_letters(record.topic, group)


class LoopApp:
    """``python -m learner_svc`` in a training mode: a :class:`LearningLoop` in the service
    shell."""

    name = "learner_svc"

    def __init__(self, loop: LearningLoop[Any], *, shutdown_timeout_s: float = 30.0) -> None:
        self.loop = loop
        self.shell = ServiceShell(self.name, shutdown_timeout_s=shutdown_timeout_s)
        self.shell.add(loop)

    async def start(self) -> None:
        await self.shell.start()

    async def stop(self) -> None:
        """Finish the update in hand (if any), leave the group; an incomplete batch is not
        committed, so it is redelivered to the next learner."""
        await self.shell.stop()

    async def wait(self) -> None:
        await self.shell.wait()


__all__ = ["LearningLoop", "LoopApp", "LoopConfig", "check_finite"]
