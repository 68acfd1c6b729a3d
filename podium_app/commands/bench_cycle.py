"""``podium bench cycle``: a drift scenario through the safe-shipping cycle, live policy vs a
frozen one vs the rule engines (docs/cycle.md).

Starts a local secured Kafka broker (or uses ``--bus``), the services as processes, and runs the
same load twice: *frozen* (the initial policy live, never replaced) and *continuous* (the
learner publishing candidates, the rollout controller shipping them in compressed cycles). The
drift (``--drift``) bites ``--drift-at-s`` into each load; ``--drift-target preferred`` first
aims it at the agents the initial policy relies on then (``config.drift_aimed`` in the JSON).
Per window of ``--window-s``: each run's mean latency/bound and the rule engines' (cpls,
cpls-online) on the same sessions in the simulator on the true pool at that time; the
acceptance verdicts; ``--json`` and ``--report``.

JSON (``--json OUT``)::

    {"config": {...},
     "windows": [{"window": 0, "start_s": 0, "end_s": 50,
                  "frozen": {"mean": X, "sessions": N}, "continuous": {...},
                  "cpls": {...}, "cpls_online": {...}}, ...],
     "runs": {"frozen": {"submitted": N, "finished": N, "run_twice": 0, "transitions": [...],
                         "controller_proposed": N, "promoted": N, ...}, "continuous": {...}},
     "verdicts": {"levels": {...}, "continuous_recovered": B, "continuous_at_or_below_rules": B,
                  "frozen_fails": B, "drift_visible": B, "accepted": B}}
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

from podium_app.commands import run_driver
from podium_app.cycle.config import RUNS, CycleConfig, validate

PROG = "podium bench cycle"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = CycleConfig()
    parser.add_argument("--duration-s", type=float, default=d.duration_s, help="load per run")
    parser.add_argument(
        "--drift-at-s", type=float, default=None, help="when the drift bites (default: 1/3 in)"
    )
    parser.add_argument("--drift", default=d.drift, help="drift scenario: a name or a file")
    parser.add_argument(
        "--drift-target",
        default=d.drift_target,
        help="named: the scenario's agents; preferred: the agents the initial policy uses most "
        "for the kinds it names when the drift bites",
    )
    parser.add_argument("--rate", type=float, default=d.rate, help="sessions per second")
    parser.add_argument(
        "--window-s", type=float, default=None, help="measurement window (default: 1/12 of it)"
    )
    parser.add_argument("--checkpoint", type=Path, default=None, help="initial policy file")
    parser.add_argument(
        "--pool", type=Path, default=None, help="sub-agent pool spec (default: the shipped pool)"
    )
    parser.add_argument("--bus", default="", help="kafka:// URL (default: a broker of its own)")
    parser.add_argument("--replicas", type=int, default=d.replicas, help="orchestrators")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--tasks", type=int, default=d.tasks, help="distinct tasks of the load")
    parser.add_argument("--time-scale", type=float, default=d.time_scale)
    parser.add_argument("--cycle-s", type=float, default=d.cycle_s, help="controller cycle")
    parser.add_argument("--learner-batch", type=int, default=d.learner_batch)
    parser.add_argument(
        "--explore-share",
        type=float,
        default=d.explore_share,
        help="share of sessions sampled for the learner (the others are measured)",
    )
    parser.add_argument(
        "--runs", default=",".join(RUNS), help="comma-separated subset of frozen,continuous"
    )
    parser.add_argument(
        "--retrain-after-s",
        type=float,
        default=d.retrain_after_s,
        help="continuous run: a retraining job this long after the drift instead of PPO",
    )
    parser.add_argument("--drain-s", type=float, default=d.drain_s)
    parser.add_argument("--work-dir", type=Path, default=d.work_dir)
    parser.add_argument("--json", type=Path, default=None, help="write the result JSON here")
    parser.add_argument("--report", type=Path, default=None, help="write report.html here")


def config_from(args: argparse.Namespace) -> CycleConfig:
    """The config of the flags; ValueError('--flag: why') for a bad one."""
    duration = float(args.duration_s)
    config = CycleConfig(
        work_dir=args.work_dir,
        bus=args.bus,
        checkpoint=args.checkpoint,
        pool=args.pool,
        duration_s=duration,
        drift_at_s=duration / 3 if args.drift_at_s is None else float(args.drift_at_s),
        drift=args.drift,
        drift_target=args.drift_target,
        rate=args.rate,
        window_s=duration / 12 if args.window_s is None else float(args.window_s),
        replicas=args.replicas,
        seed=args.seed,
        tasks=args.tasks,
        time_scale=args.time_scale,
        cycle_s=args.cycle_s,
        learner_batch=args.learner_batch,
        explore_share=args.explore_share,
        runs=tuple(r.strip() for r in args.runs.split(",") if r.strip()),
        retrain_after_s=args.retrain_after_s,
        drain_s=args.drain_s,
    )
    validate(config)
    _check_pool_and_drift(config)
    return config


def _check_pool_and_drift(config: CycleConfig) -> None:
    """The pool file parses and the drift scenario names only its agents and kinds."""
    from podium.envs.swarm.drift import load_drift
    from podium.errors import SpecError

    try:
        pool = config.pool_spec()
    except (SpecError, OSError) as exc:
        raise ValueError(f"--pool: {exc}") from exc
    try:
        load_drift(config.drift).check(pool)
    except (SpecError, OSError) as exc:
        raise ValueError(f"--drift: {exc}") from exc


def _say(text: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"{stamp} {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    from podium_app.cycle.driver import initial_policy, run_all
    from podium_app.cycle.report import table_text, write_report

    result = run_driver(
        PROG, lambda: asyncio.run(run_all(config, initial_policy(config, _say), _say)), args.json
    )
    if isinstance(result, int):
        return result
    if args.report is not None:
        _say(f"report: {write_report(result, args.report)}")
    print(table_text(result))
    return 0
