"""``podium context index``: index directories of documentation for the Context-1 search
agents (BM25 and dense embeddings in Chroma; see :mod:`podium.context.index`).

Shows a progress bar per phase on stderr (reading, BM25, embedding, storing), then prints
the build time, the index size, chunk and document counts and every skipped document. Exit
0 when built, 1 when the build failed (an unreadable document, a dead Chroma server: the
message names it and the output directory is left as it was), 2 for unusable arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from podium.errors import PodiumError

if TYPE_CHECKING:
    from podium.context.index import IndexStats

PROG = "podium context index"

PHASES = {
    "read": "reading documents",
    "bm25": "BM25 index",
    "embed": "embedding chunks",
    "store": "storing vectors in Chroma",
}
"""Progress phases of :meth:`podium.context.index.ContextIndex.build`, as the bar names them."""


def add_docs_argument(parser: argparse.ArgumentParser) -> None:
    """``--docs DIR...``, the documentation to index: one definition for every command that
    reads documents (``podium context index``, ``podium bench context``); check it with
    :func:`docs_problem`."""
    parser.add_argument(
        "--docs",
        nargs="+",
        required=True,
        metavar="DIR",
        type=Path,
        help="directories of text / reST / Markdown / HTML / man pages (optionally .gz); "
        "a document's source is its path relative to its directory",
    )


def docs_problem(docs: list[Path]) -> str | None:
    """What is wrong with ``--docs`` (the directories that are not one), or None."""
    missing = [str(d) for d in docs if not Path(d).is_dir()]
    if missing:
        return f"--docs: not a directory: {', '.join(missing)}"
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium context index``."""
    add_docs_argument(parser)
    parser.add_argument(
        "--out", required=True, metavar="DIR", type=Path, help="index directory to write"
    )
    parser.add_argument(
        "--chroma",
        metavar="URL",
        help="store the vectors on this Chroma server (default: embedded, in DIR/chroma)",
    )
    parser.add_argument(
        "--skip-unreadable",
        action="store_true",
        help="index the rest when a document cannot be read (each one is listed); "
        "default: stop and leave --out as it was",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def check_args(args: argparse.Namespace) -> str | None:
    """The problem with the arguments, or None."""
    return docs_problem(args.docs)


def phase_bar(console: Console) -> Progress:
    """The context commands' progress bar (``podium context index``, ``podium bench
    context``): the phase, its bar and count, elapsed and remaining time."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def phase_progress(
    bar: Progress, console: Console, names: Mapping[str, str]
) -> Callable[[str, int, int], None]:
    """A ``progress(phase, done, total)`` callback on one task of ``bar``, each phase shown
    by its name in ``names``; off a terminal (logs, CI) a line when a phase starts and ends."""
    task = bar.add_task("starting", total=1)
    shown = {"phase": ""}

    def progress(phase: str, done: int, total: int) -> None:
        label = names.get(phase, phase)
        bar.update(task, description=label, completed=done, total=total)
        if not console.is_terminal and (phase != shown["phase"] or done == total):
            shown["phase"] = phase
            console.print(f"{label} {done}/{total}", highlight=False)

    return progress


def run(args: argparse.Namespace) -> int:
    """Build the index with a live progress bar, then print its summary."""
    problem = check_args(args)
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    from podium.context.index import ContextIndex

    console = Console(stderr=True)
    failure: PodiumError | None = None
    with phase_bar(console) as bar:
        progress = phase_progress(bar, console, PHASES)
        try:
            index = ContextIndex.build(
                args.docs,
                args.out,
                chroma_url=args.chroma,
                progress=progress,
                skip_unreadable=args.skip_unreadable,
            )
        except PodiumError as exc:
            failure = exc
    if failure is not None:
        # Plain print after the bar is gone: a path or URL in the message stays on one line.
        print(f"{PROG}: error: {failure}", file=sys.stderr)
        return 1
    print_summary(index.stats(), args.out, args.chroma, as_json=args.json)
    return 0


def print_summary(stats: IndexStats, out: Path, chroma: str | None, *, as_json: bool) -> None:
    """The build's figures: time, bytes, chunks, documents, skipped documents."""
    if as_json:
        print(json.dumps({**asdict(stats), "path": str(out), "chroma_url": chroma}, indent=2))
        return
    where = f"Chroma server {chroma}" if chroma else "embedded Chroma"
    print(f"index: {out} (vectors: {where})")
    print(f"documents: {stats.documents}  chunks: {stats.chunks}")
    print(
        f"build: {stats.build_s:.1f} s  size: {stats.bytes / 2**20:.1f} MiB ({stats.bytes} bytes)"
    )
    for line in stats.skipped:
        print(f"skipped: {line}")
