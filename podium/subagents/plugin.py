"""The sub-agent plug-in interface: one small async contract every real sub-agent implements.

A sub-agent is given exactly one assignment's context (an :class:`ExecutionRequest`: the
subtask and its dependencies' outputs, nothing more) and hands back an
:class:`ExecutionReport` (success, a short task-relevant output, the tool calls it made with
their real wall-clock times). subagent_svc runs it for every agent whose pool-spec entry says
``runner: plugin`` (``podium.envs.swarm.spec.AgentRunner``) and turns the report into a
``SubtaskResult``.

Plug-ins are found by name through the Python entry-point group :data:`ENTRY_POINT_GROUP`
(``[project.entry-points."podium.subagents"]`` in a distribution's ``pyproject.toml``), so a
third party ships one as an ordinary package. Podium's own plug-ins are declared in the same
table of Podium's ``pyproject.toml``; when Podium itself runs from its source tree (not
installed: ``scripts/venv.sh`` puts the tree on the path, so no ``podium`` distribution
metadata exists) that one table is read from the tree's ``pyproject.toml`` instead, so the
declaration is written once and holds both ways (see :func:`registered`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Protocol, runtime_checkable

from podium.errors import PluginError
from podium.v1 import subtask_pb2

ENTRY_POINT_GROUP = "podium.subagents"
"""The entry-point group sub-agent plug-ins register under (name → factory)."""

_DISTRIBUTION = "podium"
"""Podium's own distribution name (``[project] name``): installed, its metadata lists its
plug-ins; absent, they are read from the source tree."""


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call a sub-agent made, as it happened."""

    name: str
    """Tool name (e.g. ``"bm25.search"``)."""
    arguments_json: str
    """Its arguments as JSON text."""
    ok: bool
    """Whether the call succeeded."""
    result_digest: str
    """Short digest of the result (for redundancy detection: same digest, same result)."""
    started_at: float
    """Wall-clock start, Unix epoch seconds."""
    ended_at: float
    """Wall-clock end, Unix epoch seconds (>= ``started_at``)."""


@dataclass(frozen=True)
class ExecutionRequest:
    """One execution's input: the assignment, and nothing else reaches the sub-agent."""

    session_id: str
    """Session the work belongs to."""
    execution_id: str
    """Unique id of this execution (one attempt of one chunk); stable on redelivery."""
    subtask_id: str
    """Subtask id (``<id>#<i>`` for chunks, ``<id>#merge`` for merges)."""
    kind: str
    """Kind of work."""
    agent: str
    """The agent (pool-spec name) the orchestrator chose."""
    attempt: int
    """Attempt number, from 1."""
    description: str
    """The subtask's ``description`` (``SubtaskSpec.description``): for search agents the
    query, for read-chunk the chunk id."""
    dependency_outputs: Mapping[str, str]
    """Each dependency's task-relevant output, by dependency subtask id."""
    context: subtask_pb2.ExecutionContext
    """The exact context the assignment carried (recorded verbatim in the result)."""


@dataclass(frozen=True)
class ExecutionReport:
    """What a sub-agent hands back for one execution."""

    success: bool
    """Whether it produced a usable result."""
    output: str
    """Task-relevant output handed to dependents (on failure: may be empty)."""
    tool_calls: tuple[ToolCallRecord, ...] = ()
    """Tool calls made, in order."""
    error: str = ""
    """Why it failed, when it did."""


@runtime_checkable
class SubAgent(Protocol):
    """A sub-agent: executes assignments, one call per execution, possibly concurrently."""

    async def execute(self, request: ExecutionRequest) -> ExecutionReport:
        """Run one execution. A failure of the work is a report with ``success=False``; an
        exception means the sub-agent itself broke (subagent_svc reports it as MALFORMED)."""
        ...

    async def close(self) -> None:
        """Release what the sub-agent holds (indexes, clients); called once, at shutdown."""
        ...


SubAgentFactory = Callable[[Mapping[str, str]], SubAgent]
"""What an entry point names: called with the agent's ``options:`` mapping from the pool spec
and returning a ready sub-agent (a bad option raises :class:`podium.errors.PluginError` or
:class:`podium.errors.ConfigError` naming it)."""


def _installed() -> list[EntryPoint]:
    """Entry points of the group from every installed distribution."""
    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))


def _source_tree() -> list[EntryPoint]:
    """Podium's own table read from its source tree's ``pyproject.toml``, when Podium is not
    installed (an installed Podium's entry points are already among :func:`_installed`)."""
    try:
        metadata.distribution(_DISTRIBUTION)
        return []
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not pyproject.is_file():
        return []
    return entry_points_of(pyproject)


def entry_points_of(pyproject: Path) -> list[EntryPoint]:
    """The :data:`ENTRY_POINT_GROUP` table of a ``pyproject.toml`` as entry points (none when
    the file has no such table); a malformed file or table is a :class:`PluginError` naming
    the file."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PluginError(f"{pyproject}: cannot read the plug-in table: {exc}") from exc
    table = data.get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in table.items()
    ):
        raise PluginError(
            f'{pyproject}: [project.entry-points."{ENTRY_POINT_GROUP}"] must map names to '
            '"module:attribute" strings'
        )
    return [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in table.items()]


def _by_name() -> dict[str, list[EntryPoint]]:
    """Every registered entry point by name; distinct targets under one name are kept apart
    so :func:`load_subagent` can refuse the ambiguity instead of picking one silently."""
    found: dict[str, list[EntryPoint]] = {}
    for ep in [*_source_tree(), *_installed()]:
        same = found.setdefault(ep.name, [])
        if all(other.value != ep.value for other in same):
            same.append(ep)
    return found


def registered() -> dict[str, str]:
    """Every registered plug-in: name → ``module:attribute`` (installed entry points, plus
    Podium's own table when Podium runs from its source tree; an ambiguous name lists its
    targets joined by ``" | "``)."""
    return {name: " | ".join(ep.value for ep in eps) for name, eps in sorted(_by_name().items())}


def _entry_point(plugin: str) -> EntryPoint:
    """The one entry point named ``plugin``, or a :class:`PluginError` saying why not."""
    found = _by_name()
    eps = found.get(plugin, [])
    if not eps:
        names = ", ".join(sorted(found)) or "none"
        raise PluginError(
            f"unknown sub-agent plug-in {plugin!r} (entry-point group {ENTRY_POINT_GROUP!r}; "
            f"registered: {names})",
            plugin=plugin,
        )
    if len(eps) > 1:
        targets = ", ".join(ep.value for ep in eps)
        raise PluginError(
            f"sub-agent plug-in {plugin!r} is registered more than once, to different targets "
            f"({targets}): uninstall one",
            plugin=plugin,
        )
    return eps[0]


def load_subagent(plugin: str, options: Mapping[str, str]) -> SubAgent:
    """The sub-agent plug-in ``plugin`` built with ``options``.

    Raises :class:`podium.errors.PluginError` naming the plug-in: an unknown name (the message
    lists the registered names), an entry point that does not import, a factory that fails or
    returns something that is not a :class:`SubAgent`.
    """
    ep = _entry_point(plugin)
    try:
        factory = ep.load()
    except Exception as exc:  # any import failure of third-party code: name the plug-in
        raise PluginError(
            f"sub-agent plug-in {plugin!r} ({ep.value}) does not load: {exc}", plugin=plugin
        ) from exc
    if not callable(factory):
        raise PluginError(
            f"sub-agent plug-in {plugin!r} ({ep.value}) is not callable", plugin=plugin
        )
    try:
        agent = factory(dict(options))
    except PluginError:
        raise  # the plug-in's own refusal already names it and the option
    except Exception as exc:  # a factory refusing its options: keep its message, name the plug-in
        raise PluginError(
            f"sub-agent plug-in {plugin!r} refused its options {sorted(options)}: {exc}",
            plugin=plugin,
        ) from exc
    if not isinstance(agent, SubAgent):
        raise PluginError(
            f"sub-agent plug-in {plugin!r} ({ep.value}) returned a {type(agent).__name__}, "
            "not a sub-agent (async execute(request) and close())",
            plugin=plugin,
        )
    return agent
