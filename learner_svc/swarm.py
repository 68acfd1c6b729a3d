"""The swarm learner: PPO for the orchestrator's policy on scored trajectories from the bus.

``PODIUM_LEARNER_MODE=swarm``. The same network, decoding and PPO update as the embedded
``podium train`` (:mod:`podium.train`), fed by Kafka instead of a function call:

1. **decode**: each ``ScoredTrajectory`` whose trajectory was *sampled* by a learned version
   (label ``actions=sampled``, numeric ``policy_version``) becomes an
   :class:`~podium.train.episodes.Episode` via :func:`episode_from_trajectory`; rule-engine
   and argmax sessions are accounted for and skipped (``skipped_off_policy``), trajectories
   whose acting version is more than η versions old are dropped (``dropped_stale``, as the
   generic streaming learner does), undecodable ones go to the dead-letter topic;
2. per batch of ``batch_trajectories`` episodes, **train** one
   :func:`podium.train.learn.ppo_update` (the environment's −Δclock/bound per decision plus the
   reward service's ``total`` at the end of the session);
3. **checkpoint** weights, optimizer, step, version and consumed offsets atomically
   (:mod:`learner_svc.checkpoint`), **commit**, then **publish** the new version with
   :func:`podium.train.policy.save_policy`, export it to ONNX into the Triton model repository
   when ``PODIUM_MODEL_REPOSITORY`` is set (:func:`podium.train.policy.export_swarm_policy`),
   and announce it (``PolicyUpdated`` with ``onnx_uri`` / ``onnx_sha256``, event id
   ``swarm_policy:<version>``). The order, and why it makes every trajectory count exactly
   once across crashes, is :mod:`learner_svc.streaming`'s.

On start the learner restores its checkpoint, or else starts from ``PODIUM_LEARNER_INIT`` (e.g.
a behaviour-cloning result) or a fresh network as version 0, and (re)announces its current
version, so orchestrators that start later, or missed it, catch up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner_svc.checkpoint import LearnerState, load_checkpoint, save_checkpoint
from learner_svc.config import LearnerConfig
from learner_svc.streaming import policy_lag
from podium import codec, topics
from podium.bus.base import Bus, Record, Subscriber
from podium.bus.consumer import (
    EventPublisher,
    publish_dead_letter,
)
from podium.envs.swarm import EnvConfig, PoolSpec, SwarmEnv, default_pool
from podium.envs.swarm.simulator.env import ObservationLayout
from podium.envs.swarm.spec import load_pool, parse_task
from podium.errors import ArtifactError, ConfigError, DecodeError, SpecError
from podium.policy.network import SwarmPolicyNet
from podium.train.agent import SwarmAgent
from podium.train.episodes import Episode, episode_from_trajectory
from podium.train.learn import SwarmPPOConfig, ppo_update
from podium.train.policy import (
    MODEL_NAME,
    export_swarm_policy,
    load_policy,
    save_policy,
    swarm_policy_updated,
)
from podium.v1 import reward_pb2

_log = logging.getLogger(__name__)

SAMPLED = "sampled"
"""Value of the trajectory label ``actions`` for sessions that sampled their actions."""


def swarm_layout(pool: PoolSpec, max_subtasks: int) -> ObservationLayout:
    """The observation layout of the swarm environment for ``pool`` with ``max_subtasks`` slots
    (it depends on the pool and S only, not on any task)."""
    if not pool.kinds:
        raise ConfigError(f"pool {pool.name!r} names no subtask kinds")
    probe = parse_task(
        {"name": "layout", "subtasks": [{"id": "a", "kind": pool.kinds[0], "work": 1.0}]}
    )
    return SwarmEnv([probe], pool, EnvConfig(max_subtasks=max_subtasks)).layout


def is_on_policy_sample(traj_labels: dict[str, str], policy_version: str) -> bool:
    """Whether a trajectory was sampled by a learned version (so PPO may train on it)."""
    return traj_labels.get("actions") == SAMPLED and policy_version.isdigit()


class SwarmLearner:
    """Consumes scored trajectories from ``bus``; trains, checkpoints and publishes versions.

    ``after_checkpoint(step)`` runs right after each checkpoint and before the commit (fault
    injection, as in :class:`learner_svc.streaming.StreamingLearner`).
    """

    def __init__(
        self,
        config: LearnerConfig,
        bus: Bus,
        *,
        pool: PoolSpec | None = None,
        instance: str = "learner_svc",
    ) -> None:
        self.config = config
        self.bus = bus
        self.instance = instance
        try:
            spec = (
                pool
                if pool is not None
                else (load_pool(Path(config.pool_spec)) if config.pool_spec else default_pool())
            )
        except SpecError as exc:
            raise ConfigError(f"PODIUM_POOL_SPEC={config.pool_spec!r}: {exc}") from exc
        self.layout = swarm_layout(spec, config.max_subtasks)
        self.agents = tuple(self.layout.agents)
        self.ppo = SwarmPPOConfig(
            learning_rate=config.learning_rate, learning_rate_end=config.learning_rate_end
        )
        # One intra-op thread: the update runs beside the consumer, on machines whose cores are
        # shared with the other services.
        torch.set_num_threads(1)
        torch.manual_seed(config.seed)
        self.agent = SwarmAgent(self.layout, net=self._initial_network())
        self.optimizer = torch.optim.Adam(
            self.agent.net.parameters(), lr=self.ppo.learning_rate, eps=1e-5
        )
        # Minibatch order comes from a numpy generator seeded by (seed, step), so a restored
        # learner shuffles as the crashed one would have; the checkpoint format still carries
        # a torch generator, kept for it.
        self.generator = torch.Generator().manual_seed(config.seed)
        self.state = LearnerState()
        self.publisher = EventPublisher(bus, producer_name=instance)
        self.writer: Any = None
        self.after_checkpoint: Callable[[int], None] | None = None
        """Called right after each checkpoint, before the commit (fault injection)."""
        self.updated = asyncio.Condition()
        """Notified after each published version (tests and drivers wait on it)."""
        self._restore()

    # -- set-up ---------------------------------------------------------------------------

    def _initial_network(self) -> SwarmPolicyNet | None:
        init = self.config.init
        if not init:
            return None  # SwarmAgent builds a fresh network from the layout
        try:
            net, agents = load_policy(init)
        except ArtifactError as exc:
            raise ConfigError(f"PODIUM_LEARNER_INIT={init!r}: {exc}") from exc
        if agents != self.agents:
            raise ConfigError(
                f"PODIUM_LEARNER_INIT={init!r}: trained for agents {list(agents)}, the pool has "
                f"{list(self.agents)}"
            )
        net.train()
        return net

    def _restore(self) -> None:
        ckpt = load_checkpoint(self.config.checkpoint_dir)
        if ckpt is None:
            return
        self.agent.net.load_state_dict(ckpt.model, strict=True)
        self.optimizer.load_state_dict(ckpt.optimizer)
        self.generator.set_state(ckpt.rng_state)
        self.state = ckpt.state
        _log.info(
            "restored %s: step %d, version %d, %d trained, offsets %s",
            ckpt.path,
            self.state.step,
            self.state.policy_version,
            self.state.trained,
            self.state.offsets,
        )

    # -- publishing -----------------------------------------------------------------------

    async def _publish_version(self, metrics: dict[str, float]) -> None:
        """Write the current weights as ``state.policy_version`` (identical bytes after a crash
        are a no-op, different ones an ArtifactError) and announce them."""
        st = self.state
        ref = save_policy(
            self.agent.net,
            self.config.artifacts_dir,
            st.policy_version,
            self.agents,
            max_subtasks=str(self.config.max_subtasks),
            step=str(st.step),
        )
        exported = None
        if self.config.model_repository and st.policy_version >= 1:
            # In a worker thread: the export and its onnxruntime check take about a second.
            # Version 0 (the starting weights) has none: Triton versions start at 1.
            exported = await asyncio.to_thread(
                export_swarm_policy,
                self.agent.net,
                self.config.model_repository,
                st.policy_version,
            )
        event = swarm_policy_updated(ref, exported, metrics)
        await self.publisher.publish(
            topics.POLICY_UPDATES,
            event,
            key=MODEL_NAME,
            event_id=f"{MODEL_NAME}:{st.policy_version}",
        )
        _log.info("published %s v%d (%s)", MODEL_NAME, st.policy_version, ref.path)
        async with self.updated:
            self.updated.notify_all()

    # -- training -------------------------------------------------------------------------

    def _train(self, batch: list[tuple[Episode, float, int]]) -> dict[str, float]:
        t0 = time.perf_counter()
        episodes = [e for e, _, _ in batch]
        bonus = [b for _, b, _ in batch]
        rng = np.random.default_rng([self.config.seed, self.state.step])
        progress = min(self.state.step / self.config.total_updates, 1.0)
        stats = ppo_update(
            self.agent, self.optimizer, episodes, bonus, self.ppo, rng, progress=progress
        )
        dt = time.perf_counter() - t0
        stats.update(
            reward_total=float(np.mean(bonus)),
            policy_lag=float(np.mean([lag for _, _, lag in batch])),
            ratio_to_bound=float(
                np.mean([e.info["latency"] / e.info["lower_bound"] for e in episodes])
            ),
            completion=float(np.mean([bool(e.info["completed"]) for e in episodes])),
            decisions_per_s=stats["decisions"] / dt if dt > 0 else 0.0,
        )
        return stats

    def _log(self, metrics: dict[str, float]) -> None:
        if not self.config.tensorboard_dir:
            return
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(self.config.tensorboard_dir)
        step = self.state.step
        for key, value in metrics.items():
            self.writer.add_scalar(f"learner/{key}", value, step)
        self.writer.add_scalar("learner/policy_version", self.state.policy_version, step)
        self.writer.add_scalar("learner/dropped_stale", self.state.dropped_stale, step)

    async def _step(
        self, sub: Subscriber, batch: list[tuple[Episode, float, int]], handled: list[Record]
    ) -> None:
        """Train on ``batch``, checkpoint, commit ``handled``, publish. The order matters."""
        # In a worker thread: an update takes seconds on a loaded CPU, and a blocked event loop
        # would stop the consumer's heartbeats and get the learner evicted from its group.
        metrics = await asyncio.to_thread(self._train, batch)
        st = self.state
        st.step += 1
        st.trained += len(batch)
        st.ledger.extend(str(e.info.get("trajectory_id", "")) for e, _, _ in batch)
        st.policy_version += 1
        save_checkpoint(
            self.config.checkpoint_dir,
            st,
            self.agent.net,
            self.optimizer,
            self.generator,
            extra={"model_name": MODEL_NAME, "group_id": self.config.group_id},
        )
        if self.after_checkpoint is not None:
            self.after_checkpoint(st.step)
        await sub.commit(handled)
        self._log(metrics)
        _log.info(
            "update %d: %d trajectories (latency/bound %.3f, reward %.3f, lag %.2f), "
            "approx_kl %.4f -> v%d; dropped_stale %d, skipped_off_policy %d",
            st.step,
            len(batch),
            metrics["ratio_to_bound"],
            metrics["reward_total"],
            metrics["policy_lag"],
            metrics["approx_kl"],
            st.policy_version,
            st.dropped_stale,
            st.skipped_off_policy,
        )
        await self._publish_version(metrics)

    async def _dead_letter(self, record: Record, exc: Exception) -> None:
        _log.error(
            "dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, exc
        )
        await publish_dead_letter(
            self.bus,
            record,
            exc,
            group_id=self.config.group_id,
            producer=self.publisher.producer_name,
        )

    async def _accept(self, record: Record) -> tuple[Episode, float, int] | None:
        """Account for one record: (episode, reward-service total, lag) to train on, or None."""
        st = self.state
        if record.offset < st.next_offset(record.topic, record.partition):
            st.skipped_redelivered += 1  # already inside the restored weights
            return None
        st.offsets.setdefault(record.topic, {})[record.partition] = record.offset + 1
        try:
            _, scored = codec.decode_event(record.value, reward_pb2.ScoredTrajectory)
            traj = scored.trajectory
            if not is_on_policy_sample(dict(traj.labels), traj.policy_version):
                st.skipped_off_policy += 1
                return None
            lag = policy_lag(st.policy_version, traj.policy_version)
            if lag > self.config.max_policy_lag:
                st.dropped_stale += 1
                return None
            episode = episode_from_trajectory(
                traj,
                self.layout.slot_features,
                self.layout.size - self.layout.slots_end,
                len(self.agents),
            )
            episode.info["trajectory_id"] = traj.trajectory_id or traj.session_id
            return episode, float(scored.total), lag
        except DecodeError as exc:
            st.dead_lettered += 1
            await self._dead_letter(record, exc)
            return None

    async def run(self, stop: asyncio.Event) -> LearnerState:
        """Consume until ``stop`` is set; returns the state as of the last checkpoint."""
        cfg = self.config
        sub = self.bus.subscriber(
            [topics.SCORED_TRAJECTORIES], cfg.group_id, client_id=self.instance
        )
        await sub.start()
        try:
            await self._publish_version({})
            batch: list[tuple[Episode, float, int]] = []
            handled: list[Record] = []
            while not stop.is_set():
                records = await sub.fetch(cfg.batch_max, 0.5)
                for record in records:
                    handled.append(record)
                    item = await self._accept(record)
                    if item is not None:
                        batch.append(item)
                    if len(batch) >= cfg.batch_trajectories:
                        await self._step(sub, batch, handled)
                        batch, handled = [], []
                if handled and not batch:
                    # Only skipped records in hand: committing them loses nothing (committing
                    # past an episode not yet in the weights would).
                    await sub.commit(handled)
                    handled = []
            return self.state
        finally:
            await sub.stop()
            if self.writer is not None:
                self.writer.close()


class SwarmLearnerApp:
    """``python -m learner_svc`` in swarm mode: the :class:`SwarmLearner` as a service app."""

    name = "learner_svc"

    def __init__(self, config: LearnerConfig, bus: Bus, *, instance: str) -> None:
        self.learner = SwarmLearner(config, bus, instance=instance)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[LearnerState] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self.learner.run(self._stop), name="learner_svc.swarm")

    async def stop(self) -> None:
        """Finish the update in hand (if any), leave the group; an incomplete batch is not
        committed, so it is redelivered to the next learner."""
        self._stop.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=self.learner.config.shutdown_timeout_s)

    async def wait(self) -> None:
        if self._task is not None:
            await self._task
