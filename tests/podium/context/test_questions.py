"""Question files: the JSONL format loads, round-trips and rejects bad lines by file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.context.questions import GoldSpan, Question, load_questions, write_questions
from podium.errors import QuestionFileError

GOOD = {
    "id": "q1",
    "question": "Which header declares open()?",
    "gold": [{"source": "man2/open.2.gz", "start": 10, "end": 42}],
}


def write_lines(tmp_path: Path, *objects: object) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text(
        "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects),
        encoding="utf-8",
    )
    return path


def test_loads_a_question_with_its_gold(tmp_path: Path) -> None:
    path = write_lines(tmp_path, GOOD, "", {**GOOD, "id": "q2"})
    questions = load_questions(path)
    assert [q.id for q in questions] == ["q1", "q2"]
    assert questions[0].gold == (GoldSpan("man2/open.2.gz", 10, 42),)
    assert questions[0].question == "Which header declares open()?"


def test_round_trip_keeps_optional_and_unknown_keys(tmp_path: Path) -> None:
    line = {**GOOD, "kind": "header", "answer": "<fcntl.h>", "difficulty": 3}
    first = load_questions(write_lines(tmp_path, line))
    out = tmp_path / "again.jsonl"
    assert write_questions(out, first) == 1
    again = load_questions(out)
    assert again == first
    assert json.loads(out.read_text(encoding="utf-8")) == line


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ({**GOOD, "id": ""}, "'id' must be a non-empty string"),
        ({k: v for k, v in GOOD.items() if k != "question"}, "'question'"),
        ({**GOOD, "gold": []}, "'gold' must be a non-empty list"),
        ({**GOOD, "gold": ["x"]}, "gold[0]: must be an object"),
        ({**GOOD, "gold": [{"source": "a", "start": 5, "end": 5}]}, "'end' (5) must exceed"),
        (
            {**GOOD, "gold": [{"source": "a", "start": True, "end": 5}]},
            "'start' must be an integer",
        ),
        ({**GOOD, "gold": [{"source": "a", "start": -1, "end": 5}]}, "'start' must be an integer"),
        ({**GOOD, "gold": [{"start": 0, "end": 5}]}, "gold[0]: 'source'"),
        ({**GOOD, "kind": 7}, "'kind' must be a string"),
    ],
)
def test_bad_line_names_file_line_and_field(tmp_path: Path, line: object, words: str) -> None:
    path = write_lines(tmp_path, GOOD | {"id": "ok"}, line)
    with pytest.raises(QuestionFileError) as err:
        load_questions(path)
    assert f"{path}:2" in str(err.value)
    assert words in str(err.value)
    assert err.value.line == 2
    assert not err.value.retriable


def test_repeated_id_names_both_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path, GOOD, GOOD)
    with pytest.raises(
        QuestionFileError, match=r"q\.jsonl:2: id 'q1' repeats the question of line 1"
    ):
        load_questions(path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(QuestionFileError, match="cannot read question file"):
        load_questions(tmp_path / "nope.jsonl")


def test_writing_a_repeated_id_fails_before_touching_the_file(tmp_path: Path) -> None:
    q = Question("a", "why?", (GoldSpan("s", 0, 1),))
    out = tmp_path / "out.jsonl"
    with pytest.raises(QuestionFileError, match="written twice"):
        write_questions(out, [q, q])
    assert not out.exists()
