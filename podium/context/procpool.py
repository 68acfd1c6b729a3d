"""A small pool of worker processes for CPU-bound plug-in work that the GIL would serialise.

Why: a search costs milliseconds of CPU, mostly Python under the GIL (bm25s' tokenizer and
scoring, the embedding model's per-op dispatch), so searches run in threads of one process
take turns however many group members subagent_svc runs. In worker processes they run on as
many cores as there are workers, and the event loop that waits for them only watches a pipe.

Each worker is a *spawned* process (nothing inherited: no locks, threads or open database
handles of the parent) that builds its state once with ``setup()`` and then answers requests
one at a time with ``handle(state, request)`` over a pipe. The pool has ``processes`` slots;
:meth:`WorkerPool.call` takes an idle worker (starting one in an empty slot, so the first
calls pay the start, an idle pool costs nothing and a pool used one call at a time runs one
worker), sends the request and awaits the reply without blocking the event loop or holding a
thread.

Errors, so nothing is silently lost:

* an exception of one of the ``expected`` types raised by ``handle`` is raised again in the
  caller, same type, same message (the worker stays);
* any other exception raised by ``handle`` is a :class:`WorkerError`, not retriable, naming its
  type and message (the worker stays);
* a worker that dies (killed, out of memory, crashed) before answering a call is a retriable
  :class:`WorkerError` for that call naming its pid and exit status (the request may be sent
  again); its slot is emptied, so the next call starts a replacement;
* a worker that cannot start (``setup`` raised, or it exited) is a :class:`WorkerError`, not
  retriable, with the reason; the next call tries again.

:meth:`WorkerPool.close` ends every worker (the pipe closes, the worker exits; one that does
not within a few seconds is terminated) and reaps it: no process outlives the pool. Workers
are daemonic too, so an interpreter that exits without closing still takes them along.
A pool's asyncio parts bind to the event loop of its first call: use it from one loop. As with
any spawned process, the program's main module must be guarded (``if __name__ ==
"__main__":``): a spawned worker imports it again.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from podium.errors import WorkerError

START_TIMEOUT_S = 600.0
"""Longest a worker may take to start (import, open its state, warm up) on a busy machine."""
_STOP_WAIT_S = 5.0
"""How long a closing worker may take to exit by itself before it is terminated."""


@dataclass(eq=False)
class _Worker:
    """One live worker process and the parent's end of its pipe."""

    process: BaseProcess
    conn: Connection
    waiting: asyncio.Future[None] | None = None
    """The reply the parent is awaiting, if any (resolved by a closing pool)."""


def _serve(
    conn: Connection,
    setup: Callable[[], Any],
    handle: Callable[[Any, Any], Any],
    expected: tuple[type[BaseException], ...],
) -> None:
    """A worker's life (in the child): build the state, then answer until the pipe closes.

    Replies are ``("ready", pid)`` or ``("broken", why)`` once, then per request
    ``("ok", reply)``, ``("fail", (i, message))`` for ``expected[i]``, or ``("error", what)``.
    """
    # Ctrl-C reaches the whole process group; the parent decides when its workers end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        state = setup()
    except Exception as exc:  # any failure to start is reported, never a silent exit
        _send(conn, ("broken", f"{type(exc).__name__}: {exc}"))
        return
    _send(conn, ("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return  # the parent closed the pipe (or died): nothing left to serve
        if not _send(conn, _answer(state, handle, request, expected)):
            return


def _answer(
    state: Any,
    handle: Callable[[Any, Any], Any],
    request: Any,
    expected: tuple[type[BaseException], ...],
) -> tuple[str, Any]:
    """One request's reply message (see :func:`_serve`)."""
    try:
        return ("ok", handle(state, request))
    except Exception as exc:  # reported to the caller, typed when it expects the type
        for i, kind in enumerate(expected):
            if isinstance(exc, kind):
                return ("fail", (i, str(exc)))
        return ("error", f"{type(exc).__name__}: {exc}")


def _send(conn: Connection, message: tuple[str, Any]) -> bool:
    """Send ``message``; False when the parent has gone (its end of the pipe is closed)."""
    try:
        conn.send(message)
    except OSError:
        return False
    return True


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


UNGUARDED_MAIN_HINT = (
    "A spawned worker imports the program's main module again: if that module starts the "
    'pool at import time (no `if __name__ == "__main__":` guard around its entry point), the '
    "worker fails that way; guard it, or run the plug-ins with processes=0"
)
"""Why a worker most often dies before it is ready, and the fix (its stderr has the rest)."""


def exit_status(process: BaseProcess) -> str:
    """How a finished process ended, in words (``exit code 3``, ``killed by SIGKILL``)."""
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class WorkerPool:
    """Up to ``processes`` spawned workers, each built by ``setup()`` and answering
    ``handle(state, request)``; :meth:`call` sends one request to an idle worker."""

    def __init__(
        self,
        name: str,
        processes: int,
        setup: Callable[[], Any],
        handle: Callable[[Any, Any], Any],
        expected: Sequence[type[BaseException]] = (),
    ) -> None:
        """``setup`` and ``handle`` must be picklable (module-level functions, or
        ``functools.partial`` of them) and the ``expected`` exception types constructible
        from one message."""
        if processes < 1:
            raise ValueError(f"{name}: a worker pool needs at least 1 process, got {processes}")
        self._name = name
        self._processes = processes
        self._setup = setup
        self._handle = handle
        self._expected = tuple(expected)
        self._slots: asyncio.Queue[_Worker | None] | None = None
        self._live: set[_Worker] = set()
        self._closed = False

    @property
    def processes(self) -> int:
        """Slots: the most workers that run at once."""
        return self._processes

    def pids(self) -> tuple[int, ...]:
        """Process ids of the workers running now (started on demand: none before a call)."""
        return tuple(sorted(w.process.pid for w in self._live if w.process.pid is not None))

    async def call(self, request: Any) -> Any:
        """``handle(state, request)`` in an idle worker (waiting for one when all are busy);
        its return value, or its error as the module docstring says."""
        if self._closed:
            raise WorkerError(f"{self._name}: the worker pool is closed", retriable=False)
        slots = self._queue()
        worker = await slots.get()
        if self._closed:  # closed while this call waited for a worker: start none
            slots.put_nowait(None)
            raise WorkerError(f"{self._name}: the worker pool is closed", retriable=False)
        try:
            if worker is None:
                worker = await self._started()
            status, payload = await self._ask(worker, request)
        except BaseException:
            # Dead, never started, or abandoned mid-call (cancelled: its late reply must not
            # reach the next caller): the slot is emptied and refilled on demand.
            if worker is not None:
                self._stop(worker)
            slots.put_nowait(None)
            raise
        if self._closed:
            self._stop(worker)
        slots.put_nowait(None if self._closed else worker)
        return self._reply(worker, status, payload)

    async def close(self) -> None:
        """End and reap every worker; later calls raise :class:`WorkerError`."""
        self._closed = True
        workers = list(self._live)
        for worker in workers:
            if worker.waiting is not None:
                _resolve(worker.waiting)  # its caller then reads a closed pipe: an error
            worker.conn.close()  # the worker sees the pipe close and exits
        await asyncio.to_thread(_reap, workers)
        self._live.difference_update(workers)

    # -- internals ------------------------------------------------------------------------

    def _queue(self) -> asyncio.Queue[_Worker | None]:
        """The slots (``None``: empty, start a worker there), made on the first call. Last
        in, first out: the worker that just answered takes the next call, so calls one after
        another keep one worker and only calls at once start more."""
        if self._slots is None:
            self._slots = asyncio.LifoQueue()
            for _ in range(self._processes):
                self._slots.put_nowait(None)
        return self._slots

    async def _started(self) -> _Worker:
        """A new worker, ready. Its start runs in a thread that a cancelled caller cannot
        interrupt: the worker it starts then would belong to no slot and live on until
        :meth:`close`, so it is stopped as soon as its start ends."""
        starting = asyncio.ensure_future(asyncio.to_thread(self._start))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(self._stop_abandoned)
            raise

    def _stop_abandoned(self, starting: asyncio.Future[_Worker]) -> None:
        """Stop a worker whose caller was cancelled while it started (a failed start has
        stopped its worker already)."""
        if not starting.cancelled() and starting.exception() is None:
            self._stop(starting.result())

    def _start(self) -> _Worker:
        """Spawn a worker and wait until its ``setup`` is done (run in a thread)."""
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(
            target=_serve,
            args=(child, self._setup, self._handle, self._expected),
            name=f"{self._name}-worker",
            daemon=True,
        )
        process.start()
        child.close()  # only the worker holds its end: its death reads as end-of-file here
        worker = _Worker(process, parent)
        self._live.add(worker)
        try:
            if not parent.poll(START_TIMEOUT_S):
                raise WorkerError(
                    f"{self._name}: worker process {process.pid} did not start within "
                    f"{START_TIMEOUT_S:.0f} s",
                    retriable=False,
                )
            status, payload = parent.recv()
        except (EOFError, OSError) as exc:
            self._stop(worker)
            raise WorkerError(
                f"{self._name}: worker process {process.pid} exited while starting "
                f"({exit_status(process)}). {UNGUARDED_MAIN_HINT}",
                retriable=False,
            ) from exc
        except BaseException:
            self._stop(worker)
            raise
        if status != "ready":
            self._stop(worker)
            raise WorkerError(
                f"{self._name}: worker process {process.pid} failed to start: {payload}",
                retriable=False,
            )
        return worker

    async def _ask(self, worker: _Worker, request: Any) -> tuple[str, Any]:
        """Send ``request`` and await the reply; a dead worker raises a retriable
        :class:`WorkerError` naming it."""
        try:
            worker.conn.send(request)
            await _readable(worker)
            status, payload = worker.conn.recv()
        except (EOFError, OSError) as exc:
            self._stop(worker)
            if self._closed:
                raise WorkerError(
                    f"{self._name}: the worker pool closed mid-call", retriable=False
                ) from exc
            raise WorkerError(
                f"{self._name}: worker process {worker.process.pid} died before answering "
                f"({exit_status(worker.process)}); a new worker serves the next call",
                retriable=True,
            ) from exc
        return str(status), payload

    def _reply(self, worker: _Worker, status: str, payload: Any) -> Any:
        """The caller's value for a reply message, or the error it stands for."""
        if status == "ok":
            return payload
        if status == "fail":
            index, message = payload
            raise self._expected[int(index)](str(message))
        raise WorkerError(
            f"{self._name}: worker process {worker.process.pid} raised {payload}",
            retriable=False,
        )

    def _stop(self, worker: _Worker) -> None:
        """End one worker now (its pipe closed, then terminated) and reap it."""
        worker.conn.close()
        _end(worker.process, grace_s=0.0)
        self._live.discard(worker)


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


def _reap(workers: Sequence[_Worker]) -> None:
    """Wait for closing workers to exit; terminate (then kill) any that do not in time."""
    for worker in workers:
        _end(worker.process, grace_s=_STOP_WAIT_S)


def _end(process: BaseProcess, *, grace_s: float) -> None:
    """Give ``process`` ``grace_s`` to exit by itself, then terminate it, then kill it if it
    still lingers; reaped in every case (a zero grace still reaps one already gone)."""
    process.join(grace_s)
    if process.is_alive():
        process.terminate()
        process.join(_STOP_WAIT_S)
    if process.is_alive():
        process.kill()
        process.join()


async def _readable(worker: _Worker) -> None:
    """Wait until the worker's pipe has data (or end-of-file) without blocking the event
    loop: the loop watches the pipe (a thread waits where the loop cannot watch files)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = worker.conn.fileno()
    try:
        loop.add_reader(fd, _resolve, ready)
    except NotImplementedError:
        await asyncio.to_thread(worker.conn.poll, None)
        return
    worker.waiting = ready
    try:
        await ready
    finally:
        worker.waiting = None
        loop.remove_reader(fd)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
