"""What has been observed of each sub-agent: a per-(agent, kind) statistics store.

A pool spec says what each agent *advertises* (speed, success rate, noise per kind). A real
deployment never knows whether that is true, nor whether it stays true, so the scheduler
also needs what recent sessions *showed*: :class:`AgentStats` keeps, per (agent name, kind),
exponentially decayed sums of the executions it was fed and blends them with the
advertisement (:meth:`AgentStats.estimate`). Rule engines (``cpls-online``), the observation
and the orchestrator read it; the trajectory stream feeds it
(:meth:`AgentStats.record_trajectory`, :mod:`podium.observed.follower`).

**The model.** An execution of ``work`` units on an agent of speed ``s`` and noise ``σ`` lasts
``work / s × F`` with ``F ~ LogNormal(−σ²/2, σ)``, ``E[F] = 1`` (:func:`~podium.envs.swarm.pool.
sample_execution`), and succeeds with probability ``p``, independently of its duration.

**Speed.** The store estimates the *pace* ``1/s`` as the mean of ``duration / work``:
``E[duration / work] = E[F] / s = 1/s``, so the estimate is unbiased whatever ``σ``, and so is
every expected duration a planner derives from it (``work × pace``, linear in the pace). The
tempting mean of ``work / duration`` is not: ``E[1/F] = e^{σ²}``, so it overstates the speed
by 4 % at σ = 0.2 and 57 % at σ = 0.67 — a noisy agent would look fast exactly because it is
noisy. Failed executions count too: their duration is drawn independently of the outcome.
:attr:`Estimate.speed` is reported as ``1 / pace``.

**Success.** The decayed fraction of successful executions.

**Blend.** The advertisement is a prior worth ``prior_weight`` executions: with ``n`` the
decayed count observed, each estimate is ``(prior_weight × advertised + Σ observed) /
(prior_weight + n)`` (a conjugate-style shrinkage: Beta for the success rate, the mean of a
pace), and :attr:`Estimate.confidence` is ``n / (n + prior_weight)``. Nothing observed is
exactly the advertisement, with confidence 0.

**Decay.** Each new execution of an (agent, kind) first multiplies that pair's sums by
``2^(−1/half_life)``: an execution ``half_life`` executions old weighs half as much as a new
one, so after a drift the estimates move most of the way to the new behaviour within about
two half-lives (three quarters of the old evidence is gone), while the count of a stationary
agent saturates at ``1 / (1 − 2^(−1/half_life)) ≈ 1.44 × half_life``. Decay is per pair, in
that pair's executions (not wall time): an agent used rarely keeps its evidence.

Noise is not estimated: :attr:`Estimate.noise` is the advertised σ (no planner reads it yet).

**Merges.** A split's merge is planned as ``split_overhead × work`` of the pool spec; what it
really costs is the pool's, not an agent's (a drift may make it costlier,
:mod:`podium.envs.swarm.drift`). So merges are kept apart from the agents' cells: each one
observed gives the ratio of its pace (duration / planned work) to the merging agent's pace on
that kind as observed so far, a sample of how many times the planned cost a merge really is
(E = the true factor, the agent's speed cancelling out); decayed in merges as the cells are in
executions, blended with a prior of 1 worth ``prior_weight`` merges (:meth:`AgentStats.
merge_factor`). A merge on a pair with no execution observed yet says nothing and is skipped.
:meth:`AgentStats.estimated_world` applies it; :meth:`AgentStats.estimated_pool`, what the
rule engines and the observation's advice plan on, does not: the rollout controller's twins
meet merges as observed, while cpls-online, like the issue that defines it, plans on agent
profiles.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

from podium.envs.swarm.spec import WILDCARD_KIND, AgentSpec, KindProfile, PoolSpec, default_pool
from podium.envs.swarm.state import MERGE_SUFFIX
from podium.errors import ConfigError, DecodeError, ProcessingError
from podium.v1 import subtask_pb2, task_pb2, trajectory_pb2

FORMAT = 1
"""Version of :meth:`AgentStats.to_dict`'s layout (refused by :meth:`AgentStats.from_dict`
when different)."""


_RECORDED = frozenset(
    {subtask_pb2.OUTCOME_SUCCESS, subtask_pb2.OUTCOME_FAILURE, subtask_pb2.OUTCOME_MALFORMED}
)
"""Outcomes that say how an execution went (a malformed result is a failure of the agent);
UNSPECIFIED (no result) and CANCELLED (cut off by the session's end) say nothing."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """What is believed of one agent on one kind: the advertisement blended with observations."""

    speed: float
    """Estimated work units per unit of time (> 0): 1 / the blended mean pace."""
    success: float
    """Estimated probability that an execution succeeds, in [0, 1]."""
    noise: float
    """σ of the duration factor (>= 0): the advertised one (not estimated)."""
    confidence: float
    """n / (n + prior_weight), in [0, 1): how much of the estimate is observation; 0 = nothing
    observed (the estimate is the advertisement)."""
    observations: float
    """Effective (decayed) number of executions observed."""

    def profile(self) -> KindProfile:
        """The estimate as a profile (what planners read)."""
        return KindProfile(speed=self.speed, success=self.success, noise=self.noise)


@dataclass(slots=True)
class _Cell:
    """Decayed sums of one (agent, kind): executions, successes, Σ duration / work."""

    n: float = 0.0
    successes: float = 0.0
    pace: float = 0.0


@dataclass(slots=True)
class _Merges:
    """Decayed sums of the merges observed: how many, and Σ their pace / the agent's pace."""

    n: float = 0.0
    ratio: float = 0.0


def _finite(value: float, name: str) -> float:
    """``value`` as a float, or ProcessingError naming it when it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProcessingError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@functools.cache
def default_split_overhead() -> float:
    """The shipped default pool's ``split_overhead`` (the merge work of a split, as a fraction
    of the subtask's work): what :meth:`AgentStats.record_trajectory` assumes unless told."""
    return default_pool().split_overhead


class AgentStats:
    """Per-(agent name, kind) statistics of executions observed in recent sessions.

    Not thread-safe: one event loop (or one thread) feeds and reads it; :meth:`copy` hands a
    snapshot elsewhere.
    """

    def __init__(self, *, half_life: float = 200.0, prior_weight: float = 5.0) -> None:
        """``half_life``: executions of an (agent, kind) after which an observation weighs half
        (> 0); ``prior_weight``: how many executions the advertisement is worth (> 0)."""
        self.half_life = _positive(half_life, "half_life")
        self.prior_weight = _positive(prior_weight, "prior_weight")
        self._keep = 2.0 ** (-1.0 / self.half_life)
        self._cells: dict[tuple[str, str], _Cell] = {}
        self._merges = _Merges()
        self.version = 0
        """Bumped by every execution recorded: a cache key for whoever derives from it."""

    def __repr__(self) -> str:
        return (
            f"AgentStats(half_life={self.half_life:g}, prior_weight={self.prior_weight:g}, "
            f"pairs={len(self._cells)}, version={self.version})"
        )

    # ------------------------------------------------------------------ feeding

    def record(
        self,
        agent: str,
        kind: str,
        work: float,
        duration: float,
        success: bool,
        *,
        merge: bool = False,
    ) -> None:
        """One execution of ``work`` units of ``kind`` on ``agent`` that lasted ``duration``;
        ``merge``: it was a split's merge and ``work`` its planned work (kept apart, see the
        module docstring).

        Raises ProcessingError (nothing recorded) for an empty name, work that is not a finite
        number > 0, or a duration that is not a finite number >= 0.
        """
        self._check(agent, kind, work, duration)
        if merge:
            self._record_merge(agent, kind, work, duration)
            return
        cell = self._cells.setdefault((agent, kind), _Cell())
        keep = self._keep
        cell.n = cell.n * keep + 1.0
        cell.successes = cell.successes * keep + (1.0 if success else 0.0)
        cell.pace = cell.pace * keep + duration / work
        self.version += 1

    def _record_merge(self, agent: str, kind: str, work: float, duration: float) -> None:
        cell = self._cells.get((agent, kind))
        if cell is None or cell.pace <= 0:  # nothing to compare the merge's pace with
            return
        merges = self._merges
        merges.n = merges.n * self._keep + 1.0
        merges.ratio = merges.ratio * self._keep + (duration / work) / (cell.pace / cell.n)
        self.version += 1

    @staticmethod
    def _check(agent: str, kind: str, work: float, duration: float) -> None:
        if not isinstance(agent, str) or not agent:
            raise ProcessingError(f"agent must be a non-empty name, got {agent!r}")
        if not isinstance(kind, str) or not kind:
            raise ProcessingError(f"kind of agent {agent!r} must be a non-empty name, got {kind!r}")
        if _finite(work, f"work of {agent!r} on {kind!r}") <= 0:
            raise ProcessingError(f"work of {agent!r} on {kind!r} must be > 0, got {work!r}")
        if _finite(duration, f"duration of {agent!r} on {kind!r}") < 0:
            raise ProcessingError(
                f"duration of {agent!r} on {kind!r} must be >= 0, got {duration!r}"
            )

    def record_trajectory(
        self, traj: trajectory_pb2.Trajectory, *, split_overhead: float | None = None
    ) -> int:
        """Record every finished execution of ``traj``; returns how many were recorded.

        An execution's work comes from the trajectory's task spec: the subtask's work for the
        whole subtask (unit id ``<id>``), work / split_k for a chunk (``<id>#<i>``), and
        ``split_overhead`` × work for a merge (``<id>#merge``). The pool's split overhead is
        not in the trajectory: ``split_overhead`` defaults to the shipped default pool's
        (:func:`default_split_overhead`); the orchestrator passes its own pool's. Executions
        without an outcome (UNSPECIFIED) or cancelled at the session's end are skipped.

        All or nothing: an execution naming a subtask the task lacks, a unit id that does not
        fit its split factor, a kind other than its subtask's, or times that do not make a
        finite duration >= 0 raise DecodeError naming it, and nothing of ``traj`` is recorded.
        """
        overhead = default_split_overhead() if split_overhead is None else split_overhead
        if _finite(overhead, "split_overhead") <= 0:
            raise ConfigError(f"split_overhead must be > 0, got {overhead!r}")
        rows = trajectory_executions(traj, overhead)
        for agent, kind, work, duration, success, merge in rows:
            self.record(agent, kind, work, duration, success, merge=merge)
        return len(rows)

    # ------------------------------------------------------------------ reading

    def observed(self, agent: str, kind: str) -> float:
        """Effective (decayed) number of executions of ``kind`` on ``agent`` observed."""
        cell = self._cells.get((agent, kind))
        return 0.0 if cell is None else cell.n

    def merge_factor(self) -> float:
        """How many times its planned cost a merge is believed to really cost (1: as planned;
        the prior, worth ``prior_weight`` merges, blended with the merges observed)."""
        w = self.prior_weight
        return (w + self._merges.ratio) / (w + self._merges.n)

    @property
    def merges_observed(self) -> float:
        """Effective (decayed) number of merges observed."""
        return self._merges.n

    def pairs(self) -> list[tuple[str, str]]:
        """The (agent, kind) pairs observed, sorted."""
        return sorted(self._cells)

    def estimate(self, agent: str, kind: str, advertised: KindProfile | None) -> Estimate | None:
        """The advertisement of ``agent`` on ``kind`` blended with what was observed (see the
        module doc); None when ``advertised`` is None (the agent cannot do the kind: it is
        never routed there, whatever was observed)."""
        if advertised is None:
            return None
        w = self.prior_weight
        cell = self._cells.get((agent, kind))
        if cell is None:  # exactly the advertisement (1 / (1 / s) need not be s in floats)
            return Estimate(advertised.speed, advertised.success, advertised.noise, 0.0, 0.0)
        pace = (w / advertised.speed + cell.pace) / (w + cell.n)
        success = (w * advertised.success + cell.successes) / (w + cell.n)
        return Estimate(
            # A pace of 0 needs every duration observed to be 0 and a prior worth nothing:
            # prior_weight > 0 rules it out, so the speed is finite and > 0.
            speed=1.0 / pace,
            success=min(1.0, max(0.0, success)),
            noise=advertised.noise,
            confidence=cell.n / (cell.n + w),
            observations=cell.n,
        )

    def estimated_pool(self, spec: PoolSpec) -> PoolSpec:
        """``spec`` as it is believed to behave: its advertisement (any true profiles and drift
        stripped) with every profile replaced by its :meth:`estimate`. Same agents, order and
        kinds, so an action layout or a rule engine built for ``spec`` applies unchanged.

        A generalist (``"*"``) keeps its advertised ``"*"`` profile for kinds nothing was seen
        of, and gets an explicit estimated profile (over the ``"*"`` prior) per kind observed
        on it.
        """
        advertised = spec.advertised()
        agents = tuple(self._estimated_agent(a) for a in advertised.agents)
        return replace(advertised, agents=agents)

    def estimated_world(self, spec: PoolSpec) -> PoolSpec:
        """:meth:`estimated_pool` with merges at their observed cost too (``split_overhead`` ×
        :meth:`merge_factor`): the world as observed, for whoever must reproduce sessions in
        it (the rollout controller's twins) rather than plan on agent profiles."""
        pool = self.estimated_pool(spec)
        factor = self.merge_factor()
        return pool if factor == 1.0 else replace(pool, split_overhead=pool.split_overhead * factor)

    def _estimated_agent(self, agent: AgentSpec) -> AgentSpec:
        kinds = list(agent.kinds)
        if WILDCARD_KIND in agent.kinds:
            seen = sorted(k for a, k in self._cells if a == agent.name)
            kinds += [k for k in seen if k not in agent.kinds]
        profiles: dict[str, KindProfile] = {}
        for kind in kinds:
            found = self.estimate(agent.name, kind, agent.profile(kind))
            assert found is not None  # every kind listed has an advertised profile
            # "*" itself: nothing is recorded under that name, so it stays the advertisement.
            profiles[kind] = found.profile()
        return replace(agent, kinds=profiles)

    # ------------------------------------------------------------------ copies, files

    def copy(self) -> AgentStats:
        """An independent copy (the same settings, sums and version)."""
        out = AgentStats(half_life=self.half_life, prior_weight=self.prior_weight)
        out._cells = {k: _Cell(c.n, c.successes, c.pace) for k, c in self._cells.items()}
        out._merges = _Merges(self._merges.n, self._merges.ratio)
        out.version = self.version
        return out

    def to_dict(self) -> dict[str, Any]:
        """The store as plain JSON-able data (reports, checkpoints); :meth:`from_dict` inverts."""
        return {
            "format": FORMAT,
            "half_life": self.half_life,
            "prior_weight": self.prior_weight,
            "version": self.version,
            "pairs": [
                {"agent": a, "kind": k, "n": c.n, "successes": c.successes, "pace": c.pace}
                for (a, k), c in sorted(self._cells.items())
            ],
            "merges": {"n": self._merges.n, "ratio": self._merges.ratio},
        }

    @classmethod
    def from_dict(cls, data: Any) -> AgentStats:
        """The store :meth:`to_dict` wrote; ConfigError naming the problem for anything else."""
        if not isinstance(data, dict):
            raise ConfigError(f"agent stats must be a mapping, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ConfigError(
                f"agent stats format {data.get('format')!r} is not {FORMAT} (written by another "
                "version of podium)"
            )
        out = cls(half_life=data.get("half_life", 0.0), prior_weight=data.get("prior_weight", 0.0))
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ConfigError(f"agent stats version must be an integer >= 0, got {version!r}")
        out.version = version
        pairs = data.get("pairs")
        if not isinstance(pairs, list):
            raise ConfigError(f"agent stats 'pairs' must be a list, got {pairs!r}")
        for i, row in enumerate(pairs):
            key, cell = _pair_from_dict(row, f"agent stats pairs[{i}]")
            if key in out._cells:
                raise ConfigError(f"agent stats pairs[{i}]: {key} appears twice")
            out._cells[key] = cell
        out._merges = _merges_from_dict(data.get("merges", {"n": 0.0, "ratio": 0.0}))
        return out


def observed_pool(stats: AgentStats, pool: PoolSpec, name: str) -> PoolSpec:
    """``pool``'s advertisement with ``stats``' estimated world as its truth (each agent's
    estimated profiles, the merges' estimated cost), named ``name``: the world as a
    deployment's store sees it, as a pool a retraining job may train on without reading the
    truth (``pool_to_dict`` writes it; kinds a generalist was only estimated on are left out)."""
    advertised = pool.advertised()
    world = stats.estimated_world(advertised)
    return replace(
        advertised, name=name, truth=world.agents, true_split_overhead=world.split_overhead
    )


def _positive(value: float, name: str) -> float:
    """``value`` if it is a finite number > 0, else ConfigError naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _merges_from_dict(row: Any) -> _Merges:
    """The ``merges`` of :meth:`AgentStats.to_dict` (absent in stores written before it: none
    observed), checked (ConfigError naming the field)."""
    if not isinstance(row, dict):
        raise ConfigError(f"agent stats merges must be a mapping, got {row!r}")
    values = []
    for name in ("n", "ratio"):
        v = row.get(name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"agent stats merges.{name} must be a finite number >= 0, got {v!r}")
        values.append(float(v))
    return _Merges(*values)


def _pair_from_dict(row: Any, where: str) -> tuple[tuple[str, str], _Cell]:
    """One ``pairs`` row of :meth:`AgentStats.to_dict`, checked (ConfigError naming ``where``)."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where} must be a mapping, got {row!r}")
    agent, kind = row.get("agent"), row.get("kind")
    if not isinstance(agent, str) or not agent or not isinstance(kind, str) or not kind:
        raise ConfigError(f"{where}: agent and kind must be non-empty strings")
    values = []
    for name in ("n", "successes", "pace"):
        v = row.get(name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"{where}.{name} must be a finite number >= 0, got {v!r}")
        values.append(float(v))
    n, successes, pace = values
    if successes > n * (1 + 1e-9):
        raise ConfigError(f"{where}: successes {successes:g} exceed executions {n:g}")
    return (agent, kind), _Cell(n, successes, pace)


# --------------------------------------------------------------------------- trajectories

Row = tuple[str, str, float, float, bool, bool]
"""One execution as the store records it: (agent, kind, work, duration, success, merge)."""


def trajectory_executions(traj: trajectory_pb2.Trajectory, split_overhead: float) -> list[Row]:
    """The executions of ``traj`` that finished (see :meth:`AgentStats.record_trajectory`),
    checked: DecodeError naming the first one that does not fit the trajectory's task."""
    subtasks = {s.id: s for s in traj.task.subtasks}
    rows: list[Row] = []
    for i, ex in enumerate(traj.executions):
        if ex.outcome not in _RECORDED:
            continue
        where = f"trajectory {traj.trajectory_id!r} execution {i} ({ex.subtask_id!r})"
        base, work = _unit_work(ex, subtasks, split_overhead, where)
        if ex.kind and ex.kind != base.kind:
            raise DecodeError(f"{where}: kind {ex.kind!r} is not its subtask's {base.kind!r}")
        duration = ex.end_time - ex.start_time
        if not math.isfinite(duration) or duration < 0:
            raise DecodeError(
                f"{where}: start {ex.start_time!r} and end {ex.end_time!r} make no duration >= 0"
            )
        if not ex.agent:
            raise DecodeError(f"{where}: no agent")
        if not math.isfinite(work) or work <= 0:
            raise DecodeError(f"{where}: work {work!r} is not a finite number > 0")
        success = ex.outcome == subtask_pb2.OUTCOME_SUCCESS
        merge = ex.split_k > 1 and ex.subtask_id.endswith(MERGE_SUFFIX)
        rows.append((ex.agent, base.kind, work, duration, success, merge))
    return rows


def _unit_work(
    ex: trajectory_pb2.Execution,
    subtasks: dict[str, task_pb2.SubtaskSpec],
    split_overhead: float,
    where: str,
) -> tuple[task_pb2.SubtaskSpec, float]:
    """(the subtask spec, the work of the unit ``ex`` ran), from the unit id and split factor:
    ``<id>`` whole, ``<id>#<i>`` chunk i < split_k, ``<id>#merge``."""
    uid, k = ex.subtask_id, ex.split_k
    if k <= 1:
        base = subtasks.get(uid)
        if base is None:
            raise DecodeError(f"{where}: the task has no subtask {uid!r}")
        return base, base.work
    sid, _, part = uid.rpartition("#")
    base = subtasks.get(sid)
    if base is None:
        raise DecodeError(f"{where}: the task has no subtask {sid!r} (split {k} ways)")
    if uid.endswith(MERGE_SUFFIX):
        return base, split_overhead * base.work
    if not (part.isascii() and part.isdigit() and int(part) < k):
        raise DecodeError(f"{where}: {part!r} is not a chunk of a subtask split {k} ways")
    return base, base.work / k


__all__ = [
    "FORMAT",
    "AgentStats",
    "Estimate",
    "default_split_overhead",
    "observed_pool",
    "trajectory_executions",
]
