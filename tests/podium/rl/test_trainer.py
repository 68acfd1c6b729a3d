"""The Gymnasium trainer: masking end to end, KL early stop, TensorBoard scalars, bad envs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from podium.errors import ConfigError
from podium.rl.ppo import PPOConfig
from podium.rl.trainer import Evaluator, IterationStats, PPOTrainer


class MaskedChoice(gym.Env[np.ndarray, int]):
    """Each step, 2 of 6 actions are valid and one of those pays 1. Taking an invalid action
    raises, so a single unmasked sample anywhere in training or evaluation fails the test."""

    n_actions = 6
    horizon = 8

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2 * self.n_actions,), np.float32)
        self.action_space = gym.spaces.Discrete(self.n_actions)  # type: ignore[assignment]
        self._valid = np.zeros(self.n_actions, dtype=bool)
        self._good = 0
        self._t = 0

    def _draw(self) -> np.ndarray:
        pair = self.np_random.choice(self.n_actions, size=2, replace=False)
        self._valid[:] = False
        self._valid[pair] = True
        self._good = int(pair[0])
        obs = np.zeros(2 * self.n_actions, dtype=np.float32)
        obs[: self.n_actions] = self._valid
        obs[self.n_actions + self._good] = 1.0
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self._valid[int(action)]:
            raise AssertionError(
                f"invalid action {action} taken; valid were {np.flatnonzero(self._valid)}"
            )
        reward = 1.0 if int(action) == self._good else 0.0
        self._t += 1
        return self._draw(), reward, False, self._t >= self.horizon, {}

    def action_masks(self) -> np.ndarray:
        return self._valid.copy()


def test_masked_env_learns_and_never_takes_an_invalid_action() -> None:
    cfg = PPOConfig(total_env_steps=8_192, num_envs=4, num_steps=64, seed=3)
    trainer = PPOTrainer(MaskedChoice, cfg)
    evaluator = Evaluator(MaskedChoice, 10, seed=123)
    try:
        assert trainer._masks is not None  # the trainer found action_masks()
        before = float(np.mean(evaluator.evaluate(trainer.model, deterministic=False)))
        trainer.train()
        after = float(np.mean(evaluator.evaluate(trainer.model)))
    finally:
        trainer.close()
        evaluator.close()
    # Random valid choice earns ~4 of 8; the learned policy picks the paying action.
    assert before < 6.0
    assert after >= 7.5


def test_kl_target_stops_epochs_early() -> None:
    seen: dict[str, list[int]] = {"strict": [], "off": []}
    for name, target in (("strict", 1e-9), ("off", None)):
        cfg = PPOConfig(
            total_env_steps=1_024, num_envs=4, num_steps=64, update_epochs=6, target_kl=target
        )
        trainer = PPOTrainer("CartPole-v1", cfg)
        try:
            trainer.train(lambda it, name=name: seen[name].append(it.epochs_run))  # type: ignore[misc]
        finally:
            trainer.close()
    assert seen["strict"] == [1, 1, 1, 1]
    assert seen["off"] == [6, 6, 6, 6]


def test_tensorboard_scalars_and_schedules(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stats: list[IterationStats] = []
    cfg = PPOConfig(total_env_steps=4_096, num_envs=4, num_steps=128)
    trainer = PPOTrainer("CartPole-v1", cfg, log_dir=tmp_path)
    try:
        result = trainer.train(stats.append)
    finally:
        trainer.close()
    assert result.global_step == 4_096 and len(stats) == 8
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clip_fraction",
        "charts/learning_rate",
        "charts/ent_coef",
        "charts/episodic_return",
        "charts/policy_lag",
        "charts/env_steps_per_s",
    ):
        assert tag in tags, tag
    lrs = [e.value for e in acc.Scalars("charts/learning_rate")]
    ents = [e.value for e in acc.Scalars("charts/ent_coef")]
    assert lrs[0] == pytest.approx(cfg.learning_rate) and lrs == sorted(lrs, reverse=True)
    assert ents[0] == pytest.approx(cfg.ent_coef_start) and ents == sorted(ents, reverse=True)
    # Minibatches after the first learn from data an older policy collected.
    assert all(s.policy_lag > 0 for s in stats)
    assert all(0.0 <= s.clip_fraction <= 1.0 for s in stats)


def test_rejects_non_discrete_action_space() -> None:
    with pytest.raises(ConfigError, match="Discrete action space"):
        PPOTrainer(
            "Pendulum-v1",
            PPOConfig(total_env_steps=64, num_envs=1, num_steps=64, num_minibatches=1),
        )
