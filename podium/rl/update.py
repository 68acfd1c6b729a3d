"""One PPO update (epochs of minibatch SGD on a flat batch), shared by every trainer.

The synchronous Gymnasium trainer and the learning loop's generic PPO differ in where transitions come
from (vectorised environments vs scored trajectories on Kafka), not in how they learn from them:
both hand a flat :class:`~podium.rl.ppo.Minibatch` of a whole batch to :func:`ppo_update`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from podium.errors import ProcessingError
from podium.rl.networks import ActorCritic
from podium.rl.ppo import (
    Minibatch,
    PPOConfig,
    PPOLossParts,
    categorical_logprob_entropy,
    explained_variance,
    normalize_advantages,
    ppo_loss,
)


@dataclass(frozen=True, slots=True)
class UpdateStats:
    """What one :func:`ppo_update` did."""

    pg_loss: float
    """Clipped surrogate loss of the last minibatch."""
    v_loss: float
    """Value loss of the last minibatch."""
    entropy: float
    """Mean policy entropy of the last minibatch."""
    approx_kl: float
    """Mean approximate KL over the last epoch's minibatches."""
    clip_fraction: float
    """Mean clip fraction over all minibatches."""
    explained_variance: float
    """How much of the return variance the behaviour values explained."""
    epochs_run: int
    """Epochs run (fewer than configured when the KL target stopped them)."""
    optimizer_steps: int
    """Gradient steps taken."""
    policy_lag: float
    """Mean number of optimizer steps between the batch's collection and each minibatch."""

    def metrics(self, learning_rate: float, ent_coef: float) -> dict[str, float]:
        """The figures every trainer logs for an update (with the schedules' values)."""
        return {
            "pg_loss": self.pg_loss,
            "v_loss": self.v_loss,
            "entropy": self.entropy,
            "approx_kl": self.approx_kl,
            "clip_fraction": self.clip_fraction,
            "explained_variance": self.explained_variance,
            "learning_rate": learning_rate,
            "ent_coef": ent_coef,
            "epochs_run": float(self.epochs_run),
        }


def minibatch_loss(
    model: ActorCritic, mb: Minibatch, config: PPOConfig, ent_coef: float
) -> PPOLossParts:
    """The PPO loss parts of one minibatch under the model's current parameters."""
    logits = model.logits(mb.obs, mb.action_masks)
    new_logprobs, entropy = categorical_logprob_entropy(logits, mb.actions)
    new_values = model.value(mb.obs)
    advantages = normalize_advantages(mb.advantages) if config.norm_adv else mb.advantages
    return ppo_loss(
        new_logprobs,
        mb.logprobs,
        advantages,
        new_values,
        mb.values,
        mb.returns,
        entropy,
        clip_coef=config.clip_coef,
        ent_coef=ent_coef,
        vf_coef=config.vf_coef,
        vf_clip_coef=config.vf_clip_coef,
    )


def ppo_update(
    model: ActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: Minibatch,
    config: PPOConfig,
    *,
    learning_rate: float,
    ent_coef: float,
    minibatch_size: int,
    generator: torch.Generator,
) -> UpdateStats:
    """``config.update_epochs`` epochs of shuffled minibatch PPO on ``batch``.

    Sets the optimizer's learning rate, clips the global gradient norm to
    ``config.max_grad_norm``, and stops the epochs early once the mean approximate KL of an
    epoch exceeds ``config.target_kl``. A last minibatch smaller than ``minibatch_size`` is
    kept (streamed batches need not divide evenly).
    """
    n = int(batch.actions.shape[0])
    if n == 0:
        raise ProcessingError("ppo_update got an empty batch")
    if minibatch_size < 1:
        raise ProcessingError(f"minibatch_size must be >= 1, got {minibatch_size}")
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    params = list(model.parameters())
    steps, lag_sum = 0, 0.0
    clipfracs: list[float] = []
    kls: list[float] = []
    epochs_run = 0
    parts: PPOLossParts | None = None
    for _epoch in range(config.update_epochs):
        epochs_run += 1
        kls = []
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, minibatch_size):
            idx = perm[start : start + minibatch_size]
            mb = Minibatch(
                obs=batch.obs[idx],
                actions=batch.actions[idx],
                logprobs=batch.logprobs[idx],
                values=batch.values[idx],
                advantages=batch.advantages[idx],
                returns=batch.returns[idx],
                action_masks=None if batch.action_masks is None else batch.action_masks[idx],
            )
            parts = minibatch_loss(model, mb, config, ent_coef)
            optimizer.zero_grad(set_to_none=True)
            parts.loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            lag_sum += steps
            steps += 1
            kls.append(float(parts.approx_kl))
            clipfracs.append(float(parts.clip_fraction))
        if config.target_kl is not None and float(np.mean(kls)) > config.target_kl:
            break
    if parts is None:  # pragma: no cover - n >= 1 and update_epochs >= 1
        raise ProcessingError("PPO update ran no minibatch")
    return UpdateStats(
        pg_loss=float(parts.pg_loss.detach()),
        v_loss=float(parts.v_loss.detach()),
        entropy=float(parts.entropy.detach()),
        approx_kl=float(np.mean(kls)),
        clip_fraction=float(np.mean(clipfracs)),
        explained_variance=explained_variance(batch.values, batch.returns),
        epochs_run=epochs_run,
        optimizer_steps=steps,
        policy_lag=lag_sum / steps,
    )
