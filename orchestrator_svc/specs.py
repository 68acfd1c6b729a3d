"""Task specs at the service boundary: protobuf or text in, validated environment spec out.

Every task that enters a session — over gRPC as a ``TaskSpec`` message or as JSON/YAML text,
or on the tasks topic from a training driver — goes through :func:`validate_task`, which
uses the swarm environment's own parser, so a spec the service accepts is exactly a spec the
environment accepts, and every rejection is a :class:`~podium.errors.SpecError` naming the
field.

At the gRPC edge a spec is also held to :class:`TaskLimits` — its size and subtask count are
checked before it is parsed, and a YAML document may not expand (through aliases) beyond the
size limit — and it is parsed by :class:`SpecWorkers`, a small pool of processes, so that the
worst spec the limits admit never blocks the event loop (health checks included).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import yaml

from orchestrator_svc.config import OrchestratorConfig
from podium.config import env_var
from podium.envs.swarm.spec import PoolSpec, TaskSpec, check_task_against_pool, parse_task
from podium.envs.swarm.trajectory import task_from_proto
from podium.errors import AdmissionError, SpecError, WorkerError
from podium.procpool import WorkerPool
from podium.v1 import task_pb2

# libyaml's parser is several times faster than the pure-Python one and caps nesting depth
# (deep nesting is a RecursionError in the pure-Python composer, handled below too).
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

TEXT_FIELD = "task_spec_text"
"""Request field holding a task as JSON/YAML text."""


SUBTASKS_FIELD = "subtasks"
"""Field named when a task has too many subtasks (as the environment's parser names it)."""

_log = logging.getLogger(__name__)

PARSER_PROCESSES = 2
"""Processes parsing specs (about 70 MB each): two keep one slow spec from holding up the
next without taking more than a core or two from the sessions."""


@dataclass(frozen=True)
class TaskLimits:
    """Caps a submitted task is held to before it is parsed; each names its setting."""

    max_bytes: int
    """Largest request (serialised), and largest expanded YAML document (PODIUM_MAX_TASK_BYTES)."""
    max_subtasks: int
    """Most subtasks (PODIUM_MAX_SUBTASKS)."""

    @classmethod
    def of(cls, config: OrchestratorConfig) -> TaskLimits:
        """The limits ``config`` sets."""
        return cls(max_bytes=config.max_task_bytes, max_subtasks=config.max_subtasks)


def _setting(field_name: str) -> str:
    return env_var(OrchestratorConfig, field_name)


def check_request_size(size: int, limits: TaskLimits, *, field: str) -> None:
    """Refuse a request of ``size`` serialised bytes over the task limit, before any parsing."""
    if size > limits.max_bytes:
        raise SpecError(
            f"{field}: the request is {size} bytes, over the limit "
            f"{_setting('max_task_bytes')}={limits.max_bytes}",
            field=field,
        )


def check_subtask_count(count: int, limits: TaskLimits, *, where: str = "") -> None:
    """Refuse a task of ``count`` subtasks over the limit, before it is validated."""
    if count > limits.max_subtasks:
        raise SpecError(
            f"{where + ': ' if where else ''}the task has {count} subtasks, over the limit "
            f"{_setting('max_subtasks')}={limits.max_subtasks}",
            field=SUBTASKS_FIELD,
        )


def expanded_size(doc: Any, budget: int) -> int:
    """Size of a parsed YAML document with every alias expanded (a container or non-string
    scalar counts 1, a string its length), counted only up to ``budget``: above it the
    count stops, so a billion-laughs document costs O(budget), not O(its expansion).

    Iterative rather than recursive: libyaml allows nesting deeper than Python's recursion
    limit. A self-referencing alias is simply counted until the budget runs out.
    """
    size = 0
    stack = [doc]
    while stack and size <= budget:
        node = stack.pop()
        if isinstance(node, str):
            size += max(1, len(node))
        elif isinstance(node, Mapping):
            size += 1
            for key, value in node.items():
                stack.append(key)
                stack.append(value)
        elif isinstance(node, list | tuple | set):
            size += 1
            stack.extend(node)
        else:
            size += 1
    return size


def _load_yaml(text: str) -> Any:
    """The document ``text`` holds, or SpecError naming line and column."""
    try:
        return yaml.load(text, Loader=_LOADER)  # a safe loader (C or Python)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = (
            f"{TEXT_FIELD}:{mark.line + 1}:{mark.column + 1}" if mark is not None else TEXT_FIELD
        )
        raise SpecError(
            f"{where}: invalid JSON/YAML: {getattr(exc, 'problem', exc)}", field=TEXT_FIELD
        ) from exc
    except RecursionError as exc:
        raise SpecError(
            f"{TEXT_FIELD}: invalid JSON/YAML: nested too deeply", field=TEXT_FIELD
        ) from exc


def parse_task_text(text: str, limits: TaskLimits | None = None) -> TaskSpec:
    """Parse a JSON or YAML task spec (YAML is a superset of JSON, so one parser does both).

    With ``limits``, the document may not expand beyond ``limits.max_bytes`` through YAML
    aliases, and its subtask count is checked before the subtasks are validated.
    """
    doc = _load_yaml(text)
    if limits is not None:
        if expanded_size(doc, limits.max_bytes) > limits.max_bytes:
            raise SpecError(
                f"{TEXT_FIELD}: YAML aliases expand the spec beyond the limit "
                f"{_setting('max_task_bytes')}={limits.max_bytes}",
                field=TEXT_FIELD,
            )
        subtasks = doc.get(SUBTASKS_FIELD) if isinstance(doc, Mapping) else None
        if isinstance(subtasks, list):
            check_subtask_count(len(subtasks), limits, where=TEXT_FIELD)
    return parse_task(doc, source=TEXT_FIELD)


def validate_task(
    pool: PoolSpec,
    *,
    message: task_pb2.TaskSpec | None = None,
    text: str = "",
    limits: TaskLimits | None = None,
) -> TaskSpec:
    """The validated task from exactly one of ``message`` or ``text``; checked against ``pool``
    (and against ``limits``, when given, before the spec is parsed).

    Raises :class:`SpecError` whose ``field`` names the offending field or subtask id.
    """
    has_message = message is not None and (bool(message.name) or len(message.subtasks) > 0)
    if has_message and text:
        raise SpecError("give either task or task_spec_text, not both", field="task")
    if not has_message and not text:
        raise SpecError("no task: set task or task_spec_text", field="task")
    if text:
        task = parse_task_text(text, limits)
    else:
        assert message is not None
        if limits is not None:
            check_subtask_count(len(message.subtasks), limits, where="task")
        task = task_from_proto(message)
    check_task_against_pool(task, pool)
    return task


@dataclass(frozen=True)
class _Rejected:
    """A SpecError as it crosses the process boundary (pickling an exception drops ``field``)."""

    message: str
    field: str


def parser_state(pool: PoolSpec, limits: TaskLimits) -> tuple[PoolSpec, TaskLimits]:
    """A parser process's state (its ``setup``): what every spec is checked against."""
    return pool, limits


def parse_in_worker(
    state: tuple[PoolSpec, TaskLimits], request: tuple[task_pb2.TaskSpec | None, str]
) -> TaskSpec | _Rejected:
    """:func:`validate_task` in a parser process (its ``handle``); a rejection is returned,
    not raised."""
    pool, limits = state
    message, text = request
    try:
        return validate_task(pool, message=message, text=text, limits=limits)
    except SpecError as exc:
        return _Rejected(str(exc), exc.field)


class SpecWorkers:
    """Validates task specs in :data:`PARSER_PROCESSES` worker processes, off the event loop
    (a :class:`~podium.procpool.WorkerPool`).

    Processes, not threads: libyaml and the garbage collector hold the GIL for tens of ms at a
    time, so a parser *thread* still stalled the loop by 0.2-0.5 s under a few maximal specs
    (measured); a process has its own GIL and stalls it by under 0.05 s. One starts as the
    server starts (:meth:`warm`), the rest on demand; they live as long as the server (exiting
    with it, kill -9 included) and one that dies is replaced. A spec whose parser died on it
    is tried once more on a new one; a second death is blamed on the spec. At most
    ``max_pending`` specs wait or run at once; beyond that :meth:`validate` raises
    :class:`AdmissionError` at once instead of queueing without bound (each waiting spec holds
    up to the request size limit).
    """

    def __init__(self, pool: PoolSpec, limits: TaskLimits, *, max_pending: int) -> None:
        self.pool = pool
        self.limits = limits
        self.max_pending = max_pending
        self.pending = 0
        self._closed = False
        self._parsers = WorkerPool(
            "spec parser", PARSER_PROCESSES, partial(parser_state, pool, limits), parse_in_worker
        )

    def warm(self) -> None:
        """Start one parser now, in the background, so the first spec after a start does not
        wait for a process to start and import (about a second)."""
        self._parsers.warm()

    def pids(self) -> list[int]:
        """Process ids of the parser processes running now."""
        return list(self._parsers.pids())

    async def validate(
        self, *, message: task_pb2.TaskSpec | None = None, text: str = ""
    ) -> TaskSpec:
        """:func:`validate_task` with this worker's pool and limits, in a parser process.

        A caller that gives up (deadline, cancel) stops waiting at once; the process finishes
        that one spec, which the limits keep short.
        """
        if self.pending >= self.max_pending:
            setting = _setting("max_pending_specs")
            raise AdmissionError(
                f"{self.pending} task specs are already being parsed, the limit "
                f"{setting}={self.max_pending}; retry later",
                limit=setting,
            )
        self.pending += 1
        try:
            outcome = await self._parse(message, text)
        finally:
            self.pending -= 1
        if isinstance(outcome, _Rejected):
            raise SpecError(outcome.message, field=outcome.field)
        return outcome

    async def _parse(self, message: task_pb2.TaskSpec | None, text: str) -> TaskSpec | _Rejected:
        """One spec, tried once more if its parser died on it (killed, out of memory)."""
        for attempt in range(2):
            try:
                outcome: TaskSpec | _Rejected = await self._parsers.call((message, text))
                return outcome
            except WorkerError as exc:
                if self._closed:
                    raise AdmissionError(
                        "the server is stopping: its spec parsers are shut down"
                    ) from exc
                if not exc.retriable:
                    raise
                _log.warning("spec parser died on a spec (try %d of 2): %s", attempt + 1, exc)
        field = TEXT_FIELD if text else "task"
        raise SpecError(f"{field}: the spec parser died on this spec", field=field)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Refuse specs not started yet; the processes exit after the spec in hand (those still
        running after ``timeout_s`` are killed)."""
        self._closed = True
        await self._parsers.close(timeout_s)
