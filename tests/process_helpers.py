"""Helpers of tests that watch processes: which worker processes of :mod:`podium.procpool`
this test process has started, read from ``/proc`` (so a process no pool knows of counts)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from podium.procpool import WORKER_COMMAND


def worker_children() -> list[int]:
    """Pids of this process's children that run a pool's worker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # it ended while read
        if ppid == os.getpid() and WORKER_COMMAND.encode() in command:
            found.append(int(entry.name))
    return found


def gone(pids: tuple[int, ...]) -> bool:
    """No process of ``pids`` exists any more (reaped, not a zombie)."""
    return not any(Path(f"/proc/{pid}").exists() for pid in pids)


async def gone_within(pids: tuple[int, ...], seconds: float) -> bool:
    """``gone(pids)`` becomes true within ``seconds``."""
    for _ in range(int(seconds / 0.05)):
        if gone(pids):
            return True
        await asyncio.sleep(0.05)
    return gone(pids)
