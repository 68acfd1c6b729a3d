"""The streaming learner: PPO on scored trajectories from the bus, exactly once, crash-safe.

Per batch of ``batch_trajectories`` usable trajectories the learner does, in this order:

1. **train**: one PPO update (:func:`podium.rl.update.ppo_update`) on the batch;
2. **checkpoint**: weights, optimizer, RNG, schedule step, policy version, counters and the
   *consumed offsets* (per partition, the first offset not yet accounted for), written
   atomically (:mod:`learner_svc.checkpoint`);
3. **commit** the records to the consumer group;
4. **publish** the new policy version (safetensors + sha256) and announce it with a
   ``PolicyUpdated`` event whose event id is ``<model>:<version>`` (re-announcements dedupe).

A crash before 2 loses the in-memory update; the records were not committed, so they come
back and are trained on once, by the restarted learner. A crash between 2 and 3 (the case the
Kafka test forces with a SIGKILL) brings back records the checkpoint already contains: the
restarted learner skips every record below the checkpoint's offset for its partition and
counts it in ``skipped_redelivered``. A crash between 2 and 4 leaves the version unannounced;
on start the learner publishes and announces its checkpoint's version again (identical bytes,
so the immutable-version rule holds). Net effect: every scored trajectory is trained on
exactly once in the lineage of the weights, and the ledger of trained ids proves it.

**Staleness (η).** A trajectory's policy lag is the learner's current policy version minus the
version that acted (the last integer in ``Trajectory.policy_version``; none, e.g. the rule
engine, counts as version 0). Trajectories with lag > ``max_policy_lag`` are **dropped**
(counted in ``dropped_stale``, offsets advanced, never trained on). Within the bound no extra
importance weight is applied: PPO's ratio ``pi_new / pi_behaviour`` is computed against the
behaviour log-probability recorded in each decision, so it already is the importance weight,
and clipping bounds it. Beyond η that ratio's clipping would silence most of the gradient
anyway (and the value targets would be off-policy), so dropping is cheaper and honest.

**Rewards.** Each decision's ``env_reward`` is its step reward; the scored trajectory's
``total`` (reward_svc's verdict on the whole session) is added to the last decision, which
ends the episode (terminated: no bootstrap).

The learner is one consumer (it scales by data parallelism, not by splitting partitions among
members): a rebalance mid-batch could otherwise hand uncommitted records to another member.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner_svc.checkpoint import LearnerState, load_checkpoint, save_checkpoint
from podium import codec, topics
from podium.bus.base import Bus, Record, Subscriber
from podium.bus.consumer import (
    EventPublisher,
    publish_dead_letter,
)
from podium.errors import ConfigError, DecodeError, ProcessingError
from podium.policy.artifacts import policy_updated_event, publish_weights
from podium.rl.networks import ActorCritic
from podium.rl.ppo import Minibatch, PPOConfig, compute_gae, cosine_schedule, linear_schedule
from podium.rl.update import ppo_update
from podium.v1 import reward_pb2

_log = logging.getLogger(__name__)

_VERSION_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def version_number(policy_version: str) -> int:
    """The last integer in a policy version string (``"orchestrator:12"`` -> 12); 0 if none."""
    m = _VERSION_NUMBER.search(policy_version)
    return int(m.group(1)) if m else 0


def policy_lag(current_version: int, behaviour_version: str) -> int:
    """Versions between the acting policy and the learner's current one (never negative)."""
    return max(current_version - version_number(behaviour_version), 0)


@dataclass(frozen=True, slots=True)
class Episode:
    """One scored trajectory as tensors, time-major ``(T, ...)``."""

    trajectory_id: str
    """Id of the trajectory (what the ledger records)."""
    obs: torch.Tensor
    """Observations ``(T, obs_dim)``."""
    actions: torch.Tensor
    """Action indices ``(T,)``."""
    logprobs: torch.Tensor
    """Behaviour log-probabilities ``(T,)``."""
    values: torch.Tensor
    """Behaviour values ``(T,)``."""
    rewards: torch.Tensor
    """Rewards ``(T,)``: step rewards plus the scored total on the last step."""
    masks: torch.Tensor
    """Valid actions ``(T, n_actions)``."""
    lag: int
    """Policy lag when it was accepted."""


def episode_from_scored(
    scored: reward_pb2.ScoredTrajectory, obs_dim: int, n_actions: int, lag: int = 0
) -> Episode:
    """Validate and convert; :class:`ProcessingError` names the trajectory, decision and field."""
    traj = scored.trajectory
    tid = traj.trajectory_id or traj.session_id
    if not tid:
        raise ProcessingError("scored trajectory has neither trajectory_id nor session_id")
    if not traj.decisions:
        raise ProcessingError(f"trajectory {tid}: no decisions to train on")
    t_len = len(traj.decisions)
    obs = np.zeros((t_len, obs_dim), dtype=np.float32)
    masks = np.ones((t_len, n_actions), dtype=np.bool_)
    actions = np.zeros(t_len, dtype=np.int64)
    logprobs = np.zeros(t_len, dtype=np.float32)
    values = np.zeros(t_len, dtype=np.float32)
    rewards = np.zeros(t_len, dtype=np.float32)
    for t, d in enumerate(traj.decisions):
        where = f"trajectory {tid} decision {t}"
        if len(d.observation_tensor) != 4 * obs_dim:
            raise ProcessingError(
                f"{where}: observation_tensor has {len(d.observation_tensor)} bytes, "
                f"expected {4 * obs_dim} (obs_dim {obs_dim} float32)"
            )
        obs[t] = np.frombuffer(d.observation_tensor, dtype="<f4")
        if d.action_mask:
            if len(d.action_mask) != n_actions:
                raise ProcessingError(
                    f"{where}: action_mask has {len(d.action_mask)} entries, expected {n_actions}"
                )
            masks[t] = np.frombuffer(d.action_mask, dtype=np.uint8) != 0
        a = int(d.action.index)
        if not 0 <= a < n_actions:
            raise ProcessingError(f"{where}: action.index {a} outside [0, {n_actions})")
        if not masks[t, a]:
            raise ProcessingError(f"{where}: action.index {a} is masked out by action_mask")
        if not np.isfinite(d.log_prob) or d.log_prob > 1e-6:
            raise ProcessingError(f"{where}: log_prob {d.log_prob} is not a log-probability")
        actions[t], logprobs[t], values[t], rewards[t] = a, d.log_prob, d.value, d.env_reward
    if not np.isfinite(obs).all():
        raise ProcessingError(f"trajectory {tid}: observation_tensor holds NaN or inf")
    rewards[-1] += scored.total
    return Episode(
        trajectory_id=tid,
        obs=torch.from_numpy(obs),
        actions=torch.from_numpy(actions),
        logprobs=torch.from_numpy(logprobs),
        values=torch.from_numpy(values),
        rewards=torch.from_numpy(rewards),
        masks=torch.from_numpy(masks),
        lag=lag,
    )


def batch_from_episodes(episodes: Sequence[Episode], gamma: float, gae_lambda: float) -> Minibatch:
    """Concatenate episodes on one time axis and compute GAE; each ends terminated."""
    values = torch.cat([e.values for e in episodes])
    ends = torch.zeros_like(values, dtype=torch.bool)
    pos = -1
    for e in episodes:
        pos += e.values.shape[0]
        ends[pos] = True
    next_values = torch.zeros_like(values)
    next_values[:-1] = values[1:]  # zeroed at episode ends by `terminated`
    rewards = torch.cat([e.rewards for e in episodes])
    advantages, returns = compute_gae(
        rewards.unsqueeze(1),
        values.unsqueeze(1),
        next_values.unsqueeze(1),
        ends.unsqueeze(1),
        ends.unsqueeze(1),
        gamma,
        gae_lambda,
    )
    return Minibatch(
        obs=torch.cat([e.obs for e in episodes]),
        actions=torch.cat([e.actions for e in episodes]),
        logprobs=torch.cat([e.logprobs for e in episodes]),
        values=values,
        advantages=advantages.squeeze(1),
        returns=returns.squeeze(1),
        action_masks=torch.cat([e.masks for e in episodes]),
    )


def _streaming_ppo_defaults() -> PPOConfig:
    # Streamed batches are small and arrive slowly: fewer epochs than on CartPole, so one
    # batch cannot drag the policy far from the behaviour policy that produced it.
    return PPOConfig(update_epochs=4, learning_rate=3e-4, learning_rate_end=1e-5)


@dataclass(frozen=True, slots=True)
class StreamingConfig:
    """Settings of the streaming learner."""

    obs_dim: int
    """Length of each decision's observation tensor (float32 values)."""
    n_actions: int
    """Size of the action space (and of each action mask)."""
    checkpoint_dir: Path
    """Where ``checkpoint.json`` and its tensor file live (one learner per directory)."""
    artifacts_dir: Path
    """Root of published versions: ``<artifacts_dir>/<model_name>/<version>/weights.safetensors``."""
    topic: str = topics.SCORED_TRAJECTORIES
    """Topic of scored trajectories to consume."""
    policy_topic: str = topics.POLICY_UPDATES
    """Topic to announce new versions on."""
    group_id: str = "learner"
    """Consumer group (its committed offsets trail the checkpoint's, never lead them)."""
    model_name: str = "orchestrator"
    """Model name in the artifact repository and in ``PolicyUpdated``."""
    ppo: PPOConfig = field(default_factory=_streaming_ppo_defaults)
    """PPO hyperparameters (the env-stepping fields num_envs/num_steps are unused here)."""
    batch_trajectories: int = 16
    """Usable trajectories per PPO update."""
    minibatch_size: int = 64
    """Decisions per minibatch."""
    total_updates: int = 10_000
    """Updates over which the learning-rate and entropy schedules run."""
    max_policy_lag: int = 2
    """η: trajectories whose acting policy is more than this many versions old are dropped."""
    publish_every: int = 1
    """Publish a new policy version every this many updates."""
    fetch_max: int = 100
    """Most records fetched at once."""
    fetch_timeout_s: float = 0.5
    """How long one fetch waits for records."""
    idle_flush_s: float = 2.0
    """Train on a partial batch after this long without new records (0: never)."""
    keep_ledger: bool = True
    """Keep every trained trajectory id in the checkpoint (proof of exactly-once; grows with
    the stream, so production deployments may turn it off and keep the counters only)."""
    log_dir: Path | None = None
    """TensorBoard directory, or None."""

    def __post_init__(self) -> None:
        for name in ("obs_dim", "n_actions", "batch_trajectories", "minibatch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"StreamingConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("total_updates", "publish_every", "fetch_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"StreamingConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_policy_lag < 0:
            raise ConfigError(
                f"StreamingConfig.max_policy_lag must be >= 0, got {self.max_policy_lag}"
            )


class StreamingLearner:
    """Consumes scored trajectories from ``bus`` and trains, checkpoints and publishes.

    ``after_checkpoint(step)`` runs right after each checkpoint is written and before the
    commit; it exists for fault injection (the crash tests kill the process there).
    """

    def __init__(
        self,
        config: StreamingConfig,
        bus: Bus,
        *,
        after_checkpoint: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self.bus = bus
        self.after_checkpoint = after_checkpoint
        cfg = config.ppo
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        self.model = ActorCritic(config.obs_dim, config.n_actions, cfg.hidden_sizes)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps
        )
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.state = LearnerState()
        self.publisher = EventPublisher(bus, producer_name=f"learner_svc:{config.model_name}")
        self.writer: Any = None
        self._restore()

    def _restore(self) -> None:
        ckpt = load_checkpoint(self.config.checkpoint_dir)
        if ckpt is None:
            return
        self.model.load_state_dict(ckpt.model, strict=True)
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
        """Write the current weights as ``state.policy_version`` (if absent) and announce it."""
        cfg, version = self.config, self.state.policy_version
        meta = self.model.architecture() | {"step": str(self.state.step)}
        # After a crash the file may exist already: publish_weights accepts identical bytes
        # (the version is only bumped by the checkpoint these weights were restored from)
        # and raises ArtifactError if the file on disk differs (corrupt or tampered).
        ref = publish_weights(
            self.model.state_dict(), cfg.artifacts_dir, cfg.model_name, version, metadata=meta
        )
        event = policy_updated_event(ref, metrics)
        await self.publisher.publish(
            cfg.policy_topic, event, key=cfg.model_name, event_id=f"{cfg.model_name}:{version}"
        )

    # -- training -------------------------------------------------------------------------

    def _train(self, episodes: list[Episode]) -> dict[str, float]:
        cfg, ppo = self.config, self.config.ppo
        t0 = time.perf_counter()
        progress = min(self.state.step / cfg.total_updates, 1.0)
        lr = cosine_schedule(ppo.learning_rate, ppo.learning_rate_end, progress)
        ent_coef = linear_schedule(ppo.ent_coef_start, ppo.ent_coef_end, progress)
        batch = batch_from_episodes(episodes, ppo.gamma, ppo.gae_lambda)
        stats = ppo_update(
            self.model,
            self.optimizer,
            batch,
            ppo,
            learning_rate=lr,
            ent_coef=ent_coef,
            minibatch_size=cfg.minibatch_size,
            generator=self.generator,
        )
        dt = time.perf_counter() - t0
        return {
            "pg_loss": stats.pg_loss,
            "v_loss": stats.v_loss,
            "entropy": stats.entropy,
            "approx_kl": stats.approx_kl,
            "clip_fraction": stats.clip_fraction,
            "explained_variance": stats.explained_variance,
            "learning_rate": lr,
            "ent_coef": ent_coef,
            "epochs_run": float(stats.epochs_run),
            "return": float(np.mean([float(e.rewards.sum()) for e in episodes])),
            "policy_lag": float(np.mean([e.lag for e in episodes])),
            "decisions_per_s": float(batch.actions.shape[0]) / dt if dt > 0 else 0.0,
        }

    def _log(self, metrics: dict[str, float]) -> None:
        if self.config.log_dir is None:
            return
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.config.log_dir))
        step = self.state.step
        for key in (
            "pg_loss",
            "v_loss",
            "entropy",
            "approx_kl",
            "clip_fraction",
            "explained_variance",
        ):
            self.writer.add_scalar(f"losses/{key}", metrics[key], step)
        for key in ("learning_rate", "ent_coef", "return", "policy_lag", "decisions_per_s"):
            self.writer.add_scalar(f"charts/{key}", metrics[key], step)
        self.writer.add_scalar("charts/policy_version", self.state.policy_version, step)
        self.writer.add_scalar("charts/dropped_stale", self.state.dropped_stale, step)

    async def _step(self, sub: Subscriber, episodes: list[Episode], handled: list[Record]) -> None:
        """Train on ``episodes``, checkpoint, commit ``handled``, publish. The order matters."""
        metrics = self._train(episodes) if episodes else {}
        st = self.state
        if episodes:
            st.step += 1
            st.trained += len(episodes)
            if self.config.keep_ledger:
                st.ledger.extend(e.trajectory_id for e in episodes)
            bumped = st.step % self.config.publish_every == 0
            if bumped:
                st.policy_version += 1
        else:
            bumped = False
        save_checkpoint(
            self.config.checkpoint_dir,
            st,
            self.model,
            self.optimizer,
            self.generator,
            extra={"model_name": self.config.model_name, "group_id": self.config.group_id},
        )
        if self.after_checkpoint is not None:
            self.after_checkpoint(st.step)
        if handled:
            await sub.commit(handled)
        if metrics:
            self._log(metrics)
        if bumped:
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
        sub = self.bus.subscriber([cfg.topic], cfg.group_id, client_id=f"learner-{cfg.model_name}")
        await sub.start()
        try:
            if self.state.policy_version > 0:
                await self._publish_version({})  # a crash may have left it unannounced
            pending: list[Episode] = []
            handled: list[Record] = []
            idle_since = time.monotonic()
            while not (stop is not None and stop.is_set()) and not self._reached(until_trained):
                records = await sub.fetch(cfg.fetch_max, cfg.fetch_timeout_s)
                if not records:
                    idle = time.monotonic() - idle_since
                    if handled and cfg.idle_flush_s > 0 and idle >= cfg.idle_flush_s:
                        await self._step(sub, pending, handled)
                        pending, handled = [], []
                    continue
                idle_since = time.monotonic()
                for record in records:
                    handled.append(record)
                    episode = await self._accept(record)
                    if episode is not None:
                        pending.append(episode)
                    if len(pending) >= cfg.batch_trajectories:
                        await self._step(sub, pending, handled)
                        pending, handled = [], []
                        if self._reached(until_trained):
                            break  # the rest of this fetch is the next run's (see docstring)
            return self.state
        finally:
            await sub.stop()
            if self.writer is not None:
                self.writer.close()

    def _reached(self, until_trained: int | None) -> bool:
        """Whether ``until_trained`` trajectories (None: no bound) are in the weights."""
        return until_trained is not None and self.state.trained >= until_trained

    async def _accept(self, record: Record) -> Episode | None:
        """Account for one record; the episode to train on, or None (skipped/dropped/DLQ)."""
        st = self.state
        if record.offset < st.next_offset(record.topic, record.partition):
            st.skipped_redelivered += 1  # already inside the restored weights
            return None
        st.offsets.setdefault(record.topic, {})[record.partition] = record.offset + 1
        try:
            _, scored = codec.decode_event(record.value, reward_pb2.ScoredTrajectory)
            lag = policy_lag(st.policy_version, scored.trajectory.policy_version)
            if lag > self.config.max_policy_lag:
                st.dropped_stale += 1
                return None
            return episode_from_scored(scored, self.config.obs_dim, self.config.n_actions, lag)
        except (DecodeError, ProcessingError) as exc:
            st.dead_lettered += 1
            await self._dead_letter(record, exc)
            return None


# -- command line (used by the crash test and for running the learner by hand) ---------------


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m learner_svc.streaming", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--bootstrap", default=os.environ.get("PODIUM_KAFKA_BOOTSTRAP", ""), help="Kafka host:port."
    )
    p.add_argument("--topic", default=topics.SCORED_TRAJECTORIES)
    p.add_argument("--policy-topic", default=topics.POLICY_UPDATES)
    p.add_argument("--group", default="learner")
    p.add_argument("--model-name", default="orchestrator")
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--artifacts-dir", type=Path, required=True)
    p.add_argument("--obs-dim", type=int, required=True)
    p.add_argument("--n-actions", type=int, required=True)
    p.add_argument("--batch", type=int, default=16, help="Trajectories per update.")
    p.add_argument("--max-policy-lag", type=int, default=2)
    p.add_argument("--until-trained", type=int, default=None)
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument(
        "--kill-after-checkpoint",
        type=int,
        default=None,
        help="Fault injection: SIGKILL this process right after checkpoint N, before its commit.",
    )
    return p.parse_args(argv)


async def _amain(args: argparse.Namespace) -> int:
    from podium.bus import KafkaBus, KafkaConfig

    if not args.bootstrap:
        raise ConfigError("--bootstrap (or PODIUM_KAFKA_BOOTSTRAP) is required")
    bus = KafkaBus(
        KafkaConfig(
            args.bootstrap,
            client_id="learner_svc",
            heartbeat_interval_ms=250,
            session_timeout_ms=args.session_timeout_ms,
        )
    )
    config = StreamingConfig(
        obs_dim=args.obs_dim,
        n_actions=args.n_actions,
        checkpoint_dir=args.checkpoint_dir,
        artifacts_dir=args.artifacts_dir,
        topic=args.topic,
        policy_topic=args.policy_topic,
        group_id=args.group,
        model_name=args.model_name,
        batch_trajectories=args.batch,
        max_policy_lag=args.max_policy_lag,
    )
    checkpoints = 0

    def after_checkpoint(step: int) -> None:
        nonlocal checkpoints
        checkpoints += 1
        if args.kill_after_checkpoint is not None and checkpoints >= args.kill_after_checkpoint:
            _log.warning(
                "fault injection: SIGKILL after checkpoint at step %d, before commit", step
            )
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    await bus.start()
    try:
        learner = StreamingLearner(config, bus, after_checkpoint=after_checkpoint)
        state = await learner.run(until_trained=args.until_trained)
    finally:
        await bus.stop()
    print(
        f"trained {state.trained} dropped_stale {state.dropped_stale} "
        f"skipped_redelivered {state.skipped_redelivered} version {state.policy_version}",
        flush=True,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m learner_svc.streaming``."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(_amain(args))
    except ConfigError as exc:
        print(f"learner_svc.streaming: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
