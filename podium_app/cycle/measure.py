"""What a cycle bench measures, as pure functions of its inputs (no bus, no processes).

* :func:`plan_sessions`: the load — the same sessions (task, seed, submission offset) for every
  run, so the runs and the rule engines are compared session for session (paired seeds);
* :func:`reference_ratios`: the rule engines on those very sessions, in the simulator, each
  session on the *true* pool of its submission time (the drift scenario applied) — cpls on the
  advertised pool, and cpls-online reading a statistics store of its own fed by its own
  sessions in submission order (a cpls-online deployment serving the same traffic);
  :func:`replay_ratios` replays any policy so (:class:`Replayed`), e.g. the initial learned
  policy on a store that stops learning at the drift (:func:`frozen_store_arm`: frozen weights
  *and* frozen knowledge of the agents, beside the frozen run's frozen weights on the live
  store);
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
from podium.envs.swarm.drift import DriftChange, DriftSchedule
from podium.envs.swarm.generator import DEFAULT_KINDS, generate_suite
from podium.envs.swarm.spec import WILDCARD_KIND, PoolSpec
from podium.errors import ConfigError
from podium.observed import AgentStats
from podium.policy.agent import SwarmAgent
from podium.policy.decisions import Episode
from podium.policy.network import SwarmPolicyNet
from podium.policy.rollout import Job, run_episodes
from podium.rollout.metrics import LATENCY_RATIO_CAP
from podium.rollout.twins import TwinPolicy, learned_twin, rule_twin

RECOVERY_TOLERANCE = 0.05
"""The live policy's latency/bound after the drift must come back within 5 % of before."""
REFERENCES = ("cpls", "cpls-online")
"""The rule engines every window is compared with."""
FROZEN_STORE = "frozen-store"
"""The replayed arm of the initial policy on a store frozen at the drift (its window key
``frozen_store``)."""
STORES = ("none", "live", "until-drift")
"""What a replayed policy's statistics store is (:attr:`Replayed.store`)."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """A policy replayed on the planned sessions in the simulator, beside the runs."""

    policy: TwinPolicy
    """A rule engine or a learned version (greedy), in the environment the orchestrator gives
    it (:meth:`TwinPolicy.env_config`)."""
    store: str = "live"
    """``"none"``: no statistics store (the advertisement only); ``"live"``: a store of its
    own fed by its own sessions in submission order, as a deployment's is; ``"until-drift"``:
    that store fed until the drift and only read after it — a deployment that stopped learning
    about its agents when they changed."""

    def __post_init__(self) -> None:
        if self.store not in STORES:
            raise ConfigError(f"store must be one of {', '.join(STORES)}, got {self.store!r}")


REFERENCE_ARMS = {
    "cpls": Replayed(rule_twin("rules:cpls"), "none"),
    "cpls-online": Replayed(rule_twin("rules:cpls-online"), "live"),
}
""":data:`REFERENCES` as replayed arms."""


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


def cycle_tasks(n: int, seed: int, pool: PoolSpec | None = None) -> list[TaskSpec]:
    """The load's tasks: ``n`` small random DAGs (5-10 subtasks) over every kind of ``pool``
    (default: the shipped kinds), so sessions last a fraction of a second and every specialist
    is needed. The shipped kinds keep their order, so a pool of the same kinds gets the same
    tasks as the default one."""
    if pool is None:
        return generate_suite(n, seed=seed, sizes=(5, 10))
    kinds = [k for k in DEFAULT_KINDS if k in pool.kinds]
    kinds += [k for k in pool.kinds if k not in DEFAULT_KINDS]
    return generate_suite(n, seed=seed, sizes=(5, 10), kinds=kinds)


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
    arm: Replayed,
    group: Sequence[PlannedSession],
    nominal: PoolSpec,
    true_pool: PoolSpec,
    stats: AgentStats | None,
    feed: bool,
) -> list[float]:
    """Each session of ``group`` under ``arm``'s policy, its latency/bound; the sessions feed
    ``stats`` when ``feed``."""
    return [
        ratio(float(e.info["latency"]), float(e.info["lower_bound"]), bool(e.info["completed"]))
        for e in replay_episodes(arm, group, nominal, true_pool, stats, feed)
    ]


def replay_episodes(
    arm: Replayed,
    group: Sequence[PlannedSession],
    nominal: PoolSpec,
    true_pool: PoolSpec,
    stats: AgentStats | None,
    feed: bool,
) -> list[Episode]:
    """Each session of ``group`` under ``arm``'s policy (greedy for a learned one), in the
    simulator on ``true_pool`` while the policy reads ``nominal`` and ``stats``; the sessions
    feed ``stats`` when ``feed``."""
    policy = arm.policy
    slots = max(policy.slots(len(s.task.subtasks)) for s in group)
    config = replace(policy.env_config(slots), feed_stats=feed and stats is not None)
    named = {s.task.name: s.task for s in group}
    envs = SwarmEnv.replicas(
        min(16, len(group)), list(named.values()), nominal, config, true_pool=true_pool, stats=stats
    )
    jobs = [Job(s.task, s.seed) for s in group]
    if policy.rule is not None:
        episodes, _ = run_episodes(envs, jobs, rule=policy.rule)
    else:
        assert policy.net is not None
        agent = SwarmAgent(envs[0].layout, net=policy.net)
        episodes, _ = run_episodes(envs, jobs, agent=agent, greedy=True)
    return episodes


def _phase_groups(
    plan: Sequence[PlannedSession], schedule: DriftSchedule, drift_at_s: float, chunk: int
) -> list[tuple[int, int, float]]:
    """The plan cut into runs of at most ``chunk`` sessions of one drift phase: (start, end,
    drift time of the first)."""
    out = []
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
        out.append((i, j, t))
        i = j
    return out


def replay_ratios(
    plan: Sequence[PlannedSession],
    nominal: PoolSpec,
    schedule: DriftSchedule,
    drift_at_s: float,
    arms: Mapping[str, Replayed],
    chunk: int = 64,
    stores: dict[str, AgentStats | None] | None = None,
) -> dict[str, list[float]]:
    """Per arm, each planned session's latency/bound (plan order), replayed in the simulator
    on the true pool of its submission time. ``stores``: a dict the arms' statistics stores
    are left in (by arm name), for a caller that wants what the sessions showed."""
    truth = nominal.true_spec()
    out: dict[str, list[float]] = {name: [] for name in arms}
    if stores is None:
        stores = {}
    stores.update(
        {name: None if arm.store == "none" else AgentStats() for name, arm in arms.items()}
    )
    # In submission order, a chunk at a time and one drift phase per run: a store then holds
    # what its own earlier sessions showed it, as a deployment's would.
    for i, j, t in _phase_groups(plan, schedule, drift_at_s, chunk):
        group = plan[i:j]
        true_pool = schedule.pool_at(truth, t)
        before = group[0].at_s < drift_at_s
        for name, arm in arms.items():
            feed = arm.store == "live" or (arm.store == "until-drift" and before)
            out[name] += _replay(arm, group, nominal.advertised(), true_pool, stores[name], feed)
    return out


def reference_ratios(
    plan: Sequence[PlannedSession],
    nominal: PoolSpec,
    schedule: DriftSchedule,
    drift_at_s: float,
    chunk: int = 64,
) -> dict[str, list[float]]:
    """Per rule engine of :data:`REFERENCES`, each planned session's latency/bound (plan
    order), replayed in the simulator on the true pool of its submission time."""
    return replay_ratios(plan, nominal, schedule, drift_at_s, REFERENCE_ARMS, chunk)


def frozen_store_arm(net: SwarmPolicyNet) -> dict[str, Replayed]:
    """The frozen policy of the acceptance: the initial weights (``net``) reading a store that
    its own sessions feed until the drift and nothing after it. The frozen *run* serves the
    same weights on the orchestrators' live store, which keeps learning the agents: a policy
    that reads observed estimates then recovers from a drift the observations show without
    any new weights, and that run alone cannot tell the learner's part."""
    return {FROZEN_STORE: Replayed(learned_twin("1", net), "until-drift")}


def store_at_drift(
    plan: Sequence[PlannedSession],
    nominal: PoolSpec,
    schedule: DriftSchedule,
    drift_at_s: float,
    net: SwarmPolicyNet,
) -> AgentStats:
    """What the initial policy (``net``) has seen of the agents when the drift bites: the
    statistics store its own sessions before ``drift_at_s`` feed, replayed in the simulator
    (the :func:`frozen_store_arm`'s store at the drift; a deployment's store before the drift
    holds the same sessions, the same luck)."""
    before = [s for s in plan if s.at_s < drift_at_s]
    stores: dict[str, AgentStats | None] = {}
    if before:
        replay_ratios(before, nominal, schedule, drift_at_s, frozen_store_arm(net), stores=stores)
    return stores.get(FROZEN_STORE) or AgentStats()


def preferred_drift(
    schedule: DriftSchedule, nominal: PoolSpec, stats: AgentStats
) -> tuple[DriftSchedule, list[str]]:
    """``schedule`` aimed at what the policy relies on: each (agent, kind) a change hits (every
    kind the named agent declares when the change names none) is moved to the agent ``stats``
    has observed doing that kind most (decayed executions; ties to the named agent, then pool
    order), among the agents that can do it. A drift of an agent nobody routes to bites nobody
    that reads observations; this one bites every policy whose store stopped at the drift.

    Returns the new schedule (named ``<name>@preferred``) and one line per (agent, kind) saying
    where it went and on what evidence."""
    agents = {a.name: a for a in nominal.agents}
    changes: list[DriftChange] = []
    said: list[str] = []
    for change in schedule.changes:
        if change.agent is None:  # the pool's merges: every policy meets them
            changes.append(change)
            continue
        named = agents[change.agent]
        kinds = (
            [change.kind]
            if change.kind is not None
            else [k for k in named.kinds if k != WILDCARD_KIND]
        )
        if not kinds:  # an agent of every kind and none of its own: nothing to aim
            changes.append(change)
            continue
        for kind in kinds:
            capable = [a.name for a in nominal.agents if a.profile(kind) is not None]
            seen = {name: stats.observed(name, kind) for name in capable}
            target = max(capable, key=lambda n: (seen[n], n == change.agent))
            changes.append(replace(change, agent=target, kind=kind))
            counts = ", ".join(
                f"{n} {seen[n]:.0f}" for n in sorted(capable, key=lambda n: -seen[n])
            )
            said.append(
                f"{change.agent}/{kind} -> {target}/{kind} (executions of {kind} observed before "
                f"the drift: {counts})"
            )
    aimed = DriftSchedule(
        name=f"{schedule.name}@preferred",
        changes=tuple(sorted(changes, key=lambda c: c.at_s)),
        description=f"{schedule.description} Aimed at the preferred agents: {'; '.join(said)}",
    )
    return aimed, said


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
    the end, while the frozen policy does not do both (the replayed ``frozen_store`` arm when
    the rows have it, else the frozen run; both are reported); plus the drift's visibility
    (frozen post-drift above pre-drift)."""
    span = phases(rows, drift_at_s, tail_windows)
    keys = [
        k
        for k in ("continuous", "frozen", "frozen_store", "cpls", "cpls_online")
        if rows and k in rows[0]
    ]
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
    frozen_holds, store_holds = holds("frozen"), holds("frozen_store")
    out: dict[str, Any] = {
        "levels": level,
        "better_rule_end": best_rule,
        "continuous_recovered": recovered("continuous"),
        "continuous_at_or_below_rules": (
            None if cont_end is None or best_rule is None else cont_end <= best_rule
        ),
        "frozen_recovered": recovered("frozen"),
        "frozen_fails": None if frozen_holds is None else not frozen_holds,
        "frozen_store_recovered": recovered("frozen_store"),
        "frozen_store_fails": None if store_holds is None else not store_holds,
        "drift_visible": (
            None if frozen_pre is None or frozen_post is None else frozen_post > frozen_pre
        ),
    }
    # The frozen policy of the acceptance is the one nothing updates, weights nor store, when
    # it was replayed; the frozen run (frozen weights, live store) otherwise.
    frozen_fails = out["frozen_store_fails"] if "frozen_store" in keys else out["frozen_fails"]
    parts = [out["continuous_recovered"], out["continuous_at_or_below_rules"], frozen_fails]
    out["accepted"] = None if any(p is None for p in parts) else all(parts)
    return out


__all__ = [
    "FROZEN_STORE",
    "RECOVERY_TOLERANCE",
    "REFERENCES",
    "REFERENCE_ARMS",
    "STORES",
    "PlannedSession",
    "Replayed",
    "cycle_tasks",
    "drift_time",
    "frozen_store_arm",
    "phases",
    "plan_sessions",
    "preferred_drift",
    "ratio",
    "reference_ratios",
    "replay_ratios",
    "store_at_drift",
    "verdicts",
    "window_of",
    "window_table",
]
