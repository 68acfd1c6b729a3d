"""``podium bench env``: swarm-environment steps per second with a random valid policy.

The target is 20,000 steps/s on one core for 30-subtask tasks; the default workload is the
seeded generator's 30-subtask tasks of every shape on the shipped pool.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from podium.envs.swarm.benchmark import measure_env_speed
from podium.envs.swarm.generator import SHAPES, generate_task
from podium.envs.swarm.spec import default_pool, load_pool, load_tasks
from podium.errors import PodiumError

PROG = "podium bench env"
TARGET_STEPS_PER_SECOND = 20_000.0
"""The acceptance target (one core, 30-subtask tasks, random valid policy)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium bench env``."""
    parser.add_argument(
        "--tasks", metavar="DIR_OR_FILE", help="tasks (default: generated, 30 subtasks)"
    )
    parser.add_argument("--pool", metavar="FILE", help="pool spec (default: the shipped pool)")
    parser.add_argument("--size", type=int, default=30, help="subtasks per generated task")
    parser.add_argument("--seconds", type=float, default=5.0, help="CPU seconds to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="OUT", help="write the result as JSON here")


def run(args: argparse.Namespace) -> int:
    """Measure and print steps/s against the target; 1 if below it, 2 on bad input."""
    try:
        pool = load_pool(args.pool) if args.pool else default_pool()
        if args.tasks:
            tasks = load_tasks(args.tasks, pool)
        else:
            if args.size < 2 or args.size > 64:
                print(f"{PROG}: --size must be in [2, 64], got {args.size}", file=sys.stderr)
                return 2
            tasks = [generate_task(s, args.size, args.seed + i) for i, s in enumerate(SHAPES)]
        if args.seconds <= 0:
            print(f"{PROG}: --seconds must be > 0", file=sys.stderr)
            return 2
        res = measure_env_speed(tasks, pool, seconds=args.seconds, seed=args.seed)
    except PodiumError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    sizes = sorted({len(t.subtasks) for t in tasks})
    ok = res.steps_per_second >= TARGET_STEPS_PER_SECOND
    report = {
        "steps": res.steps,
        "episodes": res.episodes,
        "cpu_seconds": res.cpu_seconds,
        "steps_per_second": res.steps_per_second,
        "wall_steps_per_second": res.wall_steps_per_second,
        "target_steps_per_second": TARGET_STEPS_PER_SECOND,
        "meets_target": ok,
        "task_sizes": sizes,
    }
    print(
        f"{res.steps_per_second:,.0f} steps/s per CPU core ({res.wall_steps_per_second:,.0f} "
        f"wall) over {res.steps:,} steps, {res.episodes:,} episodes, tasks of {sizes} subtasks; "
        f"target {TARGET_STEPS_PER_SECOND:,.0f}: {'met' if ok else 'NOT met'}"
    )
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"{PROG}: --json {args.json}: cannot write ({exc.strerror})", file=sys.stderr)
            return 2
    return 0 if ok else 1
