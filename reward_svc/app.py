"""reward_svc as a :class:`podium.service.App`: trajectories in, scored trajectories out.

One loop for every bus: the scoring function (:func:`score_trajectory`) plugged into the bus
layer's consume-transform-produce primitive, :class:`podium.bus.Transformer`. Each batch of
trajectories is one transaction: the scored trajectories (and the poison records, on the
dead-letter topic) become visible together with the consumed offsets, or not at all. On
``kafka://`` that is Kafka's exactly-once with one transactional id per input partition
(``<PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX>.<topic>.<partition>``, the same for every
replica): whichever replica owns a partition claims its id before reading its offset, which
fences a zombie predecessor and ends what a crashed one left open. On ``inproc://``
(``podium demo``, ``podium train``, tests) the in-process twin gives the same visibility.
Broker stalls are retried with backoff; a trajectory whose scoring keeps failing goes to the
dead-letter topic after ``PODIUM_REWARD_MAX_ATTEMPTS`` tries.

A stop request lets the batch in hand finish (commit its transaction) within
``shutdown_timeout_s``; a batch cut off after that stays uncommitted and is scored again by
the next owner, so nothing is lost or counted twice. Scored events carry a deterministic
event id (the input's id and the reward version), so a re-score is recognisably the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from podium.bus import Bus, Output, Record, TransactionFencedError, Transformer
from podium.errors import BusError
from podium.metrics import record_reward
from podium.rewards import RewardConfig
from podium.rewards.events import score_envelope
from podium.service import ServiceShell
from podium.v1 import envelope_pb2, reward_pb2
from reward_svc.config import SERVICE, RewardServiceConfig

_log = logging.getLogger(SERVICE)


def score_trajectory(
    envelope: envelope_pb2.Envelope,
    reward: RewardConfig,
    *,
    out_topic: str,
    fixed_progress: float | None = None,
) -> Output:
    """The scored trajectory of one trajectory event (:func:`score_envelope`) as an output of
    the transaction."""
    scored = score_envelope(envelope, reward, fixed_progress=fixed_progress)
    return Output(
        out_topic,
        scored.message,
        key=scored.key,
        event_id=scored.event_id,
        idempotency_key=scored.event_id,
        occurred_at=scored.occurred_at,
    )


def count_committed(outputs: Sequence[Output]) -> None:
    """Reward metrics of a committed transaction's scored trajectories: counted at commit, so
    a transaction aborted and processed again counts its trajectories once."""
    for out in outputs:
        if isinstance(out.message, reward_pb2.ScoredTrajectory):
            record_reward(SERVICE, out.message.components, out.message.penalties)


class RewardApp:
    """Scores every trajectory on ``config.in_topic`` of a started ``bus``, exactly once."""

    name = SERVICE

    def __init__(self, config: RewardServiceConfig, reward: RewardConfig, bus: Bus) -> None:
        self.config = config
        self.reward = reward
        self.bus = bus
        self.shell = ServiceShell(SERVICE, shutdown_timeout_s=config.shutdown_timeout_s)
        self.transformer = self.shell.add(
            Transformer(
                bus,
                [config.in_topic],
                config.group_id,
                self._score,
                transactional_id_prefix=config.transactional_id_prefix,
                producer_name=config.producer_name,
                output_topics=[config.out_topic],
                max_batch=config.max_batch,
                poll_timeout_s=config.poll_timeout_ms / 1000,
                partitions=config.topic_partitions,
                max_attempts=config.max_attempts,
                on_committed=count_committed,
            )
        )
        """The consume-score-produce loop (its ``stats`` say what was committed)."""

    async def _score(self, envelope: envelope_pb2.Envelope, record: Record) -> Sequence[Output]:
        del record  # everything needed is in the envelope
        if self.config.record_delay_ms:
            # Fault injection: hold the transaction open (crash and SIGTERM tests).
            await asyncio.sleep(self.config.record_delay_ms / 1000)
        return [
            score_trajectory(
                envelope,
                self.reward,
                out_topic=self.config.out_topic,
                fixed_progress=self.config.fixed_progress,
            )
        ]

    async def start(self) -> None:
        """Create the topics, join the group (claiming its partitions), start the loop."""
        await self.shell.start()
        _log.info(
            "%s: consuming %s as %s (transactional ids %s.*), reward %s",
            SERVICE,
            self.config.in_topic,
            self.config.group_id,
            self.config.transactional_id_prefix,
            self.reward.version,
        )

    async def stop(self) -> None:
        """Stop consuming; let the batch in hand commit, up to ``shutdown_timeout_s``."""
        await self.shell.stop()
        _log.info("%s: stopped (%s)", SERVICE, self.transformer.stats)

    async def wait(self) -> None:
        """Return when the loop ends by itself; raise if it failed. Losing every partition to
        newer owners is reported by name."""
        try:
            await self.shell.wait()
        except TransactionFencedError as exc:
            # Newer owners took over every partition this replica held: it was a zombie (it
            # restarts and rejoins), or another group uses the same prefix on the same topic
            # (a deployment error). Either way visible, as a non-zero exit.
            raise BusError(
                f"fenced: newer owners took over every partition of {SERVICE} group "
                f"{self.config.group_id!r} this replica held (transactional ids "
                f"{self.config.transactional_id_prefix!r}.*; PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX "
                "must be the same for the replicas of one group and differ between groups)",
                retriable=False,
            ) from exc
