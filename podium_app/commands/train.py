"""``podium train``: train the orchestrator policy (behaviour cloning from cpls, then PPO with the
reward service's reward) and write TensorBoard logs, checkpoints, ``report.html`` and
``summary.json`` into the run directory. See :mod:`podium_app.train.job`."""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from podium.errors import ConfigError, PodiumError

if TYPE_CHECKING:
    from podium_app.train.config import TrainConfig, TrainResult

PROG = "podium train"


QUICK: dict[str, Any] = {
    "suite_size": 60,
    "sizes": (5, 20),
    "curriculum": (12, 20),
    "bc_demos_per_task": 1,
    "bc_epochs": 2,
    "dagger_rounds": 1,
    "dagger_epochs": 1,
    "iterations": 4,
    "episodes_per_iteration": 32,
    "num_envs": 16,
    "eval_every": 2,
    "validation_seeds": 1,
    "test_suite_size": 8,
    "test_sizes": (5, 25),
    "test_episodes": 2,
}
"""``--quick``: a 1-2 minute smoke run (a preset under ``--config`` and the flags)."""

ALIASES = {"episodes_per_iteration": ("--episodes",), "test_suite_size": ("--test-tasks",)}
"""Older flag names kept working beside the generated ones."""

GENERATED_SUITES = ("suite_size", "test_suite_size")
"""Settings that size the generated suites (refused on the command line with ``--tasks``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``podium train``: one flag per setting of ``TrainConfig`` and its sections
    (generated: :mod:`podium_app.settings_cli`), plus ``--config``, ``--resume`` and
    ``--quick``. The defaults take about 17 CPU-minutes."""
    from podium_app.settings_cli import add_flags
    from podium_app.train.config import train_settings

    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        default=None,
        help="settings from a YAML or TOML file: top-level keys are the settings below "
        "without their section, sections (ppo:, env:, network:) are mappings of theirs "
        "(a run's RUN_DIR/config.yaml reproduces it). Flags override the file, the file "
        "overrides the defaults",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        default=None,
        help="continue the run in RUN_DIR from its last checkpoint (the learner's weights, "
        "optimizer, update counter and generator; the driver's random streams, statistics "
        "stores, curves and TensorBoard step) with its config.yaml; flags (e.g. "
        "--iterations to run longer) override it",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a 1-2 minute smoke run (tiny suite, few iterations)"
    )
    add_flags(parser.add_argument_group("settings"), train_settings(), aliases=ALIASES)
    parser.add_argument(
        "--env",
        choices=("swarm", "context"),
        default="swarm",
        help="what to train: the orchestrator's swarm policy (default), or the Context-1 "
        "search-and-prune agent (podium_app.train.context: --index, --questions, --budget)",
    )
    from podium_app.train.context_cli import add_context_arguments

    add_context_arguments(parser)


def config_from_args(args: argparse.Namespace) -> object:
    """The :class:`TrainConfig` the options describe: defaults < ``--quick`` < the resumed
    run's ``config.yaml`` < ``--config`` < flags. ConfigError naming the key, the flag or
    the file for anything unusable."""
    from podium_app.settings_cli import apply, flag_values, load_file
    from podium_app.train.config import DERIVED, TrainConfig, train_settings

    settings = train_settings()
    values: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.resume is not None:
        values.update(load_file(args.resume / "config.yaml", settings, derived=DERIVED))
        values["run_dir"] = args.resume
    if args.config is not None:
        values.update(load_file(args.config, settings, derived=DERIVED))
    flags = flag_values(args, settings)
    if args.resume is not None and "run_dir" in flags and flags["run_dir"] != args.resume:
        raise ConfigError("--run-dir: a resumed run stays in its directory (--resume RUN_DIR)")
    values.update(flags)
    return apply(TrainConfig(), values)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops the run like Ctrl-C does: the job's ``finally`` stops the service
    processes it started (they would otherwise outlive it)."""
    raise KeyboardInterrupt


def training_progress(console: Console) -> Progress:
    """The training commands' progress bar (``--env swarm`` and ``--env context``): the phase,
    its bar and count, the latest figures, elapsed and remaining time."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f}"),
        TextColumn("{task.fields[figures]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def print_if_not_terminal(console: Console, bar: Progress) -> None:
    """Without a terminal (logs, CI) there is no live bar: one line per progress event."""
    if console.is_terminal:
        return
    shown = bar.tasks[0]
    console.print(
        f"{shown.description} {shown.completed:.0f}/{shown.total:.0f} "
        f"{shown.fields.get('figures', '')}",
        highlight=False,
    )


def set_aside_previous_run(run_dir: Path) -> Path | None:
    """Move a non-empty ``run_dir`` to ``<run_dir>.<its modification time>`` and return the new
    path (None if there was nothing to move).

    Published versions are immutable, so a second run cannot write into the first one's
    checkpoints; re-running the README's main job must still just work, and must not destroy
    the previous run either.
    """
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(run_dir.stat().st_mtime))
    target = run_dir.with_name(f"{run_dir.name}.{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = run_dir.with_name(f"{run_dir.name}.{stamp}-{n}")
    run_dir.rename(target)
    return target


def check_inputs(args: argparse.Namespace) -> tuple[TrainConfig | None, str | None]:
    """The config the options give, or the one-line problem with them (a setting, a
    ``--config`` file, ``--pool`` / ``--tasks`` / ``--init``, a device this machine lacks, a
    flag that does not apply): checked before anything else happens, the previous run
    included."""
    from podium_app.settings_cli import given_flag
    from podium_app.train.config import TrainConfig, train_settings
    from podium_app.train.suites import load_train_pool, task_suites

    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        return None, str(exc)
    assert isinstance(cfg, TrainConfig)
    if cfg.tasks is not None:
        for s in train_settings():
            if s.key in GENERATED_SUITES and given_flag(args, s):
                flag = " / ".join((s.flag, *ALIASES.get(s.key, ())))
                return None, (
                    f"{flag} sizes the generated suites; with --tasks the tasks are your "
                    f"files ({cfg.tasks}): drop {flag}"
                )
    try:
        pool = load_train_pool(cfg.pool)
    except PodiumError as exc:
        return None, f"--pool: {exc}"
    if cfg.init is not None:
        from podium.policy.swarm import load_policy, resolve_checkpoint

        try:
            load_policy(resolve_checkpoint(cfg.init))
        except PodiumError as exc:
            return None, f"--init: {exc}"
    if cfg.tasks is None:
        return cfg, None
    try:
        task_suites(cfg, pool.advertised)
    except PodiumError as exc:
        return None, f"--tasks: {exc}"
    return cfg, None


def print_result(result: TrainResult) -> None:
    """The held-out table, what the run trained on, and where its files are (stdout)."""
    from podium_app.train.report import headline

    table = Table(
        title=f"held-out tasks ({len(result.summary['tasks'])}), policy v{result.best_version}"
    )
    for col in ("policy", "latency/bound", "completion", "reduction vs sequential"):
        table.add_column(col, justify="right")
    for name, s in result.summary["summary"].items():
        table.add_row(
            name,
            f"{s['ratio_to_bound_mean']:.3f}",
            f"{s['completion_rate_mean']:.3f}",
            f"{s['reduction_vs_sequential_mean']:.1%}",
        )
    Console().print(table)
    print(f"trained on {headline(result.summary)}")
    print(f"report: {result.run_dir / 'report.html'}  ({result.wall_s / 60:.1f} min)")
    print(f"checkpoint: {result.best_checkpoint}")
    print(f"tensorboard: tensorboard --logdir {result.run_dir / 'tb'}")


def bar_update(phase: str, f: dict[str, float], cfg: TrainConfig, start: str) -> dict[str, Any]:
    """The progress bar's fields for one event of the job (``phase`` and its figures, see
    :data:`podium_app.train.config.Progress`); ``start``: the first phase's description."""
    if phase == "bc":
        text = (
            f"cpls val latency/bound {f['cpls_val']:.3f} · BC accuracy {f['accuracy']:.3f}"
            if "accuracy" in f
            else "collecting demonstrations"
            if cfg.init is None
            else f"starting from {cfg.init}"
        )
        # The bar counts PPO iterations again once cloning's sessions are collected.
        return {"description": start, "figures": text, "completed": 0, "total": cfg.iterations}
    if phase == "collect":
        # Cloning's sessions counted on the bar (a planner teacher takes seconds each).
        what = "demonstrations" if f["round"] == 0 else f"DAgger {f['round']:.0f} labels"
        return {"completed": f["done"], "total": f["total"], "figures": what}
    if phase == "ppo":
        val = (
            ""
            if math.isnan(f["val"])
            else f" · val {f['val']:.3f} (best {f['best']:.3f}, cpls {f['cpls_val']:.3f})"
        )
        return {
            "completed": f["iteration"],
            "total": cfg.iterations,
            "description": "PPO",
            "figures": (
                f"latency/bound {f['ratio']:.3f} · completion {f['completion']:.2f}"
                f" · reward {f['reward']:+.3f}{val}"
            ),
        }
    return {"description": "held-out evaluation", "figures": ""}


def run(args: argparse.Namespace) -> int:
    """Train (or go on with ``--resume``), showing live progress on stderr, then print the
    held-out table; 2 with a line naming the setting, flag or file when the options are
    unusable."""
    if args.env == "context":
        from podium_app.train.context_cli import run_context

        return run_context(args)
    cfg, problem = check_inputs(args)
    if cfg is None:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    if args.resume is None:
        moved = set_aside_previous_run(cfg.run_dir)
        if moved is not None:
            print(f"previous run in {cfg.run_dir} moved to {moved}", file=sys.stderr)
    from podium_app.train.job import train

    console = Console(stderr=True)
    with training_progress(console) as bar:
        # With --init there is nothing to clone: the first phase only loads and validates it.
        start = (
            f"resuming {cfg.run_dir}"
            if args.resume is not None
            else "loading --init"
            if cfg.init is not None
            else "behaviour cloning"
        )
        task = bar.add_task(start, total=cfg.iterations, figures="")

        def progress(phase: str, f: dict[str, float]) -> None:
            bar.update(task, **bar_update(phase, f, cfg, start))
            print_if_not_terminal(console, bar)

        try:
            signal.signal(signal.SIGTERM, _interrupt)
            result = asyncio.run(train(cfg, progress, resume_run=args.resume is not None))
        except PodiumError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 1
    print_result(result)
    return 0
