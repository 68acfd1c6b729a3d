"""The swarm algorithm: behaviour cloning from a rule engine, then PPO, for the orchestrator.

Both work on decisions gathered from :class:`~podium.policy.decisions.Episode` objects, padded
per minibatch to the largest task *and* the largest pool in it: the network reads agents by
features (one pair row per (slot, agent)), so one batch may mix sessions of pools with
different agents, and padding agents, like padding slots, are never valid. The PPO math is
:mod:`podium.rl.ppo`'s (``compute_gae``, ``ppo_loss``); this module batches variable-size
observations for it (size-bucketed minibatches), adds the rollout baseline a simulating actor
attaches to each trajectory (``Trajectory.baseline``: a rule engine's return on the same
session under the same sub-agent luck, Kool et al. 2019) and warms the critic up before the
first policy step.
:class:`SwarmPPO` is the algorithm the learning loop (:mod:`learner_svc.loop`) drives, in
``python -m learner_svc`` and in both drivers of ``podium train``.

1. **decode**: a ``ScoredTrajectory`` whose trajectory was *sampled* by a learned version
   (label ``actions=sampled``, numeric ``policy_version``) becomes an :class:`Episode`, its
   tensors decoded with its own pool's agent count (``Trajectory.agents``; the configured
   pool's for a trajectory written before it existed); rule engine and argmax sessions are
   skipped (counted as off-policy by the loop);
2. **update**: one :func:`ppo_update` with the environment's −Δclock/bound per decision plus,
   at the end of the session, the reward service's ``total`` minus the baseline's return;
3. **publish**: safetensors with sha256 (:func:`podium.policy.swarm.save_policy`), an ONNX
   export into the Triton model repository when one is configured, and a ``PolicyUpdated``
   signed with the learner's key (``PODIUM_POLICY_SIGNING_KEY``, :mod:`podium.policy.signing`)
   over model, version and both hashes, which orchestrators verify before serving it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from podium.config import env, positive_float, positive_int
from podium.envs.swarm import EnvConfig, PoolSpec, default_pool
from podium.envs.swarm.actions import ActionCodec
from podium.envs.swarm.observation import ObservationLayout, subtask_present
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import load_pool
from podium.envs.swarm.trajectory import ACTIONS_LABEL, SAMPLED
from podium.errors import ArtifactError, ConfigError, SpecError
from podium.policy.agent import SwarmAgent
from podium.policy.decisions import Episode, episode_from_trajectory
from podium.policy.network import SwarmPolicyNet, advice_indicator
from podium.policy.signing import SIGNING_KEY_VAR, SigningKey
from podium.policy.swarm import (
    MODEL_NAME,
    export_swarm_policy,
    load_policy,
    save_policy,
    swarm_policy_updated,
)
from podium.policy.versions import is_version_number
from podium.rl.ppo import (
    PPOLossParts,
    compute_gae,
    cosine_schedule,
    normalize_advantages,
    ppo_loss,
)
from podium.v1 import reward_pb2


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
    bc_advice_gain: float = 0.0
    """The network's advice gain (the logit bonus of the advised action) that cloning starts
    from when it is 0 (a fresh network, or one saved before the gain existed). 0 (default):
    cloning leaves it to learn, as every other weight. 4 for a teacher that follows the
    advice on ~99 % of states (``--teacher planner-online``): the first passes already follow
    the advice and the rest of the network learns the departures (Adam alone moves the gain
    ~1e-3 a step). Not the default: it pulls a clone of a teacher that departs often (greedy,
    sequential) towards the advice, which the rollout suite's weak candidates showed."""
    bc_departure_weight: float = 1.0
    """Weight in the cloning loss of a decision where the teacher departs from the
    observation's advice (1, default: every decision alike). A planner teacher agrees with the
    advice on ~99 % of states and its gain lives in the rest; unweighted, those few decisions
    are ~1 % of the loss and the clone copies the advice there too (8-16 for such a teacher)."""


CLONING_FIELDS = ("bc_learning_rate", "bc_epochs", "bc_advice_gain", "bc_departure_weight")
"""The :class:`SwarmPPOConfig` fields only behaviour cloning reads (it runs in ``podium
train``'s driver): no learner setting carries them."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Decisions padded to a common number of slots and agents (the minibatch's most of each:
    episodes of different tasks and pools share one batch)."""

    slots: Tensor
    """Slot rows ``[B, n_max, F]`` (padding slots all zero)."""
    present: Tensor
    """Which slots are a subtask ``[B, n_max]``."""
    globals_: Tensor
    """Global tokens ``[B, G']``."""
    pairs: Tensor
    """Pair rows ``[B, n_max, A_max, P]`` (padding slots and agents all zero)."""
    masks: Tensor
    """Valid actions in the padded layout ``[B, n_max·A_max·3 + 2]`` (padding never valid)."""
    actions: Tensor
    """Actions in the padded layout ``[B]``."""


def collate(
    episodes: Sequence[Episode],
    index: NDArray[np.int64],
    *,
    use_teacher: bool = False,
) -> tuple[Batch, int]:
    """Gather decisions ``index`` (rows of ``[episode, t]``) into one padded batch; returns it
    and its slot count ``n_max``.

    Every decision is padded to the batch's largest task (``n_max`` slots) and largest pool
    (``A_max`` agents): its mask and action move from the episode's own action layout to the
    batch's through :meth:`ActionCodec.translate_mask_to` / :meth:`ActionCodec.translate_to`
    (a START keeps its slot, agent and split; WAIT and FINISH move to the padded layout's
    end), so padding slots and agents are never valid and change no valid action's logit.
    ``use_teacher`` takes the DAgger label as the action where an episode has a valid one.
    """
    which = index[:, 0]
    used = [int(e) for e in np.unique(which)]
    n_max = max(episodes[e].n for e in used)
    a_max = max(episodes[e].num_agents for e in used)
    batch_codec = ActionCodec(n_max, a_max)
    first = episodes[used[0]]
    B = len(index)
    slots = np.zeros((B, n_max, first.slots.shape[-1]), dtype=np.float32)
    globals_ = np.empty((B, first.globals_.shape[-1]), dtype=np.float32)
    pairs = np.zeros((B, n_max, a_max, first.pairs.shape[-1]), dtype=np.float32)
    masks = np.empty((B, batch_codec.size), dtype=bool)
    actions = np.empty(B, dtype=np.int64)
    for e in used:  # one episode's decisions at a time: whole-array copies and translations
        ep = episodes[e]
        rows = np.flatnonzero(which == e)
        ts = index[rows, 1]
        n, a = ep.n, ep.num_agents
        own = ActionCodec(n, a)
        slots[rows, :n] = ep.slots[ts]
        globals_[rows] = ep.globals_[ts]
        pairs[rows, :n, :a] = ep.pairs[ts]
        masks[rows] = own.translate_mask_to(ep.masks[ts], batch_codec)
        acts = ep.actions[ts]
        if use_teacher and ep.teacher is not None:
            teach = ep.teacher[ts]
            acts = np.where(ep.masks[ts, teach], teach, acts)
        actions[rows] = own.translate_to(acts, batch_codec)
    return (
        Batch(
            slots=torch.from_numpy(slots),
            present=torch.from_numpy(subtask_present(slots)),
            globals_=torch.from_numpy(globals_),
            pairs=torch.from_numpy(pairs),
            masks=torch.from_numpy(masks),
            actions=torch.from_numpy(actions),
        ),
        n_max,
    )


def _device(agent: SwarmAgent) -> torch.device:
    """Where the network's weights are (``SwarmSettings.device``; the actor's: cpu)."""
    return next(agent.net.parameters()).device


def _net(agent: SwarmAgent, b: Batch) -> tuple[Tensor, Tensor]:
    """(masked logits, values) of a padded batch, computed where the network is."""
    dev = _device(agent)
    logits, values = agent.net(
        b.slots.to(dev), b.present.to(dev), b.globals_.to(dev), b.pairs.to(dev), b.masks.to(dev)
    )
    return logits, values


def _forward(agent: SwarmAgent, b: Batch) -> tuple[Tensor, Tensor, Tensor]:
    logits, values = _net(agent, b)
    log_p = torch.log_softmax(logits, dim=-1)
    lp = log_p.gather(-1, b.actions.to(logits.device)[:, None]).squeeze(-1)
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
    """One epoch's minibatches: positions into ``steps``, grouped by task size and pool size.

    A minibatch is padded to its largest task and its largest pool, and attention costs O(n²)
    in the slots, so uniformly random minibatches over tasks of 5–60 subtasks pay for 60
    almost every time. Shuffling, then sorting stably by (slots n, agents A), then cutting
    consecutive runs keeps each minibatch a random sample *within* a size band, and the
    minibatch order is shuffled, so every decision is still used once per epoch; the update
    costs what the tasks need (≈40 % less time, measured). Slots come first because they cost
    quadratically and agents only linearly (the pair block is n·A); within one task size,
    decisions of the same pool size stay together, so a mixed batch rarely pads agents. With
    one pool the order is exactly the slots-only one.
    """
    n_of = np.array([ep.n for ep in episodes], dtype=np.int64)
    a_of = np.array([ep.num_agents for ep in episodes], dtype=np.int64)
    sizes, agents = n_of[steps[:, 0]], a_of[steps[:, 0]]
    perm = rng.permutation(len(steps))
    order = perm[np.lexsort((agents[perm], sizes[perm]))]  # lexsort is stable
    batches = [order[i : i + minibatch_size] for i in range(0, len(order), minibatch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def departures(b: Batch) -> Tensor:
    """Which decisions of a batch depart from the observation's advice ``[B]`` (bool): the
    action is not the advised one, where there is advice (none: never a departure)."""
    advice = advice_indicator(b.slots, b.globals_, b.pairs)
    advised = advice.argmax(dim=-1)
    departed: Tensor = (advice.sum(dim=-1) > 0) & (advised != b.actions)
    return departed


def cloning_loss(logits: Tensor, b: Batch, departure_weight: float) -> tuple[Tensor, Tensor]:
    """(weighted mean cross-entropy, departures ``[B]``) of a cloning batch: a decision that
    departs from the advice weighs ``departure_weight``, any other 1."""
    departed = departures(b).to(logits.device)
    actions = b.actions.to(logits.device)
    ce = torch.nn.functional.cross_entropy(logits, actions, reduction="none")
    w = 1.0 + (departure_weight - 1.0) * departed.to(ce.dtype)
    return (w * ce).sum() / w.sum(), departed


def behaviour_cloning(
    agent: SwarmAgent,
    demos: Sequence[Episode],
    config: SwarmPPOConfig,
    rng: np.random.Generator,
    *,
    epochs: int | None = None,
) -> list[dict[str, float]]:
    """Fit the policy to the demonstrators' actions (cross-entropy over valid actions, the
    teacher's departures from the advice weighted ``config.bc_departure_weight``).

    The value head is fitted too, to the demonstrations' Monte-Carlo returns, so PPO starts
    with a critic that already knows what a cpls-quality session is worth. The history adds,
    per pass, the share of departures and how many of them the policy's argmax reproduces
    (where there were any).
    """
    returns = [np.cumsum(ep.rewards[::-1])[::-1].astype(np.float32) for ep in demos]
    steps = _all_steps(demos)
    gain = agent.net.advice_gain
    if agent.net.reads_advice and float(gain.detach()) == 0.0:
        with torch.no_grad():
            gain.fill_(config.bc_advice_gain)
    opt = torch.optim.Adam(agent.net.parameters(), lr=config.bc_learning_rate)
    history = []
    n_epochs = epochs if epochs is not None else config.bc_epochs
    for epoch in range(n_epochs):
        tot = np.zeros(5)  # loss, accuracy, batches, departures, departures reproduced
        for sel in size_bucketed_minibatches(steps, demos, config.minibatch_size, rng):
            idx = steps[sel]
            b, _ = collate(demos, idx, use_teacher=True)
            logits, values = _net(agent, b)
            target_v = torch.from_numpy(
                np.array([returns[e][t] for e, t in idx], dtype=np.float32)
            ).to(logits.device)
            ce, departed = cloning_loss(logits, b, config.bc_departure_weight)
            loss = ce + 0.5 * ((values - target_v) ** 2).mean()
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(agent.net.parameters(), 1.0)
            opt.step()
            hit = logits.argmax(-1) == b.actions.to(logits.device)
            tot += (
                float(ce.detach()),
                float(hit.float().mean()),
                1,
                float(departed.sum()),
                float((hit & departed).sum()),
            )
        for g in opt.param_groups:  # cosine over the BC epochs
            g["lr"] = cosine_schedule(config.bc_learning_rate, 0.0, (epoch + 1) / n_epochs)
        h = {
            "epoch": float(epoch),
            "bc_loss": tot[0] / tot[2],
            "bc_accuracy": tot[1] / tot[2],
            "bc_departures": tot[3] / len(steps),
        }
        if tot[3]:  # none (a rule-engine teacher): no accuracy to report, and no NaN to store
            h["bc_departure_accuracy"] = tot[4] / tot[3]
        history.append(h)
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


@dataclass(frozen=True, slots=True)
class _Targets:
    """A batch's decisions in one flat order, with their PPO targets."""

    steps: NDArray[np.int64]
    """(episode, step) of each decision."""
    advantages: NDArray[np.float32]
    returns: NDArray[np.float32]
    old_log_probs: NDArray[np.float32]
    old_values: NDArray[np.float32]


def _targets(
    episodes: Sequence[Episode], terminal_bonus: Sequence[float], config: SwarmPPOConfig
) -> _Targets:
    advs, rets = zip(
        *(
            episode_advantages(ep, b, config)
            for ep, b in zip(episodes, terminal_bonus, strict=True)
        ),
        strict=True,
    )
    return _Targets(
        steps=_all_steps(episodes),
        advantages=np.concatenate(advs),
        returns=np.concatenate(rets),
        old_log_probs=np.concatenate([ep.log_probs for ep in episodes]),
        old_values=np.concatenate([ep.values for ep in episodes]),
    )


def _value_head_only(
    agent: SwarmAgent, t: _Targets, lr: float
) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
    """Re-centre the value head on the batch (one bias shift), then fit the head alone: the
    encoder, and so the policy, stay exactly as cloned."""
    head = agent.net.value_head
    last = head[-1]
    assert isinstance(last, torch.nn.Linear)
    with torch.no_grad():
        last.bias.add_(float(np.mean(t.returns - t.old_values)))
    params = list(head.parameters())
    return params, torch.optim.Adam(params, lr=lr, eps=1e-5)


def _minibatch_loss(
    agent: SwarmAgent,
    episodes: Sequence[Episode],
    t: _Targets,
    sel: NDArray[np.int64],
    config: SwarmPPOConfig,
    ent_coef: float,
) -> PPOLossParts:
    b, _ = collate(episodes, t.steps[sel])
    new_lp, entropy, new_v = _forward(agent, b)
    dev = new_lp.device
    return ppo_loss(
        new_lp,
        torch.from_numpy(t.old_log_probs[sel]).to(dev),
        normalize_advantages(torch.from_numpy(t.advantages[sel]).to(dev)),
        new_v,
        torch.from_numpy(t.old_values[sel]).to(dev),
        torch.from_numpy(t.returns[sel]).to(dev),
        entropy,
        clip_coef=config.clip_coef,
        ent_coef=ent_coef,
        vf_coef=config.vf_coef,
    )


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
    t = _targets(episodes, terminal_bonus, config)
    lr = cosine_schedule(config.learning_rate, config.learning_rate_end, progress)
    ent_coef = config.ent_coef_start + (config.ent_coef_end - config.ent_coef_start) * progress
    for g in optimizer.param_groups:
        g["lr"] = lr
    params, opt = list(agent.net.parameters()), optimizer
    if critic_only:
        params, opt = _value_head_only(agent, t, lr)
    stats: dict[str, list[float]] = {
        k: [] for k in ("loss", "pg_loss", "v_loss", "entropy", "approx_kl", "clip_fraction")
    }
    stopped_early = 0.0
    for _epoch in range(config.update_epochs):
        kls = []
        for sel in size_bucketed_minibatches(t.steps, episodes, config.minibatch_size, rng):
            parts = _minibatch_loss(agent, episodes, t, sel, config, ent_coef)
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
        decisions=float(len(t.steps)),
        critic_only=float(critic_only),
    )
    return out


# -- the algorithm the learning loop drives ------------------------------------------------------


def is_on_policy_sample(traj_labels: dict[str, str], policy_version: str) -> bool:
    """Whether a trajectory was sampled by a learned version (so PPO may train on it)."""
    return traj_labels.get(ACTIONS_LABEL) == SAMPLED and is_version_number(policy_version)


def swarm_layout(pool: PoolSpec, max_subtasks: int) -> ObservationLayout:
    """The observation layout of the swarm environment for ``pool`` with ``max_subtasks`` slots
    (it depends on the pool and S only, not on any task)."""
    if not pool.kinds:
        raise ConfigError(f"pool {pool.name!r} names no subtask kinds")
    return ObservationLayout.for_pool(SubagentPool(pool), max_subtasks, EnvConfig().max_running_obs)


_PPO = SwarmPPOConfig()
"""The PPO defaults the settings below do not choose otherwise (written once, there)."""


def resolve_device(text: str) -> str:
    """The torch device a device setting names on this machine: ``cpu``, ``cuda``, ``cuda:N``,
    or ``auto`` (cuda when one is available, else cpu); ConfigError naming the setting's
    value when it is malformed or this machine lacks it."""
    value = text.strip().lower()
    if value in ("auto", ""):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if value == "cpu":
        return value
    if value != "cuda" and not (value.startswith("cuda:") and value[5:].isdigit()):
        raise ConfigError(f"device must be cpu, cuda, cuda:N or auto, got {text!r}")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {text!r}: no CUDA device is available on this machine")
    count = torch.cuda.device_count()
    if value.startswith("cuda:") and int(value[5:]) >= count:
        raise ConfigError(f"device {text!r}: this machine has {count} CUDA device(s)")
    return value


@dataclass(frozen=True)
class SwarmSettings:
    """Settings of :class:`SwarmPPO` (``python -m learner_svc`` reads them from the environment;
    the drivers of ``podium train`` build them directly).

    The PPO defaults are the ones that beat the rule engine in ``podium train``: small steps
    and little entropy, because PPO fine-tunes a policy that already *is* the rule engine
    (behaviour cloning), and λ = 1 because with the rollout baseline the Monte-Carlo return is
    low-variance and only it carries the paired comparison back to the early decisions.
    """

    artifacts_dir: str = env("PODIUM_LEARNER_ARTIFACTS")
    """Root of published versions, ``<root>/swarm_policy/<version>/weights.safetensors``;
    orchestrators must be able to read it."""
    model_repository: str = env("PODIUM_MODEL_REPOSITORY", default="")
    """Triton model repository to export every published version >= 1 into
    (``<repo>/swarm_policy/<version>/model.onnx``, announced as ``onnx_uri`` /
    ``onnx_sha256``), for orchestrators with a served backend; empty = no export."""
    signing_key: str = env(SIGNING_KEY_VAR, default="")
    """Path of the Ed25519 private key (PEM) every ``PolicyUpdated`` is signed with, mounted
    from a Secret; required (orchestrators refuse unsigned versions). Make one with ``podium
    keys generate --out DIR``; ``podium train`` makes its own in the run directory."""
    init: str = env("PODIUM_LEARNER_INIT", default="")
    """A swarm policy (safetensors, e.g. a behaviour-cloning result) to start from as version 0
    when there is no checkpoint; empty = a freshly initialised network."""
    pool_spec: str = env("PODIUM_POOL_SPEC", default="")
    """Pool spec file (JSON/YAML); empty = the shipped default. Nothing the learner trains
    depends on it (the network reads agents by features, a batch may mix pools): it only
    names the agents of a trajectory that does not (one written before
    ``Trajectory.agents``) and the pool recorded with each version (for reports)."""
    max_subtasks: int = env("PODIUM_LEARNER_MAX_SUBTASKS", default=64, parse=positive_int)
    """Environment slot count S stored with each version."""
    seed: int = env("PODIUM_LEARNER_SEED", default=0)
    """Seed of a fresh network and of the minibatch shuffling (with the update's step)."""
    learning_rate: float = env("PODIUM_LEARNER_LR", default=1e-4, parse=positive_float)
    """Adam learning rate at the start of the cosine schedule."""
    learning_rate_end: float = env("PODIUM_LEARNER_LR_END", default=1e-5, parse=positive_float)
    """Learning rate at the end of the schedule."""
    ent_coef_start: float = env("PODIUM_LEARNER_ENT_COEF", default=0.003)
    """Entropy bonus at the start; decays linearly to ``ent_coef_end``."""
    ent_coef_end: float = env("PODIUM_LEARNER_ENT_COEF_END", default=0.0003)
    """Entropy bonus at the end of the schedule."""
    gae_lambda: float = env("PODIUM_LEARNER_GAE_LAMBDA", default=1.0)
    """GAE λ."""
    total_updates: int = env("PODIUM_LEARNER_TOTAL_UPDATES", default=100, parse=positive_int)
    """Updates over which the learning-rate and entropy schedules run."""
    critic_warmup_updates: int = env("PODIUM_LEARNER_CRITIC_WARMUP", default=1)
    """First updates that fit only the value head (``ppo_update(critic_only=True)``): the
    cloned critic never saw the reward service's score nor the rollout baseline."""
    gamma: float = env("PODIUM_LEARNER_GAMMA", default=_PPO.gamma)
    """Discount (1: none; the objective is a session's total latency)."""
    clip_coef: float = env("PODIUM_LEARNER_CLIP_COEF", default=_PPO.clip_coef, parse=positive_float)
    """PPO's clip range ε."""
    vf_coef: float = env("PODIUM_LEARNER_VF_COEF", default=_PPO.vf_coef)
    """Weight of the value loss."""
    update_epochs: int = env(
        "PODIUM_LEARNER_UPDATE_EPOCHS", default=_PPO.update_epochs, parse=positive_int
    )
    """Passes over each batch."""
    minibatch_size: int = env(
        "PODIUM_LEARNER_MINIBATCH", default=_PPO.minibatch_size, parse=positive_int
    )
    """Decisions per gradient step."""
    max_grad_norm: float = env(
        "PODIUM_LEARNER_MAX_GRAD_NORM", default=_PPO.max_grad_norm, parse=positive_float
    )
    """Global gradient-norm clip."""
    target_kl: float = env("PODIUM_LEARNER_TARGET_KL", default=_PPO.target_kl, parse=positive_float)
    """An update's epochs stop early once the approximate KL exceeds this."""
    torch_threads: int = env("PODIUM_LEARNER_TORCH_THREADS", default=1, parse=positive_int)
    """torch's intra-op threads (1: the update runs beside the consumer on cores shared with
    other services, and its arithmetic is the same in every process)."""
    device: str = env("PODIUM_LEARNER_DEVICE", default="cpu")
    """Where the updates run: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``; a device this
    machine lacks fails the start, naming it. Published weights and exports are the same
    either way (written from a CPU copy)."""

    def __post_init__(self) -> None:
        if not self.artifacts_dir:
            raise ConfigError("PODIUM_LEARNER_ARTIFACTS: the swarm algorithm needs a directory")
        if self.seed < 0 or self.critic_warmup_updates < 0:
            raise ConfigError("PODIUM_LEARNER_SEED and PODIUM_LEARNER_CRITIC_WARMUP must be >= 0")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ConfigError(f"PODIUM_LEARNER_GAE_LAMBDA must be in [0, 1], got {self.gae_lambda}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"PODIUM_LEARNER_GAMMA must be in [0, 1], got {self.gamma}")

    def ppo(self) -> SwarmPPOConfig:
        """The PPO hyperparameters these settings choose."""
        return SwarmPPOConfig(
            learning_rate=self.learning_rate,
            learning_rate_end=self.learning_rate_end,
            ent_coef_start=self.ent_coef_start,
            ent_coef_end=self.ent_coef_end,
            gae_lambda=self.gae_lambda,
            gamma=self.gamma,
            clip_coef=self.clip_coef,
            vf_coef=self.vf_coef,
            update_epochs=self.update_epochs,
            minibatch_size=self.minibatch_size,
            max_grad_norm=self.max_grad_norm,
            target_kl=self.target_kl,
        )


@dataclass(frozen=True, slots=True)
class SwarmSample:
    """One on-policy session to train on."""

    episode: Episode
    """Its decisions as the network sees them."""
    trajectory_id: str
    """The trajectory's id (the ledger records it)."""
    score: float
    """reward_svc's total for the session."""
    baseline: float
    """The rollout baseline's return on the same session (0 when the trajectory has none)."""
    lag: int
    """Policy lag when it was accepted."""
    seed: str = ""
    """The session's seed label (a stable sort key of the batch)."""


def load_pool_setting(pool_spec: str) -> PoolSpec:
    """The pool a ``PODIUM_POOL_SPEC`` value names (empty: the shipped default)."""
    try:
        return load_pool(Path(pool_spec)) if pool_spec else default_pool()
    except SpecError as exc:
        raise ConfigError(f"PODIUM_POOL_SPEC={pool_spec!r}: {exc}") from exc


def initial_network(init: str) -> SwarmPolicyNet | None:
    """The network ``PODIUM_LEARNER_INIT`` names (any pool's: the network reads agents by
    features, so a policy trained on one pool goes on learning on others)."""
    if not init:
        return None  # SwarmAgent builds a fresh network from the layout
    try:
        net, _trained_for = load_policy(init)
    except ArtifactError as exc:
        raise ConfigError(f"PODIUM_LEARNER_INIT={init!r}: {exc}") from exc
    net.train()
    return net


def _session_order(sample: SwarmSample) -> tuple[str, str, str]:
    return (sample.seed, sample.episode.info.get("task", ""), sample.trajectory_id)


class SwarmPPO:
    """The orchestrator's PPO as an :class:`~learner_svc.algorithm.Algorithm`."""

    model_name = MODEL_NAME

    def __init__(
        self,
        settings: SwarmSettings,
        layout: ObservationLayout,
        net: SwarmPolicyNet | None = None,
    ) -> None:
        self.settings = settings
        self.layout = layout
        self.agents = tuple(layout.agents)
        """The configured pool's agents: of trajectories that name none, and recorded with each
        version (for reports; the network decides on any pool)."""
        self.ppo = settings.ppo()
        torch.set_num_threads(settings.torch_threads)
        torch.manual_seed(settings.seed)
        self.agent = SwarmAgent(layout, net=net)
        self.agent.net.to(resolve_device(settings.device))
        self.model: torch.nn.Module = self.agent.net
        self.optimizer: torch.optim.Optimizer = torch.optim.Adam(
            self.agent.net.parameters(), lr=self.ppo.learning_rate, eps=1e-5
        )
        # Minibatch order comes from a numpy generator seeded by (seed, step), so a restored
        # learner shuffles as the crashed one would have; the checkpoint still carries a torch
        # generator (the loop's format).
        self.generator = torch.Generator().manual_seed(settings.seed)
        # Loaded now, so a learner without a usable key fails at start, naming the setting.
        self.signer = SigningKey.load(settings.signing_key)

    @classmethod
    def from_settings(cls, settings: SwarmSettings) -> SwarmPPO:
        """Build from settings alone: the pool's layout, and the init network if one is named."""
        layout = swarm_layout(load_pool_setting(settings.pool_spec), settings.max_subtasks)
        return cls(settings, layout, initial_network(settings.init))

    def decode(self, scored: reward_pb2.ScoredTrajectory, lag: int) -> SwarmSample | None:
        traj = scored.trajectory
        if not is_on_policy_sample(dict(traj.labels), traj.policy_version):
            return None
        layout = self.layout
        # Each trajectory's tensors in its own pool's layout (Trajectory.agents); the
        # configured pool's agents only for one that names none (written before pools mixed).
        episode = episode_from_trajectory(
            traj, layout.slot_features, layout.global_token_features, self.agents
        )
        return SwarmSample(
            episode=episode,
            trajectory_id=traj.trajectory_id or traj.session_id,
            score=float(scored.total),
            baseline=float(traj.baseline.env_return) if traj.baseline.policy else 0.0,
            lag=lag,
            seed=traj.labels.get("seed", ""),
        )

    def sample_id(self, sample: SwarmSample) -> str:
        return sample.trajectory_id

    def update(self, batch: list[SwarmSample], step: int) -> dict[str, float]:
        """One PPO update: the session's score plus the gain over the rollout baseline at its
        end (``score − baseline_return``, a baseline independent of the policy's actions, so
        the gradient stays unbiased); the critic alone for the first warm-up updates."""
        t0 = time.perf_counter()
        # The bus delivers a batch in an order that depends on partitions and timing; the
        # update must not, so the same sessions give the same weights on any bus.
        batch = sorted(batch, key=_session_order)
        episodes = [s.episode for s in batch]
        bonus = [s.score - s.baseline for s in batch]
        stats = ppo_update(
            self.agent,
            self.optimizer,
            episodes,
            bonus,
            self.ppo,
            np.random.default_rng([self.settings.seed, step]),
            progress=min((step + 1) / self.settings.total_updates, 1.0),
            critic_only=step < self.settings.critic_warmup_updates,
        )
        dt = time.perf_counter() - t0
        stats.update(
            reward_total=float(np.mean([s.score for s in batch])),
            policy_lag=float(np.mean([s.lag for s in batch])),
            ratio_to_bound=float(
                np.mean([e.info["latency"] / e.info["lower_bound"] for e in episodes])
            ),
            completion=float(np.mean([bool(e.info["completed"]) for e in episodes])),
            decisions_per_s=stats["decisions"] / dt if dt > 0 else 0.0,
        )
        with_baseline = [s for s in batch if s.baseline != 0.0]
        if with_baseline:
            # > 0: the sampled sessions beat the reference under the same luck (environment
            # return: −latency/bound, plus penalties for incomplete sessions).
            stats["gain_vs_baseline"] = float(
                np.mean([float(np.sum(s.episode.rewards)) - s.baseline for s in with_baseline])
            )
        return stats

    def publish(
        self, version: int, step: int, metrics: dict[str, float]
    ) -> reward_pb2.PolicyUpdated:
        """safetensors + sha256 under the artifacts root; ONNX into the model repository for
        versions >= 1 (Triton versions start at 1); the announcement signed."""
        # Published from a CPU copy: the file and the ONNX export do not depend on the device.
        net = self.agent.net
        if _device(self.agent).type != "cpu":
            net = copy.deepcopy(net).cpu()
        ref = save_policy(
            net,
            self.settings.artifacts_dir,
            version,
            self.agents,
            max_subtasks=str(self.layout.max_subtasks),
            step=str(step),
        )
        exported = None
        if self.settings.model_repository and version >= 1:
            exported = export_swarm_policy(net, self.settings.model_repository, version)
        return self.signer.sign(swarm_policy_updated(ref, exported, metrics))
