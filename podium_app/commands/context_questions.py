"""``podium context questions``: generate Context-1 questions from documentation's structure.

Reads every document under ``--docs`` (the same walk as ``podium context index``, so sources
and offsets match the index's chunks), generates the question families of
:mod:`podium.context.generate` and writes ``train.jsonl``, ``validation.jsonl`` and
``held-out.jsonl`` under ``--out`` (split by document). A progress bar on stderr counts the
documents; then a table (or ``--json``) gives the questions of each kind in each split.
Exit 0 when written, 1 when a document cannot be read (the message names it; nothing is
written), 2 for unusable arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from podium.context.corpus import iter_documents
from podium.context.generate import KINDS, SPLITS, GenerateConfig, generate, write_generated
from podium.errors import ConfigError, PodiumError

PROG = "podium context questions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium context questions``."""
    parser.add_argument(
        "--docs", nargs="+", required=True, metavar="DIR", type=Path, help="docs roots"
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", type=Path, help="directory for <split>.jsonl"
    )
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=list(KINDS),
        choices=KINDS,
        metavar="KIND",
        help=f"question families (default: all of {', '.join(KINDS)})",
    )
    parser.add_argument(
        "--max-per-document",
        type=int,
        default=GenerateConfig().max_per_document,
        metavar="N",
        help="at most N questions of one family per document (0: no cap; FAQ never capped)",
    )
    parser.add_argument("--validation-percent", type=int, default=10, metavar="P")
    parser.add_argument("--held-out-percent", type=int, default=10, metavar="P")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")


def config_from(args: argparse.Namespace) -> GenerateConfig:
    """The generator's config from the arguments (:class:`ConfigError` names a bad one)."""
    return GenerateConfig(
        kinds=tuple(args.kinds),
        max_per_document=args.max_per_document,
        validation_percent=args.validation_percent,
        held_out_percent=args.held_out_percent,
    )


def check_args(args: argparse.Namespace) -> tuple[GenerateConfig | None, str]:
    """The generator's config, or the problem with the arguments."""
    missing = [str(d) for d in args.docs if not Path(d).is_dir()]
    if missing:
        return None, f"--docs: not a directory: {', '.join(missing)}"
    try:
        return config_from(args), ""
    except ConfigError as exc:
        return None, str(exc)


def run(args: argparse.Namespace) -> int:
    """Generate with a progress bar, write the splits, print the counts."""
    config, problem = check_args(args)
    if config is None:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    try:
        total = sum(1 for _ in iter_documents(args.docs))
        with Progress(
            TextColumn("[bold]reading documents"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f}"),
            TimeElapsedColumn(),
            console=console,
        ) as bar:
            task = bar.add_task("read", total=total)
            generated = generate(args.docs, config, lambda _source: bar.advance(task))
        paths = write_generated(args.out, generated)
    except PodiumError as exc:
        # Plain print: rich would wrap a long path in the middle.
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    counts = generated.counts()
    if not any(generated.splits.values()):
        print(
            f"{PROG}: no question generated: the families need reST version directives, "
            "a faq/ directory or man pages (write a question file by hand for other docs)",
            file=sys.stderr,
        )
    if args.json:
        out = {"documents": generated.documents, "counts": counts}
        print(json.dumps({**out, "files": {s: str(p) for s, p in paths.items()}}, indent=2))
        return 0
    print(f"documents: {generated.documents}")
    print(f"{'kind':<16}" + "".join(f"{s:>12}" for s in SPLITS) + f"{'total':>12}")
    for kind in KINDS:
        row = counts[kind]
        print(f"{kind:<16}" + "".join(f"{row[s]:>12}" for s in SPLITS) + f"{sum(row.values()):>12}")
    for split, path in paths.items():
        print(f"{split}: {path}", file=sys.stdout)
    return 0
