"""``podium bench context``: Context-1 policies on any docs and question file, at one budget.

Builds the index of ``--docs`` (or reuses ``--index`` when it was built from the same roots
with the same chunking; :func:`podium.context.benchmark.prepare_index`), then plays every
question with the BM25, dense and hybrid (RRF) top-k baselines and the learned agent
(``--checkpoint``, a weights file or version directory of ``podium train --env context``),
each at ``--budget`` tokens, and reports per policy answer found, precision, tokens kept,
p50/p99 latency and questions per second per core, plus the index's build time and size::

    {"policies": {"<name>": {"answer_found", "precision", "tokens_kept", "p50_ms", "p99_ms",
                             "qps_per_core", ...}},
     "index": {"build_s", "bytes", ...}, "absent": {"<name>": "<why>"}, "settings": {...}}

No trained weights ship with Podium (they depend on the corpus), so without ``--checkpoint``
``learned`` is not run: it is listed under ``absent`` with the reason, and said on stderr.
``--wide N`` adds the wide-search measurement (:mod:`podium_app.bench_context`): composite
tasks of N sub-questions run by the search sub-agents through the swarm, in parallel and one
after another, under ``"wide"``.

Progress bars on stderr while the index builds and each policy plays. Exit 0 when measured,
1 when the index build or a search failed (the message names the document or server), 2 for
bad input: a missing docs directory or question file, a malformed question line, a gold
source that is not a document under ``--docs``, unusable checkpoint weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from podium.errors import PodiumError
from podium_app.commands.context import (
    PHASES,
    add_docs_argument,
    docs_problem,
    phase_bar,
    phase_progress,
)

PROG = "podium bench context"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium bench context``."""
    add_docs_argument(parser)
    parser.add_argument(
        "--questions", required=True, metavar="FILE", type=Path, help="question file (JSONL)"
    )
    parser.add_argument(
        "--budget", required=True, type=int, metavar="TOKENS", help="tokens a context may keep"
    )
    parser.add_argument(
        "--json", required=True, metavar="OUT", type=Path, help="write the figures here"
    )
    parser.add_argument(
        "--index",
        metavar="DIR",
        type=Path,
        help="index directory: reused when built from the same --docs, else built there "
        "(default: a temporary one)",
    )
    parser.add_argument("--chroma", metavar="URL", help="keep the vectors on this Chroma server")
    parser.add_argument(
        "--checkpoint",
        metavar="FILE",
        type=Path,
        help="the learned agent's weights (without it, 'learned' is reported absent)",
    )
    parser.add_argument("--k", type=int, default=20, help="hits per search (default 20)")
    parser.add_argument(
        "--wide",
        type=int,
        default=0,
        metavar="N",
        help="also measure wide-search tasks of N sub-questions, parallel vs one by one",
    )
    parser.add_argument(
        "--wide-tasks", type=int, default=3, metavar="T", help="wide-search tasks (default 3)"
    )


def check_args(args: argparse.Namespace) -> str | None:
    """The problem with the arguments, or None."""
    problem = docs_problem(args.docs)
    if problem:
        return problem
    if not args.questions.is_file():
        return f"--questions: no such file: {args.questions}"
    if args.budget < 1 or args.k < 1:
        return "--budget and --k must be >= 1"
    if args.wide < 0 or args.wide == 1 or args.wide_tasks < 1:
        return "--wide must be 0 (off) or >= 2 sub-questions, --wide-tasks >= 1"
    if args.checkpoint is not None and not args.checkpoint.exists():
        return f"--checkpoint: no such file or directory: {args.checkpoint}"
    return None


def run(args: argparse.Namespace) -> int:
    """Check the input, build or reuse the index, measure, write the JSON."""
    problem = check_args(args)
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    from podium.context.benchmark import gold_sources_checked
    from podium.context.questions import load_questions

    try:
        questions = load_questions(args.questions)
        gold_sources_checked(questions, args.docs, args.questions)
        policies, absent = _policies(args.checkpoint)
    except PodiumError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    problem = _too_few(args, len(questions))
    if problem:
        print(f"{PROG}: {args.questions}: {problem}", file=sys.stderr)
        return 2
    for name, why in absent.items():
        print(f"{PROG}: {name}: {why}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="podium-bench-context-") as tmp:
        try:
            report = _measure(args, questions, policies, args.index or Path(tmp) / "index")
        except PodiumError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 1
    report["absent"] = absent
    try:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"{PROG}: --json {args.json}: cannot write ({exc.strerror})", file=sys.stderr)
        return 2
    _print_table(report)
    return 0


def _too_few(args: argparse.Namespace, questions: int) -> str | None:
    """Why the file holds too few questions for the run asked for, or None."""
    if questions == 0:
        return "no questions"
    wanted = args.wide * (args.wide_tasks + 1)  # the measured tasks and one warm-up
    if args.wide and questions < wanted:
        return f"--wide {args.wide} --wide-tasks {args.wide_tasks} needs {wanted} questions, it has {questions}"
    return None


def _policies(checkpoint: Path | None) -> tuple[list[Any], dict[str, str]]:
    """The baselines, plus the learned agent when weights are given (else why it is absent)."""
    from podium.context.heuristics import BASELINES

    if checkpoint is None:
        why = "no --checkpoint given (Podium ships no trained weights: train with podium train --env context)"
        return list(BASELINES), {"learned": why}
    from podium.context.env import OBSERVATION_FEATURES
    from podium.context.learned import FEATURES_KEY, check_features, load_learned_policy

    learned = load_learned_policy(checkpoint)
    # Refused now, naming the file, rather than after the baselines have played.
    check_features(
        {FEATURES_KEY: ",".join(learned.features)}, OBSERVATION_FEATURES, str(checkpoint)
    )
    return [*BASELINES, learned], {}


def _measure(
    args: argparse.Namespace, questions: list[Any], policies: list[Any], index_dir: Path
) -> dict[str, Any]:
    """Index, then every policy over every question, with progress on stderr."""
    from podium.context.benchmark import (
        evaluate_policy,
        index_report,
        prepare_index,
        report_json,
        warm_up,
    )
    from podium.context.env import ContextEnv, ContextEnvConfig

    console = Console(stderr=True)
    names = {**PHASES, **{p.name: f"playing {p.name}" for p in policies}}
    with phase_bar(console) as bar:
        progress = phase_progress(bar, console, names)
        index, reused = prepare_index(
            args.docs, index_dir, chroma_url=args.chroma, progress=progress
        )
        warm_up(index)
        env = ContextEnv(
            index, questions, ContextEnvConfig(budget_tokens=args.budget, top_k=args.k)
        )
        results = {p.name: evaluate_policy(env, p, questions, progress) for p in policies}
        wide = _wide(args, index, questions, progress) if args.wide else None
    settings = {"budget": args.budget, "k": args.k, "questions": len(questions)}
    report = report_json(results, index_report(index, reused), {}, settings)
    if wide is not None:
        report["wide"] = wide
    index.close()
    return report


def _wide(args: argparse.Namespace, index: Any, questions: list[Any], progress: Any) -> Any:
    """The wide-search measurement (:func:`podium_app.bench_context.measure_wide`)."""
    from podium_app.bench_context import measure_wide

    return measure_wide(index, questions, args.wide, args.wide_tasks, args.k, progress)


def _print_table(report: dict[str, Any]) -> None:
    """The figures as a table on stdout."""
    print(
        f"{'policy':<10} {'found':>6} {'prec':>6} {'tokens':>7} {'p50 ms':>8} {'p99 ms':>8} {'q/s/core':>9}"
    )
    for name, r in report["policies"].items():
        print(
            f"{name:<10} {r['answer_found']:6.3f} {r['precision']:6.3f} {r['tokens_kept']:7.1f}"
            f" {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['qps_per_core']:9.1f}"
        )
    idx = report["index"]
    state = "reused" if idx["reused"] else "built"
    print(
        f"index: {idx['chunks']} chunks, {idx['bytes']} bytes, build {idx['build_s']:.1f} s ({state})"
    )
    wide = report.get("wide")
    if wide:
        print(
            f"wide search: parallel {wide['parallel_s']:.2f} s, one by one {wide['sequential_s']:.2f} s,"
            f" x{wide['speedup']:.2f}"
        )
