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

import asyncio
import collections
import contextlib
import logging
import os
import pickle
import signal
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from orchestrator_svc.config import OrchestratorConfig
from podium.config import env_var
from podium.envs.swarm.spec import PoolSpec, TaskSpec, check_task_against_pool, parse_task
from podium.envs.swarm.trajectory import task_from_proto
from podium.errors import AdmissionError, SpecError
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


def _validate_job(
    pool: PoolSpec, message: task_pb2.TaskSpec | None, text: str, limits: TaskLimits
) -> TaskSpec | _Rejected:
    """:func:`validate_task` in a parser process; a rejection is returned, not raised."""
    try:
        return validate_task(pool, message=message, text=text, limits=limits)
    except SpecError as exc:
        return _Rejected(str(exc), exc.field)


def serve_parser() -> None:
    """A parser process's loop: a pickled job per frame on stdin, its pickled
    :func:`_validate_job` outcome per frame on stdout, until stdin ends.

    stdin ends when :meth:`SpecWorkers.close` closes it or when the service process is gone
    (kill -9 included: the kernel closes its end of the pipe), so a parser never outlives the
    service. Started by :data:`PARSER_COMMAND`; runs nothing of the service's main module.
    """
    # SIGINT reaches the whole process group (Ctrl-C): the service decides when parsers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the replies
    jobs = sys.stdin.buffer
    while (header := jobs.read(_FRAME.size)) and len(header) == _FRAME.size:
        (size,) = _FRAME.unpack(header)
        pool, message, text, limits = pickle.loads(jobs.read(size))
        reply = pickle.dumps(_validate_job(pool, message, text, limits))
        try:
            replies.write(_FRAME.pack(len(reply)) + reply)
            replies.flush()
        except BrokenPipeError:
            return  # the service is gone


_FRAME = struct.Struct(">I")
"""A frame's header: the pickle's length."""

PARSER_COMMAND = "from orchestrator_svc.specs import serve_parser; serve_parser()"
"""What a parser process runs (``python -c``): an explicit entry point, so a parser needs
nothing of the service's main module. multiprocessing's spawn re-imports ``__main__`` in
every child, which fails for a service embedded in a ``python -`` stdin script (there is no
file to import) and re-runs a script that lacks a ``__main__`` guard."""


class _ParserDied(Exception):
    """A parser process ended before answering; ``sent``: after its job reached it (so it
    may have died of the job), not before (it was gone already)."""

    def __init__(self, *, sent: bool) -> None:
        super().__init__("the spec parser died")
        self.sent = sent


@dataclass(eq=False)
class _Parser:
    """One parser process and its pipes."""

    process: asyncio.subprocess.Process

    @classmethod
    async def start(cls) -> _Parser:
        """A new parser process, on the service's own interpreter and import path."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PARSER_COMMAND,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        return cls(process)

    async def run(self, job: bytes) -> bytes:
        """Send one job, return its reply; :class:`_ParserDied` if the process ended first."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(_FRAME.pack(len(job)) + job)
            await stdin.drain()
        except OSError as exc:  # a broken pipe: nobody reads it any more
            raise _ParserDied(sent=False) from exc
        try:
            (size,) = _FRAME.unpack(await stdout.readexactly(_FRAME.size))
            return await stdout.readexactly(size)
        except (OSError, asyncio.IncompleteReadError) as exc:  # it ended while on the job
            raise _ParserDied(sent=True) from exc

    def finish(self) -> None:
        """No more jobs: the process exits after the one in hand."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()


class SpecWorkers:
    """Validates task specs in :data:`PARSER_PROCESSES` worker processes, off the event loop.

    Processes, not threads: libyaml and the garbage collector hold the GIL for tens of ms at a
    time, so a parser *thread* still stalled the loop by 0.2-0.5 s under a few maximal specs
    (measured); a process has its own GIL and stalls it by under 0.05 s. They are started
    (never forked: forking a process that runs gRPC is unsafe) as ``python -c``
    :data:`PARSER_COMMAND`, one as the server starts (:meth:`warm`) and the rest on demand,
    live as long as the server (exiting with it, kill -9 included: their stdin ends), and one
    that dies is replaced. At most ``max_pending`` specs
    wait or run at once; beyond that :meth:`validate` raises :class:`AdmissionError` at once
    instead of queueing without bound (each waiting spec holds up to the request size limit).
    """

    def __init__(self, pool: PoolSpec, limits: TaskLimits, *, max_pending: int) -> None:
        self.pool = pool
        self.limits = limits
        self.max_pending = max_pending
        self.pending = 0
        self._parsers: set[_Parser] = set()
        self._idle: list[_Parser] = []
        self._waiters: collections.deque[asyncio.Future[_Parser | None]] = collections.deque()
        self._exchanges: set[asyncio.Task[bytes]] = set()
        self._starting = 0
        self._closed = False
        self._warming: asyncio.Task[None] | None = None

    def warm(self) -> None:
        """Start one parser now, in the background, so the first spec after a start does not
        wait for a process to spawn and import (about a second). A failed start is logged;
        the first :meth:`validate` then starts one as usual."""
        if self._warming is None and not self._closed:
            self._warming = asyncio.get_running_loop().create_task(self._warm())

    async def _warm(self) -> None:
        if self._parsers or self._starting:
            return  # a spec arrived first and started its own
        try:
            parser = await self._start()
        except OSError as exc:
            _log.warning("could not start a spec parser ahead of the first spec: %s", exc)
            return
        self._release(parser)

    def pids(self) -> list[int]:
        """Process ids of the parser processes running now."""
        return [p.process.pid for p in self._parsers if p.process.returncode is None]

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
            outcome = await self._run(message, text)
        finally:
            self.pending -= 1
        if isinstance(outcome, _Rejected):
            raise SpecError(outcome.message, field=outcome.field)
        return outcome

    async def _run(self, message: task_pb2.TaskSpec | None, text: str) -> TaskSpec | _Rejected:
        """One job; if its parser died (killed, out of memory) it is replaced and the job
        tried once more, and a second death on the job is blamed on the spec (a parser found
        dead before the job reached it is not counted, but tried at most
        :data:`PARSER_PROCESSES` times)."""
        job = pickle.dumps((self.pool, message, text, self.limits))
        deaths = 0
        for _attempt in range(2 + PARSER_PROCESSES):
            parser = await self._acquire()
            exchange = asyncio.ensure_future(self._exchange(parser, job))
            self._exchanges.add(exchange)
            exchange.add_done_callback(self._exchanges.discard)
            try:
                # Shielded: a caller that gives up leaves the exchange to finish, so the
                # parser's reply is read and the parser reused, never left half-way.
                reply = await asyncio.shield(exchange)
            except _ParserDied as died:
                deaths += died.sent
                if deaths < 2:
                    continue
                break
            outcome: TaskSpec | _Rejected = pickle.loads(reply)
            return outcome
        field = TEXT_FIELD if text else "task"
        raise SpecError(f"{field}: the spec parser died on this spec", field=field)

    async def _exchange(self, parser: _Parser, job: bytes) -> bytes:
        """``job`` on ``parser``, which then serves the next caller (or is dropped, dead)."""
        try:
            reply = await parser.run(job)
        except BaseException:
            self._drop(parser)
            raise
        self._release(parser)
        return reply

    async def _acquire(self) -> _Parser:
        """An idle parser, a new one while there are fewer than :data:`PARSER_PROCESSES`, or
        the next one freed."""
        while True:
            if self._closed:
                raise AdmissionError("the server is stopping: its spec parsers are shut down")
            while self._idle:
                idle = self._idle.pop()
                if idle.process.returncode is None:
                    return idle
                self._parsers.discard(idle)  # died while idle (killed, out of memory)
            if len(self._parsers) + self._starting < PARSER_PROCESSES:
                return await self._start()
            waiter: asyncio.Future[_Parser | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                parser = await waiter
            except asyncio.CancelledError:
                # Handed a parser just as the caller gave up: pass it on.
                handed = None if waiter.cancelled() or not waiter.done() else waiter.result()
                if handed is not None:
                    self._release(handed)
                raise
            if parser is not None:
                return parser
            # None: a parser died, there is room to start another.

    async def _start(self) -> _Parser:
        """A new parser, counted from before it runs (so callers arriving meanwhile do not
        start more than :data:`PARSER_PROCESSES`)."""
        self._starting += 1
        try:
            parser = await _Parser.start()
        finally:
            self._starting -= 1
        self._parsers.add(parser)
        return parser

    def _release(self, parser: _Parser) -> None:
        """``parser`` is free: to the first caller still waiting, else idle."""
        if self._closed:
            parser.finish()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(parser)
                return
        self._idle.append(parser)

    def _drop(self, parser: _Parser) -> None:
        """``parser`` died (or its exchange broke): forget it, make room for a new one."""
        self._parsers.discard(parser)
        with contextlib.suppress(ProcessLookupError):
            parser.process.kill()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self, timeout_s: float = 5.0) -> None:
        """Drop specs not started yet; the processes exit after the spec in hand (those still
        running after ``timeout_s`` are killed)."""
        self._closed = True
        if self._warming is not None:
            await asyncio.wait([self._warming])  # its parser is then counted below
        while self._waiters:
            self._waiters.popleft().cancel()
        self._idle.clear()
        parsers = list(self._parsers)
        for parser in parsers:
            parser.finish()
        if not parsers:
            return
        waits = [asyncio.ensure_future(p.process.wait()) for p in parsers]
        _done, late = await asyncio.wait(waits, timeout=timeout_s)
        for parser in parsers:
            if parser.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    parser.process.kill()
        if late:
            await asyncio.wait(late, timeout=1.0)
