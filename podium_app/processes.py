"""A supervisor for service processes started by a driver (``podium train --bus kafka://``).

Each service runs as ``python -m <service>`` with its own environment, logs to
``<log_dir>/<name>.log``, and is stopped with SIGTERM (SIGKILL after a timeout) whatever
happened, so a failed run never leaves processes behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from podium.errors import PodiumError

_log = logging.getLogger(__name__)

SERVICES_ROOT = Path(__file__).resolve().parents[1]
"""Directory holding the service packages (the repository root), put on their PYTHONPATH."""


class ServiceProcesses:
    """The service processes this driver started; stops them all, whatever happens."""

    def __init__(self, log_dir: Path, stop_timeout_s: float) -> None:
        self.log_dir = log_dir
        self.stop_timeout_s = stop_timeout_s
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self.exit_codes: dict[str, int] = {}

    async def start(self, name: str, python: str, module: str, env: Mapping[str, str]) -> None:
        """``python -m module`` with ``env``; stdout and stderr to ``<log_dir>/<name>.log``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("wb")
        self._logs[name] = log
        self.procs[name] = await asyncio.create_subprocess_exec(
            python,
            "-m",
            module,
            env=dict(env),
            cwd=SERVICES_ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )

    def log_tail(self, name: str, chars: int = 2000) -> str:
        """The end of a process's log."""
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def check(self) -> None:
        """Raise if a process has ended (a service must run until the driver stops it)."""
        for name, proc in self.procs.items():
            if proc.returncode is not None:
                raise PodiumError(
                    f"{name} exited with status {proc.returncode}:\n{self.log_tail(name)}"
                )

    async def stop(self) -> dict[str, int]:
        """SIGTERM every process, wait up to the stop timeout, SIGKILL what is left."""
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                code = await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
            except TimeoutError:
                _log.error("%s did not stop within %.0fs; killing it", name, self.stop_timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                code = await proc.wait()
            self.exit_codes[name] = code
        for log in self._logs.values():
            log.close()
        return dict(self.exit_codes)


__all__ = ["SERVICES_ROOT", "ServiceProcesses"]
