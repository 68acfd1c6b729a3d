"""The run of ``podium train --env context`` (see :mod:`podium_app.train.context`): cloning,
PPO iterations through reward_svc and the learning loop, selection, the held-out table, the
files (``policy.safetensors``, ``summary.json``, ``report.html`` and its plots, ``tb/``)."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from podium.bus import EventPublisher, connect
from podium.context.env import ACTIONS, CachedIndex, ContextEnv, ContextEnvConfig
from podium.context.heuristics import ContextPolicy
from podium.context.index import ContextIndex
from podium.context.learned import LearnedPolicy, load_learned_policy
from podium.context.questions import Question
from podium.errors import ConfigError, PodiumError
from podium.policy.artifacts import path_from_uri
from podium.policy.signing import TrustedKeys, ensure_key_pair
from podium.rewards import RewardConfig
from podium.rl.networks import ActorCritic
from podium.v1 import reward_pb2
from podium_app.plots import pyplot, save
from podium_app.train.actor import publish_trajectories
from podium_app.train.context import (
    MODEL_NAME,
    ContextTrainConfig,
    Demonstrations,
    Follower,
    GoldTeacher,
    Progress,
    clone,
    demonstrate,
    evaluate,
    heuristics,
    learner,
    load_splits,
    merge,
    play,
    rank_key,
    reward_config,
    services,
    session,
)
from podium_app.train.services import RunTopics


@dataclass(slots=True)
class ContextResult:
    """What a run produced."""

    run_dir: Path
    policy: Path
    """The selected version's weights (``RUN_DIR/policy.safetensors``)."""
    best_version: int
    teacher: str
    history: list[dict[str, float]] = field(default_factory=list)
    """One row per iteration (0: the cloned version)."""
    bc_history: list[dict[str, float]] = field(default_factory=list)
    validation: dict[str, dict[str, float]] = field(default_factory=dict)
    """The heuristics' validation scores."""
    held_out: dict[str, dict[str, float]] = field(default_factory=dict)
    """Every policy's held-out scores, ``learned`` included."""
    wall_s: float = 0.0


@dataclass(slots=True)
class _Run:
    config: ContextTrainConfig
    env: ContextEnv
    reward: RewardConfig
    """reward_svc's config; ``env`` rewards with its ``context:`` section."""
    splits: dict[str, list[Question]]
    writer: Any
    say: Progress
    rng: np.random.Generator
    generator: torch.Generator
    result: ContextResult
    best: tuple[tuple[float, float], reward_pb2.PolicyUpdated] | None = None
    t0: float = field(default_factory=time.perf_counter)


def run_env(cfg: ContextTrainConfig, questions: list[Question], reward: RewardConfig) -> ContextEnv:
    """The run's environment over ``questions``: searches cached, the budget, and the reward
    config's ``context:`` section as its reward (what reward_svc scores the episodes with)."""
    index = CachedIndex(ContextIndex.open(cfg.index, chroma_url=cfg.chroma_url))
    env_cfg = ContextEnvConfig(budget_tokens=cfg.budget_tokens, reward=reward.context)
    return ContextEnv(index, questions, env_cfg)


def _open(cfg: ContextTrainConfig, say: Progress) -> _Run:
    """The run's environment (cached searches), splits and log."""
    from torch.utils.tensorboard import SummaryWriter

    if (cfg.run_dir / "checkpoints").exists():
        # The learner would resume that run's checkpoint and never announce version 0.
        raise ConfigError(f"{cfg.run_dir} holds a previous run: give a new --run-dir")
    torch.manual_seed(cfg.seed)
    # One decision is a forward pass of a small MLP: more threads only add contention.
    torch.set_num_threads(1)
    splits = load_splits(cfg.questions)
    if cfg.max_questions:
        splits["train"] = splits["train"][: cfg.max_questions]
    reward = reward_config(cfg)
    env = run_env(cfg, [q for s in splits.values() for q in s], reward)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    return _Run(
        config=cfg,
        env=env,
        reward=reward,
        splits=splits,
        writer=SummaryWriter(str(cfg.run_dir / "tb")),
        say=say,
        rng=np.random.default_rng(cfg.seed),
        generator=torch.Generator().manual_seed(cfg.seed),
        result=ContextResult(cfg.run_dir, cfg.run_dir / "policy.safetensors", 0, ""),
    )


def _cold_start(run: _Run) -> ActorCritic:
    """The heuristics' validation scores, the teacher and the network cloned from it (then
    refined by DAgger rounds when the teacher is the gold one)."""
    cfg = run.config
    run.say("bc", {})
    scores = {p.name: evaluate(run.env, p, run.splits["validation"]) for p in heuristics()}
    run.result.validation = scores
    teacher: ContextPolicy = (
        GoldTeacher()
        if cfg.teacher == "gold"
        else max(heuristics(), key=lambda p: rank_key(scores[p.name]))
    )
    run.result.teacher = teacher.name
    model = ActorCritic(len(run.env.features), ACTIONS.size, cfg.hidden_sizes)
    demos = demonstrate(run.env, teacher, run.splits["train"])
    history = _fit(run, model, demos, 0)
    rounds = cfg.dagger_rounds if cfg.teacher == "gold" else 0
    for r in range(1, rounds + 1):
        run.say("bc", {"dagger_round": float(r)})
        student = LearnedPolicy(model.eval(), run.env.features)
        demos = merge(demos, demonstrate(run.env, teacher, run.splits["train"], driver=student))
        model.train()
        history += _fit(run, model, demos, r)
    run.result.bc_history = history
    accuracy = history[-1]["bc_accuracy"] if history else math.nan
    run.say("bc", {"accuracy": accuracy, "teacher_val": _teacher_val(run, teacher, scores)})
    return model


def _fit(
    run: _Run, model: ActorCritic, demos: Demonstrations, round_: int
) -> list[dict[str, float]]:
    """One cloning pass over ``demos`` (DAgger round ``round_``), logged."""
    cfg = run.config
    history = clone(model, demos, cfg.bc_epochs, cfg.bc_learning_rate, cfg.seed + round_)
    offset = round_ * cfg.bc_epochs
    for h in history:
        h["round"] = float(round_)
        run.writer.add_scalar("bc/loss", h["bc_loss"], offset + int(h["epoch"]))
        run.writer.add_scalar("bc/accuracy", h["bc_accuracy"], offset + int(h["epoch"]))
    return history


def _teacher_val(run: _Run, teacher: ContextPolicy, scores: dict[str, dict[str, float]]) -> float:
    """The teacher's validation answer-found rate (the gold teacher's measured here)."""
    if teacher.name not in scores:
        scores[teacher.name] = evaluate(run.env, teacher, run.splits["validation"])
    return scores[teacher.name]["answer_found"]


def _validate(
    run: _Run, follower: Follower, event: reward_pb2.PolicyUpdated, row: dict[str, float]
) -> None:
    """The served version, greedy, on the validation questions; remember the best."""
    served = follower.holder.current()
    policy = LearnedPolicy(served.policy, run.env.features)
    scores = evaluate(run.env, policy, run.splits["validation"])
    row["val_answer_found"], row["val_reward"] = scores["answer_found"], scores["reward"]
    run.writer.add_scalar("val/answer_found", scores["answer_found"], int(row["iteration"]))
    run.writer.add_scalar("val/reward", scores["reward"], int(row["iteration"]))
    if run.best is None or rank_key(scores) > run.best[0]:
        run.best = (rank_key(scores), event)


async def _iteration(
    run: _Run,
    it: int,
    version: int,
    follower: Follower,
    publisher: EventPublisher,
    topic: str,
    guard: Any,
) -> int:
    """Sample, publish, wait for the next version; returns it."""
    cfg = run.config
    model = follower.holder.current().policy
    train = run.splits["train"]
    picks = run.rng.integers(len(train), size=cfg.episodes_per_iteration)
    infos, trajs = [], []
    for n, i in enumerate(picks):
        info, decisions = play(run.env, model, train[int(i)], run.generator)
        infos.append(info)
        trajs.append(session(info, decisions, f"{MODEL_NAME}-{it}-{n}", version))
    await publish_trajectories(publisher, topic, trajs)
    event = await guard(follower.wait_version(version + 1, cfg.reward_timeout_s))
    row = {
        "iteration": float(it),
        "answer_found": float(np.mean([i["answer_found"] for i in infos])),
        "reward": float(np.mean([i["reward"].total for i in infos])),
        **{k: float(v) for k, v in event.metrics.items()},
    }
    run.writer.add_scalar("train/answer_found", row["answer_found"], it)
    run.writer.add_scalar("train/reward", row["reward"], it)
    if it % cfg.eval_every == 0 or it == cfg.iterations:
        _validate(run, follower, event, row)
    run.result.history.append(row)
    best = run.best[0][0] if run.best else math.nan
    run.say(
        "ppo",
        {
            "iteration": float(it),
            "answer_found": row["answer_found"],
            "reward": row["reward"],
            "val": row.get("val_answer_found", math.nan),
            "best": best,
        },
    )
    return int(event.version)


def _finish(run: _Run) -> None:
    """The best version to ``policy.safetensors``; the held-out table; the files."""
    run.say("eval", {})
    assert run.best is not None
    cfg, event = run.config, run.best[1]
    source = path_from_uri(event.uri)
    shutil.copyfile(source, run.result.policy)
    run.result.policy.with_name("policy.safetensors.sha256").write_text(
        f"{event.sha256}  policy.safetensors\n"
    )
    run.result.best_version = int(event.version)
    learned = load_learned_policy(run.result.policy)
    held = run.splits["held-out"]
    table = {p.name: evaluate(run.env, p, held) for p in heuristics()}
    table["learned"] = evaluate(run.env, learned, held)
    run.result.held_out = table
    run.result.wall_s = time.perf_counter() - run.t0
    (cfg.run_dir / "summary.json").write_text(json.dumps(summary(run.result, cfg), indent=2))
    write_report(run.result)


def summary(result: ContextResult, cfg: ContextTrainConfig) -> dict[str, Any]:
    """``summary.json``: settings, teacher, curves and the held-out table."""
    best_baseline = max(v["answer_found"] for k, v in result.held_out.items() if k != "learned")
    return {
        "env": "context",
        "index": str(cfg.index),
        "questions": str(cfg.questions),
        "budget_tokens": cfg.budget_tokens,
        "teacher": result.teacher,
        "best_version": result.best_version,
        "policy": str(result.policy),
        "validation": result.validation,
        "held_out": result.held_out,
        "learned_minus_best_baseline": result.held_out["learned"]["answer_found"] - best_baseline,
        "history": result.history,
        "bc_history": result.bc_history,
        "wall_s": result.wall_s,
    }


async def train_context(cfg: ContextTrainConfig, progress: Progress | None = None) -> ContextResult:
    """The whole run (module docstring)."""
    run = _open(cfg, progress or (lambda _p, _f: None))
    tag = f"ctx-{int(time.time() * 1000)}"
    keys = ensure_key_pair(cfg.run_dir.resolve() / "keys")
    model = _cold_start(run)
    bus = connect(cfg.bus)
    run_topics = RunTopics.private(tag)
    algo = learner(cfg, model, run.env.features, keys.private_path)
    svc = services(cfg, bus, algo, run_topics, tag, run.reward)
    follower = Follower(bus, run_topics.policy, TrustedKeys.load(str(keys.public_path)), tag)
    publisher = EventPublisher(bus, producer_name=f"podium-train/{tag}")

    async def guard(aw: Any) -> reward_pb2.PolicyUpdated:
        # The services run beside the driver: one that died is named, not waited for.
        task = asyncio.ensure_future(aw)
        while not task.done():
            svc.check()
            await asyncio.wait({task}, timeout=0.5)
        if isinstance(task.exception(), TimeoutError):
            raise PodiumError(
                f"no new policy version within {cfg.reward_timeout_s:.0f}s: the learner "
                "did not receive every episode (see reward_svc's dead letters)"
            )
        return task.result()  # type: ignore[no-any-return]

    await bus.start()
    following: asyncio.Task[None] | None = None
    try:
        await svc.start()
        await follower.consumer.start()
        following = asyncio.create_task(follower.consumer.run())
        first = await guard(follower.wait_version(0, cfg.reward_timeout_s))
        row: dict[str, float] = {"iteration": 0.0}
        _validate(run, follower, first, row)
        run.result.history.append(row)
        version = 0
        for it in range(1, cfg.iterations + 1):
            version = await _iteration(
                run, it, version, follower, publisher, run_topics.trajectories, guard
            )
        _finish(run)
    finally:
        run.writer.close()
        with contextlib.suppress(Exception):
            await follower.consumer.stop()
        if following is not None:
            following.cancel()
            with contextlib.suppress(BaseException):
                await following
        await svc.stop()
        await bus.stop()
    return run.result


# ---------------------------------------------------------------- the report


def plot_curves(result: ContextResult, out: Path) -> None:
    """Validation and training answer found per iteration against the teacher, and the
    reward."""
    plt = pyplot()
    hist = result.history
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    train = [(h["iteration"], h["answer_found"]) for h in hist if "answer_found" in h]
    val = [(h["iteration"], h["val_answer_found"]) for h in hist if "val_answer_found" in h]
    ax1.plot([t[0] for t in train], [t[1] for t in train], alpha=0.5, label="training (sampled)")
    ax1.plot([v[0] for v in val], [v[1] for v in val], "o-", label="validation (greedy)")
    if result.teacher in result.validation:
        ax1.axhline(
            result.validation[result.teacher]["answer_found"],
            color="k",
            ls="--",
            label=f"teacher ({result.teacher}) on validation",
        )
    ax1.set_xlabel("PPO iteration (0 = after behaviour cloning)")
    ax1.set_ylabel("answer found")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(
        [h["iteration"] for h in hist if "reward" in h],
        [h["reward"] for h in hist if "reward" in h],
        color="tab:green",
    )
    ax2.set_xlabel("PPO iteration")
    ax2.set_ylabel("context reward (mean per episode)")
    ax2.grid(alpha=0.3)
    save(fig, out, dpi=110)


def plot_policies(result: ContextResult, out: Path) -> None:
    """Held-out answer found and precision per policy."""
    plt = pyplot()
    names = list(result.held_out)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = np.arange(len(names))
    ax.bar(x - 0.2, [result.held_out[n]["answer_found"] for n in names], 0.4, label="answer found")
    ax.bar(x + 0.2, [result.held_out[n]["precision"] for n in names], 0.4, label="precision")
    ax.set_xticks(x, names)
    ax.set_ylim(0, 1)
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    save(fig, out, dpi=110)


def write_report(result: ContextResult) -> Path:
    """``report.html`` with the plots and the held-out table."""
    plot_curves(result, result.run_dir / "learning_curve.png")
    plot_policies(result, result.run_dir / "policies.png")
    cols = ("answer_found", "precision", "tokens_kept", "searches", "reward", "p50_ms")
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td>"
        + "".join(f"<td>{s[c]:.3f}</td>" for c in cols)
        + "</tr>"
        for name, s in result.held_out.items()
    )
    page = (
        "<html><head><meta charset='utf-8'><title>podium train --env context</title></head><body>"
        f"<h1>Context-1: learned agent v{result.best_version}</h1>"
        f"<p>teacher (behaviour cloning): {html.escape(result.teacher)}; {result.wall_s / 60:.1f} min</p>"
        "<h2>Held-out questions</h2><table border=1><tr><th>policy</th>"
        + "".join(f"<th>{c}</th>" for c in cols)
        + f"</tr>{rows}</table>"
        "<img src='learning_curve.png'><img src='policies.png'></body></html>"
    )
    out = result.run_dir / "report.html"
    out.write_text(page)
    return out


__all__ = ["ContextResult", "summary", "train_context", "write_report"]
