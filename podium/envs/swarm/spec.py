"""Task specs and pool specs: the public input formats of the swarm environment.

A *task spec* is a DAG of typed subtasks; a *pool spec* describes the frozen sub-agent kinds
that can run them. Both are plain JSON or YAML so users can bring their own (see
``docs/specs.md``). Everything here is parsing and validation: every problem raises
:class:`~podium.errors.SpecError` with a message naming the file, the subtask and the field,
because a spec author must be able to fix their file from the message alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from podium.errors import ConfigError, SpecError

if TYPE_CHECKING:
    from podium.envs.swarm.drift import DriftSchedule

WILDCARD_KIND = "*"
"""Kind name an agent uses to declare it can do every kind (the generalist)."""

SPLIT_FACTORS: tuple[int, ...] = (1, 2, 4)
"""Split factors the orchestrator may choose; 1 means "run whole"."""

_TASK_KEYS = frozenset({"name", "max_parallel", "subtasks", "description"})
_SUBTASK_KEYS = frozenset({"id", "kind", "work", "deps", "splittable", "sensitive", "description"})
_POOL_KEYS = frozenset(
    {"name", "max_parallel", "main_step_cost", "split_overhead", "agents", "drift", "true"}
)
_POOL_TRUE_KEYS = frozenset({"split_overhead"})
_AGENT_KEYS = frozenset({"name", "kinds", "true", "runner", "plugin", "options"})
_PROFILE_KEYS = frozenset({"speed", "success", "noise"})


@dataclass(frozen=True, slots=True)
class Subtask:
    """One typed unit of work inside a task."""

    id: str
    """Unique id inside the task; dependencies refer to it."""
    kind: str
    """Kind of work (e.g. ``"ui"``); the pool says which agents can do it."""
    work: float
    """Effort (> 0): an agent of speed s takes work / s on average."""
    deps: tuple[str, ...] = ()
    """Ids of subtasks that must succeed before this one may start."""
    splittable: bool = False
    """Whether it may be split into k ∈ {2, 4} parallel chunks plus a merge."""
    sensitive: bool = False
    """Whether running it will need human approval (carried, not enforced, here)."""
    description: str = ""
    """Free-form text handed to the sub-agent."""


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A composite task: subtasks in a dependency DAG (validated acyclic on parse)."""

    name: str
    """Human-readable name; also the key of the task in benchmark reports."""
    subtasks: tuple[Subtask, ...]
    """Subtasks in file order (which is the order rule engines break ties in)."""
    max_parallel: int | None = None
    """Concurrency cap overriding the pool's, or None for the pool's."""
    description: str = ""
    """Free-form description of the whole task."""

    def index(self) -> dict[str, int]:
        """Map subtask id -> position in :attr:`subtasks`."""
        return {s.id: i for i, s in enumerate(self.subtasks)}


@dataclass(frozen=True, slots=True)
class KindProfile:
    """How one agent performs on one kind of work."""

    speed: float
    """Work units per unit of simulated time (> 0)."""
    success: float
    """Probability an execution succeeds, in [0, 1]."""
    noise: float
    """σ of the mean-one lognormal factor on the duration (0 = deterministic)."""


RUNNER_SIMULATED = "simulated"
"""Runner of an agent simulated from its profile (subagent_svc samples the outcome)."""
RUNNER_PLUGIN = "plugin"
"""Runner of an agent that is a Python plug-in (:mod:`podium.subagents`) run by subagent_svc."""
RUNNER_EXTERNAL = "external"
"""Runner of an agent executed by a process outside Podium (docs/subagent-contract.md):
subagent_svc leaves its assignments alone."""
RUNNERS: tuple[str, ...] = (RUNNER_SIMULATED, RUNNER_PLUGIN, RUNNER_EXTERNAL)
"""Every runner a pool spec may name."""


@dataclass(frozen=True, slots=True)
class AgentRunner:
    """Who executes an agent's assignments (the pool spec's ``runner:``, ``plugin:`` and
    ``options:``). Planners never read it: they plan on the advertised profiles whatever runs
    the work, and learn the truth from what is observed."""

    kind: str = RUNNER_SIMULATED
    """One of :data:`RUNNERS`."""
    plugin: str = ""
    """The plug-in's entry-point name (``runner: plugin`` only)."""
    options: Mapping[str, str] = field(default_factory=dict)
    """Options handed to the plug-in's factory (``runner: plugin`` only)."""


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One kind of frozen sub-agent; unlimited instances, bounded only by max_parallel."""

    name: str
    """Unique agent name (e.g. ``"ui-specialist"``)."""
    kinds: Mapping[str, KindProfile]
    """Profile per kind it can do; ``"*"`` covers every kind not listed explicitly."""
    runner: AgentRunner = AgentRunner()
    """Who executes its assignments (default: simulated from its profile)."""

    def profile(self, kind: str) -> KindProfile | None:
        """The profile this agent uses for ``kind``, or None if it cannot do it."""
        found = self.kinds.get(kind)
        return found if found is not None else self.kinds.get(WILDCARD_KIND)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """The pool of frozen sub-agents and the cost model of the orchestrator."""

    agents: tuple[AgentSpec, ...]
    """Agent kinds in file order (their order is the agent axis of the action space)."""
    max_parallel: int = 3
    """Most executions running at once, unless a task overrides it."""
    main_step_cost: float = 0.05
    """Simulated time one orchestrator decision costs."""
    split_overhead: float = 0.15
    """Merge work as a fraction of the split subtask's work."""
    name: str = "pool"
    """Human-readable name."""
    kinds: tuple[str, ...] = field(default=())
    """Explicit kinds named by any agent (sorted; excludes ``"*"``). Filled by the parser."""
    truth: tuple[AgentSpec, ...] | None = None
    """The agents as they really behave (same names, order and kinds as :attr:`agents`; each
    profile the advertised one overridden by the agent's ``true:`` fields), or None when the
    pool behaves as advertised. Only the simulator may read it (:meth:`true_spec`): planners
    read :attr:`agents`, the advertisement, as a real deployment can."""
    drift: DriftSchedule | None = None
    """How the true behaviour changes over time (``drift:`` in the file, a
    :mod:`podium.envs.swarm.drift` scenario applied over :meth:`true_spec`), or None."""
    true_split_overhead: float | None = None
    """What a merge really costs, as a fraction of the split subtask's work (the pool's own
    ``true: {split_overhead: ...}``), or None when :attr:`split_overhead` is the truth.
    Only the simulator reads it (:meth:`true_spec`); planners plan merges at
    :attr:`split_overhead`."""

    def advertised(self) -> PoolSpec:
        """The pool as its agents advertise themselves: the spec every planner (rule engines,
        observation, lower bound) is given. The truth and the drift are stripped, so nothing
        holding it can read them."""
        if not self.has_truth and self.drift is None:
            return self
        return replace(self, truth=None, drift=None, true_split_overhead=None)

    def true_spec(self) -> PoolSpec:
        """The pool the simulator draws outcomes from: the true profiles (at time 0 of the
        drift, if any), or the pool itself when it carries no truth. Same agents, same order,
        same kinds, so it is a valid ``SwarmEnv(..., true_pool=)``."""
        if not self.has_truth:
            return self.advertised()
        overhead = self.split_overhead
        if self.true_split_overhead is not None:
            overhead = self.true_split_overhead
        agents = self.agents if self.truth is None else self.truth
        return replace(self.advertised(), agents=agents, split_overhead=overhead)

    @property
    def has_truth(self) -> bool:
        """Whether the pool behaves otherwise than advertised (an agent's ``true:``, or the
        pool's own for its merges)."""
        return self.truth is not None or self.true_split_overhead is not None

    def can_do(self, kind: str) -> bool:
        """Whether some agent can do ``kind`` with a non-zero success probability."""
        return any((p := a.profile(kind)) is not None and p.success > 0 for a in self.agents)

    def agent_names(self) -> tuple[str, ...]:
        """Agent names in action-space order."""
        return tuple(a.name for a in self.agents)


# ----------------------------------------------------------------------------- loading


def read_document(path: str | Path) -> Any:
    """Parse a JSON or YAML file (chosen by suffix; YAML is a superset so it is the fallback)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise SpecError(f"{p}: no such file", field=str(p)) from exc
    except OSError as exc:
        raise SpecError(f"{p}: cannot read: {exc.strerror}", field=str(p)) from exc
    try:
        if p.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{p}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        raise SpecError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc


def _prefix(source: str) -> str:
    return f"{source}: " if source else ""


def _check_keys(obj: Mapping[str, Any], allowed: frozenset[str], where: str, source: str) -> None:
    unknown = sorted(str(k) for k in set(obj) - allowed)
    if unknown:
        raise SpecError(
            f"{_prefix(source)}{where}: unknown field {unknown[0]!r} "
            f"(allowed: {', '.join(sorted(allowed))})",
            field=f"{where}.{unknown[0]}",
        )


def _number(value: Any, where: str, source: str) -> float:
    # bool is an int subclass; "work: true" is a typo, not the number 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{_prefix(source)}{where} must be a number, got {value!r}", field=where)
    out = float(value)
    if not math.isfinite(out):
        raise SpecError(f"{_prefix(source)}{where} must be finite, got {value!r}", field=where)
    return out


def _bool(value: Any, where: str, source: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(
            f"{_prefix(source)}{where} must be true or false, got {value!r}", field=where
        )
    return value


def _str(value: Any, where: str, source: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(
            f"{_prefix(source)}{where} must be a non-empty string, got {value!r}", field=where
        )
    return value


def _max_parallel(value: Any, where: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(
            f"{_prefix(source)}{where} must be an integer >= 1, got {value!r}", field=where
        )
    return value


def find_cycle(deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A dependency cycle as ``[a, b, ..., a]`` (each depends on the next), or None.

    Iterative DFS with colours, so a 10,000-deep chain cannot overflow the stack.
    """
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(deps, white)
    for root in deps:
        if colour[root] != white:
            continue
        path: list[str] = [root]
        iters = [iter(deps[root])]
        colour[root] = grey
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                colour[path.pop()] = black
                iters.pop()
                continue
            if nxt not in colour:
                continue  # unknown ids are reported separately
            if colour[nxt] == grey:
                return [*path[path.index(nxt) :], nxt]
            if colour[nxt] == white:
                colour[nxt] = grey
                path.append(nxt)
                iters.append(iter(deps[nxt]))
    return None


def parse_task(data: Any, *, source: str = "") -> TaskSpec:
    """Validate a task document (already parsed from JSON/YAML) into a :class:`TaskSpec`.

    Checks structure, types, unknown fields, duplicate ids, non-positive work, unknown
    dependencies and cycles. Kinds are checked against a pool by :func:`check_task_against_pool`.
    """
    if not isinstance(data, Mapping):
        raise SpecError(
            f"{_prefix(source)}a task spec must be a mapping, got {type(data).__name__}"
        )
    _check_keys(data, _TASK_KEYS, "task", source)
    name = _str(data.get("name"), "task.name", source)
    raw_subtasks = data.get("subtasks")
    if not isinstance(raw_subtasks, list) or not raw_subtasks:
        raise SpecError(
            f"{_prefix(source)}task {name!r}: 'subtasks' must be a non-empty list", field="subtasks"
        )
    max_parallel = (
        None
        if data.get("max_parallel") is None
        else _max_parallel(data["max_parallel"], "task.max_parallel", source)
    )
    subtasks: list[Subtask] = []
    seen: set[str] = set()
    for pos, raw in enumerate(raw_subtasks):
        where = f"subtasks[{pos}]"
        if not isinstance(raw, Mapping):
            raise SpecError(f"{_prefix(source)}{where} must be a mapping, got {raw!r}", field=where)
        sid = _str(raw.get("id"), f"{where}.id", source)
        where = f"subtask {sid!r}"
        _check_keys(raw, _SUBTASK_KEYS, where, source)
        if sid in seen:
            raise SpecError(f"{_prefix(source)}duplicate subtask id {sid!r}", field=sid)
        seen.add(sid)
        kind = _str(raw.get("kind"), f"{where}.kind", source)
        if kind == WILDCARD_KIND:
            raise SpecError(f"{_prefix(source)}{where}: kind '*' is reserved for pools", field=sid)
        if "work" not in raw:
            raise SpecError(f"{_prefix(source)}{where}: missing field 'work'", field=sid)
        work = _number(raw["work"], f"{where}.work", source)
        if work <= 0:
            raise SpecError(f"{_prefix(source)}{where}: work must be > 0, got {work:g}", field=sid)
        deps_raw = raw.get("deps", [])
        if not isinstance(deps_raw, list) or not all(isinstance(d, str) for d in deps_raw):
            raise SpecError(f"{_prefix(source)}{where}: deps must be a list of ids", field=sid)
        if len(set(deps_raw)) != len(deps_raw):
            raise SpecError(f"{_prefix(source)}{where}: deps lists an id twice", field=sid)
        subtasks.append(
            Subtask(
                id=sid,
                kind=kind,
                work=work,
                deps=tuple(deps_raw),
                splittable=_bool(raw.get("splittable", False), f"{where}.splittable", source),
                sensitive=_bool(raw.get("sensitive", False), f"{where}.sensitive", source),
                description=str(raw.get("description", "")),
            )
        )
    for s in subtasks:
        for d in s.deps:
            if d not in seen:
                raise SpecError(
                    f"{_prefix(source)}subtask {s.id!r} depends on unknown subtask {d!r}",
                    field=s.id,
                )
            if d == s.id:
                raise SpecError(f"{_prefix(source)}subtask {s.id!r} depends on itself", field=s.id)
    cycle = find_cycle({s.id: s.deps for s in subtasks})
    if cycle is not None:
        raise SpecError(
            f"{_prefix(source)}dependency cycle: {' -> '.join(cycle)}", field=",".join(cycle[:-1])
        )
    return TaskSpec(
        name=name,
        subtasks=tuple(subtasks),
        max_parallel=max_parallel,
        description=str(data.get("description", "")),
    )


def _profile(
    prof: Any, where: str, source: str, advertised: KindProfile | None = None
) -> KindProfile:
    """One validated profile; with ``advertised`` (a ``true:`` entry) every field is optional
    and a missing one keeps the advertised value."""
    if not isinstance(prof, Mapping):
        raise SpecError(f"{_prefix(source)}{where} must be a mapping", field=where)
    _check_keys(prof, _PROFILE_KEYS, where, source)
    if advertised is None and "speed" not in prof:
        raise SpecError(f"{_prefix(source)}{where}: missing field 'speed'", field=where)
    base = advertised or KindProfile(speed=1.0, success=1.0, noise=0.0)
    speed = _number(prof.get("speed", base.speed), f"{where}.speed", source)
    success = _number(prof.get("success", base.success), f"{where}.success", source)
    noise = _number(prof.get("noise", base.noise), f"{where}.noise", source)
    if speed <= 0:
        raise SpecError(f"{_prefix(source)}{where}.speed must be > 0, got {speed:g}", field=where)
    if not 0.0 <= success <= 1.0:
        raise SpecError(
            f"{_prefix(source)}{where}.success must be in [0, 1], got {success:g}", field=where
        )
    if noise < 0:
        raise SpecError(f"{_prefix(source)}{where}.noise must be >= 0, got {noise:g}", field=where)
    return KindProfile(speed=speed, success=success, noise=noise)


def _true_agent(raw_true: Any, agent: AgentSpec, where: str, source: str) -> AgentSpec:
    """The agent as it really behaves: its ``true:`` mapping (kind -> partial profile) over
    its advertised profiles. A kind it does not advertise is an error: the truth changes how
    an agent behaves, never what it may be given."""
    if not isinstance(raw_true, Mapping) or not raw_true:
        raise SpecError(
            f"{_prefix(source)}{where}.true must be a non-empty mapping of kind -> profile",
            field=f"{agent.name}.true",
        )
    kinds = dict(agent.kinds)
    for kind, prof in raw_true.items():
        kw = f"{where}.true.{kind}"
        advertised = agent.kinds.get(kind) if isinstance(kind, str) else None
        if advertised is None:
            raise SpecError(
                f"{_prefix(source)}{kw}: agent {agent.name!r} does not advertise kind {kind!r} "
                f"in its kinds: ({', '.join(agent.kinds)}); true: may only correct them",
                field=kw,
            )
        kinds[kind] = _profile(prof, kw, source, advertised)
    return replace(agent, kinds=kinds)


def _options(value: Any, where: str, source: str) -> dict[str, str]:
    """A plug-in's ``options:``: a mapping of names to scalars, each kept as text (numbers
    written unquoted in YAML are accepted and stringified; lists, mappings, booleans and nulls
    are refused, since a factory receives strings only)."""
    if not isinstance(value, Mapping):
        raise SpecError(
            f"{_prefix(source)}{where}.options must be a mapping of name -> value", field=where
        )
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise SpecError(
                f"{_prefix(source)}{where}.options: names must be strings, got {key!r}",
                field=f"{where}.options",
            )
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise SpecError(
                f"{_prefix(source)}{where}.options.{key} must be a string or a number, "
                f"got {item!r}",
                field=f"{where}.options.{key}",
            )
        out[key] = str(item)
    return out


def _runner(raw: Mapping[str, Any], where: str, source: str) -> AgentRunner:
    """The agent's ``runner:`` (default simulated), with ``plugin:`` and ``options:`` allowed
    and ``plugin:`` required exactly when it is ``plugin``; ``true:`` only for a simulated
    agent (a real agent's behaviour is measured, not declared)."""
    kind = raw.get("runner", RUNNER_SIMULATED)
    if kind not in RUNNERS:
        raise SpecError(
            f"{_prefix(source)}{where}.runner must be one of {', '.join(RUNNERS)}, got {kind!r}",
            field=f"{where}.runner",
        )
    if kind != RUNNER_SIMULATED and "true" in raw:
        raise SpecError(
            f"{_prefix(source)}{where}.true is only for simulated agents: the behaviour of a "
            f"{kind!r} agent is measured, not declared",
            field=f"{where}.true",
        )
    if kind != RUNNER_PLUGIN:
        for key in ("plugin", "options"):
            if key in raw:
                raise SpecError(
                    f"{_prefix(source)}{where}.{key} is only for runner: plugin "
                    f"(runner is {kind!r})",
                    field=f"{where}.{key}",
                )
        return AgentRunner(kind=kind)
    plugin = _str(raw.get("plugin"), f"{where}.plugin", source)
    options = _options(raw.get("options", {}), where, source)
    return AgentRunner(kind=kind, plugin=plugin, options=options)


def _agent(raw: Any, pos: int, source: str) -> tuple[AgentSpec, AgentSpec | None]:
    """One agent as advertised, and as it truly behaves when it carries ``true:``."""
    where = f"agents[{pos}]"
    if not isinstance(raw, Mapping):
        raise SpecError(f"{_prefix(source)}{where} must be a mapping", field=where)
    # YAML 1.1 reads an unquoted ``true:`` key as the boolean True; it means the field.
    raw = {("true" if k is True else k): v for k, v in raw.items()}
    name = _str(raw.get("name"), f"{where}.name", source)
    where = f"agent {name!r}"
    _check_keys(raw, _AGENT_KEYS, where, source)
    raw_kinds = raw.get("kinds")
    if not isinstance(raw_kinds, Mapping) or not raw_kinds:
        raise SpecError(f"{_prefix(source)}{where}: kinds must be a non-empty mapping", field=name)
    profiles: dict[str, KindProfile] = {}
    for kind, prof in raw_kinds.items():
        if not isinstance(kind, str) or not kind:
            raise SpecError(f"{_prefix(source)}{where}: kind names must be strings", field=name)
        profiles[kind] = _profile(prof, f"{where}.kinds.{kind}", source)
    agent = AgentSpec(name=name, kinds=profiles, runner=_runner(raw, where, source))
    if "true" not in raw:
        return agent, None
    return agent, _true_agent(raw["true"], agent, where, source)


def _true_pool_fields(raw: Any, source: str) -> float | None:
    """The pool's own ``true:`` (what its merges really cost), or None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw:
        raise SpecError(
            f"{_prefix(source)}pool.true must be a non-empty mapping "
            f"({', '.join(sorted(_POOL_TRUE_KEYS))})",
            field="pool.true",
        )
    _check_keys(raw, _POOL_TRUE_KEYS, "pool.true", source)
    overhead = _number(raw["split_overhead"], "pool.true.split_overhead", source)
    if overhead < 0:
        raise SpecError(
            f"{_prefix(source)}pool.true.split_overhead must be >= 0, got {overhead:g}",
            field="pool.true.split_overhead",
        )
    return overhead


def _drift(value: Any, source: str) -> DriftSchedule:
    """The pool's ``drift:`` scenario: a shipped name, or a file (relative paths are read
    from the pool file's directory when there is one)."""
    from podium.envs.swarm.drift import load_drift  # drift.py imports this module

    text = _str(value, "pool.drift", source)
    if source and ("/" in text or Path(text).suffix):
        beside = Path(source).parent / text
        if not Path(text).is_absolute() and beside.exists():
            text = str(beside)
    try:
        return load_drift(text)
    except SpecError as exc:
        raise SpecError(f"{_prefix(source)}pool.drift: {exc}", field="pool.drift") from None


def parse_pool(data: Any, *, source: str = "") -> PoolSpec:
    """Validate a pool document into a :class:`PoolSpec` (with its ``true:`` profiles and
    ``drift:`` scenario, when given; see docs/specs.md)."""
    if not isinstance(data, Mapping):
        raise SpecError(
            f"{_prefix(source)}a pool spec must be a mapping, got {type(data).__name__}"
        )
    # YAML 1.1 reads an unquoted ``true:`` key as the boolean True; it means the field.
    data = {("true" if k is True else k): v for k, v in data.items()}
    _check_keys(data, _POOL_KEYS, "pool", source)
    max_parallel = _max_parallel(data.get("max_parallel", 3), "pool.max_parallel", source)
    step = _number(data.get("main_step_cost", 0.05), "pool.main_step_cost", source)
    if step < 0:
        raise SpecError(f"{_prefix(source)}pool.main_step_cost must be >= 0, got {step:g}")
    overhead = _number(data.get("split_overhead", 0.15), "pool.split_overhead", source)
    if overhead < 0:
        raise SpecError(f"{_prefix(source)}pool.split_overhead must be >= 0, got {overhead:g}")
    raw_agents = data.get("agents")
    if not isinstance(raw_agents, list) or not raw_agents:
        raise SpecError(f"{_prefix(source)}pool.agents must be a non-empty list", field="agents")
    agents: list[AgentSpec] = []
    truth: list[AgentSpec] = []
    corrected = False
    for pos, raw in enumerate(raw_agents):
        agent, true_agent = _agent(raw, pos, source)
        if any(a.name == agent.name for a in agents):
            raise SpecError(
                f"{_prefix(source)}duplicate agent name {agent.name!r}", field=agent.name
            )
        agents.append(agent)
        truth.append(true_agent or agent)
        corrected = corrected or true_agent is not None
    pool = PoolSpec(
        agents=tuple(agents),
        max_parallel=max_parallel,
        main_step_cost=step,
        split_overhead=overhead,
        name=str(data.get("name", "pool")),
        kinds=tuple(sorted({k for a in agents for k in a.kinds if k != WILDCARD_KIND})),
        truth=tuple(truth) if corrected else None,
        true_split_overhead=_true_pool_fields(data.get("true"), source),
    )
    if data.get("drift") is None:
        return pool
    drift = _drift(data["drift"], source)
    try:
        drift.check(pool)
    except SpecError as exc:
        raise SpecError(f"{_prefix(source)}pool.drift: {exc}", field="pool.drift") from None
    return replace(pool, drift=drift)


def check_true_pool(advertised: PoolSpec, true: PoolSpec, *, source: str = "") -> None:
    """Raise :class:`SpecError` unless ``true`` can stand for how ``advertised``'s agents
    really behave: the same agent names in the same order, each able to do every kind it
    advertises. The message names the missing, extra or reordered agents, or the kind."""
    have, want = true.agent_names(), advertised.agent_names()
    if have != want:
        missing = [a for a in want if a not in have]
        extra = [a for a in have if a not in want]
        parts = [f"missing agents {missing}"] if missing else []
        parts += [f"extra agents {extra}"] if extra else []
        problem = "; ".join(parts) or (
            f"the agents are in another order ({list(have)}, advertised {list(want)})"
        )
        raise SpecError(
            f"{_prefix(source)}true pool {true.name!r} must have the agents of pool "
            f"{advertised.name!r}: {problem}",
            field="agents",
        )
    for a, t in zip(advertised.agents, true.agents, strict=True):
        for kind in a.kinds:
            if t.profile(kind) is None:
                raise SpecError(
                    f"{_prefix(source)}true pool {true.name!r}: agent {a.name!r} cannot do kind "
                    f"{kind!r}, which pool {advertised.name!r} advertises for it",
                    field=f"{a.name}.{kind}",
                )


def split_truth(pool: PoolSpec, true_pool: PoolSpec | None) -> tuple[PoolSpec, PoolSpec | None]:
    """The advertised pool the planners read, and the true pool the simulator draws from
    (None: the advertisement is the truth). The truth is ``true_pool`` (its own ``true:``
    profiles if it has some) or ``pool``'s ``true:`` profiles; both at once is ambiguous, and
    a true pool with other agents than ``pool`` is refused, the agents named."""
    if true_pool is None:
        return pool.advertised(), pool.true_spec() if pool.has_truth else None
    if pool.has_truth:
        raise ConfigError(
            f"pool {pool.name!r} carries true: profiles and a true pool {true_pool.name!r} "
            "was given too; give the truth one way"
        )
    truth = true_pool.true_spec()
    check_true_pool(pool, truth)
    return pool.advertised(), truth


def check_task_against_pool(task: TaskSpec, pool: PoolSpec, *, source: str = "") -> None:
    """Raise :class:`SpecError` naming the first subtask whose kind no agent can do."""
    for s in task.subtasks:
        if not pool.can_do(s.kind):
            raise SpecError(
                f"{_prefix(source)}subtask {s.id!r}: no agent in pool {pool.name!r} can do "
                f"kind {s.kind!r} (agents: {', '.join(pool.agent_names())})",
                field=s.id,
            )


def load_task(path: str | Path, pool: PoolSpec | None = None) -> TaskSpec:
    """Read and validate one task file; with ``pool``, also check every kind is covered."""
    task = parse_task(read_document(path), source=str(path))
    if pool is not None:
        check_task_against_pool(task, pool, source=str(path))
    return task


def load_pool(path: str | Path) -> PoolSpec:
    """Read and validate one pool file."""
    return parse_pool(read_document(path), source=str(path))


TASK_SUFFIXES = (".json", ".yaml", ".yml")
"""File suffixes read as task specs when a directory is given."""


def task_files(dir_or_file: str | Path) -> list[Path]:
    """Task files under a directory (sorted, non-recursive) or the single file given."""
    p = Path(dir_or_file)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in TASK_SUFFIXES)
        if not files:
            raise SpecError(f"{p}: no task files (*.json, *.yaml, *.yml) in directory")
        return files
    if not p.exists():
        raise SpecError(f"{p}: no such file or directory", field=str(p))
    return [p]


def load_tasks(dir_or_file: str | Path, pool: PoolSpec | None = None) -> list[TaskSpec]:
    """Every task under a directory, or the one file given; names must be unique."""
    tasks = [load_task(f, pool) for f in task_files(dir_or_file)]
    names: set[str] = set()
    for t in tasks:
        if t.name in names:
            raise SpecError(f"{dir_or_file}: two task files use the name {t.name!r}", field=t.name)
        names.add(t.name)
    return tasks


def default_pool_path() -> Path:
    """Path of the shipped default pool (``podium/data/pools/default.yaml``)."""
    return Path(str(resources.files("podium") / "data" / "pools" / "default.yaml"))


def default_tasks_dir() -> Path:
    """Directory of the shipped task library (``podium/data/tasks``)."""
    return Path(str(resources.files("podium") / "data" / "tasks"))


def default_pool() -> PoolSpec:
    """The shipped default pool."""
    return load_pool(default_pool_path())


def default_tasks(pool: PoolSpec | None = None) -> list[TaskSpec]:
    """The shipped task library, checked against ``pool`` (default: the default pool)."""
    return load_tasks(default_tasks_dir(), pool if pool is not None else default_pool())


def pool_to_dict(pool: PoolSpec) -> dict[str, Any]:
    """The public (JSON/YAML) form of a pool: its advertisement, each simulated agent's
    ``true:`` profiles where they differ from it, the pool's own ``true: {split_overhead}``
    when set; ``parse_pool(pool_to_dict(p)) == p`` for a pool without ``drift:`` (a scenario
    is written by name or file, not here). A true profile of a kind the agent does not
    advertise (a store's estimate of a generalist's kind) cannot be written and is left out:
    the truth may only correct advertised kinds."""
    truths = pool.truth if pool.truth is not None else (None,) * len(pool.agents)
    agents: list[dict[str, Any]] = []
    for agent, true in zip(pool.agents, truths, strict=True):
        out: dict[str, Any] = {
            "name": agent.name,
            "kinds": {k: _profile_to_dict(p) for k, p in agent.kinds.items()},
        }
        runner = agent.runner
        if runner.kind != RUNNER_SIMULATED:
            out["runner"] = runner.kind
            if runner.plugin:
                out["plugin"] = runner.plugin
            if runner.options:
                out["options"] = dict(runner.options)
        if true is not None:
            wrong = {
                k: _profile_to_dict(p)
                for k, p in true.kinds.items()
                if k in agent.kinds and agent.kinds[k] != p
            }
            if wrong:
                out["true"] = wrong
        agents.append(out)
    doc: dict[str, Any] = {
        "name": pool.name,
        "max_parallel": pool.max_parallel,
        "main_step_cost": pool.main_step_cost,
        "split_overhead": pool.split_overhead,
    }
    if pool.true_split_overhead is not None:
        doc["true"] = {"split_overhead": pool.true_split_overhead}
    doc["agents"] = agents
    return doc


def _profile_to_dict(p: KindProfile) -> dict[str, float]:
    return {"speed": p.speed, "success": p.success, "noise": p.noise}


def task_to_dict(task: TaskSpec) -> dict[str, Any]:
    """The public (JSON/YAML) form of a task; ``parse_task(task_to_dict(t)) == t``."""
    out: dict[str, Any] = {"name": task.name}
    if task.description:
        out["description"] = task.description
    if task.max_parallel is not None:
        out["max_parallel"] = task.max_parallel
    subs: list[dict[str, Any]] = []
    for s in task.subtasks:
        d: dict[str, Any] = {"id": s.id, "kind": s.kind, "work": s.work, "deps": list(s.deps)}
        if s.splittable:
            d["splittable"] = True
        if s.sensitive:
            d["sensitive"] = True
        if s.description:
            d["description"] = s.description
        subs.append(d)
    out["subtasks"] = subs
    return out


def tasks_by_name(tasks: Iterable[TaskSpec]) -> dict[str, TaskSpec]:
    """Index tasks by name."""
    return {t.name: t for t in tasks}
