"""``podium bench pipeline``: the event pipeline's throughput over Kafka vs embedded, and how
fast a new policy version reaches sessions (:mod:`podium_app.pipeline`; bench/README.md).

The same services (orchestrator on a learned policy, ``--workers`` sub-agent workers with
zero-duration executions, reward, learner) run twice on the same load: embedded (one process,
in-process bus) and over Kafka (each service its own process, on a local secured broker of the
run's own or ``--bus``). Progress goes to stderr; the result to ``--json``.

JSON (``--json OUT``)::

    {"kafka": {"sessions_per_s": X, "decisions_per_s_per_core": X, "decisions_per_s": X,
               "orchestrator_cpu_s": X, "orchestrator_cores": X, "sessions": N,
               "decisions": N, "submitted": N, "finished": N, "run_twice": 0,
               "policy_update_to_first_session_ms": {...}, ...},
     "embedded": {same keys, "charged_cpu_s": {service: s}},
     "policy_update_to_first_session_ms": {"p50": X, "p99": X, "max": X, "versions": N,
                                           "samples_ms": [...], ...},  # the Kafka one
     "verdicts": {"kafka_over_embedded_per_core": X, "per_core_at_least_half_of_embedded": B,
                  "pickup_p99_ms": X, "pickup_p99_within_1s": B},
     "load_average": {"before": [1m, 5m, 15m], "after": [...]}, "config": {...}}
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from podium_app.commands import run_driver

PROG = "podium bench pipeline"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from podium_app.pipeline import PipelineConfig

    d = PipelineConfig()
    parser.add_argument("--bus", default="", help="kafka:// URL (default: a broker of its own)")
    parser.add_argument("--workers", type=int, default=d.workers, help="sub-agent workers")
    parser.add_argument(
        "--sessions", type=int, default=d.sessions, help="sessions per throughput measurement"
    )
    parser.add_argument(
        "--versions", type=int, default=d.versions, help="versions published for the pick-up"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=d.rate,
        help="sessions/s while versions are published (0: half the measured throughput)",
    )
    parser.add_argument("--warmup", type=int, default=d.warmup, help="warm-up sessions")
    parser.add_argument("--checkpoint", type=Path, default=None, help="the learned policy file")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--tasks", type=int, default=d.tasks, help="distinct tasks of the load")
    parser.add_argument("--timeout-s", type=float, default=d.timeout_s, help="longest phase")
    parser.add_argument("--work-dir", type=Path, default=d.work_dir)
    parser.add_argument("--json", type=Path, default=None, help="write the result JSON here")


def _say(text: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"{stamp} {text}", file=sys.stderr, flush=True)


def summary(result: dict[str, Any]) -> str:
    """The figures as a few lines for the terminal."""
    lines = []
    for name in ("kafka", "embedded"):
        r = result[name]
        lines.append(
            f"{name:<9} {r['sessions_per_s']:8.1f} sessions/s {r['decisions_per_s']:9.0f} "
            f"decisions/s  orchestrator {r['orchestrator_cores']:.2f} cores "
            f"-> {r['decisions_per_s_per_core']:8.0f} decisions/s per core"
        )
    p = result["policy_update_to_first_session_ms"]
    v = result["verdicts"]
    lines.append(
        f"PolicyUpdated -> first session decided: p50 {p['p50']:.0f} ms, p99 {p['p99']:.0f} ms "
        f"over {p['versions']} versions"
    )
    lines.append(
        f"kafka/embedded per core {v['kafka_over_embedded_per_core']:.2f} (target >= 0.5: "
        f"{'met' if v['per_core_at_least_half_of_embedded'] else 'NOT met'}); pick-up p99 "
        f"<= 1 s: {'met' if v['pickup_p99_within_1s'] else 'NOT met'}; load average "
        f"{result['load_average']['before']}"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from podium_app.pipeline import PipelineConfig, initial_policy, run_all, validate

    config = PipelineConfig(
        work_dir=args.work_dir,
        bus=args.bus,
        workers=args.workers,
        sessions=args.sessions,
        versions=args.versions,
        rate=args.rate,
        warmup=args.warmup,
        checkpoint=args.checkpoint,
        seed=args.seed,
        tasks=args.tasks,
        timeout_s=args.timeout_s,
    )
    try:
        validate(config)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    result = run_driver(
        PROG, lambda: asyncio.run(run_all(config, initial_policy(config, _say), _say)), args.json
    )
    if isinstance(result, int):
        return result
    print(summary(result))
    return 0
