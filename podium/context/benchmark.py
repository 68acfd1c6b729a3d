"""Measuring Context-1 policies on a corpus and a question file (``podium bench context``).

Each policy plays every question once on the same index and budget
(:func:`~podium.context.heuristics.run_episode`, searches uncached so latencies are the
index's), and is reported by answer found, precision, gold recall, tokens kept, searches, the
per-question latency's p50 and p99, and questions per second per core: questions over the CPU
seconds the process spent on them (every thread counted), so a figure from a busy or a wide
machine reads the same. The index is built from the docs (or an existing one reused when it
was built from the same roots with the same chunking) and reported by build time and bytes.

Input is checked before anything is measured: a missing docs root, a malformed question line
(:func:`~podium.context.questions.load_questions` names ``file:line`` and the field) and a gold
span whose document is not under the docs roots are errors naming the problem: a question
that could never be answered would silently lower every policy's score.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from podium.config import from_env
from podium.context.corpus import ChunkingConfig, iter_documents
from podium.context.env import ContextEnv
from podium.context.heuristics import ContextPolicy, run_episode
from podium.context.index import BuildProgress, ContextIndex
from podium.context.questions import Question
from podium.errors import QuestionFileError

EvalProgress = Callable[[str, int, int], None]
"""Called as ``progress(policy, done, total)`` after each question a policy played."""


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """One policy's figures over a question file."""

    answer_found: float
    """Fraction of questions whose kept context overlaps a gold span."""
    precision: float
    """Mean fraction of kept chunks that overlap a gold span."""
    tokens_kept: float
    """Mean tokens kept (``corpus.count_tokens``)."""
    p50_ms: float
    """Median wall-clock milliseconds per question (searches, reads, decisions)."""
    p99_ms: float
    """99th percentile of the same."""
    qps_per_core: float
    """Questions per CPU second of this process (all its threads)."""
    qps: float
    """Questions per wall-clock second."""
    gold_recall: float
    """Mean fraction of gold spans covered (a two-hop question needs both)."""
    searches: float
    """Mean searches per question."""
    questions: int
    """Questions played."""


@dataclass(frozen=True, slots=True)
class IndexReport:
    """The index the policies ran on."""

    build_s: float
    """Wall-clock seconds its build took (from its manifest when reused)."""
    bytes: int
    """Bytes of the index directory (vectors on a Chroma server not included)."""
    chunks: int
    documents: int
    reused: bool
    """Whether an existing index of the same docs was reused instead of built."""
    path: str


def gold_sources_checked(
    questions: Sequence[Question], roots: Sequence[Path], where: Path | str
) -> None:
    """Raise :class:`QuestionFileError` naming the question and source when a gold span's
    document is not among the documents under ``roots`` (as the index reads them)."""
    known = {source for source, _ in iter_documents(roots)}
    for question in questions:
        for span in question.gold:
            if span.source not in known:
                raise QuestionFileError(
                    f"{where}: question {question.id!r}: gold source {span.source!r} is not a "
                    f"document under --docs ({', '.join(str(r) for r in roots)})",
                    path=str(where),
                )


def index_matches(path: Path, roots: Sequence[Path], chroma_url: str | None) -> bool:
    """Whether ``path`` holds an index built from exactly ``roots`` (resolved, in order) with
    the current chunking settings and its vectors where ``chroma_url`` says."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    built = [str(Path(r).resolve()) for r in manifest.get("roots", [])]
    wanted = [str(r.resolve()) for r in roots]
    same_store = chroma_url is None or manifest.get("chroma_url") == chroma_url
    chunking = asdict(from_env(ChunkingConfig))
    return built == wanted and manifest.get("chunking") == chunking and same_store


def prepare_index(
    roots: Sequence[Path],
    path: Path,
    *,
    chroma_url: str | None = None,
    progress: BuildProgress | None = None,
) -> tuple[ContextIndex, bool]:
    """The index of ``roots`` at ``path``: reused when it matches (:func:`index_matches`),
    else built there (replacing an older index). Returns it and whether it was reused."""
    if index_matches(path, roots, chroma_url):
        return ContextIndex.open(path, chroma_url=chroma_url), True
    return ContextIndex.build(roots, path, chroma_url=chroma_url, progress=progress), False


def index_report(index: ContextIndex, reused: bool) -> IndexReport:
    """Build time, bytes, chunks and documents of ``index``."""
    stats = index.stats()
    return IndexReport(
        stats.build_s, stats.bytes, stats.chunks, stats.documents, reused, str(index.path)
    )


def warm_up(index: ContextIndex) -> None:
    """One search of each retriever, untimed: the embedding model and the BM25 arrays load
    once per process, which is not a question's latency."""
    index.bm25("warm up", 1)
    index.dense("warm up", 1)


def percentile_ms(seconds: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``seconds``, in milliseconds (0 for none)."""
    return float(np.percentile(np.asarray(seconds) * 1000.0, q)) if seconds else 0.0


def summarise(infos: Sequence[dict[str, Any]], wall: Sequence[float], cpu_s: float) -> PolicyResult:
    """A policy's figures from each question's final ``info`` and wall seconds."""
    n = len(infos)

    def mean(key: str) -> float:
        return float(sum(float(i[key]) for i in infos) / n) if n else 0.0

    total_wall = sum(wall)
    return PolicyResult(
        answer_found=mean("answer_found"),
        precision=mean("precision"),
        tokens_kept=mean("tokens_kept"),
        p50_ms=percentile_ms(wall, 50),
        p99_ms=percentile_ms(wall, 99),
        qps_per_core=n / cpu_s if cpu_s > 0 else 0.0,
        qps=n / total_wall if total_wall > 0 else 0.0,
        gold_recall=mean("gold_recall"),
        searches=mean("searches"),
        questions=n,
    )


def evaluate_policy(
    env: ContextEnv,
    policy: ContextPolicy,
    questions: Sequence[Question],
    progress: EvalProgress | None = None,
) -> PolicyResult:
    """Play every question with ``policy``; each timed on the wall clock, all on the CPU."""
    infos: list[dict[str, Any]] = []
    wall: list[float] = []
    cpu_start = time.process_time()
    for done, question in enumerate(questions, 1):
        started = time.perf_counter()
        infos.append(run_episode(env, policy, question))
        wall.append(time.perf_counter() - started)
        if progress is not None:
            progress(policy.name, done, len(questions))
    return summarise(infos, wall, time.process_time() - cpu_start)


def report_json(
    results: dict[str, PolicyResult],
    index: IndexReport,
    absent: dict[str, str],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The benchmark's JSON: ``policies`` (figures rounded), ``index``, the policies that
    could not run with why (``absent``) and the settings."""
    policies = {
        name: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(r).items()}
        for name, r in results.items()
    }
    return {
        "policies": policies,
        "index": {
            k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(index).items()
        },
        "absent": absent,
        "settings": settings,
    }
