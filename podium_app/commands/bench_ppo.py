"""``podium bench ppo``: our PPO and Stable-Baselines3's PPO side by side, same budget, same judge.

Both learners get the same environment, the same env-step budget, the same network (separate
64x64 tanh actor and critic, orthogonal init: SB3's ``MlpPolicy`` default and ours), one torch
thread each, and are judged by the same :class:`~podium.rl.trainer.Evaluator`: ``--eval-episodes``
episodes on separate evaluation environments, greedy (deterministic) actions, every
``--eval-every`` env steps, evaluated right after the update that crossed the boundary (so each
evaluated policy has been trained on exactly the steps reported). ``steps_to_solve`` is the first
evaluated step whose mean return reaches the threshold; ``wall_s`` is training time without the
evaluations, over the whole budget.

SB3 runs with rl-baselines3-zoo's tuned CartPole-v1 hyperparameters (8 envs, n_steps 32,
batch 256, 20 epochs, gamma 0.98, GAE lambda 0.8, lr and clip range linearly decayed from
1e-3 and 0.2, no entropy bonus); ours with :class:`~podium.rl.ppo.PPOConfig` defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podium.errors import ConfigError

SB3_ZOO_CARTPOLE: dict[str, Any] = {
    "n_envs": 8,
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": "lin_0.001",
    "clip_range": "lin_0.2",
}
"""rl-baselines3-zoo ``hyperparams/ppo.yml``, entry ``CartPole-v1`` (SB3's own tuned setting)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``podium bench ppo``."""
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium id (Discrete actions).")
    parser.add_argument("--seeds", type=int, default=3, help="Seeds 0..N-1 for each learner.")
    parser.add_argument(
        "--compare",
        choices=("sb3", "none"),
        default="sb3",
        help="Peer to run alongside ours (default sb3).",
    )
    parser.add_argument("--steps", type=int, default=150_000, help="Env-step budget per run.")
    parser.add_argument(
        "--eval-every", type=int, default=5_120, help="Env steps between evaluations."
    )
    parser.add_argument(
        "--eval-episodes", type=int, default=20, help="Episodes per evaluation (default 20)."
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="Mean evaluation return that counts as solved (default: the env's reward_threshold).",
    )
    parser.add_argument("--json", type=Path, default=None, help="Write the figures here.")
    parser.add_argument(
        "--tensorboard", type=Path, default=None, help="TensorBoard log dir for our runs."
    )


@dataclass(slots=True)
class RunFigures:
    """One learner on one seed."""

    steps_to_solve: int | None = None
    final_return: float = float("nan")
    wall_s: float = 0.0
    env_steps_per_s: float = 0.0
    curve: list[tuple[int, float]] = field(default_factory=list)


class _Judge:
    """Evaluates at the first opportunity after each multiple of ``every`` env steps."""

    def __init__(self, evaluate: Callable[[], float], every: int, threshold: float) -> None:
        self.evaluate = evaluate
        self.every = every
        self.threshold = threshold
        self.next_at = every
        self.figures = RunFigures()
        self.eval_s = 0.0

    def maybe(self, step: int) -> None:
        if step < self.next_at:
            return
        while self.next_at <= step:
            self.next_at += self.every
        self.force(step)

    def force(self, step: int) -> float:
        t0 = time.perf_counter()
        mean = self.evaluate()
        self.eval_s += time.perf_counter() - t0
        self.figures.curve.append((step, mean))
        if mean >= self.threshold and self.figures.steps_to_solve is None:
            self.figures.steps_to_solve = step
        return mean


def _run_ours(
    env_id: str,
    seed: int,
    budget: int,
    judge_args: tuple[int, int, float],
    tensorboard: Path | None,
    on_progress: Callable[[int, float | None], None],
) -> RunFigures:
    import numpy as np

    from podium.rl.ppo import PPOConfig
    from podium.rl.trainer import Evaluator, IterationStats, PPOTrainer

    every, episodes, threshold = judge_args
    config = PPOConfig(total_env_steps=budget, seed=seed)
    log_dir = None if tensorboard is None else tensorboard / f"ours_seed{seed}"
    trainer = PPOTrainer(env_id, config, log_dir=log_dir)
    evaluator = Evaluator(env_id, episodes, seed=10_000 + seed)
    judge = _Judge(lambda: float(np.mean(evaluator.evaluate(trainer.model))), every, threshold)

    def on_iteration(it: IterationStats) -> bool:
        judge.maybe(it.global_step)
        on_progress(it.global_step, judge.figures.curve[-1][1] if judge.figures.curve else None)
        return False

    try:
        result = trainer.train(on_iteration)
        last = judge.figures.curve[-1] if judge.figures.curve else None
        final = (
            last[1] if last and last[0] == result.global_step else judge.force(result.global_step)
        )
    finally:
        trainer.close()
        evaluator.close()
    fig = judge.figures
    fig.final_return = final
    fig.wall_s = result.wall_s
    fig.env_steps_per_s = result.global_step / result.wall_s
    return fig


def _run_sb3(
    env_id: str,
    seed: int,
    budget: int,
    judge_args: tuple[int, int, float],
    on_progress: Callable[[int, float | None], None],
) -> RunFigures:
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    from podium.rl.trainer import Evaluator

    every, episodes, threshold = judge_args
    hp = SB3_ZOO_CARTPOLE
    torch.set_num_threads(1)
    envs = make_vec_env(env_id, n_envs=hp["n_envs"], seed=seed)

    def linear(start: float) -> Callable[[float], float]:
        return lambda remaining: remaining * start  # SB3 passes progress_remaining: 1 -> 0

    model = PPO(
        "MlpPolicy",
        envs,
        n_steps=hp["n_steps"],
        batch_size=hp["batch_size"],
        gae_lambda=hp["gae_lambda"],
        gamma=hp["gamma"],
        n_epochs=hp["n_epochs"],
        ent_coef=hp["ent_coef"],
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    evaluator = Evaluator(env_id, episodes, seed=10_000 + seed)

    def evaluate() -> float:
        def act(obs: torch.Tensor, _masks: torch.Tensor | None) -> torch.Tensor:
            actions, _values, _logp = model.policy(obs, deterministic=True)
            return actions  # type: ignore[no-any-return]

        return float(np.mean(evaluator.run(act)))

    judge = _Judge(evaluate, every, threshold)

    class _Callback(BaseCallback):  # type: ignore[misc]
        # `_on_rollout_start` runs right after the previous update, so the policy evaluated
        # has learned from exactly `num_timesteps` steps, as ours is after each iteration.
        def _on_rollout_start(self) -> None:
            judge.maybe(self.num_timesteps)
            on_progress(
                self.num_timesteps, judge.figures.curve[-1][1] if judge.figures.curve else None
            )

        def _on_step(self) -> bool:
            return True

    t0 = time.perf_counter()
    try:
        model.learn(total_timesteps=budget, callback=_Callback())
        wall = time.perf_counter() - t0 - judge.eval_s
        steps = int(model.num_timesteps)
        final = judge.force(steps)
    finally:
        envs.close()
        evaluator.close()
    fig = judge.figures
    fig.final_return = final
    fig.wall_s = wall
    fig.env_steps_per_s = steps / wall
    on_progress(steps, final)
    return fig


def _threshold(env_id: str, given: float | None) -> float:
    import gymnasium as gym

    from podium.rl.trainer import env_factory

    env_factory(env_id)  # ConfigError naming an unknown id
    if given is not None:
        return given
    spec = gym.spec(env_id)
    if spec.reward_threshold is None:
        raise ConfigError(f"--env {env_id} has no reward_threshold; pass --threshold")
    return float(spec.reward_threshold)


def _summary(figs: list[RunFigures]) -> dict[str, Any]:
    return {
        "steps_to_solve": [f.steps_to_solve for f in figs],
        "final_return": [round(f.final_return, 2) for f in figs],
        "wall_s": [round(f.wall_s, 3) for f in figs],
        "env_steps_per_s": [round(f.env_steps_per_s, 1) for f in figs],
        "eval_curve": [[[s, round(r, 2)] for s, r in f.curve] for f in figs],
    }


def _check(args: argparse.Namespace) -> float:
    """Validate the options and the environment; the solve threshold."""
    for name in ("seeds", "steps", "eval_every", "eval_episodes"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    threshold = _threshold(args.env, args.threshold)
    from podium.rl.trainer import check_env_spaces, env_factory

    probe = env_factory(args.env)()
    check_env_spaces(probe)
    probe.close()
    return threshold


def _run_all(
    args: argparse.Namespace, threshold: float, console: Any
) -> dict[str, list[RunFigures]]:
    """Every learner on every seed, with a progress bar per run."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    judge_args = (args.eval_every, args.eval_episodes, threshold)
    learners = ["ours"] + (["sb3"] if args.compare == "sb3" else [])
    results: dict[str, list[RunFigures]] = {name: [] for name in learners}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:>7.0f}/{task.total:.0f} steps"),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        # Interleave learners per seed so both see the same machine load over time.
        for seed in range(args.seeds):
            for name in learners:
                task = progress.add_task(f"{name} seed {seed}", total=args.steps, note="")

                def on_progress(step: int, last: float | None, task: Any = task) -> None:
                    note = "" if last is None else f"eval {last:6.1f}"
                    progress.update(task, completed=min(step, args.steps), note=note)

                if name == "ours":
                    fig = _run_ours(
                        args.env, seed, args.steps, judge_args, args.tensorboard, on_progress
                    )
                else:
                    fig = _run_sb3(args.env, seed, args.steps, judge_args, on_progress)
                results[name].append(fig)
    return results


def _print_table(
    args: argparse.Namespace, threshold: float, results: dict[str, list[RunFigures]]
) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"PPO on {args.env}: budget {args.steps} steps, solved = mean >= {threshold:g}"
    )
    for col in ("learner", "seed", "steps_to_solve", "final_return", "wall_s", "env_steps/s"):
        table.add_column(col, justify="right")
    for name, figs in results.items():
        for seed, f in enumerate(figs):
            table.add_row(
                name,
                str(seed),
                "-" if f.steps_to_solve is None else str(f.steps_to_solve),
                f"{f.final_return:.1f}",
                f"{f.wall_s:.1f}",
                f"{f.env_steps_per_s:.0f}",
            )
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    """Run the comparison, print a table, write ``--json``."""
    from rich.console import Console

    err = Console(stderr=True)
    try:
        threshold = _check(args)
    except ConfigError as exc:
        err.print(f"[red]podium bench ppo: {exc}[/red]")
        return 2
    results = _run_all(args, threshold, err)
    _print_table(args, threshold, results)
    out: dict[str, Any] = {name: _summary(figs) for name, figs in results.items()}
    out["settings"] = {
        "env": args.env,
        "env_step_budget": args.steps,
        "eval_every": args.eval_every,
        "eval_episodes": args.eval_episodes,
        "eval_policy": "deterministic (argmax), separate evaluation envs",
        "solve_threshold": threshold,
        "network": "actor and critic: separate MLPs 64x64 tanh (both learners)",
        "torch_threads": 1,
        "wall_s": "training only, evaluations excluded, whole budget",
        "ours": "podium.rl.ppo.PPOConfig defaults",
        "sb3": {"source": "rl-baselines3-zoo hyperparams/ppo.yml CartPole-v1", **SB3_ZOO_CARTPOLE},
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        err.print(f"wrote {args.json}")
    else:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0
