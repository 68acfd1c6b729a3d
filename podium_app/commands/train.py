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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from podium.errors import PodiumError

if TYPE_CHECKING:
    from podium_app.train.config import TrainResult

PROG = "podium train"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``podium train`` (defaults take about 17 CPU-minutes)."""
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path("runs/latest"),
        help="output directory (default runs/latest)",
    )
    parser.add_argument(
        "--bus",
        default="inproc://",
        help="inproc:// (default: embedded, reward_svc and learner_svc as tasks in this process) "
        "or kafka://HOST:PORT (the same job, python -m reward_svc and python -m learner_svc as "
        "processes against the broker)",
    )
    parser.add_argument(
        "--iterations", type=_positive, default=None, help="PPO iterations (default 60)"
    )
    parser.add_argument(
        "--episodes", type=_positive, default=None, help="sessions per PPO iteration (default 96)"
    )
    parser.add_argument(
        "--suite-size", type=_positive, default=None, help="generated training tasks (default 400)"
    )
    parser.add_argument(
        "--bc-epochs", type=_positive, default=None, help="behaviour-cloning epochs (default 2)"
    )
    parser.add_argument(
        "--test-tasks", type=_positive, default=None, help="held-out test tasks (default 60)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument(
        "--pool",
        type=Path,
        metavar="FILE",
        default=None,
        help="your pool spec (JSON/YAML, docs/specs.md): the profiles its agents advertise, "
        "and, when it carries true: profiles, how they really behave (the simulated "
        "sub-agents draw from those; planners never see them). Default: the shipped pool",
    )
    parser.add_argument(
        "--tasks",
        type=Path,
        metavar="DIR_OR_FILE",
        default=None,
        help="your task library (a directory of task specs, or one file), checked against "
        "the pool; a hashed 20%% is held out for the final table (none with fewer than 10 "
        "tasks). Default: generated suites over the pool's kinds",
    )
    parser.add_argument(
        "--pool-variants",
        type=_count,
        default=None,
        metavar="N",
        help="also train on N variants of the pool (renamed agents, other counts, true "
        "profiles slower/flakier/better than advertised), each session on one pool drawn "
        "uniformly (default 0)",
    )
    parser.add_argument(
        "--init",
        type=Path,
        metavar="CHECKPOINT",
        default=None,
        help="start from this trained policy (a policy .safetensors, its version directory or "
        "a `podium train` run directory) instead of behaviour cloning: fine-tune it on this "
        "run's pool and tasks. Default: clone the rule engine",
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=None,
        help="also export every published version to ONNX into this Triton model "
        "repository (<DIR>/swarm_policy/<version>/model.onnx; default: weights only)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a 1-2 minute smoke run (tiny suite, few iterations)"
    )


def config_from_args(args: argparse.Namespace) -> object:
    """The :class:`TrainConfig` the options describe."""
    from podium_app.train.config import TrainConfig

    cfg = TrainConfig(
        run_dir=args.run_dir,
        bus=args.bus,
        seed=args.seed,
        model_repository=args.model_repository,
        pool=args.pool,
        tasks=args.tasks,
        init=args.init,
    )
    if args.quick:
        cfg = replace(
            cfg,
            suite_size=60,
            sizes=(5, 20),
            curriculum=(12, 20),
            bc_demos_per_task=1,
            bc_epochs=2,
            dagger_rounds=1,
            dagger_epochs=1,
            iterations=4,
            episodes_per_iteration=32,
            num_envs=16,
            eval_every=2,
            validation_seeds=1,
            test_suite_size=8,
            test_sizes=(5, 25),
            test_episodes=2,
        )
    overrides = {
        "iterations": args.iterations,
        "episodes_per_iteration": args.episodes,
        "suite_size": args.suite_size,
        "bc_epochs": args.bc_epochs,
        "test_suite_size": args.test_tasks,
        "pool_variants": args.pool_variants,
    }
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops the run like Ctrl-C does: the job's ``finally`` stops the service
    processes it started (they would otherwise outlive it)."""
    raise KeyboardInterrupt


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


def check_inputs(args: argparse.Namespace) -> str | None:
    """The one-line problem with ``--pool`` / ``--tasks`` (a missing or invalid file, a task
    the pool cannot run, a flag that does not apply), or None: checked before anything else
    happens, the previous run included."""
    from podium_app.train.config import TrainConfig
    from podium_app.train.suites import load_train_pool, task_suites

    if args.tasks is not None:
        for flag, value in (("--suite-size", args.suite_size), ("--test-tasks", args.test_tasks)):
            if value is not None:
                return (
                    f"{flag} sizes the generated suites; with --tasks the tasks are your "
                    f"files ({args.tasks}): drop {flag}"
                )
    try:
        pool = load_train_pool(args.pool)
    except PodiumError as exc:
        return f"--pool: {exc}"
    if args.init is not None:
        from podium.policy.swarm import load_policy, resolve_checkpoint

        try:
            load_policy(resolve_checkpoint(args.init))
        except PodiumError as exc:
            return f"--init: {exc}"
    if args.tasks is None:
        return None
    try:
        task_suites(TrainConfig(tasks=args.tasks), pool.advertised)
    except PodiumError as exc:
        return f"--tasks: {exc}"
    return None


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


def run(args: argparse.Namespace) -> int:
    """Train, showing live progress on stderr, then print the held-out table; 2 with a line
    naming the flag when ``--pool`` or ``--tasks`` is unusable."""
    problem = check_inputs(args)
    if problem is not None:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    moved = set_aside_previous_run(args.run_dir)
    if moved is not None:
        print(f"previous run in {args.run_dir} moved to {moved}", file=sys.stderr)
    from podium_app.train.job import TrainConfig, train

    cfg = config_from_args(args)
    assert isinstance(cfg, TrainConfig)
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f}"),
        TextColumn("{task.fields[figures]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        # With --init there is nothing to clone: the first phase only loads and validates it.
        start = "loading --init" if cfg.init is not None else "behaviour cloning"
        task = bar.add_task(start, total=cfg.iterations, figures="")

        def progress(phase: str, f: dict[str, float]) -> None:
            if phase == "bc":
                text = (
                    f"cpls val latency/bound {f['cpls_val']:.3f} · BC accuracy {f['accuracy']:.3f}"
                    if "accuracy" in f
                    else "collecting demonstrations"
                    if cfg.init is None
                    else f"starting from {cfg.init}"
                )
                bar.update(task, description=start, figures=text)
            elif phase == "ppo":
                val = (
                    ""
                    if math.isnan(f["val"])
                    else f" · val {f['val']:.3f} (best {f['best']:.3f}, cpls {f['cpls_val']:.3f})"
                )
                bar.update(
                    task,
                    completed=f["iteration"],
                    description="PPO",
                    figures=(
                        f"latency/bound {f['ratio']:.3f} · completion {f['completion']:.2f}"
                        f" · reward {f['reward']:+.3f}{val}"
                    ),
                )
            else:
                bar.update(task, description="held-out evaluation", figures="")
            if not console.is_terminal:
                # No live bar in logs and CI: one line per event instead.
                shown = bar.tasks[0]
                console.print(
                    f"{shown.description} {shown.completed:.0f}/{shown.total:.0f} "
                    f"{shown.fields.get('figures', '')}",
                    highlight=False,
                )

        try:
            signal.signal(signal.SIGTERM, _interrupt)
            result = asyncio.run(train(cfg, progress))
        except PodiumError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 1
    print_result(result)
    return 0
