"""Question files: the public JSONL format of the context environment's questions.

One question per line::

    {"id": "py-versionadded-0001", "question": "In which Python version was os.cpu_count added?",
     "gold": [{"source": "library/os.rst.txt", "start": 1234, "end": 1301}]}

``source`` is the document's path relative to its docs root and ``start``/``end`` are
character offsets into its decoded text (:func:`podium.context.corpus.read_document`), the
same coordinates as a :class:`~podium.context.corpus.Chunk`'s, so scoring is an interval
overlap. Optional keys written by the generator, ``kind`` (the question's family) and
``answer`` (the short answer, for people reading the file), are kept; any other key is kept
in :attr:`Question.extra` and written back, so a file read and written again loses nothing.
A malformed line is an error naming ``file:line`` and the field, never skipped: a silently
dropped question would change a benchmark's denominator.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podium.errors import QuestionFileError

KNOWN_KEYS = frozenset({"id", "question", "gold", "kind", "answer"})
"""Keys with a meaning; others travel in :attr:`Question.extra`."""


@dataclass(frozen=True, slots=True)
class GoldSpan:
    """Where an answer lies: a character range of one document."""

    source: str
    """The document's path relative to its docs root (as in ``Chunk.source``)."""
    start: int
    """First character of the span (offset into the decoded text, >= 0)."""
    end: int
    """One past the last character (> ``start``)."""

    def overlaps(self, source: str, start: int, end: int) -> bool:
        """Whether the half-open range ``[start, end)`` of ``source`` shares a character."""
        return source == self.source and start < self.end and self.start < end


@dataclass(frozen=True, slots=True)
class Question:
    """A question and the spans any correct context must include one of."""

    id: str
    """Unique within its file."""
    question: str
    """The question as a user would ask it."""
    gold: tuple[GoldSpan, ...]
    """Gold spans (at least one); a two-hop question has spans in two documents."""
    kind: str = ""
    """The family that generated it (``versionadded``, ``header``, ``errno``, ``seealso``,
    ``faq``); empty for hand-written questions."""
    answer: str = ""
    """The short answer, for people reading the file; scoring never uses it."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys of the line this format does not know, kept so nothing read is lost."""

    def to_json_dict(self) -> dict[str, Any]:
        """The JSONL object of this question (optional keys only when set)."""
        out: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "gold": [{"source": g.source, "start": g.start, "end": g.end} for g in self.gold],
        }
        if self.kind:
            out["kind"] = self.kind
        if self.answer:
            out["answer"] = self.answer
        out.update(self.extra)
        return out


def _fail(where: str, message: str, path: Path, line: int) -> QuestionFileError:
    return QuestionFileError(f"{where}: {message}", path=str(path), line=line)


def _text(obj: Mapping[str, Any], key: str, where: str, path: Path, line: int) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, f"{key!r} must be a non-empty string, got {value!r}", path, line)
    return value


def _offset(obj: Mapping[str, Any], key: str, where: str, path: Path, line: int) -> int:
    value = obj.get(key)
    # bool is an int in Python; true/false as an offset is a mistake, not 1/0.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _fail(where, f"{key!r} must be an integer >= 0, got {value!r}", path, line)
    return value


def parse_gold(value: Any, where: str, path: Path, line: int) -> tuple[GoldSpan, ...]:
    """The ``gold`` list of one line, every span checked (``start < end``)."""
    if not isinstance(value, list) or not value:
        raise _fail(where, f"'gold' must be a non-empty list of spans, got {value!r}", path, line)
    spans: list[GoldSpan] = []
    for i, item in enumerate(value):
        at = f"{where}: gold[{i}]"
        if not isinstance(item, dict):
            raise _fail(at, f"must be an object, got {item!r}", path, line)
        span = GoldSpan(
            source=_text(item, "source", at, path, line),
            start=_offset(item, "start", at, path, line),
            end=_offset(item, "end", at, path, line),
        )
        if span.end <= span.start:
            raise _fail(at, f"'end' ({span.end}) must exceed 'start' ({span.start})", path, line)
        spans.append(span)
    return tuple(spans)


def parse_question(text: str, path: Path, line: int) -> Question:
    """One JSONL line as a :class:`Question`; errors name ``path:line`` and the field."""
    where = f"{path}:{line}"
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise _fail(where, f"not valid JSON ({e})", path, line) from e
    if not isinstance(obj, dict):
        raise _fail(
            where, f"a question must be a JSON object, got {type(obj).__name__}", path, line
        )
    optional = {}
    for key in ("kind", "answer"):
        if key in obj and not isinstance(obj[key], str):
            raise _fail(where, f"{key!r} must be a string, got {obj[key]!r}", path, line)
        optional[key] = obj.get(key, "")
    return Question(
        id=_text(obj, "id", where, path, line),
        question=_text(obj, "question", where, path, line),
        gold=parse_gold(obj.get("gold"), where, path, line),
        kind=optional["kind"],
        answer=optional["answer"],
        extra={k: v for k, v in obj.items() if k not in KNOWN_KEYS},
    )


def load_questions(path: Path | str) -> list[Question]:
    """Every question of a JSONL file, in file order (blank lines allowed).

    Raises :class:`~podium.errors.QuestionFileError` for a missing or unreadable file, a
    malformed line (naming ``file:line`` and the field) or a repeated id (naming both lines).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise QuestionFileError(f"{path}: cannot read question file ({e})", path=str(path)) from e
    questions: list[Question] = []
    first_line: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        q = parse_question(text, path, number)
        if q.id in first_line:
            raise _fail(
                f"{path}:{number}",
                f"id {q.id!r} repeats the question of line {first_line[q.id]}",
                path,
                number,
            )
        first_line[q.id] = number
        questions.append(q)
    return questions


def write_questions(path: Path | str, questions: Iterable[Question]) -> int:
    """Write ``questions`` as JSONL (atomically: a temporary file renamed); returns the count.

    Ids must be unique (:class:`~podium.errors.QuestionFileError` otherwise), so whatever is
    written loads back.
    """
    path = Path(path)
    seen: set[str] = set()
    lines: list[str] = []
    for q in questions:
        if q.id in seen:
            raise QuestionFileError(f"{path}: id {q.id!r} written twice", path=str(path))
        seen.add(q.id)
        lines.append(json.dumps(q.to_json_dict(), ensure_ascii=False, sort_keys=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)
    return len(lines)


def sources_of(questions: Sequence[Question]) -> set[str]:
    """Every document some question's gold lies in."""
    return {g.source for q in questions for g in q.gold}
