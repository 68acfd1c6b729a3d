"""``podium bench scheduling``: compare scheduling policies on task specs against the bound.

Runs every policy (sequential always, as the reference) for N seeded episodes per task,
prints a table and writes JSON of the shape documented in ``docs/specs.md``. ``learned`` in
``--policies`` evaluates a trained orchestrator policy loaded from ``--checkpoint``; torch is
imported only then, so the rule-engine benchmark stays quick to start.

``--true-pool FILE`` (or a ``--pool`` file carrying ``true:`` profiles) makes the simulated
sub-agents behave otherwise than advertised: every policy reads ``--pool``'s advertisement,
outcomes are drawn from the truth. ``planner`` is the rollout planner on the true model, a
reference line that reads the truth; ``cpls-online`` (and ``planner-online``, the planner on
the estimates) read profiles estimated from each policy's own statistics store, warmed by
``--warmup`` cpls episodes per task. Any policy may be listed as ``NAME+scout``
(``learned+scout``, ``cpls-online+scout``): that policy with scouting
(:mod:`podium.envs.swarm.scouting`), which tries untried agents only where the schedule has
slack for them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from podium.envs.swarm.baselines import BASELINES
from podium.envs.swarm.benchmark import PLANNER, PLANNER_ONLINE, bench_scheduling
from podium.envs.swarm.scheduling import SchedulingPolicy
from podium.envs.swarm.scouting import SCOUT_SUFFIX, base_policy
from podium.envs.swarm.spec import (
    check_true_pool,
    default_pool,
    default_tasks_dir,
    load_pool,
    load_tasks,
)
from podium.errors import ArtifactError, ConfigError, PodiumError

PROG = "podium bench scheduling"

LEARNED = "learned"
"""Policy name of the trained network given by ``--checkpoint``."""


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``, else a message naming the value."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}")
        return v

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = {*BASELINES, LEARNED, PLANNER, PLANNER_ONLINE}
    unknown = [p for p in names if base_policy(p) not in known]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown policy {unknown[0] if unknown else text!r}; known: "
            f"{', '.join(sorted(known))}, each also as NAME{SCOUT_SUFFIX}"
        )
    return names


def _learned_policies(args: argparse.Namespace) -> dict[str, SchedulingPolicy]:
    """The trained policy named by ``--checkpoint`` when ``learned`` is listed, else nothing.

    Raises :class:`ConfigError` when the flags disagree, :class:`ArtifactError` (missing,
    tampered or foreign file) with the flag named.
    """
    wanted = any(base_policy(p) == LEARNED for p in args.policies)
    if wanted and not args.checkpoint:
        raise ConfigError(
            f"--policies lists {LEARNED!r}: give the trained policy with --checkpoint PATH "
            "(a policy .safetensors file, its version directory or a `podium train` run directory)"
        )
    if not wanted:
        if args.checkpoint:
            # A checkpoint that would be silently ignored is almost certainly a mistake.
            raise ConfigError(
                f"--checkpoint {args.checkpoint} is only used with --policies ...,{LEARNED}"
            )
        return {}
    # Imported here: torch loads in seconds, and the rule engines do not need it.
    from podium.policy.swarm import LearnedPolicy

    try:
        return {LEARNED: LearnedPolicy.from_checkpoint(args.checkpoint)}
    except ArtifactError as exc:
        raise ArtifactError(f"--checkpoint {args.checkpoint}: {exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium bench scheduling``."""
    parser.add_argument(
        "--tasks",
        metavar="DIR_OR_FILE",
        default=None,
        help="task spec file or directory of them (default: the shipped library)",
    )
    parser.add_argument(
        "--pool",
        metavar="FILE",
        help="pool spec the policies read (default: the shipped pool); its agents' true: "
        "profiles, if any, are what the simulated sub-agents really do",
    )
    parser.add_argument(
        "--true-pool",
        metavar="FILE",
        help="pool spec with the same agents as --pool giving how they truly behave: the "
        "simulator draws outcomes from it, every policy but the planner reads --pool",
    )
    parser.add_argument(
        "--policies",
        type=_policies,
        default=["sequential", "greedy", "cpls"],
        help=f"comma-separated policies among "
        f"{', '.join(sorted({*BASELINES, LEARNED, PLANNER, PLANNER_ONLINE}))}"
        f" (sequential always runs as the reference; {LEARNED} needs --checkpoint; {PLANNER} "
        f"is the rollout planner on the true model, a reference line that reads the truth; "
        f"{PLANNER_ONLINE} plans on the statistics store's estimates instead; NAME{SCOUT_SUFFIX}: "
        f"that policy trying untried agents where the schedule has slack)",
    )
    parser.add_argument(
        "--warmup",
        type=_non_negative_int,
        default=10,
        help="with a policy that reads the statistics store (cpls-online, learned): cpls "
        "episodes per task on the true pool that warm up each policy's store (default 10)",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="trained policy for 'learned': a policy .safetensors (sha256-verified), its "
        "version directory, or a `podium train` run directory (its newest checkpoint)",
    )
    parser.add_argument("--episodes", type=_positive_int, default=20, help="episodes per task")
    parser.add_argument("--seed", type=int, default=0, help="seed of episode 0 (default 0)")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON here")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 2 with a message naming the problem on bad input."""
    try:
        extra = _learned_policies(args)  # first: a bad checkpoint fails before any work
        pool = load_pool(args.pool) if args.pool else default_pool()
        true_pool = load_pool(args.true_pool) if args.true_pool else None
        if true_pool is not None:  # here too, so the message names the file
            check_true_pool(pool, true_pool.true_spec(), source=f"--true-pool {args.true_pool}")
        tasks = load_tasks(args.tasks or default_tasks_dir(), pool)
        result = bench_scheduling(
            tasks,
            pool,
            args.policies,
            args.episodes,
            args.seed,
            extra=extra,
            true_pool=true_pool,
            warmup=args.warmup,
        )
    except PodiumError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    config: dict[str, Any] = result["config"]
    if LEARNED in extra:
        config["checkpoint"] = str(args.checkpoint)
    if args.true_pool:
        config["true_pool"] = str(args.true_pool)
    names = config["policies"]
    table = Table(title=f"Scheduling on {len(tasks)} tasks, {args.episodes} episodes each")
    table.add_column("task")
    table.add_column("n", justify="right")
    table.add_column("bound", justify="right")
    for n in names:
        table.add_column(f"{n}\nlatency (×bound)", justify="right")
    for t in result["tasks"]:
        cells = [t["name"], str(t["subtasks"]), f"{t['lower_bound']:.2f}"]
        for n in names:
            p = t["policies"][n]
            done = "" if p["completion_rate"] == 1.0 else f" {p['completion_rate']:.0%} done"
            cells.append(f"{p['latency_mean']:.2f} ({p['ratio_to_bound']:.2f}){done}")
        table.add_row(*cells)
    table.add_section()
    row = ["mean ratio to bound", "", ""]
    row += [f"{result['summary'][n]['ratio_to_bound_mean']:.3f}" for n in names]
    table.add_row(*row)
    row = ["mean reduction vs sequential", "", ""]
    row += [f"{result['summary'][n]['reduction_vs_sequential_mean']:.1%}" for n in names]
    table.add_row(*row)
    Console().print(table)
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"{PROG}: --json {args.json}: cannot write ({exc.strerror})", file=sys.stderr)
            return 2
    return 0
