"""One module per `podium` command (see podium_app/cli.py), and what they share."""

from __future__ import annotations

import sys

from podium.errors import ConfigError, PodiumError


def fail(prog: str, exc: PodiumError) -> int:
    """Report ``exc`` as one line naming the command on stderr, and the command's exit code:
    2 for bad input (a :class:`ConfigError`: flags, files, settings), 1 for a failure while
    working (the bus, the server, a decode)."""
    print(f"{prog}: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, ConfigError) else 1
