"""Non-stationary sub-agents: how the *true* pool drifts from the pool spec over time.

The planners (rule engines, the learned policy's observation, the lower bound) read the pool
spec, which never changes. The sub-agents themselves may change: a specialist gets slow at its
kind, an agent starts failing. A :class:`DriftSchedule` says when and how, and
:meth:`DriftSchedule.pool_at` gives the true pool at a time; the simulator samples outcomes from
it (``SwarmEnv(..., true_pool=)``) and so does ``subagent_svc`` (``PODIUM_SUBAGENT_DRIFT``).
This is what the rollout's guardrails must notice: the live policy gets worse while nothing it
reads has changed.

A scenario file (YAML or JSON; shipped ones in ``podium/data/drift/``)::

    name: slow-specialist
    description: free text
    changes:
      - at_s: 60            # seconds since the schedule's origin
        agent: qa           # an agent of the pool
        kind: test          # optional: one kind; omitted = every kind the agent does
        speed_factor: 0.2   # optional, > 0: true speed = nominal speed x factor
        success_factor: 1.0 # optional, >= 0: true success = min(1, nominal x factor)
      - at_s: 60            # no agent: a change of the pool itself
        merge_factor: 8     # > 0: a split's merge really costs split_overhead x factor

Factors are relative to the *nominal* profile, never compounded: for one (agent, kind) the
change in effect at ``t`` is the latest one with ``at_s <= t`` (file order breaks ties), so a
later change with factors 1 restores the agent. Noise never drifts. Likewise the pool's merge
cost at ``t`` is the latest pool change's ``merge_factor`` × the nominal ``split_overhead``.
Planners keep planning merges at the nominal overhead
(:func:`~podium.envs.swarm.pool.merge_work_factor`): the statistics store estimates the merge
cost apart from the agents' profiles (:meth:`~podium.observed.AgentStats.merge_factor`), the
rollout controller's twins meet it, and no rule engine plans on it: a change that only a
learner's returns turn into other decisions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import WILDCARD_KIND, KindProfile, PoolSpec, read_document
from podium.errors import SpecError

_SCHEDULE_KEYS = frozenset({"name", "description", "changes"})
_AGENT_CHANGE_KEYS = frozenset({"at_s", "agent", "kind", "speed_factor", "success_factor"})
_POOL_CHANGE_KEYS = frozenset({"at_s", "merge_factor"})
SCENARIO_SUFFIXES = (".yaml", ".yml", ".json")
"""Suffixes of scenario files (a bare name is looked up with each, in this order)."""


@dataclass(frozen=True, slots=True)
class DriftChange:
    """One change of one agent's true behaviour, or of the pool's merges, from ``at_s`` on."""

    at_s: float
    """Seconds since the schedule's origin at which it takes effect (>= 0)."""
    agent: str | None
    """The agent whose behaviour changes; None: a change of the pool (:attr:`merge_factor`)."""
    kind: str | None = None
    """The kind it changes for; None: every kind the agent declares (``"*"`` included)."""
    speed_factor: float = 1.0
    """True speed = nominal speed × this (> 0)."""
    success_factor: float = 1.0
    """True success = min(1, nominal success × this) (>= 0)."""
    merge_factor: float = 1.0
    """A pool change's: true ``split_overhead`` = nominal × this (> 0)."""


@dataclass(frozen=True, slots=True)
class DriftSchedule:
    """A scenario of drift: changes in time order (see the module docstring)."""

    name: str
    """Scenario name (``none``, ``slow-specialist``, ...)."""
    changes: tuple[DriftChange, ...] = ()
    """The changes, sorted by ``at_s`` (stable: file order within one time)."""
    description: str = ""
    """What the scenario models."""

    def check(self, nominal: PoolSpec) -> None:
        """Raise :class:`SpecError` naming the change whose agent or kind ``nominal`` lacks
        (services check this once at start, so a mistyped scenario fails loudly there)."""
        agents = {a.name: a for a in nominal.agents}
        for i, change in enumerate(self.changes):
            where = f"drift {self.name!r}: changes[{i}]"
            if change.agent is None:
                if change.merge_factor != 1.0 and nominal.split_overhead <= 0:
                    raise SpecError(
                        f"{where}.merge_factor: pool {nominal.name!r} plans merges as free "
                        "(split_overhead 0); a factor cannot make them cost",
                        field=f"changes[{i}].merge_factor",
                    )
                continue
            agent = agents.get(change.agent)
            if agent is None:
                raise SpecError(
                    f"{where}.agent: no agent {change.agent!r} in pool {nominal.name!r} "
                    f"(agents: {', '.join(agents)})",
                    field=f"changes[{i}].agent",
                )
            if change.kind is not None and agent.profile(change.kind) is None:
                raise SpecError(
                    f"{where}.kind: agent {change.agent!r} cannot do kind {change.kind!r} "
                    f"(kinds: {', '.join(agent.kinds)})",
                    field=f"changes[{i}].kind",
                )

    def active(self, t_s: float) -> tuple[DriftChange, ...]:
        """The changes that have taken effect at ``t_s`` (``at_s <= t_s``), in order."""
        return self.changes[: self.phase(t_s)]

    def phase(self, t_s: float) -> int:
        """How many changes have taken effect at ``t_s``: :meth:`pool_at` is the same for two
        times of the same phase, so callers may cache the true pool by it."""
        return sum(1 for c in self.changes if c.at_s <= t_s)

    def pool_at(self, nominal: PoolSpec, t_s: float) -> PoolSpec:
        """The true pool at ``t_s`` seconds since the origin: ``nominal`` itself before the
        first change, otherwise a copy with the drifted profiles (same agents, same order,
        same kinds; only speeds, success rates and the merge cost differ)."""
        changes = self.active(t_s)
        if not changes:
            return nominal
        self.check(nominal)
        merge_factor = 1.0
        for change in changes:
            if change.agent is None:
                merge_factor = change.merge_factor
        agents = []
        for agent in nominal.agents:
            kinds = dict(agent.kinds)
            for change in changes:  # later changes override earlier ones (see module doc)
                if change.agent != agent.name:
                    continue
                for kind in (change.kind,) if change.kind is not None else tuple(agent.kinds):
                    nominal_profile = agent.profile(kind)
                    assert nominal_profile is not None  # check() above
                    kinds[kind] = _drifted(nominal_profile, change)
            agents.append(replace(agent, kinds=kinds))
        overhead = nominal.split_overhead * merge_factor
        return replace(nominal, agents=tuple(agents), split_overhead=overhead)


def _drifted(profile: KindProfile, change: DriftChange) -> KindProfile:
    """``profile`` (nominal) under ``change``'s factors."""
    return KindProfile(
        speed=profile.speed * change.speed_factor,
        success=min(1.0, profile.success * change.success_factor),
        noise=profile.noise,
    )


class DriftingPool:
    """The true pool over wall-clock time: the nominal pool under ``schedule``, whose ``at_s``
    count from ``origin`` (unix seconds). One :class:`SubagentPool` per phase of the schedule,
    built when first needed, so an execution costs a comparison, not a pool."""

    def __init__(self, nominal: SubagentPool, schedule: DriftSchedule, origin: float) -> None:
        schedule.check(nominal.spec)
        self.nominal = nominal
        """The pool the planners read (phase 0 of every schedule)."""
        self.schedule = schedule
        """The scenario."""
        self.origin = origin
        """Unix time its ``at_s`` count from."""
        self._pools: dict[int, SubagentPool] = {0: nominal}

    def at(self, now: float) -> SubagentPool:
        """The true pool at unix time ``now``."""
        t_s = now - self.origin
        phase = self.schedule.phase(t_s)
        pool = self._pools.get(phase)
        if pool is None:
            pool = SubagentPool(self.schedule.pool_at(self.nominal.spec, t_s))
            self._pools[phase] = pool
        return pool


NONE = DriftSchedule(name="none")
"""No drift: the true pool is the nominal one at all times."""


def _number(raw: Mapping[str, Any], key: str, where: str, default: float | None) -> float:
    value = raw.get(key, default)
    if value is None:
        raise SpecError(f"{where}.{key}: missing field {key!r}", field=f"{where}.{key}")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(
            f"{where}.{key} must be a finite number, got {value!r}", field=f"{where}.{key}"
        )
    return float(value)


def _name(raw: Mapping[str, Any], key: str, where: str, *, required: bool) -> str | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise SpecError(
            f"{where}.{key} must be a non-empty string, got {value!r}", field=f"{where}.{key}"
        )
    return value


def _unknown(raw: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in set(raw) - allowed)
    if unknown:
        raise SpecError(
            f"{where}.{unknown[0]}: unknown field {unknown[0]!r} "
            f"(allowed: {', '.join(sorted(allowed))})",
            field=f"{where}.{unknown[0]}",
        )


def parse_change(raw: Any, where: str) -> DriftChange:
    """One validated change; :class:`SpecError` naming ``where`` and the field otherwise."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be a mapping, got {raw!r}", field=where)
    at_s = _number(raw, "at_s", where, None)
    if at_s < 0:
        raise SpecError(f"{where}.at_s must be >= 0, got {at_s:g}", field=f"{where}.at_s")
    if "agent" not in raw:
        if "merge_factor" not in raw:
            raise SpecError(
                f"{where}.agent: missing field 'agent' (a change names an agent, or changes the "
                "pool's merges with merge_factor)",
                field=f"{where}.agent",
            )
        _unknown(raw, _POOL_CHANGE_KEYS, where)
        merge = _number(raw, "merge_factor", where, None)
        if merge <= 0:
            raise SpecError(
                f"{where}.merge_factor must be > 0, got {merge:g}", field=f"{where}.merge_factor"
            )
        return DriftChange(at_s, None, merge_factor=merge)
    _unknown(raw, _AGENT_CHANGE_KEYS, where)
    speed = _number(raw, "speed_factor", where, 1.0)
    if speed <= 0:
        raise SpecError(
            f"{where}.speed_factor must be > 0, got {speed:g}", field=f"{where}.speed_factor"
        )
    success = _number(raw, "success_factor", where, 1.0)
    if success < 0:
        raise SpecError(
            f"{where}.success_factor must be >= 0, got {success:g}",
            field=f"{where}.success_factor",
        )
    kind = _name(raw, "kind", where, required=False)
    if kind == WILDCARD_KIND:
        kind = None  # "*" means every kind, as omitting it does
    agent = _name(raw, "agent", where, required=True)
    assert agent is not None
    return DriftChange(at_s, agent, kind, speed, success)


def parse_drift(data: Any, *, source: str = "") -> DriftSchedule:
    """Validate a scenario document into a :class:`DriftSchedule`."""
    prefix = f"{source}: " if source else ""
    if not isinstance(data, Mapping):
        raise SpecError(f"{prefix}a drift scenario must be a mapping, got {type(data).__name__}")
    try:
        _unknown(data, _SCHEDULE_KEYS, "drift")
        name = _name(data, "name", "drift", required=True)
        raw_changes = data.get("changes", [])
        if not isinstance(raw_changes, list):
            raise SpecError(
                f"drift.changes must be a list, got {raw_changes!r}", field="drift.changes"
            )
        changes = [parse_change(c, f"changes[{i}]") for i, c in enumerate(raw_changes)]
    except SpecError as exc:
        raise SpecError(f"{prefix}{exc}", field=exc.field) from None
    assert name is not None
    return DriftSchedule(
        name=name,
        changes=tuple(sorted(changes, key=lambda c: c.at_s)),
        description=str(data.get("description", "")),
    )


def drift_dir() -> Path:
    """Directory of the shipped scenarios (``podium/data/drift``)."""
    return Path(str(resources.files("podium") / "data" / "drift"))


def scenario_names() -> list[str]:
    """Names of the shipped scenarios."""
    return sorted(p.stem for p in drift_dir().iterdir() if p.suffix in SCENARIO_SUFFIXES)


def load_drift(name_or_path: str | Path) -> DriftSchedule:
    """A scenario: a shipped one by name (``slow-specialist``), or a file by path.

    Empty means no drift (:data:`NONE`). An unknown name or an invalid file raises
    :class:`SpecError` naming the file and the field.
    """
    text = str(name_or_path)
    if not text:
        return NONE
    path = Path(text)
    if path.suffix not in SCENARIO_SUFFIXES and "/" not in text:
        shipped = [drift_dir() / f"{text}{suffix}" for suffix in SCENARIO_SUFFIXES]
        found = [p for p in shipped if p.is_file()]
        if not found:
            raise SpecError(
                f"unknown drift scenario {text!r}; shipped: {', '.join(scenario_names())} "
                "(or give a path to a scenario file)",
                field=text,
            )
        path = found[0]
    return parse_drift(read_document(path), source=str(path))


def drift_document(schedule: DriftSchedule) -> dict[str, Any]:
    """``schedule`` as a scenario document (what :func:`parse_drift` reads back to an equal
    schedule): to hand a schedule made in code to ``PODIUM_SUBAGENT_DRIFT`` as a file."""
    changes: list[dict[str, Any]] = []
    for c in schedule.changes:
        if c.agent is None:
            changes.append({"at_s": c.at_s, "merge_factor": c.merge_factor})
            continue
        change: dict[str, Any] = {"at_s": c.at_s, "agent": c.agent}
        if c.kind is not None:
            change["kind"] = c.kind
        change |= {"speed_factor": c.speed_factor, "success_factor": c.success_factor}
        changes.append(change)
    return {"name": schedule.name, "description": schedule.description, "changes": changes}


__all__ = [
    "NONE",
    "DriftChange",
    "DriftSchedule",
    "DriftingPool",
    "drift_dir",
    "drift_document",
    "load_drift",
    "parse_drift",
    "scenario_names",
]
