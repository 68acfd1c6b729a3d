"""Generic PPO as a learning algorithm: a flat actor-critic on any observation vector.

Each decision of a scored trajectory carries its observation as ``obs_dim`` little-endian
float32 values in the one wire encoding of decisions (zlib-compressed, see
:mod:`podium.policy.decisions`), its valid actions and the behaviour log-probability and value; the scored
``total`` (reward_svc's verdict on the session) is added to the last decision's reward, which
ends the episode (terminated: no bootstrap). The update is :func:`podium.rl.update.ppo_update`
on GAE advantages — the same code that beats Stable-Baselines3 on CartPole.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from podium.errors import ConfigError, ProcessingError
from podium.policy.artifacts import policy_updated_event, publish_weights
from podium.policy.decisions import decode_mask, decode_observation
from podium.policy.signing import SigningKey
from podium.rl.networks import ActorCritic
from podium.rl.ppo import Minibatch, PPOConfig, compute_gae, cosine_schedule, linear_schedule
from podium.rl.update import ppo_update
from podium.v1 import reward_pb2


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
    """Validate and convert; a :class:`ProcessingError` or :class:`DecodeError` names the
    trajectory, decision and field."""
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
        # The one wire encoding of decisions (podium.policy.decisions); DecodeError names it.
        obs[t] = decode_observation(d.observation_tensor, obs_dim, where)
        if d.action_mask:
            masks[t] = decode_mask(d.action_mask, n_actions, where)
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
class GenericPPOConfig:
    """Settings of :class:`GenericPPO`."""

    obs_dim: int
    """Length of each decision's observation tensor (float32 values)."""
    n_actions: int
    """Size of the action space (and of each action mask)."""
    artifacts_dir: Path
    """Root of published versions: ``<artifacts_dir>/<model_name>/<version>/weights.safetensors``."""
    model_name: str = "orchestrator"
    """Model name in the artifact repository and in ``PolicyUpdated``."""
    signing_key: str = ""
    """Path of the Ed25519 private key (PEM) announcements are signed with (required:
    consumers refuse unsigned versions; ``podium keys generate`` makes one)."""
    ppo: PPOConfig = field(default_factory=_streaming_ppo_defaults)
    """PPO hyperparameters (the env-stepping fields num_envs/num_steps are unused here)."""
    minibatch_size: int = 64
    """Decisions per minibatch."""
    total_updates: int = 10_000
    """Updates over which the learning-rate and entropy schedules run."""
    metadata: tuple[tuple[str, str], ...] = ()
    """Extra (key, value) metadata written beside each version's architecture: what a
    consumer checks before acting with it (e.g. the Context-1 agent's observation columns,
    :mod:`podium.context.learned`)."""

    def __post_init__(self) -> None:
        for name in ("obs_dim", "n_actions", "minibatch_size", "total_updates"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"GenericPPOConfig.{name} must be >= 1, got {getattr(self, name)}"
                )


class GenericPPO:
    """PPO on flat observations (:class:`podium.rl.networks.ActorCritic`)."""

    def __init__(self, config: GenericPPOConfig) -> None:
        self.config = config
        self.model_name = config.model_name
        cfg = config.ppo
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        self.model = ActorCritic(config.obs_dim, config.n_actions, cfg.hidden_sizes)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps
        )
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.signer = SigningKey.load(config.signing_key, setting="GenericPPOConfig.signing_key")

    def decode(self, scored: reward_pb2.ScoredTrajectory, lag: int) -> Episode:
        """Every trajectory is a sample; a malformed one raises ProcessingError."""
        return episode_from_scored(scored, self.config.obs_dim, self.config.n_actions, lag)

    def sample_id(self, sample: Episode) -> str:
        return sample.trajectory_id

    def update(self, batch: list[Episode], step: int) -> dict[str, float]:
        """One PPO update (cosine learning rate, linear entropy decay over ``total_updates``)."""
        cfg, ppo = self.config, self.config.ppo
        t0 = time.perf_counter()
        progress = min(step / cfg.total_updates, 1.0)
        lr = cosine_schedule(ppo.learning_rate, ppo.learning_rate_end, progress)
        ent_coef = linear_schedule(ppo.ent_coef_start, ppo.ent_coef_end, progress)
        minibatch = batch_from_episodes(batch, ppo.gamma, ppo.gae_lambda)
        stats = ppo_update(
            self.model,
            self.optimizer,
            minibatch,
            ppo,
            learning_rate=lr,
            ent_coef=ent_coef,
            minibatch_size=cfg.minibatch_size,
            generator=self.generator,
        )
        dt = time.perf_counter() - t0
        return stats.metrics(lr, ent_coef) | {
            "return": float(np.mean([float(e.rewards.sum()) for e in batch])),
            "policy_lag": float(np.mean([e.lag for e in batch])),
            "decisions_per_s": float(minibatch.actions.shape[0]) / dt if dt > 0 else 0.0,
        }

    def publish(
        self, version: int, step: int, metrics: dict[str, float]
    ) -> reward_pb2.PolicyUpdated:
        """safetensors + sha256 under ``artifacts_dir`` (identical bytes: no-op); the
        announcement signed."""
        meta = self.model.architecture() | dict(self.config.metadata) | {"step": str(step)}
        ref = publish_weights(
            self.model.state_dict(),
            self.config.artifacts_dir,
            self.model_name,
            version,
            metadata=meta,
        )
        return self.signer.sign(policy_updated_event(ref, metrics))


__all__ = [
    "Episode",
    "GenericPPO",
    "GenericPPOConfig",
    "batch_from_episodes",
    "episode_from_scored",
]
