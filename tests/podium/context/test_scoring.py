"""Scoring a kept context: half-open overlap with gold spans of the same document."""

from __future__ import annotations

import pytest

from podium.context.corpus import Chunk
from podium.context.questions import GoldSpan
from podium.context.scoring import (
    answer_found,
    gold_recall,
    hits,
    precision,
    score_context,
    tokens,
)
from podium.tokens import count_tokens

GOLD = (GoldSpan("man2/open.2.gz", 100, 200), GoldSpan("man2/lseek.2.gz", 0, 50))


def chunk(source: str, start: int, end: int, text: str = "a b c") -> Chunk:
    return Chunk(id=f"{source}#{start}", source=source, start=start, end=end, text=text)


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [(0, 100, False), (0, 101, True), (199, 300, True), (200, 300, False), (120, 130, True)],
)
def test_overlap_is_half_open(start: int, end: int, expected: bool) -> None:
    assert hits(chunk("man2/open.2.gz", start, end), GOLD) is expected


def test_same_offsets_in_another_document_do_not_hit() -> None:
    assert not answer_found([chunk("man2/close.2.gz", 100, 200)], GOLD)


def test_precision_recall_and_found() -> None:
    kept = [chunk("man2/open.2.gz", 150, 250), chunk("man3/x.3.gz", 0, 10), chunk("a", 0, 1)]
    assert answer_found(kept, GOLD)
    assert precision(kept, GOLD) == pytest.approx(1 / 3)
    assert gold_recall(kept, GOLD) == pytest.approx(0.5)
    both = [*kept, chunk("man2/lseek.2.gz", 40, 60)]
    assert gold_recall(both, GOLD) == 1.0


def test_empty_context_finds_nothing_and_is_not_precise() -> None:
    assert not answer_found([], GOLD)
    assert precision([], GOLD) == 0.0
    assert gold_recall([], GOLD) == 0.0


def test_tokens_use_the_one_counter() -> None:
    kept = [chunk("a", 0, 1, "os.path(x) is"), chunk("b", 0, 1, "two words")]
    assert tokens(kept) == count_tokens("os.path(x) is") + count_tokens("two words") == 9
    score = score_context(kept, GOLD)
    assert (score.answer_found, score.tokens_kept, score.chunks_kept) == (False, 9, 2)
