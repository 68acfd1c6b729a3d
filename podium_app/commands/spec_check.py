"""``podium spec check``: validate task and pool spec files and print their lower bounds.

Exit 0 if every file is valid, 2 otherwise; each problem is printed with the file and the
subtask or field it concerns, so a spec author can fix it from the message alone.
"""

from __future__ import annotations

import argparse
import sys

from podium.envs.swarm.bound import lower_bound
from podium.envs.swarm.spec import (
    default_pool,
    default_tasks_dir,
    load_pool,
    load_task,
    task_files,
)
from podium.errors import PodiumError

PROG = "podium spec check"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium spec check``."""
    parser.add_argument(
        "tasks",
        nargs="*",
        metavar="TASK",
        help="task spec files or directories of them (default: the shipped library)",
    )
    parser.add_argument("--pool", metavar="FILE", help="pool spec (default: the shipped pool)")


def run(args: argparse.Namespace) -> int:
    """Check every file; print one line per task with its bound."""
    try:
        pool = load_pool(args.pool) if args.pool else default_pool()
    except PodiumError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    print(f"pool {pool.name!r}: ok ({len(pool.agents)} agents, max_parallel {pool.max_parallel})")
    bad = 0
    for target in args.tasks or [default_tasks_dir()]:
        try:
            files = task_files(target)
        except PodiumError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            bad += 1
            continue
        for f in files:
            try:
                task = load_task(f, pool)
                b = lower_bound(task, pool)
            except PodiumError as exc:
                print(f"{PROG}: {exc}", file=sys.stderr)
                bad += 1
                continue
            print(
                f"{f}: ok: task {task.name!r}, {len(task.subtasks)} subtasks, lower bound "
                f"{b.value:.3f} (critical path {b.critical_path:.3f}, work/max_parallel "
                f"{b.work:.3f} with max_parallel {b.max_parallel})"
            )
    return 2 if bad else 0
