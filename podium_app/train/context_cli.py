"""The command line of ``podium train --env context``: its own options (the index, the
questions, the budget), the shared ones it reads (``--iterations``, ``--run-dir``, ...), the
progress bar and the held-out table."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from podium.errors import ConfigError, PodiumError

if TYPE_CHECKING:  # the parser is built for every command: torch is imported only to train
    from podium_app.train.context import ContextTrainConfig

PROG = "podium train --env context"

SHARED: dict[str, str] = {
    "run_dir": "run_dir",
    "bus": "bus",
    "seed": "seed",
    "iterations": "iterations",
    "episodes_per_iteration": "episodes_per_iteration",
    "eval_every": "eval_every",
    "bc_epochs": "bc_epochs",
    "ppo.learning_rate": "learning_rate",
    "ppo.ent_coef_start": "ent_coef",
    "ppo.update_epochs": "update_epochs",
    "ppo.minibatch_size": "minibatch_size",
    "ppo.bc_learning_rate": "bc_learning_rate",
}
"""Settings of ``podium train`` that mean the same for the context agent → its field."""


def add_context_arguments(parser: argparse.ArgumentParser) -> None:
    """The options only ``--env context`` reads."""
    group = parser.add_argument_group("context (--env context)")
    group.add_argument(
        "--index",
        "--docs",
        dest="context_index",
        type=Path,
        metavar="DIR",
        help="the index directory (podium context index --out DIR)",
    )
    group.add_argument(
        "--questions",
        dest="context_questions",
        type=Path,
        metavar="PATH",
        help="a directory of train/validation/held-out .jsonl splits, or one JSONL file "
        "(split 80/10/10 by id)",
    )
    group.add_argument(
        "--budget",
        dest="context_budget",
        type=int,
        default=300,
        metavar="TOKENS",
        help="the context budget (default 300)",
    )
    group.add_argument(
        "--max-questions",
        dest="context_max_questions",
        type=int,
        default=0,
        metavar="N",
        help="train on at most N training questions (default: all)",
    )
    group.add_argument(
        "--chroma",
        dest="context_chroma",
        default=None,
        metavar="URL",
        help="the Chroma server holding the index's vectors (default: where it was built)",
    )
    group.add_argument(
        "--reward-config",
        dest="context_reward_config",
        type=Path,
        default=None,
        metavar="YAML",
        help="the reward config reward_svc scores with; its context: section is also the "
        "environment's reward (default: the packaged podium/data/rewards/default.yaml)",
    )


def context_config(args: argparse.Namespace) -> ContextTrainConfig:
    """The run the options describe; ConfigError naming a missing option or a swarm flag
    that does not apply."""
    from podium_app.settings_cli import flag_values
    from podium_app.train.config import train_settings
    from podium_app.train.context import ContextTrainConfig, reward_config

    for flag in ("config", "resume", "init"):
        if getattr(args, flag, None) not in (None, False):
            raise ConfigError(f"--{flag} is not supported with --env context")
    if args.quick:
        raise ConfigError("--quick is not supported with --env context (use --iterations)")
    if args.context_index is None or args.context_questions is None:
        raise ConfigError("--env context needs --index DIR and --questions PATH")
    values: dict[str, Any] = {}
    for key, value in flag_values(args, train_settings()).items():
        if key not in SHARED:
            flag = "--" + key.replace(".", "-").replace("_", "-")
            raise ConfigError(f"{flag} does not apply to --env context")
        values[SHARED[key]] = value
    if "run_dir" not in values:
        values["run_dir"] = Path("runs/context")
    cfg = ContextTrainConfig(
        index=args.context_index,
        questions=args.context_questions,
        budget_tokens=args.context_budget,
        max_questions=args.context_max_questions,
        chroma_url=args.context_chroma,
        reward_config=args.context_reward_config,
        **values,
    )
    reward_config(cfg)  # a bad reward YAML is bad input: named before anything starts
    return cfg


def bar_fields(phase: str, f: dict[str, float], iterations: int) -> dict[str, Any]:
    """The progress bar's fields for one event of the run."""
    if phase == "bc":
        if "accuracy" in f:
            text = (
                f"teacher val answer found {f['teacher_val']:.3f} · BC accuracy {f['accuracy']:.3f}"
            )
        elif "dagger_round" in f:
            text = f"DAgger round {f['dagger_round']:.0f}: the clone plays, the teacher labels"
        else:
            text = "choosing the teacher, collecting demonstrations"
        return {"description": "behaviour cloning", "figures": text, "completed": 0}
    if phase == "ppo":
        val = "" if math.isnan(f["val"]) else f" · val {f['val']:.3f} (best {f['best']:.3f})"
        return {
            "description": "PPO",
            "completed": f["iteration"],
            "total": iterations,
            "figures": f"answer found {f['answer_found']:.3f} · reward {f['reward']:+.3f}{val}",
        }
    return {"description": "held-out evaluation", "figures": ""}


def print_table(result: Any) -> None:
    """The held-out table and where the files are (stdout)."""
    table = Table(title=f"held-out questions, learned v{result.best_version}")
    cols = ("answer_found", "precision", "tokens_kept", "searches", "reward")
    for col in ("policy", *cols):
        table.add_column(col, justify="right")
    for name, s in result.held_out.items():
        table.add_row(name, *(f"{s[c]:.3f}" for c in cols))
    Console().print(table)
    print(f"teacher: {result.teacher}; report: {result.run_dir / 'report.html'}")
    print(f"policy: {result.policy}  ({result.wall_s / 60:.1f} min)")
    print(f"tensorboard: tensorboard --logdir {result.run_dir / 'tb'}")


def run_context(args: argparse.Namespace) -> int:
    """Train the Context-1 agent with live progress on stderr, then print the table; 2 with
    a line naming the problem when the options are unusable."""
    from podium_app.train.context_run import train_context

    try:
        cfg = context_config(args)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    from podium_app.commands.train import (
        print_if_not_terminal,
        set_aside_previous_run,
        training_progress,
    )

    # A learner resumes from the checkpoint in its run directory and versions are
    # immutable: a new run never starts in an old one's directory (it is moved aside).
    moved = set_aside_previous_run(cfg.run_dir)
    if moved is not None:
        print(f"previous run in {cfg.run_dir} moved to {moved}", file=sys.stderr)
    console = Console(stderr=True)
    with training_progress(console) as bar:
        task = bar.add_task("behaviour cloning", total=cfg.iterations, figures="")

        def progress(phase: str, f: dict[str, float]) -> None:
            bar.update(task, **bar_fields(phase, f, cfg.iterations))
            print_if_not_terminal(console, bar)

        try:
            result = asyncio.run(train_context(cfg, progress))
        except PodiumError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 1
    print_table(result)
    return 0


__all__ = ["add_context_arguments", "context_config", "run_context"]
