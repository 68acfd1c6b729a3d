"""Helpers of tests that watch processes: which worker processes of :mod:`podium.procpool`
this test process has started, read from ``/proc`` (so a process no pool knows of counts)."""

from __future__ import annotations

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
