"""What a cycle bench measures, as pure functions of its inputs (no bus, no processes).

* :func:`plan_sessions`: the load — the same sessions (task, seed, submission offset) for every
  run, so the runs and the rule engines are compared session for session (paired seeds);
* :func:`reference_ratios`: the rule engines on those very sessions, in the simulator, each
  session on the *true* pool of its submission time (the drift scenario applied) — cpls on the
  advertised pool, and cpls-online reading a statistics store of its own fed by its own
  sessions in submission order (a cpls-online deployment serving the same traffic);
* :func:`window_table` and :func:`verdicts`: per-window means and the acceptance verdicts.

Why a simulated reference is fair: the live sessions' outcomes are a pure function of the
session seed and the true pool (the rollout's twins reproduce a live session's latency
exactly), so a rule engine replayed on the same (task, seed) against the pool that was true when
the session ran meets the same sub-agent luck the learned policy met; a live baseline arm would
see only its 5-10 % of the sessions, and no arm can run cpls-online next to cpls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import fmean
from typing import Any

from podium.envs.swarm import SwarmEnv, TaskSpec
from podium.envs.swarm.drift import DriftSchedule
from podium.envs.swarm.generator import generate_suite
from podium.envs.swarm.spec import PoolSpec
from podium.observed import AgentStats
from podium.policy.rollout import Job, run_episodes
from podium.rollout.metrics import LATENCY_RATIO_CAP
from podium.rollout.twins import rule_twin

RECOVERY_TOLERANCE = 0.05
"""The live policy's latency/bound after the drift must come back within 5 % of before."""
REFERENCES = ("cpls", "cpls-online")
"""The rule engines every window is compared with."""


@dataclass(frozen=True, slots=True)
class PlannedSession:
    """One session of the load."""

    index: int
    """Its place in the load (0, 1, ...)."""
    task: TaskSpec
    """The task it runs."""
    seed: int
    """Its session seed (the sub-agents' luck)."""
    at_s: float
    """When it is submitted, in seconds from the load's start."""
    sampled: bool = False
    """Whether the orchestrator samples its actions (exploration for the learner); the
    measured sessions are the others (decided greedily, as users get them)."""


def cycle_tasks(n: int, seed: int) -> list[TaskSpec]:
    """The load's tasks: ``n`` small random DAGs (5-10 subtasks) over every kind, so sessions
    last a fraction of a second and every specialist is needed."""
    return generate_suite(n, seed=seed, sizes=(5, 10))


def plan_sessions(
    tasks: Sequence[TaskSpec], sessions: int, rate: float, seed: int, explore_share: float = 0.0
) -> list[PlannedSession]:
    """``sessions`` sessions at ``rate`` per second, tasks in turn, seeds derived from ``seed``,
    ``explore_share`` of them sampled, spread evenly (a low-discrepancy sequence, so every
    window holds its share); identical for every run of the same settings."""
    return [
        PlannedSession(
            i,
            tasks[i % len(tasks)],
            1_000_003 * (seed + 1) + i,
            i / rate,
            sampled=(i * 0.6180339887) % 1.0 < explore_share,
        )
        for i in range(sessions)
    ]


def ratio(latency: float, lower_bound: float, completed: bool) -> float:
    """latency / lower bound, as the rollout's ``latency_ratio`` guardrail reads a session:
    capped, and the cap itself for an incomplete session."""
    if not completed or lower_bound <= 0 or not math.isfinite(latency):
        return LATENCY_RATIO_CAP
    return min(max(latency / lower_bound, 0.0), LATENCY_RATIO_CAP)


def drift_time(at_s: float, drift_at_s: float, schedule: DriftSchedule) -> float:
    """Seconds since the drift's origin of a load offset ``at_s`` (the origin is placed so
    that the scenario's first change falls at ``drift_at_s`` into the load)."""
    first = schedule.changes[0].at_s if schedule.changes else 0.0
    return at_s - drift_at_s + first


def _replay(
    rule: str,
    group: Sequence[PlannedSession],
    nominal: PoolSpec,
    true_pool: PoolSpec,
    stats: AgentStats | None,
) -> list[float]:
    """Each session of ``group`` under the rule engine ``rule``, its latency/bound."""
    policy = rule_twin(f"rules:{rule}")
    slots = max(policy.slots(len(s.task.subtasks)) for s in group)
    config = replace(policy.env_config(slots), feed_stats=stats is not None)
    named = {s.task.name: s.task for s in group}
    envs = SwarmEnv.replicas(
        min(16, len(group)), list(named.values()), nominal, config, true_pool=true_pool, stats=stats
    )
    episodes, _ = run_episodes(envs, [Job(s.task, s.seed) for s in group], rule=rule)
    return [
        ratio(float(e.info["latency"]), float(e.info["lower_bound"]), bool(e.info["completed"]))
        for e in episodes
    ]


def reference_ratios(
    plan: Sequence[PlannedSession],
    nominal: PoolSpec,
    schedule: DriftSchedule,
    drift_at_s: float,
    chunk: int = 64,
) -> dict[str, list[float]]:
    """Per rule engine of :data:`REFERENCES`, each planned session's latency/bound (plan
    order), replayed in the simulator on the true pool of its submission time."""
    truth = nominal.true_spec()
    out: dict[str, list[float]] = {name: [] for name in REFERENCES}
    store = AgentStats()
    # In submission order, a chunk at a time and one drift phase per run: cpls-online's store
    # then holds what its own earlier sessions showed it, as a deployment's would.
    i = 0
    while i < len(plan):
        t = drift_time(plan[i].at_s, drift_at_s, schedule)
        phase = schedule.phase(t)
        j = i
        while (
            j < len(plan)
            and j - i < chunk
            and schedule.phase(drift_time(plan[j].at_s, drift_at_s, schedule)) == phase
        ):
            j += 1
        group = plan[i:j]
        true_pool = schedule.pool_at(truth, t)
        out["cpls"] += _replay("cpls", group, nominal.advertised(), true_pool, None)
        out["cpls-online"] += _replay("cpls-online", group, nominal.advertised(), true_pool, store)
        i = j
    return out


def window_of(at_s: float, window_s: float, windows: int) -> int:
    """The measurement window of a submission offset."""
    return min(windows - 1, max(0, int(at_s // window_s)))


def _mean(values: Sequence[float]) -> float | None:
    return fmean(values) if values else None


def window_table(
    plan: Sequence[PlannedSession],
    runs: Mapping[str, Mapping[int, float]],
    references: Mapping[str, Sequence[float]],
    window_s: float,
    windows: int,
) -> list[dict[str, Any]]:
    """One row per window: its span, and per run (session index -> latency/bound of the
    sessions the learned policy decided) and per reference (plan order) the mean and the count
    over the window's measured (not sampled) sessions."""
    rows: list[dict[str, Any]] = []
    for w in range(windows):
        idx = [s.index for s in plan if not s.sampled and window_of(s.at_s, window_s, windows) == w]
        row: dict[str, Any] = {"window": w, "start_s": w * window_s, "end_s": (w + 1) * window_s}
        for name, by_index in runs.items():
            vals = [by_index[i] for i in idx if i in by_index]
            row[name] = {"mean": _mean(vals), "sessions": len(vals)}
        for name, in_order in references.items():
            vals = [in_order[i] for i in idx]
            row[name.replace("-", "_")] = {"mean": _mean(vals), "sessions": len(vals)}
        rows.append(row)
    return rows


def _span_mean(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """Session-weighted mean of ``key`` over ``rows``."""
    total = sum(r[key]["mean"] * r[key]["sessions"] for r in rows if r[key]["mean"] is not None)
    n = sum(r[key]["sessions"] for r in rows if r[key]["mean"] is not None)
    return total / n if n else None


def phases(
    rows: Sequence[Mapping[str, Any]], drift_at_s: float, tail_windows: int
) -> dict[str, list[Mapping[str, Any]]]:
    """The windows wholly before the drift (``pre``), those after it (``post``) and the last
    ``tail_windows`` (``end``)."""
    pre = [r for r in rows if r["end_s"] <= drift_at_s]
    post = [r for r in rows if r["start_s"] >= drift_at_s]
    return {"pre": pre, "post": post, "end": list(rows[-tail_windows:])}


def verdicts(
    rows: Sequence[Mapping[str, Any]], drift_at_s: float, tail_windows: int = 1
) -> dict[str, Any]:
    """The acceptance verdicts (None where a run is missing): the continuous run's end within
    :data:`RECOVERY_TOLERANCE` of its pre-drift level and at or below the better rule engine at
    the end, while the frozen run does not do both; plus the drift's visibility (frozen
    post-drift above pre-drift)."""
    span = phases(rows, drift_at_s, tail_windows)
    keys = [k for k in ("continuous", "frozen", "cpls", "cpls_online") if rows and k in rows[0]]
    level = {f"{k}_{p}": _span_mean(span[p], k) for k in keys for p in ("pre", "post", "end")}
    rules = [v for v in (level.get("cpls_end"), level.get("cpls_online_end")) if v is not None]
    best_rule = min(rules) if rules else None

    def holds(run: str) -> bool | None:
        pre, end = level.get(f"{run}_pre"), level.get(f"{run}_end")
        if pre is None or end is None or best_rule is None:
            return None
        return end <= (1 + RECOVERY_TOLERANCE) * pre and end <= best_rule

    def recovered(run: str) -> bool | None:
        pre, end = level.get(f"{run}_pre"), level.get(f"{run}_end")
        return None if pre is None or end is None else end <= (1 + RECOVERY_TOLERANCE) * pre

    cont_end = level.get("continuous_end")
    frozen_pre, frozen_post = level.get("frozen_pre"), level.get("frozen_post")
    frozen_holds = holds("frozen")
    out: dict[str, Any] = {
        "levels": level,
        "better_rule_end": best_rule,
        "continuous_recovered": recovered("continuous"),
        "continuous_at_or_below_rules": (
            None if cont_end is None or best_rule is None else cont_end <= best_rule
        ),
        "frozen_recovered": recovered("frozen"),
        "frozen_fails": None if frozen_holds is None else not frozen_holds,
        "drift_visible": (
            None if frozen_pre is None or frozen_post is None else frozen_post > frozen_pre
        ),
    }
    parts = [
        out["continuous_recovered"],
        out["continuous_at_or_below_rules"],
        out["frozen_fails"],
    ]
    out["accepted"] = None if any(p is None for p in parts) else all(parts)
    return out


__all__ = [
    "RECOVERY_TOLERANCE",
    "REFERENCES",
    "PlannedSession",
    "cycle_tasks",
    "drift_time",
    "phases",
    "plan_sessions",
    "ratio",
    "reference_ratios",
    "verdicts",
    "window_of",
    "window_table",
]
