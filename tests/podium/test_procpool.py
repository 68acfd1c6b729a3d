"""The worker-process pool: replies from real worker processes, errors typed as promised, a
killed worker replaced, nothing left running after close. The workers run builtins
(``int`` as setup, ``operator.truediv`` as handler) so each starts in a fraction of a second."""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest
from process_helpers import gone, gone_within, worker_children

from podium.errors import WorkerError
from podium.procpool import Batcher, WorkerPool, resolve_processes


def pool(processes: int = 1, start: str = "6") -> WorkerPool:
    """Workers whose state is ``int(start)`` and that answer ``state / request``."""
    return WorkerPool("divide", processes, partial(int, start), operator.truediv, (TypeError,))


async def test_concurrent_calls_run_in_separate_worker_processes() -> None:
    workers = pool(processes=2)
    assert workers.pids() == ()  # started on demand
    try:
        assert [await workers.call(n) for n in (1, 2, 3)] == [6.0, 3.0, 2.0]
        assert len(workers.pids()) == 1  # one call at a time: one worker is enough
        assert list(await asyncio.gather(workers.call(2), workers.call(3))) == [3.0, 2.0]
        pids = workers.pids()
        assert len(pids) == 2 and os.getpid() not in pids
        assert await workers.call(6) == 1.0 and workers.pids() == pids  # reused, not respawned
    finally:
        await workers.close()
    assert workers.pids() == () and gone(pids)


async def test_expected_errors_keep_their_type_and_others_are_named() -> None:
    workers = pool()
    try:
        with pytest.raises(TypeError, match="unsupported operand"):
            await workers.call("x")
        [pid] = workers.pids()
        with pytest.raises(WorkerError, match="ZeroDivisionError: division by zero") as caught:
            await workers.call(0)
        assert caught.value.retriable is False and str(pid) in str(caught.value)
        assert await workers.call(3) == 2.0 and workers.pids() == (pid,)  # the worker stayed
    finally:
        await workers.close()


async def test_a_worker_killed_while_idle_is_replaced_unseen() -> None:
    workers = pool()
    try:
        assert await workers.call(2) == 3.0
        [pid] = workers.pids()
        os.kill(pid, signal.SIGKILL)
        assert await gone_within((pid,), 30)
        # Dead before the request reached it: the request goes to a new worker.
        assert await workers.call(3) == 2.0
        assert len(workers.pids()) == 1 and workers.pids() != (pid,)
    finally:
        await workers.close()


async def started_call(workers: WorkerPool, request: float) -> tuple[asyncio.Task[object], int]:
    """A call in flight in its (only) worker, and that worker's pid. The worker is started
    and ready first (a zero wait answers at once), so the call is in the worker, not in its
    start, however slowly a busy machine spawns it."""
    assert await workers.call(0) is False
    [pid] = workers.pids()
    call = asyncio.create_task(workers.call(request))
    await asyncio.sleep(0.3)  # the request is on its way: the worker is waiting on it
    return call, pid


async def test_a_worker_killed_mid_call_fails_that_call_and_the_next_one_works() -> None:
    # The worker's state is an Event never set: a call waits ``request`` seconds in the worker.
    workers = WorkerPool("wait", 1, threading.Event, threading.Event.wait)
    try:
        call, pid = await started_call(workers, 60)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match=f"wait: worker process {pid} died") as caught:
            await asyncio.wait_for(call, 30)
        assert caught.value.retriable and "SIGKILL" in str(caught.value)
        assert await workers.call(0) is False and workers.pids() != (pid,)
    finally:
        await workers.close()
    assert gone((pid,))


async def test_a_cancelled_call_leaves_its_worker_to_finish_and_serve_the_next_one() -> None:
    workers = WorkerPool("wait", 1, threading.Event, threading.Event.wait)
    try:
        call, pid = await started_call(workers, 1.5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # The abandoned request's late reply (False, after 1.5 s) is read and dropped: the
        # next call gets its own reply from the same worker, not that one.
        assert await asyncio.wait_for(workers.call(0.01), 30) is False
        assert await workers.call(0) is False and workers.pids() == (pid,)
    finally:
        await workers.close()
    assert gone((pid,))


async def test_a_worker_started_for_a_cancelled_call_serves_the_next_one() -> None:
    workers = WorkerPool("wait", 1, threading.Event, threading.Event.wait)
    try:
        call = asyncio.create_task(workers.call(60))
        for _ in range(6000):  # cancelled once the worker process exists, before it is ready
            if workers.pids():
                break
            await asyncio.sleep(0.01)
        [pid] = workers.pids()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await asyncio.wait_for(workers.call(0), 60) is False
        assert workers.pids() == (pid,)  # no second worker: the one started was kept
    finally:
        await workers.close()
    assert await gone_within((pid,), 10)


async def test_warm_starts_one_worker_ahead_of_the_first_call() -> None:
    workers = pool(processes=2)
    try:
        workers.warm()
        workers.warm()  # one start under way already: no second
        for _ in range(6000):
            if workers.pids():
                break
            await asyncio.sleep(0.01)
        warm = workers.pids()
        assert len(warm) == 1
        assert await workers.call(3) == 2.0 and workers.pids() == warm
    finally:
        await workers.close()
    assert gone(warm)


async def test_closing_while_a_worker_starts_leaves_no_process() -> None:
    workers = pool()
    workers.warm()
    await asyncio.sleep(0)  # the start is under way
    await workers.close()
    # close() waited for that start and ended its process: none runs now, and none appears
    # later (a start left behind would start its worker after close() returned).
    for _ in range(40):
        assert workers.pids() == () and not worker_children(), "a worker runs after close()"
        await asyncio.sleep(0.05)
    with pytest.raises(WorkerError, match="closed"):
        await workers.call(1)


async def test_a_worker_that_cannot_start_says_why() -> None:
    workers = pool(start="six")
    with pytest.raises(WorkerError, match="failed to start: ValueError: invalid literal") as caught:
        await workers.call(1)
    assert caught.value.retriable is False and workers.pids() == ()
    await workers.close()


async def test_close_ends_every_worker_and_refuses_later_calls() -> None:
    workers = pool(processes=3)
    await asyncio.gather(*(workers.call(n) for n in (1, 2, 3)))
    pids = workers.pids()
    assert len(pids) == 3
    await workers.close()
    assert gone(pids)
    with pytest.raises(WorkerError, match="closed"):
        await workers.call(1)


def test_processes_option_values() -> None:
    assert resolve_processes("0") == 0 and resolve_processes(" 3 ") == 3
    assert 1 <= resolve_processes("auto") == min(len(os.sched_getaffinity(0)), 8)
    assert resolve_processes("AUTO", cap=1) == 1
    for bad in ("-1", "many", "2.5", ""):
        with pytest.raises(ValueError, match="non-negative integer or 'auto'"):
            resolve_processes(bad)
    with pytest.raises(ValueError, match="at least 1 process"):
        pool(processes=0)


async def test_calls_waiting_for_a_busy_pool_go_to_the_next_worker_together() -> None:
    # State 1 and operator.mul: a worker answers a list of requests with the same list.
    workers = WorkerPool("echo", 2, partial(int, "1"), operator.mul)
    batcher = Batcher(workers)
    try:
        assert await batcher.call("alone") == "alone" and batcher.largest == 1
        # One after another, each the moment the previous answered: each is sent alone.
        assert [await batcher.call(n) for n in range(3)] == [0, 1, 2] and batcher.largest == 1
        replies = await asyncio.gather(*(batcher.call(n) for n in range(7)))
        assert list(replies) == list(range(7))  # each call gets its own reply, in order
        # Seven waiting for two workers: each worker takes its share, at most ceil(7 / 2).
        assert batcher.largest == 4
    finally:
        await workers.close()


async def test_a_failed_batch_fails_every_call_in_it_with_the_error() -> None:
    workers = WorkerPool("divide", 1, partial(int, "6"), operator.truediv, (TypeError,))
    batcher = Batcher(workers)
    try:
        results = await asyncio.gather(*(batcher.call(n) for n in range(3)), return_exceptions=True)
        assert all(isinstance(r, TypeError) and "unsupported operand" in str(r) for r in results)
    finally:
        await workers.close()
    with pytest.raises(ValueError, match="at least 1 call"):
        Batcher(workers, most=0)


def test_a_program_without_a_main_guard_uses_the_pool(tmp_path: Path) -> None:
    """A program that starts a pool at import time (no ``__main__`` guard), read from stdin
    (no main module file at all): workers never import the main module, so both work."""
    program = (
        "import asyncio, operator\n"
        "from functools import partial\n"
        "from podium.procpool import WorkerPool\n"
        "pool = WorkerPool('divide', 1, partial(int, '6'), operator.truediv, ())\n"
        "async def main():\n"
        "    try:\n"
        "        print(await pool.call(2))\n"
        "    finally:\n"
        "        await pool.close()\n"
        "asyncio.run(main())\n"
    )
    (script := tmp_path / "unguarded.py").write_text(program)
    root = str(Path(__file__).resolve().parents[2])  # this checkout's podium, not another's
    env = {**os.environ, "PYTHONPATH": root}
    for command, stdin in (([str(script)], None), (["-"], program)):
        done = subprocess.run(
            [sys.executable, *command],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "3.0"


def _main_setup() -> int:
    return 1


def test_a_function_of_the_main_module_is_refused_naming_the_fix() -> None:
    _main_setup.__module__ = "__main__"  # as if the program's own script defined it
    with pytest.raises(ValueError, match=r"setup '_main_setup' is defined in __main__.*module"):
        WorkerPool("main", 1, _main_setup, operator.truediv)
    with pytest.raises(ValueError, match=r"handle .* is defined in __main__"):
        WorkerPool("main", 1, partial(int, "6"), partial(_main_setup))
