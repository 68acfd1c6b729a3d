"""Matplotlib for every report's PNGs (``podium train``'s, ``--env context``'s, the rollout
report's and the cycle bench's): one backend, one way a figure becomes a file.

matplotlib is imported on first use, not with the module: the CLI builds every command's
parser, and commands that draw nothing should not pay for it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the file-only Agg backend: reports run on servers and in CI,
    without a display, and an interactive backend would try to open one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out: Path, *, dpi: int = 100) -> Path:
    """Lay ``fig`` out tightly (labels inside the image), write it to ``out`` as PNG at
    ``dpi`` and close it: pyplot keeps every open figure alive, and a report draws many.
    Returns ``out``."""
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=dpi)
    finally:
        pyplot().close(fig)
    return out


__all__ = ["pyplot", "save"]
