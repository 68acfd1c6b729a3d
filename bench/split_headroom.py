"""What is splitting worth in a world? The same policies on the same sessions, with and without.

A drift that only the returns show (``costly-merges``: merges really cost 8x what the pool spec
says, podium/envs/swarm/drift.py) is worth learning only if a policy that acts otherwise does
better. This bench measures the simplest such policy: each policy (the learned one of
``--checkpoint`` and cpls-online, each reading a statistics store its own sessions feed) is
replayed in the simulator on ``--sessions`` sessions of the cycle's task mix
(``podium bench cycle``'s ``--tasks`` tasks and seeds for ``--seed``), in the world ``--drift`` leaves
``--pool`` in once every change has taken effect, once as the tasks are and once with every
subtask made unsplittable. Both are scored against the bound of the tasks as they are (the
planners' bound), so the figures compare with ``podium bench cycle``'s.

    python bench/split_headroom.py --pool podium/data/pools/misadvertised.yaml \\
        --drift costly-merges --checkpoint bench/policies/misadvertised-v8/policy.safetensors \\
        --sessions 300 --seed 0 --json /tmp/split.json

Per policy: the mean latency/bound with splits and without, and the paired difference
(without − with; negative: not splitting is faster) with its standard error and the share of
sessions where the latency differs at all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from podium.envs.swarm.drift import load_drift
from podium.envs.swarm.spec import PoolSpec, TaskSpec, load_pool
from podium.errors import ArtifactError, SpecError
from podium.observed import AgentStats
from podium.policy.decisions import Episode
from podium.policy.swarm import load_policy, resolve_checkpoint
from podium.rollout.twins import TwinPolicy, learned_twin, rule_twin
from podium_app.cycle.config import CycleConfig
from podium_app.cycle.measure import (
    PlannedSession,
    Replayed,
    cycle_tasks,
    plan_sessions,
    ratio,
    replay_episodes,
)

PROG = "bench/split_headroom.py"
LATER = 1e12
"""Seconds after the drift's origin: every change of a scenario is in effect."""


def unsplittable(task: TaskSpec) -> TaskSpec:
    """``task`` with no subtask that may be split."""
    return replace(task, subtasks=tuple(replace(s, splittable=False) for s in task.subtasks))


def replay(
    policy: TwinPolicy, plan: list[PlannedSession], pool: PoolSpec, truth: PoolSpec
) -> list[Episode]:
    """``plan`` under ``policy`` (greedy) on a store of its own that its sessions feed, in
    order, outcomes drawn from ``truth``."""
    return replay_episodes(Replayed(policy), plan, pool, truth, AgentStats(), feed=True)


def _ratio(episode: Episode, bounded_by: Episode) -> float:
    """``episode``'s latency/bound with ``bounded_by``'s lower bound."""
    info = episode.info
    bound = float(bounded_by.info["lower_bound"])
    return ratio(float(info["latency"]), bound, bool(info["completed"]))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The figures of every policy (see the module docstring)."""
    if args.sessions < 2:
        raise ValueError("--sessions: must be >= 2")
    if args.tasks < 1:
        raise ValueError("--tasks: must be >= 1")
    try:
        pool = load_pool(args.pool)
        schedule = load_drift(args.drift)
        schedule.check(pool)
        net, _ = load_policy(resolve_checkpoint(args.checkpoint))
    except (SpecError, ArtifactError, OSError) as exc:
        raise ValueError(str(exc)) from exc
    truth = schedule.pool_at(pool.true_spec(), LATER)
    plan = plan_sessions(cycle_tasks(args.tasks, args.seed, pool), args.sessions, 1.0, args.seed)
    flat = [replace(s, task=unsplittable(s.task)) for s in plan]
    out: dict[str, Any] = {
        "config": {
            "pool": str(args.pool),
            "drift": schedule.name,
            "checkpoint": str(args.checkpoint),
            "sessions": args.sessions,
            "seed": args.seed,
            "tasks": args.tasks,
            "true_split_overhead": truth.split_overhead,
        },
        "policies": {},
    }
    for name, policy in (
        ("learned", learned_twin("1", net)),
        ("cpls-online", rule_twin("rules:cpls-online")),
    ):
        split = replay(policy, plan, pool.advertised(), truth)
        whole = replay(policy, flat, pool.advertised(), truth)
        # Both against the bound of the tasks as they are: the planners' bound.
        with_split = [_ratio(e, e) for e in split]
        without = [_ratio(e, b) for e, b in zip(whole, split, strict=True)]
        diffs = [b - a for a, b in zip(with_split, without, strict=True)]
        out["policies"][name] = {
            "with_splits": statistics.fmean(with_split),
            "without_splits": statistics.fmean(without),
            "paired": {
                "mean": statistics.fmean(diffs),
                "se": statistics.stdev(diffs) / len(diffs) ** 0.5,
                "differ": sum(abs(d) > 1e-9 for d in diffs) / len(diffs),
            },
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=Path, required=True, help="pool spec (its true: too)")
    parser.add_argument("--drift", default="none", help="scenario: the world once it bit")
    parser.add_argument("--checkpoint", type=Path, required=True, help="the learned policy")
    parser.add_argument("--sessions", type=int, default=300, help="sessions per replay")
    parser.add_argument("--seed", type=int, default=0, help="the cycle's seed (tasks, luck)")
    parser.add_argument(
        "--tasks", type=int, default=CycleConfig().tasks, help="distinct tasks (the cycle's)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    try:
        result = measure(args)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"world: {result['config']['drift']} (true split_overhead "
        f"{result['config']['true_split_overhead']:g}), {args.sessions} sessions"
    )
    for name, fig in result["policies"].items():
        p = fig["paired"]
        print(
            f"{name:<12} latency/bound with splits {fig['with_splits']:.3f}, without "
            f"{fig['without_splits']:.3f}: without - with {p['mean']:+.3f} ± {p['se']:.3f} "
            f"(differs on {p['differ']:.0%})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
