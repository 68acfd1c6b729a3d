"""Learning on swarm episodes: behaviour cloning from a rule engine, then PPO.

Both work on decisions gathered from :class:`~podium.train.episodes.Episode` objects, padded per
minibatch to the largest task in it. The PPO math is :mod:`podium.rl.ppo`'s (``compute_gae``,
``ppo_loss``); this module only batches variable-size observations for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from podium.rl.ppo import compute_gae, normalize_advantages, ppo_loss
from podium.train.agent import SwarmAgent
from podium.train.episodes import Episode


@dataclass(frozen=True, slots=True)
class SwarmPPOConfig:
    """Hyperparameters of the orchestrator's PPO (tuned for the ~60k-parameter set policy)."""

    learning_rate: float = 3e-4
    """Adam learning rate at the start of RL; decays along a cosine to ``learning_rate_end``."""
    learning_rate_end: float = 3e-5
    """Learning rate at the end of RL."""
    gamma: float = 1.0
    """Discount: sessions are short and the objective is total latency, so none."""
    gae_lambda: float = 0.95
    """GAE λ (the article's 0.9–0.95)."""
    clip_coef: float = 0.2
    """PPO ε."""
    vf_coef: float = 0.5
    """Value-loss weight."""
    ent_coef_start: float = 0.01
    """Entropy bonus at the start of RL; decays linearly to ``ent_coef_end``."""
    ent_coef_end: float = 0.001
    """Entropy bonus at the end of RL."""
    update_epochs: int = 4
    """Passes over each batch of episodes."""
    minibatch_size: int = 256
    """Decisions per gradient step."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float = 0.02
    """Stop an update's epochs early once the approximate KL exceeds this."""
    bc_learning_rate: float = 1e-3
    """Adam learning rate of behaviour cloning."""
    bc_epochs: int = 8
    """Passes over the demonstrations."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Decisions padded to a common number of slots."""

    slots: Tensor
    present: Tensor
    globals_: Tensor
    masks: Tensor
    actions: Tensor


def collate(
    episodes: Sequence[Episode],
    index: NDArray[np.int64],
    num_agents: int,
    *,
    use_teacher: bool = False,
) -> tuple[Batch, int]:
    """Gather decisions ``index`` (rows of ``[episode, t]``) into one padded batch.

    ``use_teacher`` takes the DAgger label as the action where an episode has one.
    """
    per_slot = num_agents * 3
    ns = [episodes[e].n for e, _ in index]
    n_max = max(ns)
    B = len(index)
    F = episodes[0].slots.shape[-1]
    G = episodes[0].globals_.shape[-1]
    slots = np.zeros((B, n_max, F), dtype=np.float32)
    globals_ = np.empty((B, G), dtype=np.float32)
    masks = np.zeros((B, n_max * per_slot + 2), dtype=bool)
    actions = np.empty(B, dtype=np.int64)
    for i, (e, t) in enumerate(index):
        ep = episodes[e]
        n = ep.n
        slots[i, :n] = ep.slots[t]
        globals_[i] = ep.globals_[t]
        m = ep.masks[t]
        masks[i, : n * per_slot] = m[: n * per_slot]
        masks[i, -2:] = m[-2:]
        a = int(ep.actions[t])
        if use_teacher and ep.teacher is not None and ep.masks[t, ep.teacher[t]]:
            a = int(ep.teacher[t])
        actions[i] = a if a < n * per_slot else n_max * per_slot + (a - n * per_slot)
    return (
        Batch(
            slots=torch.from_numpy(slots),
            present=torch.from_numpy(slots[:, :, 0] > 0.5),
            globals_=torch.from_numpy(globals_),
            masks=torch.from_numpy(masks),
            actions=torch.from_numpy(actions),
        ),
        n_max,
    )


def _forward(agent: SwarmAgent, b: Batch) -> tuple[Tensor, Tensor, Tensor]:
    logits, values = agent.net(b.slots, b.present, b.globals_, b.masks)
    log_p = torch.log_softmax(logits, dim=-1)
    lp = log_p.gather(-1, b.actions[:, None]).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return lp, entropy, values


def _all_steps(episodes: Sequence[Episode]) -> NDArray[np.int64]:
    return np.array(
        [(e, t) for e, ep in enumerate(episodes) for t in range(ep.length)], dtype=np.int64
    )


def size_bucketed_minibatches(
    steps: NDArray[np.int64],
    episodes: Sequence[Episode],
    minibatch_size: int,
    rng: np.random.Generator,
) -> list[NDArray[np.int64]]:
    """One epoch's minibatches: positions into ``steps``, grouped by task size.

    A minibatch is padded to its largest task and attention costs O(n²) in it, so uniformly
    random minibatches over tasks of 5–60 subtasks pay for 60 almost every time. Shuffling,
    then sorting stably by size, then cutting consecutive runs keeps each minibatch a random
    sample *within* a size band, and the minibatch order is shuffled, so every decision is
    still used once per epoch; the update costs what the tasks need (≈40 % less time, measured).
    """
    sizes = np.array([episodes[e].n for e, _ in steps], dtype=np.int64)
    perm = rng.permutation(len(steps))
    order = perm[np.argsort(sizes[perm], kind="stable")]
    batches = [order[i : i + minibatch_size] for i in range(0, len(order), minibatch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def behaviour_cloning(
    agent: SwarmAgent,
    demos: Sequence[Episode],
    config: SwarmPPOConfig,
    rng: np.random.Generator,
    *,
    epochs: int | None = None,
) -> list[dict[str, float]]:
    """Fit the policy to the demonstrators' actions (cross-entropy over valid actions).

    The value head is fitted too, to the demonstrations' Monte-Carlo returns, so PPO starts
    with a critic that already knows what a cpls-quality session is worth.
    """
    returns = [np.cumsum(ep.rewards[::-1])[::-1].astype(np.float32) for ep in demos]
    steps = _all_steps(demos)
    opt = torch.optim.Adam(agent.net.parameters(), lr=config.bc_learning_rate)
    history = []
    n_epochs = epochs if epochs is not None else config.bc_epochs
    for epoch in range(n_epochs):
        tot_loss = tot_acc = 0.0
        batches = 0
        for sel in size_bucketed_minibatches(steps, demos, config.minibatch_size, rng):
            idx = steps[sel]
            b, _ = collate(demos, idx, agent.num_agents, use_teacher=True)
            logits, values = agent.net(b.slots, b.present, b.globals_, b.masks)
            target_v = torch.from_numpy(np.array([returns[e][t] for e, t in idx], dtype=np.float32))
            ce = torch.nn.functional.cross_entropy(logits, b.actions)
            loss = ce + 0.5 * ((values - target_v) ** 2).mean()
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(agent.net.parameters(), 1.0)
            opt.step()
            tot_loss += float(ce.detach())
            tot_acc += float((logits.argmax(-1) == b.actions).float().mean())
            batches += 1
        for g in opt.param_groups:  # cosine over the BC epochs
            g["lr"] = (
                config.bc_learning_rate * 0.5 * (1 + math.cos(math.pi * (epoch + 1) / n_epochs))
            )
        history.append(
            {"epoch": float(epoch), "bc_loss": tot_loss / batches, "bc_accuracy": tot_acc / batches}
        )
    return history


def episode_advantages(
    ep: Episode, terminal_bonus: float, config: SwarmPPOConfig
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """GAE advantages and value targets of one episode.

    ``terminal_bonus`` (the reward service's score of the session) is added to the last
    decision's reward, on top of the environment's −Δclock/bound shaping.
    """
    rewards = torch.from_numpy(ep.rewards.copy())
    rewards[-1] += terminal_bonus
    values = torch.from_numpy(ep.values)
    next_values = torch.cat([values[1:], values[-1:]])
    terminated = torch.zeros_like(values)
    dones = torch.zeros_like(values)
    dones[-1] = 1.0
    if ep.terminated:
        terminated[-1] = 1.0
    adv, ret = compute_gae(
        rewards[:, None],
        values[:, None],
        next_values[:, None],
        terminated[:, None],
        dones[:, None],
        config.gamma,
        config.gae_lambda,
    )
    return adv[:, 0].numpy(), ret[:, 0].numpy()


def ppo_update(
    agent: SwarmAgent,
    optimizer: torch.optim.Optimizer,
    episodes: Sequence[Episode],
    terminal_bonus: Sequence[float],
    config: SwarmPPOConfig,
    rng: np.random.Generator,
    *,
    progress: float,
    critic_only: bool = False,
) -> dict[str, float]:
    """One PPO update on a batch of episodes; returns the logged statistics.

    ``critic_only`` re-centres the value head on the batch's returns and fits the head alone,
    leaving the encoder and the policy untouched: for the first batch after behaviour cloning,
    whose returns include terms the cloned critic never saw (the reward service's score, the
    rollout baseline). A large value error backpropagated through the shared encoder would
    otherwise move the cloned policy before PPO has measured anything.
    """
    advs, rets = zip(
        *(
            episode_advantages(ep, b, config)
            for ep, b in zip(episodes, terminal_bonus, strict=True)
        ),
        strict=True,
    )
    steps = _all_steps(episodes)
    adv_all = np.concatenate(advs)
    ret_all = np.concatenate(rets)
    old_lp = np.concatenate([ep.log_probs for ep in episodes])
    old_v = np.concatenate([ep.values for ep in episodes])
    lr = config.learning_rate_end + 0.5 * (config.learning_rate - config.learning_rate_end) * (
        1 + math.cos(math.pi * min(max(progress, 0.0), 1.0))
    )
    ent_coef = config.ent_coef_start + (config.ent_coef_end - config.ent_coef_start) * progress
    for g in optimizer.param_groups:
        g["lr"] = lr
    opt = optimizer
    params = list(agent.net.parameters())
    if critic_only:
        # Re-centre the value head on the batch (one bias shift), then fit the head alone:
        # the encoder, and so the policy, stay exactly as cloned.
        head = agent.net.value_head
        last = head[-1]
        assert isinstance(last, torch.nn.Linear)
        with torch.no_grad():
            last.bias.add_(float(np.mean(ret_all - old_v)))
        params = list(head.parameters())
        opt = torch.optim.Adam(params, lr=lr, eps=1e-5)
    stats: dict[str, list[float]] = {
        k: [] for k in ("loss", "pg_loss", "v_loss", "entropy", "approx_kl", "clip_fraction")
    }
    stopped_early = 0.0
    for _epoch in range(config.update_epochs):
        kls = []
        for sel in size_bucketed_minibatches(steps, episodes, config.minibatch_size, rng):
            b, _ = collate(episodes, steps[sel], agent.num_agents)
            new_lp, entropy, new_v = _forward(agent, b)
            adv = normalize_advantages(torch.from_numpy(adv_all[sel]))
            parts = ppo_loss(
                new_lp,
                torch.from_numpy(old_lp[sel]),
                adv,
                new_v,
                torch.from_numpy(old_v[sel]),
                torch.from_numpy(ret_all[sel]),
                entropy,
                clip_coef=config.clip_coef,
                ent_coef=ent_coef,
                vf_coef=config.vf_coef,
            )
            loss = config.vf_coef * parts.v_loss if critic_only else parts.loss
            agent.net.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            opt.step()
            for k in stats:
                stats[k].append(float(getattr(parts, k).detach()))
            kls.append(float(parts.approx_kl))
        if not critic_only and np.mean(kls) > config.target_kl:
            stopped_early = 1.0
            break
    out = {k: float(np.mean(v)) for k, v in stats.items()}
    out.update(
        lr=lr,
        ent_coef=ent_coef,
        kl_stop=stopped_early,
        decisions=float(len(steps)),
        critic_only=float(critic_only),
    )
    return out
