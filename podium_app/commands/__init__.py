"""One module per `podium` command (see podium_app/cli.py), and what they share."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podium.errors import ConfigError, PodiumError


def fail(prog: str, exc: PodiumError) -> int:
    """Report ``exc`` as one line naming the command on stderr, and the command's exit code:
    2 for bad input (a :class:`ConfigError`: flags, files, settings), 1 for a failure while
    working (the bus, the server, a decode)."""
    print(f"{prog}: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, ConfigError) else 1


def run_driver(
    prog: str, work: Callable[[], dict[str, Any]], json_out: Path | None
) -> dict[str, Any] | int:
    """Run a driver that starts processes (``work``), the bench commands' way: its result,
    also written to ``json_out`` when given; or the command's exit code, with one line on
    stderr: 1 for a failure while working, 130 when interrupted (the driver has stopped
    every process it started by then)."""
    try:
        result = work()
    except PodiumError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except (asyncio.CancelledError, KeyboardInterrupt):
        print(f"{prog}: interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2))
    return result
