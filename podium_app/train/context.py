"""``podium train --env context``: the learned Context-1 agent, through the same learning loop.

1. **Behaviour cloning.** Every heuristic (:data:`~podium.context.heuristics.BASELINES` and
   :class:`~podium.context.heuristics.SelectivePolicy`) plays the validation questions (the
   table's reference). The teacher is :class:`GoldTeacher` — it sees the gold: the hybrid's
   searches and an identifier search, then keep what overlaps a gold span, prune the rest —
   or, with ``teacher="heuristic"``, the best heuristic. It plays the training questions and
   an actor-critic (:class:`~podium.rl.networks.ActorCritic` over the environment's
   observation, invalid actions masked) is fitted to its actions (cross-entropy) and its
   returns (the critic, so PPO starts with a sensible baseline). DAgger rounds follow: the
   clone plays the training questions, the teacher labels every state it reaches, and the
   clone is fitted again on all the labels — so it learns to recover from its own mistakes.
   The clone never sees the gold, only the observation's features, which hold what lets it
   tell an answering chunk from the rest (:func:`~podium.context.env.match_features`).
2. **PPO through the services.** The cloned weights are the learner's version 0. Each
   iteration the actor plays ``episodes_per_iteration`` training questions with the served
   version (sampling) and publishes one ``Trajectory`` per episode (``env="context"``: the
   steps as tool calls, the question and gold in labels, the decisions' observations, masks,
   log-probabilities and values); reward_svc scores them with the context reward and its
   detectors; learner_svc's :class:`~learner_svc.loop.LearningLoop` with
   :class:`~learner_svc.algorithms.ppo.GenericPPO` updates, publishes the weights (safetensors
   and sha256, signed announcement) and the actor verifies and hot-swaps to them — the swarm's
   loop and services, another algorithm and environment.
3. **Selection and the table.** The greedy agent plays the validation questions every
   ``eval_every`` iterations; the best version by answer found (then reward) is the result,
   copied to ``RUN_DIR/policy.safetensors`` (loadable by
   :func:`podium.context.learned.load_learned_policy`, ``podium bench context --checkpoint``).
   It and every heuristic then play the held-out questions at the same budget.

Searches are cached (:class:`~podium.context.env.CachedIndex`): training replays the same
questions, and a dense query costs an embedding.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from learner_svc.algorithms.ppo import Episode, GenericPPO, GenericPPOConfig
from learner_svc.config import LoopConfig
from learner_svc.loop import LearningLoop, LoopApp
from podium import rewards
from podium.bus import Bus, EventConsumer, Record
from podium.codec import unpack_as
from podium.context.env import ACTIONS, ContextEnv
from podium.context.heuristics import (
    BASELINES,
    ContextPolicy,
    SelectivePolicy,
    next_search,
    run_episode,
)
from podium.context.learned import (
    ENV_ID,
    FEATURES_KEY,
    policy_observation,
)
from podium.context.questions import Question, load_questions
from podium.context.scoring import hits
from podium.errors import ConfigError, PodiumError
from podium.policy.decisions import encode_mask, encode_observation
from podium.policy.holder import PolicyHolder, build_actor_critic
from podium.policy.signing import TrustedKeys
from podium.rewards.context import episode_trajectory
from podium.rl.networks import ActorCritic
from podium.rl.ppo import PPOConfig
from podium.v1 import envelope_pb2, reward_pb2, trajectory_pb2
from podium_app.train.services import RunTopics
from reward_svc.app import RewardApp
from reward_svc.config import RewardServiceConfig

MODEL_NAME = "context"
"""The learned agent's model name in the artifact repository and its announcements."""
SPLITS = ("train", "validation", "held-out")
"""Question splits: trained on, selected on, reported."""
TEACHERS = ("gold", "heuristic")
"""What behaviour cloning can clone (:attr:`ContextTrainConfig.teacher`)."""

Progress = Callable[[str, dict[str, float]], None]
"""``progress(phase, figures)``: ``"bc"`` (none at the start, ``dagger_round`` before each
DAgger round, ``accuracy`` and ``teacher_val`` at the end), ``"ppo"`` (``iteration``,
``answer_found``, ``reward``, ``val``, ``best``) and ``"eval"``."""


@dataclass(frozen=True, slots=True)
class ContextTrainConfig:
    """Settings of ``podium train --env context``."""

    index: Path
    """The index directory (``podium context index --out``)."""
    questions: Path
    """A directory of ``train.jsonl``/``validation.jsonl``/``held-out.jsonl`` or one JSONL
    file (split 80/10/10 by a hash of each id: the same split on every run)."""
    run_dir: Path = Path("runs/context")
    """Where TensorBoard logs, checkpoints, the report and the policy go."""
    budget_tokens: int = 300
    """The context budget every policy plays under."""
    iterations: int = 20
    """PPO iterations (one learner version each)."""
    episodes_per_iteration: int = 256
    """Episodes per iteration (the learner's batch)."""
    bc_epochs: int = 20
    """Passes over the teacher's demonstrations."""
    bc_learning_rate: float = 1e-3
    """Adam's learning rate while cloning."""
    teacher: str = "gold"
    """Who is cloned: ``"gold"`` (:class:`GoldTeacher`, which sees the gold: keep what
    answers, prune the rest) or ``"heuristic"`` (the best heuristic on validation)."""
    dagger_rounds: int = 2
    """DAgger rounds after the first cloning (gold teacher only): the clone plays the
    training questions, the teacher labels every state it reached, the clone is fitted
    again on all the labels so far — so it learns what to do after its own mistakes."""
    eval_every: int = 2
    """Validate the greedy agent every this many iterations (and after the last)."""
    max_questions: int = 0
    """Use at most this many training questions (0: all): a quicker run."""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """Actor and critic hidden widths."""
    learning_rate: float = 3e-4
    """PPO's learning rate (cosine-decayed to a tenth over the run)."""
    ent_coef: float = 0.01
    """PPO's entropy bonus (decayed to a tenth)."""
    update_epochs: int = 4
    """PPO epochs per batch."""
    minibatch_size: int = 512
    """Decisions per PPO minibatch."""
    seed: int = 0
    """Seeds the network, cloning's shuffles and the questions drawn."""
    chroma_url: str | None = None
    """The Chroma server holding the index's vectors (None: where it was built)."""
    reward_timeout_s: float = 300.0
    """Longest wait for the learner's next version."""
    bus: str = "inproc://"
    """The bus the services and the actor share (in-process only, for now)."""
    reward_config: Path | None = None
    """The reward config YAML (``PODIUM_REWARD_CONFIG``'s format) reward_svc scores with; its
    ``context:`` section is also the environment's own reward, so the two agree (None: the
    packaged default, ``podium/data/rewards/default.yaml``)."""

    def __post_init__(self) -> None:
        flags = {"budget_tokens": "--budget"}
        for name in ("budget_tokens", "iterations", "episodes_per_iteration", "eval_every"):
            if getattr(self, name) < 1:
                flag = flags.get(name, "--" + name.replace("_", "-"))
                raise ConfigError(f"{flag} must be >= 1, got {getattr(self, name)}")
        if self.bc_epochs < 0 or self.max_questions < 0:
            raise ConfigError("--bc-epochs and --max-questions must be >= 0")
        if self.teacher not in TEACHERS:
            raise ConfigError(f"teacher {self.teacher!r} unknown (known: {', '.join(TEACHERS)})")
        if self.dagger_rounds < 0:
            raise ConfigError(f"dagger_rounds must be >= 0, got {self.dagger_rounds}")
        if not self.bus.startswith("inproc://"):
            # The services run as tasks of this process; on Kafka they would need their
            # topics made and groups positioned (as ProcessServices does): not yet.
            raise ConfigError(f"--bus {self.bus}: --env context runs on inproc:// only, for now")


# ---------------------------------------------------------------- questions and policies


def split_of(question_id: str) -> str:
    """The split of a question in a single file: 80/10/10 by crc32 of its id."""
    bucket = zlib.crc32(question_id.encode("utf-8")) % 10
    return "validation" if bucket == 8 else "held-out" if bucket == 9 else "train"


def load_splits(path: Path) -> dict[str, list[Question]]:
    """The train, validation and held-out questions of ``path`` (see
    :attr:`ContextTrainConfig.questions`); a missing or empty split is a ConfigError."""
    if path.is_dir():
        missing = [s for s in SPLITS if not (path / f"{s}.jsonl").is_file()]
        if missing:
            raise ConfigError(
                f"--questions {path}: no {', '.join(f'{s}.jsonl' for s in missing)} there "
                "(a directory needs train, validation and held-out splits; or give one file)"
            )
        splits = {s: load_questions(path / f"{s}.jsonl") for s in SPLITS}
    else:
        every = load_questions(path)
        splits = {s: [q for q in every if split_of(q.id) == s] for s in SPLITS}
    empty = [s for s, qs in splits.items() if not qs]
    if empty:
        raise ConfigError(f"--questions {path}: split {', '.join(empty)} has no question")
    return splits


def heuristics() -> list[ContextPolicy]:
    """The baselines and the selective heuristic: the teacher's candidates and the table's
    rows."""
    return [*BASELINES, SelectivePolicy()]


def evaluate(
    env: ContextEnv, policy: ContextPolicy, questions: Sequence[Question]
) -> dict[str, float]:
    """Mean answer found, precision, tokens kept, searches and reward of ``policy`` over
    ``questions``, and its p50 episode latency in milliseconds."""
    rows = [run_episode(env, policy, q) for q in questions]
    walls = [r["wall_s"] * 1000 for r in rows]
    return {
        "answer_found": float(np.mean([r["answer_found"] for r in rows])),
        "precision": float(np.mean([r["precision"] for r in rows])),
        "tokens_kept": float(np.mean([r["tokens_kept"] for r in rows])),
        "searches": float(np.mean([r["searches"] for r in rows])),
        "reward": float(np.mean([r["reward"].total for r in rows])),
        "p50_ms": float(np.percentile(walls, 50)),
    }


def rank_key(scores: dict[str, float]) -> tuple[float, float]:
    """What selection maximises: answer found, then reward."""
    return scores["answer_found"], scores["reward"]


# ---------------------------------------------------------------- behaviour cloning


@dataclass(slots=True)
class Demonstrations:
    """The teacher's decisions: observations, valid actions, actions and episode returns."""

    obs: list[NDArray[np.float32]] = field(default_factory=list)
    masks: list[NDArray[np.bool_]] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class GoldTeacher:
    """The teacher that sees the gold (training only: no benchmark plays it).

    It makes the searches of ``plan`` (after the hybrid's two, an identifier search: a gold
    chunk is then among the candidates for 98 % of the questions), then keeps every head that
    overlaps a gold span and fits and prunes the rest, until the queue is empty — keeping each gold chunk, not just the first, hedges a two-hop question and teaches
    the clone to keep the best matches rather than stop at one. It acts from any state — also
    one the clone reached by its own mistakes (a wrong chunk kept, a search skipped) — which
    is what DAgger asks of it. A clone of it can only be as good as the observation lets it
    tell gold chunks from the rest: the observation's match columns
    (:func:`~podium.context.env.match_features`).
    """

    name: str = "gold"
    plan: tuple[tuple[str, str], ...] = (
        ("bm25", "question"),
        ("dense", "question"),
        ("bm25", "identifier"),
    )

    def act(self, env: ContextEnv) -> int:
        """Search the plan, then keep what answers and prune the rest."""
        search = next_search(env, self.plan)
        if search is not None:
            return search
        s = env.state
        gold = s.question.gold
        head = s.head()
        if head is None:
            return ACTIONS.finish
        if hits(head.chunk, gold) and s.tokens_kept + head.tokens <= env.config.budget_tokens:
            return ACTIONS.keep
        return ACTIONS.prune


def demonstrate(
    env: ContextEnv,
    teacher: ContextPolicy,
    questions: Sequence[Question],
    driver: ContextPolicy | None = None,
) -> Demonstrations:
    """Every decision ``teacher`` makes on ``questions``, with what it saw. With a
    ``driver`` (DAgger), the driver's actions are played and the teacher only labels the
    states they lead to; the returns are then the driver's."""
    demos = Demonstrations()
    for q in questions:
        env.reset(options={"question": q})
        start = len(demos.actions)
        while True:
            demos.obs.append(policy_observation(env))
            demos.masks.append(env.action_masks())
            action = teacher.act(env)
            demos.actions.append(action)
            played = action if driver is None else driver.act(env)
            _, reward, terminated, truncated, _ = env.step(played)
            if terminated or truncated:
                demos.returns += [float(reward)] * (len(demos.actions) - start)
                break
    return demos


def merge(a: Demonstrations, b: Demonstrations) -> Demonstrations:
    """``a``'s decisions then ``b``'s (DAgger's growing data set)."""
    return Demonstrations(
        a.obs + b.obs, a.masks + b.masks, a.actions + b.actions, a.returns + b.returns
    )


def clone(
    model: ActorCritic, demos: Demonstrations, epochs: int, lr: float, seed: int
) -> list[dict[str, float]]:
    """Fit ``model``'s actor to the teacher's actions (masked cross-entropy) and its critic
    to the episodes' returns; the loss and accuracy of every epoch."""
    obs = torch.from_numpy(np.stack(demos.obs))
    masks = torch.from_numpy(np.stack(demos.masks))
    actions = torch.tensor(demos.actions)
    returns = torch.tensor(demos.returns, dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    history = []
    for epoch in range(epochs):
        order = torch.randperm(len(actions), generator=generator)
        for idx in torch.split(order, 64):
            logits = model.logits(obs[idx], masks[idx])
            # Smoothed labels leave the clone some probability on the teacher's alternatives:
            # PPO's sampled episodes then explore around the teacher instead of replaying it.
            loss = torch.nn.functional.cross_entropy(logits, actions[idx], label_smoothing=0.05)
            value_loss = torch.nn.functional.mse_loss(model.value(obs[idx]), returns[idx])
            optimizer.zero_grad()
            (loss + 0.5 * value_loss).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        with torch.no_grad():
            logits = model.logits(obs, masks)
            history.append(
                {
                    "epoch": float(epoch + 1),
                    "bc_loss": float(torch.nn.functional.cross_entropy(logits, actions)),
                    "bc_accuracy": float((logits.argmax(-1) == actions).float().mean()),
                }
            )
    return history


# ---------------------------------------------------------------- acting


def play(
    env: ContextEnv, model: ActorCritic, question: Question, generator: torch.Generator
) -> tuple[dict[str, Any], list[trajectory_pb2.Decision]]:
    """One episode with sampled actions; the final ``info`` and the decisions to train on."""
    env.reset(options={"question": question})
    decisions: list[trajectory_pb2.Decision] = []
    while True:
        obs, mask = policy_observation(env), env.action_masks()
        with torch.inference_mode():
            a, logp, value = model.act(
                torch.from_numpy(obs).unsqueeze(0),
                torch.from_numpy(mask).unsqueeze(0),
                generator=generator,
            )
        action = int(a.item())
        decisions.append(
            trajectory_pb2.Decision(
                step=len(decisions),
                action=trajectory_pb2.Action(index=action),
                log_prob=float(logp.item()),
                value=float(value.item()),
                action_mask_size=ACTIONS.size,
                valid_actions=int(mask.sum()),
                observation_tensor=encode_observation(obs),
                action_mask=encode_mask(mask),
            )
        )
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return info, decisions


def session(
    info: dict[str, Any], decisions: list[trajectory_pb2.Decision], tid: str, version: int
) -> trajectory_pb2.Trajectory:
    """The ``Trajectory`` of one episode: the evidence reward_svc scores (its steps, question,
    budget and gold) and the decisions the learner trains on. Step rewards stay 0: the
    environment's only reward is the final one, and reward_svc's total is it."""
    policy_version = f"{MODEL_NAME}:{version}"
    traj = episode_trajectory(info["episode"], trajectory_id=tid, policy_version=policy_version)
    for d in decisions:
        d.policy_version = policy_version
    traj.decisions.extend(decisions)
    return traj


# ---------------------------------------------------------------- the services


class Follower:
    """The actor's subscription to the learner's announcements: verify (the run's key, the
    hash), hot-swap, tell the driver."""

    def __init__(self, bus: Bus, topic: str, trusted: TrustedKeys, tag: str) -> None:
        self.holder: PolicyHolder[ActorCritic] = PolicyHolder(build_actor_critic, trusted)
        self.loaded: asyncio.Queue[reward_pb2.PolicyUpdated] = asyncio.Queue()
        self.consumer = EventConsumer(
            bus, [topic], f"podium-train.context.{tag}", self._on_policy, producer_name=tag
        )

    async def _on_policy(self, env: envelope_pb2.Envelope, _rec: Record) -> None:
        event = unpack_as(env, reward_pb2.PolicyUpdated)
        if event.model_name != MODEL_NAME:
            return
        if not await self.holder.on_policy_updated(event):
            raise PodiumError(f"actor refused policy v{event.version}: {self.holder.last_error}")
        await self.loaded.put(event)

    async def wait_version(self, version: int, timeout_s: float) -> reward_pb2.PolicyUpdated:
        """The announcement of ``version`` once the actor serves it."""
        while True:
            event = await asyncio.wait_for(self.loaded.get(), timeout=timeout_s)
            if event.version == version:
                return event


def learner(
    cfg: ContextTrainConfig, model: ActorCritic, features: tuple[str, ...], key: Path
) -> GenericPPO:
    """GenericPPO over the environment's observation, starting from ``model``'s weights."""
    ppo = PPOConfig(
        learning_rate=cfg.learning_rate,
        learning_rate_end=cfg.learning_rate / 10,
        ent_coef_start=cfg.ent_coef,
        ent_coef_end=cfg.ent_coef / 10,
        update_epochs=cfg.update_epochs,
        hidden_sizes=cfg.hidden_sizes,
        seed=cfg.seed,
        gamma=1.0,
        gae_lambda=0.95,
    )
    algo = GenericPPO(
        GenericPPOConfig(
            obs_dim=len(features),
            n_actions=ACTIONS.size,
            artifacts_dir=cfg.run_dir.resolve() / "checkpoints",
            model_name=MODEL_NAME,
            signing_key=str(key),
            ppo=ppo,
            minibatch_size=cfg.minibatch_size,
            total_updates=cfg.iterations,
            metadata=(("env", ENV_ID), (FEATURES_KEY, ",".join(features))),
        )
    )
    algo.model.load_state_dict(model.state_dict())
    return algo


@dataclass(slots=True)
class Services:
    """reward_svc and the learning loop as the apps their processes run (asyncio tasks)."""

    apps: dict[str, Any]
    waits: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def start(self) -> None:
        """Start both apps."""
        for name, app in self.apps.items():
            await app.start()
            self.waits[name] = asyncio.create_task(app.wait(), name=name)

    def check(self) -> None:
        """Raise :class:`PodiumError` if a service has died."""
        for name, task in self.waits.items():
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise PodiumError(f"{name} failed: {task.exception()!r}")

    async def stop(self) -> None:
        """Stop whatever was started."""
        for name, app in self.apps.items():
            with contextlib.suppress(Exception):
                await app.stop()
            with contextlib.suppress(BaseException):
                await self.waits[name]


def reward_config(cfg: ContextTrainConfig) -> rewards.RewardConfig:
    """The run's reward config: ``cfg.reward_config`` or the packaged default. reward_svc
    scores with it and the environment's reward is its ``context:`` section (one source, so
    the actor's returns and the service's scores cannot drift apart)."""
    if cfg.reward_config is None:
        return rewards.default_config()
    try:
        return rewards.load_config(cfg.reward_config)
    except ConfigError as exc:
        raise ConfigError(f"--reward-config: {exc}") from exc


def services(
    cfg: ContextTrainConfig,
    bus: Bus,
    algo: GenericPPO,
    run_topics: RunTopics,
    tag: str,
    reward: rewards.RewardConfig,
) -> Services:
    """reward_svc (``reward``: the context reward with its detectors) and the learner on
    ``bus``."""
    reward_cfg = RewardServiceConfig(
        bus_url=cfg.bus,
        instance=f"{tag}-reward",
        in_topic=run_topics.trajectories,
        out_topic=run_topics.scored,
    )
    loop: LearningLoop[Episode] = LearningLoop(
        LoopConfig(
            checkpoint_dir=cfg.run_dir.resolve() / "learner",
            topic=run_topics.scored,
            policy_topic=run_topics.policy,
            group_id=f"{tag}.learner",
            client_id=f"{tag}-learner",
            batch_trajectories=cfg.episodes_per_iteration,
            max_policy_lag=0,
            log_dir=cfg.run_dir.resolve() / "tb",
        ),
        algo,  # type: ignore[arg-type]  # the protocol's attributes are invariant
        bus,
    )
    return Services(
        {
            "reward_svc": RewardApp(reward_cfg, reward, bus),
            "learner_svc": LoopApp(loop, shutdown_timeout_s=10.0),
        }
    )


__all__ = [
    "MODEL_NAME",
    "SPLITS",
    "ContextTrainConfig",
    "Demonstrations",
    "GoldTeacher",
    "clone",
    "demonstrate",
    "evaluate",
    "load_splits",
    "merge",
    "play",
    "reward_config",
    "session",
    "split_of",
]
