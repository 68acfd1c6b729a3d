"""Scoring a kept context against a question's gold spans: pure interval arithmetic.

A kept chunk *hits* when it shares a character with a gold span of the same document (half-
open ranges ``[start, end)`` in the decoded text's coordinates, the same for chunks and
gold). **Answer found** (the Context-1 criterion) means some kept chunk hits; **precision**
is the fraction of kept chunks that hit; **gold recall** the fraction of gold spans some kept
chunk covers (1.0 only when a two-hop question has both of its pages). Tokens are counted
with the one counter, :func:`podium.tokens.count_tokens`, so budgets and scores agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from podium.context.corpus import Chunk
from podium.context.questions import GoldSpan
from podium.tokens import count_tokens


class Located(Protocol):
    """Anything with a place in a document: a :class:`~podium.context.corpus.Chunk`, or a
    recorded keep step (:class:`~podium.rewards.context.ContextStep`), so the reward can
    re-score a trajectory from what it records."""

    @property
    def source(self) -> str: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


def hits(chunk: Located, gold: Sequence[GoldSpan]) -> bool:
    """Whether ``chunk`` overlaps some gold span of its own document."""
    return any(g.overlaps(chunk.source, chunk.start, chunk.end) for g in gold)


def answer_found(kept: Sequence[Located], gold: Sequence[GoldSpan]) -> bool:
    """Whether some kept chunk overlaps a gold span (the Context-1 success criterion)."""
    return any(hits(c, gold) for c in kept)


def precision(kept: Sequence[Located], gold: Sequence[GoldSpan]) -> float:
    """Fraction of kept chunks that overlap a gold span; 0.0 for an empty context (keeping
    nothing is not precise, it is empty)."""
    if not kept:
        return 0.0
    return sum(1 for c in kept if hits(c, gold)) / len(kept)


def gold_recall(kept: Sequence[Located], gold: Sequence[GoldSpan]) -> float:
    """Fraction of gold spans some kept chunk overlaps (1.0 with no gold: nothing to find)."""
    if not gold:
        return 1.0
    return sum(1 for g in gold if any(g.overlaps(c.source, c.start, c.end) for c in kept)) / len(
        gold
    )


def tokens(kept: Sequence[Chunk]) -> int:
    """Tokens of the kept context (:func:`~podium.tokens.count_tokens` of each chunk)."""
    return sum(count_tokens(c.text) for c in kept)


@dataclass(frozen=True, slots=True)
class ContextScore:
    """Every measure of one kept context."""

    answer_found: bool
    """Some kept chunk overlaps a gold span."""
    precision: float
    """Fraction of kept chunks overlapping a gold span."""
    gold_recall: float
    """Fraction of gold spans covered."""
    tokens_kept: int
    """Tokens of the kept chunks."""
    chunks_kept: int
    """Number of kept chunks."""


def score_context(kept: Sequence[Chunk], gold: Sequence[GoldSpan]) -> ContextScore:
    """All of the above at once (what the environment reports at finish and the bench sums)."""
    return ContextScore(
        answer_found=answer_found(kept, gold),
        precision=precision(kept, gold),
        gold_recall=gold_recall(kept, gold),
        tokens_kept=tokens(kept),
        chunks_kept=len(kept),
    )
