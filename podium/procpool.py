"""A small pool of worker processes for CPU-bound work that the GIL would serialise.

Two parts of Podium need one: the orchestrator parses submitted task specs off its event loop
(libyaml and the garbage collector hold the GIL for tens of milliseconds at a time, so a parser
*thread* still stalled the loop by 0.2-0.5 s under a few maximal specs), and the Context-1
search agents run their searches (milliseconds of Python each, which threads of one process
would take in turns) on as many cores as there are workers. The event loop that waits for a
worker only watches a pipe.

**How a worker starts.** As ``python -c`` :data:`WORKER_COMMAND` on the caller's interpreter
and import path, never forked (forking a process that runs gRPC or holds database handles is
unsafe) and never through multiprocessing's *spawn*, which imports the program's main module
again in every child: that fails for a service embedded in a ``python -`` stdin script (there
is no file to import) and re-runs a script that lacks an ``if __name__ == "__main__":`` guard.
The first frame on its stdin is ``(setup, handle, expected)``; it builds its state once with
``setup()`` and then answers one request at a time with ``handle(state, request)``, a pickle
per frame each way. It exits when its stdin ends: when the pool closes it, or when the
caller's process is gone (``kill -9`` included: the kernel closes the pipe), so no worker
outlives its pool. ``setup`` and ``handle`` must therefore be importable: module-level
functions (or ``functools.partial`` of them) of a module other than ``__main__``.

:meth:`WorkerPool.call` takes an idle worker (starting one while there are fewer than
``processes``, so the first calls pay the start, an idle pool costs nothing and calls one
after another keep one worker), sends the request and awaits the reply. :meth:`WorkerPool.warm`
starts one worker ahead of the first call.

Errors, so nothing is silently lost:

* an exception of one of the ``expected`` types raised by ``handle`` is raised again in the
  caller, same type, same message (the worker stays);
* any other exception raised by ``handle`` is a :class:`WorkerError`, not retriable, naming its
  type and message (the worker stays);
* a worker found dead before a request reached it (killed while idle) is replaced and the
  request goes to the new one: the caller never sees it;
* a worker that dies (killed, out of memory, crashed) while it holds a request is a retriable
  :class:`WorkerError` for that call, naming its pid and exit status (the request may be sent
  again; twice in a row usually means the request kills it); a new worker serves the next call;
* a worker that cannot start (``setup`` raised, or it exited) is a :class:`WorkerError`, not
  retriable, with the reason; the next call tries again.

A caller that gives up (a deadline, a cancelled session) stops waiting at once; its worker
finishes the request in hand, its reply is read and dropped, and the worker serves the next
call: a worker's state may cost seconds to build (an embedding model), and its requests are
short. :meth:`WorkerPool.close` closes every worker's stdin (each exits after the request in
hand; one still running after the timeout is killed) and reaps it. A pool binds to the event
loop of its first use: use it from one loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import pickle
import signal
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from podium.errors import WorkerError

START_TIMEOUT_S = 600.0
"""Longest a worker may take to start (import, build its state, warm up) on a busy machine."""
_STOP_GRACE_S = 5.0
"""How long a dropped worker may take to exit by itself before it is killed."""

WORKER_COMMAND = "from podium.procpool import serve; serve()"
"""What a worker process runs (``python -c``): an explicit entry point, so a worker needs
nothing of the program's main module (see the module docstring)."""

_FRAME = struct.Struct(">I")
"""A frame's header: the pickle's length."""

_log = logging.getLogger(__name__)


# -- the worker's side --------------------------------------------------------------------------


def serve() -> None:
    """A worker's life (in the child): read ``(setup, handle, expected)``, build the state,
    then answer each request frame until stdin ends.

    Replies are ``("ready", pid)`` or ``("broken", why)`` once, then per request
    ``("ok", reply)``, ``("fail", (i, message))`` for ``expected[i]``, or ``("error", what)``.
    """
    # Ctrl-C reaches the whole process group: the pool decides when its workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the replies
    requests = sys.stdin.buffer
    first = _read_frame(requests)
    if first is None:
        return
    try:
        setup, handle, expected = pickle.loads(first)
        state = setup()
    except Exception as exc:  # any failure to start is reported, never a silent exit
        _write_frame(replies, ("broken", f"{type(exc).__name__}: {exc}"))
        return
    if not _write_frame(replies, ("ready", os.getpid())):
        return
    while (frame := _read_frame(requests)) is not None:
        if not _write_frame(replies, _answer(state, handle, frame, expected)):
            return  # the pool is gone


def _answer(
    state: Any,
    handle: Callable[[Any, Any], Any],
    frame: bytes,
    expected: tuple[type[BaseException], ...],
) -> tuple[str, Any]:
    """One request's reply message (see :func:`serve`)."""
    try:
        return ("ok", handle(state, pickle.loads(frame)))
    except Exception as exc:  # reported to the caller, typed when it expects the type
        for i, kind in enumerate(expected):
            if isinstance(exc, kind):
                return ("fail", (i, str(exc)))
        return ("error", f"{type(exc).__name__}: {exc}")


def _read_frame(stream: IO[bytes]) -> bytes | None:
    """The next frame's pickle, or None at the end of the stream."""
    header = stream.read(_FRAME.size)
    if len(header) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack(header)
    body = stream.read(size)
    return body if len(body) == size else None


def _write_frame(stream: IO[bytes], message: tuple[str, Any]) -> bool:
    """Send ``message``; False when the reader has gone."""
    try:
        data = pickle.dumps(message)
    except Exception as exc:  # an unpicklable reply is the handler's error, not a dead worker
        data = pickle.dumps(("error", f"the reply cannot be pickled: {type(exc).__name__}: {exc}"))
    try:
        stream.write(_FRAME.pack(len(data)) + data)
        stream.flush()
    except (BrokenPipeError, ValueError):
        return False
    return True


# -- the pool's side ----------------------------------------------------------------------------


def resolve_processes(raw: str, cap: int = 8) -> int:
    """Worker processes for a ``processes`` option: a non-negative integer (0: none, work
    in-process), or ``auto``: the CPUs this process may run on, at most ``cap``. Anything else
    raises ``ValueError`` saying what is accepted."""
    text = raw.strip().lower()
    if text == "auto":
        return max(1, min(len(os.sched_getaffinity(0)), cap))
    if not text.isdigit():
        raise ValueError(f"must be a non-negative integer or 'auto', got {raw!r}")
    return int(text)


def exit_status(returncode: int | None) -> str:
    """How a finished process ended, in words (``exit code 3``, ``killed by SIGKILL``)."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class _Died(Exception):
    """A worker ended before answering; ``sent``: after its request reached it (so it may have
    died of the request), not before (it was gone already)."""

    def __init__(self, *, sent: bool) -> None:
        super().__init__("the worker process died")
        self.sent = sent


@dataclass(eq=False)
class _Worker:
    """One worker process and its pipes."""

    process: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        return self.process.pid

    async def ask(self, frame: bytes) -> tuple[str, Any]:
        """Send one frame, return the reply message; :class:`_Died` if the process ended first."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        if stdin.is_closing():  # finished by a closing pool
            raise _Died(sent=False)
        try:
            stdin.write(_FRAME.pack(len(frame)) + frame)
            # A write into a pipe whose reader has ended fails at once, and the transport
            # closes then (its error reaches drain() only later, if at all): the request
            # never reached the process.
            if stdin.is_closing():
                raise _Died(sent=False)
            await stdin.drain()
        except (OSError, RuntimeError) as exc:  # a broken pipe: nobody reads it any more
            raise _Died(sent=False) from exc
        try:
            (size,) = _FRAME.unpack(await stdout.readexactly(_FRAME.size))
            status, payload = pickle.loads(await stdout.readexactly(size))
        except (OSError, asyncio.IncompleteReadError) as exc:  # it ended while on the request
            raise _Died(sent=True) from exc
        return str(status), payload

    async def ended(self) -> str:
        """How the process ended, once it has (waited for briefly: its pipe is closed)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), 5.0)
        return exit_status(self.process.returncode)

    def finish(self) -> None:
        """No more requests: the process exits after the one in hand."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    async def end(self, grace_s: float) -> None:
        """Wait ``grace_s`` for the process to exit, then kill it, and reap it."""
        try:
            await asyncio.wait_for(asyncio.shield(self.process.wait()), grace_s)
        except TimeoutError:
            self.kill()
            await self.process.wait()


def _check_importable(name: str, role: str, fn: Callable[..., Any]) -> None:
    """Refuse a ``setup`` or ``handle`` a worker could not import, naming the fix."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    if getattr(target, "__module__", None) == "__main__":
        raise ValueError(
            f"{name}: {role} {getattr(target, '__qualname__', target)!r} is defined in __main__, "
            "which a worker process does not import; move it to a module"
        )


class WorkerPool:
    """Up to ``processes`` worker processes, each built by ``setup()`` and answering
    ``handle(state, request)``; :meth:`call` sends one request to an idle worker."""

    def __init__(
        self,
        name: str,
        processes: int,
        setup: Callable[[], Any],
        handle: Callable[[Any, Any], Any],
        expected: Sequence[type[BaseException]] = (),
    ) -> None:
        """``name`` prefixes every error; ``setup`` and ``handle`` must be importable
        functions (or ``functools.partial`` of them, with picklable arguments) and the
        ``expected`` exception types constructible from one message."""
        if processes < 1:
            raise ValueError(f"{name}: a worker pool needs at least 1 process, got {processes}")
        _check_importable(name, "setup", setup)
        _check_importable(name, "handle", handle)
        self._name = name
        self._processes = processes
        self._expected = tuple(expected)
        self._program = pickle.dumps((setup, handle, self._expected))
        self._workers: set[_Worker] = set()
        self._idle: list[_Worker] = []
        self._waiters: collections.deque[asyncio.Future[_Worker | None]] = collections.deque()
        self._starting = 0
        self._starts: set[asyncio.Future[_Worker]] = set()
        self._exchanges: set[asyncio.Future[tuple[str, Any]]] = set()
        self._endings: set[asyncio.Future[None]] = set()
        self._closed = False

    @property
    def processes(self) -> int:
        """The most workers that run at once."""
        return self._processes

    def pids(self) -> tuple[int, ...]:
        """Process ids of the workers running now (started on demand: none before a call)."""
        return tuple(sorted(w.pid for w in self._workers if w.process.returncode is None))

    def warm(self) -> None:
        """Start one worker now, in the background, so the first call does not wait for a
        process to start and build its state. A failed start is logged; the first call then
        starts one as usual. Needs a running event loop."""
        if self._closed or self._workers or self._starting:
            return
        self._begin_start().add_done_callback(self._warmed)

    def _warmed(self, warming: asyncio.Future[_Worker]) -> None:
        if warming.cancelled():
            return
        if (exc := warming.exception()) is not None:
            _log.warning(
                "%s: could not start a worker ahead of the first call: %s", self._name, exc
            )
            return
        self._release(warming.result())

    async def call(self, request: Any) -> Any:
        """``handle(state, request)`` in an idle worker (waiting for one when all are busy);
        its return value, or its error as the module docstring says."""
        frame = pickle.dumps(request)
        # A worker found dead before the request reached it does not count; at most every
        # slot's worker can be found so.
        for _attempt in range(self._processes + 1):
            worker = await self._acquire()
            exchange = asyncio.ensure_future(self._exchange(worker, frame))
            self._exchanges.add(exchange)
            exchange.add_done_callback(self._exchanges.discard)
            try:
                # Shielded: a caller that gives up leaves the exchange to finish, so the reply
                # is read and the worker reused, never left half-way with a late reply.
                status, payload = await asyncio.shield(exchange)
            except _Died as died:
                if not died.sent and not self._closed:
                    continue
                raise await self._death_error(worker) from died
            return self._reply(worker, status, payload)
        raise WorkerError(
            f"{self._name}: {self._processes + 1} workers in a row were dead before a request "
            "reached them",
            retriable=True,
        )

    async def close(self, timeout_s: float = 5.0) -> None:
        """Refuse new calls; every worker exits after the request in hand (those still
        running after ``timeout_s`` are killed) and is reaped. Calls in flight get their
        replies when their workers answer in time."""
        self._closed = True
        while self._waiters:
            self._waiters.popleft().cancel()
        self._idle.clear()
        if self._starts:  # a worker being started is counted below once it exists
            await asyncio.wait(list(self._starts), timeout=timeout_s)
        workers = list(self._workers)
        for worker in workers:
            worker.finish()
        if workers:
            await asyncio.wait([asyncio.ensure_future(w.end(timeout_s)) for w in workers])
        self._workers.difference_update(workers)
        if self._endings:  # workers dropped before: each is reaped or killed within its grace
            await asyncio.wait(list(self._endings))

    # -- internals ------------------------------------------------------------------------

    async def _exchange(self, worker: _Worker, frame: bytes) -> tuple[str, Any]:
        """``frame`` on ``worker``, which then serves the next caller (or is dropped, dead)."""
        try:
            reply = await worker.ask(frame)
        except BaseException:
            self._drop(worker)
            raise
        self._release(worker)
        return reply

    async def _death_error(self, worker: _Worker) -> WorkerError:
        if self._closed:
            return WorkerError(f"{self._name}: the worker pool closed mid-call", retriable=False)
        return WorkerError(
            f"{self._name}: worker process {worker.pid} died before answering "
            f"({await worker.ended()}); a new worker serves the next call",
            retriable=True,
        )

    def _reply(self, worker: _Worker, status: str, payload: Any) -> Any:
        """The caller's value for a reply message, or the error it stands for."""
        if status == "ok":
            return payload
        if status == "fail":
            index, message = payload
            raise self._expected[int(index)](str(message))
        raise WorkerError(
            f"{self._name}: worker process {worker.pid} raised {payload}", retriable=False
        )

    def _refuse_closed(self) -> None:
        if self._closed:
            raise WorkerError(f"{self._name}: the worker pool is closed", retriable=False)

    async def _acquire(self) -> _Worker:
        """An idle worker, a new one while there are fewer than ``processes``, or the next
        one freed."""
        while True:
            self._refuse_closed()
            while self._idle:
                idle = self._idle.pop()  # last in, first out: the worker that just answered
                if idle.process.returncode is None:
                    return idle
                self._workers.discard(idle)  # died while idle (killed, out of memory)
            if len(self._workers) + self._starting < self._processes:
                return await self._start()
            waiter: asyncio.Future[_Worker | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                worker = await waiter
            except asyncio.CancelledError:
                # Handed a worker just as the caller gave up: pass it on.
                handed = None if waiter.cancelled() or not waiter.done() else waiter.result()
                if handed is not None:
                    self._release(handed)
                task = asyncio.current_task()
                if waiter.cancelled() and task is not None and not task.cancelling():
                    self._refuse_closed()  # close() cancelled the wait, not the caller
                raise
            if worker is not None:
                return worker
            # None: a worker died, there is room to start another.

    def _begin_start(self) -> asyncio.Future[_Worker]:
        """Start a worker, counted from now (so callers arriving meanwhile do not start more
        than ``processes``)."""
        self._starting += 1
        starting = asyncio.ensure_future(self._spawn())
        self._starts.add(starting)
        starting.add_done_callback(self._started)
        return starting

    async def _start(self) -> _Worker:
        """A new worker, ready. Shielded: a caller cancelled meanwhile leaves the start to
        finish, and the worker then serves the next call."""
        starting = self._begin_start()
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(self._adopt)
            raise

    def _started(self, starting: asyncio.Future[_Worker]) -> None:
        self._starting -= 1
        self._starts.discard(starting)

    def _adopt(self, starting: asyncio.Future[_Worker]) -> None:
        """The worker whose caller gave up while it started: free for the next call."""
        if not starting.cancelled() and starting.exception() is None:
            self._release(starting.result())

    async def _spawn(self) -> _Worker:
        """Start a worker process and wait until its ``setup`` is done."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", WORKER_COMMAND),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        worker = _Worker(process)
        self._workers.add(worker)  # from now on close() ends it, whatever happens here
        try:
            status, payload = await asyncio.wait_for(worker.ask(self._program), START_TIMEOUT_S)
        except TimeoutError:
            worker.kill()  # alive: stuck in its setup
            self._drop(worker)
            raise WorkerError(
                f"{self._name}: worker process {worker.pid} did not start within "
                f"{START_TIMEOUT_S:.0f} s",
                retriable=False,
            ) from None
        except _Died as died:
            self._drop(worker)
            raise WorkerError(
                f"{self._name}: worker process {worker.pid} exited while starting "
                f"({await worker.ended()}); its error is on this process's stderr",
                retriable=False,
            ) from died
        except BaseException:
            self._drop(worker)
            raise
        if status != "ready":
            self._drop(worker)
            raise WorkerError(
                f"{self._name}: worker process {worker.pid} failed to start: {payload}",
                retriable=False,
            )
        return worker

    def _release(self, worker: _Worker) -> None:
        """``worker`` is free: to the first caller still waiting, else idle."""
        if self._closed:
            worker.finish()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return
        self._idle.append(worker)

    def _drop(self, worker: _Worker) -> None:
        """``worker`` died (or its exchange broke): forget it, end it if it still runs, make
        room for a new one."""
        self._workers.discard(worker)
        worker.finish()
        if worker.process.returncode is None:
            # Not killed at once: a process that is dead but not yet reaped would be reaped by
            # the kill (Popen.send_signal polls first), and its exit status lost to the
            # child watcher. One that still runs after its stdin closed is killed after a grace.
            ending = asyncio.ensure_future(worker.end(_STOP_GRACE_S))
            self._endings.add(ending)
            ending.add_done_callback(self._endings.discard)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class Batcher:
    """Calls to a :class:`WorkerPool` whose ``handle`` takes a list of requests and answers
    a list of replies, in order: calls that arrive while every worker is busy wait together
    and go to the next free worker as one request.

    Why: some work is much cheaper per item in a batch (embedding four queries at once costs
    about half as much CPU a query as one at a time), and on a busy pool the calls waiting
    anyway can share a batch for free. An idle pool sends a lone call at once, alone. Each
    free worker takes its share of what waits (``ceil(waiting / processes)``, at most
    ``most``), so the waiting calls spread over all workers rather than queue behind one.
    A failed batch (a dead worker, an error of ``handle``) fails every call in it with that
    error; a call cancelled while it waits is dropped from its batch's replies."""

    def __init__(self, pool: WorkerPool, most: int = 8) -> None:
        if most < 1:
            raise ValueError(f"a batch holds at least 1 call, got {most}")
        self._pool = pool
        self._most = most
        self._waiting: list[tuple[Any, asyncio.Future[Any]]] = []
        self._senders = 0
        """Senders running; counted down by the sender itself as it ends, so a call arriving
        just after one ended (its task not yet reaped) starts another."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.largest = 0
        """The most calls sent in one batch so far."""

    async def call(self, request: Any) -> Any:
        """The reply to ``request``, answered alone or in a batch with other waiting calls."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if self._senders < self._pool.processes:
            self._senders += 1
            sender = asyncio.create_task(self._send())
            self._tasks.add(sender)  # a reference, so the task is not collected mid-send
            sender.add_done_callback(self._tasks.discard)
        return await future

    async def _send(self) -> None:
        """Send what waits, a share at a time, until nothing does (one per busy worker)."""
        try:
            await self._send_waiting()
        finally:
            self._senders -= 1

    async def _send_waiting(self) -> None:
        while self._waiting:
            share = min(self._most, -(-len(self._waiting) // self._pool.processes))
            batch, self._waiting = self._waiting[:share], self._waiting[share:]
            self.largest = max(self.largest, len(batch))
            try:
                replies = await self._pool.call([request for request, _ in batch])
            except BaseException as exc:
                cancelled = isinstance(exc, asyncio.CancelledError)
                for _, future in batch:
                    if not future.done():
                        future.cancel() if cancelled else future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, future), reply in zip(batch, replies, strict=True):
                if not future.done():
                    future.set_result(reply)
