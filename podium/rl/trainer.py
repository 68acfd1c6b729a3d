"""A synchronous PPO trainer for any Gymnasium environment with a Discrete action space.

The trainer steps ``num_envs`` copies of the environment in a
:class:`gymnasium.vector.SyncVectorEnv` (same-step autoreset, so a time-limit truncation
bootstraps from the true final observation), collects a rollout, computes GAE and runs
``update_epochs`` passes of minibatch PPO with global gradient-norm clipping and an early stop
on a KL target. Environments that expose ``action_masks() -> array[bool]`` (the sb3-contrib
convention) get their invalid actions masked out of the categorical distribution, both when
acting and in the loss.

TensorBoard scalars (when ``log_dir`` is given) use CleanRL's names: ``losses/*`` for the loss
parts, KL and clip fraction, ``charts/*`` for learning rate, entropy coefficient, returns,
policy lag and throughput.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch import Tensor

from podium.errors import ConfigError
from podium.rl.networks import ActorCritic
from podium.rl.ppo import (
    Minibatch,
    PPOConfig,
    RolloutBatch,
    compute_gae,
    cosine_schedule,
    linear_schedule,
)
from podium.rl.update import ppo_update

EnvFactory = Callable[[], gym.Env[Any, Any]]
"""A zero-argument callable that builds one environment."""


def env_factory(env: str | EnvFactory, **kwargs: Any) -> EnvFactory:
    """Turn a Gymnasium id (``"CartPole-v1"``) or a factory into a factory.

    An unknown id is a :class:`ConfigError` here, before any environment is built."""
    if isinstance(env, str):
        env_id = env
        try:
            gym.spec(env_id)
        except gym.error.Error as exc:
            raise ConfigError(f"env {env_id!r} is not a registered Gymnasium id: {exc}") from None

        def make() -> gym.Env[Any, Any]:
            return gym.make(env_id, **kwargs)

        return make
    return env


def check_env_spaces(env: gym.Env[Any, Any]) -> tuple[int, int]:
    """``(obs_dim, n_actions)`` of a supported env; :class:`ConfigError` naming the space otherwise."""
    name = env.spec.id if env.spec is not None else type(env).__name__
    if not isinstance(env.action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"env {name}: PPO here needs a Discrete action space, got {env.action_space}"
        )
    if not isinstance(env.observation_space, gym.spaces.Box):
        raise ConfigError(
            f"env {name}: PPO here needs a Box observation space, got {env.observation_space}"
        )
    obs_dim = int(np.prod(env.observation_space.shape))
    return obs_dim, int(env.action_space.n)


def make_vector_env(
    factory: EnvFactory, num_envs: int, *, autoreset: AutoresetMode = AutoresetMode.SAME_STEP
) -> SyncVectorEnv:
    """``num_envs`` copies in one process. Sync rather than async: for cheap environments
    like CartPole, inter-process round trips cost more than the steps themselves."""
    return SyncVectorEnv([factory for _ in range(num_envs)], autoreset_mode=autoreset)


def _masks_of(envs: SyncVectorEnv) -> np.ndarray[Any, np.dtype[np.bool_]] | None:
    """Stacked ``action_masks()`` of every sub-environment, or None if they have none."""
    try:
        masks = envs.call("action_masks")
    except AttributeError:
        return None
    return np.asarray(np.stack(masks), dtype=np.bool_)


def _obs_tensor(obs: Any, n: int) -> Tensor:
    return torch.as_tensor(np.asarray(obs, dtype=np.float32).reshape(n, -1))


@dataclass(frozen=True, slots=True)
class IterationStats:
    """What one rollout + update did (also what goes to TensorBoard)."""

    iteration: int
    """1-based iteration number."""
    global_step: int
    """Environment steps so far, all environments together."""
    pg_loss: float
    """Clipped surrogate loss of the last minibatch."""
    v_loss: float
    """Value loss of the last minibatch."""
    entropy: float
    """Mean policy entropy of the last minibatch."""
    approx_kl: float
    """Mean approximate KL over the last epoch's minibatches."""
    clip_fraction: float
    """Mean clip fraction over all minibatches of the update."""
    explained_variance: float
    """How much of the return variance the critic explained before the update."""
    learning_rate: float
    """Learning rate used for this update."""
    ent_coef: float
    """Entropy coefficient used for this update."""
    epochs_run: int
    """Epochs actually run (fewer than configured when the KL target stopped them)."""
    policy_lag: float
    """Mean number of optimizer steps between collecting a transition and learning from it."""
    episodic_return: float | None
    """Mean return of episodes that finished during this rollout, None if none did."""
    episodes: int
    """Episodes that finished during this rollout."""
    env_steps_per_s: float
    """Training throughput of this iteration (rollout + update wall time)."""


@dataclass(frozen=True, slots=True)
class TrainResult:
    """Outcome of :meth:`PPOTrainer.train`."""

    global_step: int
    """Environment steps taken."""
    iterations: int
    """Iterations run."""
    wall_s: float
    """Wall time of training (rollouts and updates; evaluation callbacks excluded)."""
    stopped_early: bool
    """True when the callback asked to stop before the step budget."""


class PPOTrainer:
    """PPO on ``config.num_envs`` copies of one Gymnasium environment.

    ``on_iteration`` passed to :meth:`train` is called after every update; returning True
    stops training (used by evaluations that stop at a target). The time spent inside it is
    excluded from :attr:`TrainResult.wall_s` and from the throughput figures.
    """

    def __init__(
        self,
        env: str | EnvFactory,
        config: PPOConfig | None = None,
        *,
        log_dir: str | Path | None = None,
    ) -> None:
        self.config = config or PPOConfig()
        cfg = self.config
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.factory = env_factory(env)
        self.envs = make_vector_env(self.factory, cfg.num_envs)
        probe = self.envs.envs[0]
        self.obs_dim, self.n_actions = check_env_spaces(probe)
        self.env_name = probe.spec.id if probe.spec is not None else type(probe).__name__
        self.model = ActorCritic(self.obs_dim, self.n_actions, cfg.hidden_sizes)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps
        )
        self.global_step = 0
        self._rollout_start_step = 0
        self.iteration = 0
        self.optimizer_steps = 0
        self.writer: Any = None
        if log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(log_dir))
            self.writer.add_text(
                "config",
                "\n".join(f"{k}: {v}" for k, v in cfg.as_dict().items()),
            )
        obs, _ = self.envs.reset(seed=cfg.seed)
        self.envs.action_space.seed(cfg.seed)
        self._obs = _obs_tensor(obs, cfg.num_envs)
        masks = _masks_of(self.envs)
        self._masks = None if masks is None else torch.as_tensor(masks)
        self._episode_returns = np.zeros(cfg.num_envs, dtype=np.float64)

    # -- rollout ---------------------------------------------------------------------------

    def collect_rollout(self) -> tuple[RolloutBatch, list[float]]:
        """Step every env ``num_steps`` times with the current policy.

        Returns the rollout and the returns of the episodes that finished during it.
        """
        cfg = self.config
        t_len, n = cfg.num_steps, cfg.num_envs
        obs_buf = torch.zeros((t_len, n, self.obs_dim))
        actions = torch.zeros((t_len, n), dtype=torch.int64)
        logprobs = torch.zeros((t_len, n))
        values = torch.zeros((t_len, n))
        rewards = torch.zeros((t_len, n))
        terminated = torch.zeros((t_len, n), dtype=torch.bool)
        dones = torch.zeros((t_len, n), dtype=torch.bool)
        masks_buf = (
            None
            if self._masks is None
            else torch.zeros((t_len, n, self.n_actions), dtype=torch.bool)
        )
        # Values of the final observation of truncated episodes, filled in one batch at the end.
        truncated_final: list[tuple[int, int, np.ndarray[Any, Any]]] = []
        finished: list[float] = []
        obs = self._obs
        masks = self._masks
        for t in range(t_len):
            obs_buf[t] = obs
            if masks_buf is not None and masks is not None:
                masks_buf[t] = masks
            with torch.no_grad():
                action, logprob, value = self.model.act(obs, masks, generator=self.generator)
            actions[t], logprobs[t], values[t] = action, logprob, value
            next_obs, reward, term, trunc, infos = self.envs.step(action.numpy())
            rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
            terminated[t] = torch.as_tensor(term)
            done = np.logical_or(term, trunc)
            dones[t] = torch.as_tensor(done)
            self._episode_returns += reward
            if done.any():
                final_obs = infos["final_obs"]
                for i in np.flatnonzero(done):
                    finished.append(float(self._episode_returns[i]))
                    self._episode_returns[i] = 0.0
                    if trunc[i] and not term[i]:
                        truncated_final.append((t, int(i), np.asarray(final_obs[i])))
            obs = _obs_tensor(next_obs, n)
            if masks is not None:
                m = _masks_of(self.envs)
                masks = None if m is None else torch.as_tensor(m)
        self._obs, self._masks = obs, masks
        self._rollout_start_step = self.global_step
        self.global_step += t_len * n

        # next_values[t] = V(s_{t+1}): the next row of `values`, the bootstrap value for the
        # last row, and the value of the true final observation where a time limit cut in.
        with torch.no_grad():
            next_values = torch.empty_like(values)
            next_values[:-1] = values[1:]
            next_values[-1] = self.model.value(obs)
            if truncated_final:
                finals = _obs_tensor(
                    np.stack([f for _, _, f in truncated_final]), len(truncated_final)
                )
                final_values = self.model.value(finals)
                for k, (row, env_i, _) in enumerate(truncated_final):
                    next_values[row, env_i] = final_values[k]
        # Terminated entries are zeroed by GAE; ended-but-not-truncated rows got the reset
        # state's value above, which GAE ignores because `terminated` is set there.
        batch = RolloutBatch(
            obs=obs_buf,
            actions=actions,
            logprobs=logprobs,
            values=values,
            next_values=next_values,
            rewards=rewards,
            terminated=terminated,
            dones=dones,
            action_masks=masks_buf,
        )
        return batch, finished

    # -- update ----------------------------------------------------------------------------

    def progress(self) -> float:
        """Fraction of the step budget used before the latest rollout, in [0, 1].

        Drives both schedules; measured at the rollout's start so the first update runs at
        exactly the configured starting learning rate and entropy coefficient.
        """
        return min(self._rollout_start_step / self.config.total_env_steps, 1.0)

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """GAE, then ``update_epochs`` epochs of minibatch PPO on ``batch``."""
        cfg = self.config
        progress = self.progress()
        lr = cosine_schedule(cfg.learning_rate, cfg.learning_rate_end, progress)
        ent_coef = linear_schedule(cfg.ent_coef_start, cfg.ent_coef_end, progress)

        advantages, returns = compute_gae(
            batch.rewards,
            batch.values,
            batch.next_values,
            batch.terminated,
            batch.dones,
            cfg.gamma,
            cfg.gae_lambda,
        )
        flat = Minibatch(
            obs=batch.obs.reshape(-1, self.obs_dim),
            actions=batch.actions.reshape(-1),
            logprobs=batch.logprobs.reshape(-1),
            values=batch.values.reshape(-1),
            advantages=advantages.reshape(-1),
            returns=returns.reshape(-1),
            action_masks=(
                None
                if batch.action_masks is None
                else batch.action_masks.reshape(-1, self.n_actions)
            ),
        )
        stats = ppo_update(
            self.model,
            self.optimizer,
            flat,
            cfg,
            learning_rate=lr,
            ent_coef=ent_coef,
            minibatch_size=cfg.minibatch_size,
            generator=self.generator,
        )
        self.optimizer_steps += stats.optimizer_steps
        return stats.metrics(lr, ent_coef) | {"policy_lag": stats.policy_lag}

    # -- loop ------------------------------------------------------------------------------

    def train(
        self, on_iteration: Callable[[IterationStats], bool | None] | None = None
    ) -> TrainResult:
        """Train until the step budget is spent or ``on_iteration`` returns True."""
        cfg = self.config
        wall = 0.0
        stopped = False
        while self.global_step < cfg.total_env_steps:
            t0 = time.perf_counter()
            batch, finished = self.collect_rollout()
            stats = self.update(batch)
            dt = time.perf_counter() - t0
            wall += dt
            self.iteration += 1
            it = IterationStats(
                iteration=self.iteration,
                global_step=self.global_step,
                pg_loss=stats["pg_loss"],
                v_loss=stats["v_loss"],
                entropy=stats["entropy"],
                approx_kl=stats["approx_kl"],
                clip_fraction=stats["clip_fraction"],
                explained_variance=stats["explained_variance"],
                learning_rate=stats["learning_rate"],
                ent_coef=stats["ent_coef"],
                epochs_run=int(stats["epochs_run"]),
                policy_lag=stats["policy_lag"],
                episodic_return=float(np.mean(finished)) if finished else None,
                episodes=len(finished),
                env_steps_per_s=cfg.batch_size / dt if dt > 0 else float("inf"),
            )
            self._log(it)
            if on_iteration is not None and on_iteration(it):
                stopped = True
                break
        if self.writer is not None:
            self.writer.flush()
        return TrainResult(
            global_step=self.global_step,
            iterations=self.iteration,
            wall_s=wall,
            stopped_early=stopped,
        )

    def _log(self, it: IterationStats) -> None:
        if self.writer is None:
            return
        w, step = self.writer, it.global_step
        w.add_scalar("losses/policy_loss", it.pg_loss, step)
        w.add_scalar("losses/value_loss", it.v_loss, step)
        w.add_scalar("losses/entropy", it.entropy, step)
        w.add_scalar("losses/approx_kl", it.approx_kl, step)
        w.add_scalar("losses/clip_fraction", it.clip_fraction, step)
        w.add_scalar("losses/explained_variance", it.explained_variance, step)
        w.add_scalar("charts/learning_rate", it.learning_rate, step)
        w.add_scalar("charts/ent_coef", it.ent_coef, step)
        w.add_scalar("charts/epochs_run", it.epochs_run, step)
        w.add_scalar("charts/policy_lag", it.policy_lag, step)
        w.add_scalar("charts/env_steps_per_s", it.env_steps_per_s, step)
        if it.episodic_return is not None:
            w.add_scalar("charts/episodic_return", it.episodic_return, step)

    def close(self) -> None:
        """Close the environments and flush TensorBoard."""
        self.envs.close()
        if self.writer is not None:
            self.writer.close()


class Evaluator:
    """Runs ``n_episodes`` episodes of a policy on its own environments, in parallel.

    The environments are separate from any training env (own instances, own seeds), and are
    kept between calls so periodic evaluation does not rebuild them.
    """

    def __init__(self, env: str | EnvFactory, n_episodes: int = 20, *, seed: int = 10_000) -> None:
        if n_episodes < 1:
            raise ConfigError(f"n_episodes must be >= 1, got {n_episodes}")
        self.n_episodes = n_episodes
        self.seed = seed
        self._calls = 0
        self.envs = make_vector_env(env_factory(env), n_episodes, autoreset=AutoresetMode.NEXT_STEP)
        check_env_spaces(self.envs.envs[0])

    def run(
        self,
        policy: Callable[[Tensor, Tensor | None], Tensor],
    ) -> list[float]:
        """Returns of ``n_episodes`` episodes; ``policy(obs, masks) -> actions`` (batched)."""
        n = self.n_episodes
        # A fresh seed per call: repeated evaluations see different start states.
        obs, _ = self.envs.reset(seed=self.seed + 1000 * self._calls)
        self._calls += 1
        totals = np.zeros(n, dtype=np.float64)
        active = np.ones(n, dtype=np.bool_)
        while active.any():
            m = _masks_of(self.envs)
            with torch.no_grad():
                actions = policy(_obs_tensor(obs, n), None if m is None else torch.as_tensor(m))
            obs, reward, term, trunc, _ = self.envs.step(actions.numpy())
            totals += np.where(active, reward, 0.0)
            active &= ~np.logical_or(term, trunc)
        return totals.tolist()

    def evaluate(self, model: ActorCritic, *, deterministic: bool = True) -> list[float]:
        """Returns of ``model``; deterministic takes the most probable valid action."""

        def policy(obs: Tensor, masks: Tensor | None) -> Tensor:
            return model.act(obs, masks, deterministic=deterministic)[0]

        return self.run(policy)

    def close(self) -> None:
        """Close the evaluation environments."""
        self.envs.close()
