"""Question generation on trimmed real documents (python3.11-doc reST, Linux man pages)."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.context.corpus import chunk_file, iter_documents, read_document, troff_text
from podium.context.generate import (
    SPLITS,
    GenerateConfig,
    Generated,
    all_questions,
    generate,
    parse_man,
    seealso_questions,
    write_generated,
)
from podium.context.questions import Question, load_questions
from podium.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "c-docs"
ROOTS = [FIXTURES / "python", FIXTURES / "man"]


def path_of(source: str) -> Path:
    return next(root / source for root in ROOTS if (root / source).exists())


def gold_texts(q: Question) -> list[str]:
    return [read_document(path_of(g.source))[g.start : g.end] for g in q.gold]


@pytest.fixture(scope="module")
def generated() -> Generated:
    return generate(ROOTS)


@pytest.fixture(scope="module")
def by_question(generated: Generated) -> dict[str, Question]:
    return {q.question: q for q in all_questions(generated)}


def test_versionadded_under_a_function_directive(by_question: dict[str, Question]) -> None:
    q = by_question["In which Python version was os.fsencode() added?"]
    assert (q.kind, q.answer) == ("versionadded", "3.2")
    assert gold_texts(q) == [".. versionadded:: 3.2"]
    assert by_question["In which Python version was os.PathLike added?"].answer == "3.6"


def test_versionchanged_gold_holds_its_body(by_question: dict[str, Question]) -> None:
    q = by_question["What changed in os.fsencode() in Python 3.6?"]
    (text,) = gold_texts(q)
    assert text.startswith(".. versionchanged:: 3.6")
    assert text.endswith("interface.")


def test_dotted_method_is_qualified_by_its_module(by_question: dict[str, Question]) -> None:
    q = by_question["What changed in hmac.HMAC.update() in Python 3.4?"]
    assert "hashlib" in gold_texts(q)[0]


def test_faq_questions_keep_their_answer(by_question: dict[str, Question]) -> None:
    q = by_question["Are there tools to help find bugs or perform static analysis?"]
    (text,) = gold_texts(q)
    # "Yes." alone answers nothing: the gold runs through the first substantial paragraph.
    assert text.startswith("Yes.") and "Pylint" in text and "Mypy" not in text
    assert (
        "Is there a source code level debugger with breakpoints, single-stepping, etc.?"
        in by_question
    )
    # A reST comment under the heading is the editors' note, not the answer.
    (curses,) = gold_texts(by_question["Is there a curses/termcap package for Python?"])
    assert curses.startswith("For Unix variants:") and curses.endswith("Windows.)")


def test_header_question_spans_include_to_prototype(by_question: dict[str, Question]) -> None:
    for name in ("open", "creat", "openat"):
        q = by_question[f"Which header declares {name}()?"]
        (text,) = gold_texts(q)
        assert q.answer == "<fcntl.h>"
        assert text.startswith(".B #include <fcntl.h>")
        assert f"{name}(" in text.splitlines()[-1]
    assert by_question["Which header declares lseek()?"].answer == "<unistd.h>"
    assert "Which header declares openat2()?" not in by_question  # not a name of the page


def test_errno_questions_both_ways(by_question: dict[str, Question]) -> None:
    eacces = by_question["What does the error EACCES mean for open(2)?"]
    assert len(eacces.gold) == 2  # open(2) lists EACCES twice: either item answers
    assert all(t.startswith(".B EACCES") for t in gold_texts(eacces))
    q = by_question["Which error does lseek(2) fail with when: fd is not an open file descriptor?"]
    assert q.answer == "EBADF"
    assert gold_texts(q)[0].startswith(".B EBADF")


def test_seealso_is_two_hop(by_question: dict[str, Question]) -> None:
    q = by_question[
        "Which page listed under SEE ALSO in open(2) is about 'reposition read/write file offset'?"
    ]
    assert q.answer == "lseek(2)"
    link, name = gold_texts(q)
    assert link == ".BR lseek (2),"
    assert name == "lseek \\- reposition read/write file offset"
    assert [g.source for g in q.gold] == ["man2/open.2", "man2/lseek.2.gz"]


def test_redirect_pages_ask_nothing(generated: Generated) -> None:
    sources = {g.source for q in all_questions(generated) for g in q.gold}
    assert "man2/creat.2" not in sources
    assert sources <= {s for s, _ in iter_documents(ROOTS)}


def test_every_gold_span_overlaps_a_chunk_of_the_index(generated: Generated) -> None:
    """Questions and chunks share coordinates: each gold span is reachable by some chunk."""
    chunks = {s: chunk_file(s, p) for s, p in iter_documents(ROOTS)}
    for q in all_questions(generated):
        for g in q.gold:
            assert any(c.start < g.end and g.start < c.end for c in chunks[g.source]), (q, g)


def test_split_is_by_document_and_deterministic(generated: Generated) -> None:
    owner: dict[str, str] = {}
    for split, questions in generated.splits.items():
        for q in questions:
            assert owner.setdefault(q.gold[0].source, split) == split
    again = generate(ROOTS)
    assert again.splits == generated.splits
    everything = generate(ROOTS, GenerateConfig(validation_percent=0, held_out_percent=100))
    assert [len(everything.splits[s]) for s in SPLITS] == [
        0,
        0,
        len(list(all_questions(generated))),
    ]


def test_cap_per_document_spares_the_faq(generated: Generated) -> None:
    capped = generate(ROOTS, GenerateConfig(max_per_document=1))
    per: dict[tuple[str, str], int] = {}
    for q in all_questions(capped):
        per[(q.kind, q.gold[0].source)] = per.get((q.kind, q.gold[0].source), 0) + 1
    assert per[("faq", "faq/programming.rst.txt")] == 2
    assert max(n for (kind, _), n in per.items() if kind != "faq") == 1
    assert generated.counts()["header"] != capped.counts()["header"]


def test_counts_and_files(tmp_path: Path, generated: Generated) -> None:
    counts = generated.counts()
    assert {k: sum(v.values()) for k, v in counts.items()} == {
        "versionadded": 4,
        "versionchanged": 3,
        "faq": 3,
        "header": 4,
        "errno": 6,
        "seealso": 2,
    }
    paths = write_generated(tmp_path, generated)
    assert sorted(paths) == sorted(SPLITS)
    loaded = [q for s in SPLITS for q in load_questions(paths[s])]
    assert loaded == list(all_questions(generated))


@pytest.mark.parametrize(
    "config",
    [
        {"kinds": ("versionadded", "nope")},
        {"max_per_document": -1},
        {"validation_percent": 60, "held_out_percent": 50},
    ],
)
def test_bad_config_is_named(config: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        GenerateConfig(**config)  # type: ignore[arg-type]


def test_links_in_troff_comments_ask_nothing() -> None:
    """restart_syscall(2) keeps "FIXME . ppoll(2), select(2) ..." as a comment under SEE ALSO:
    a maintainer's note, not a link, whose gold would lie in no chunk."""
    lseek = parse_man("man2/lseek.2.gz", read_document(path_of("man2/lseek.2.gz")))
    head = ".TH restart_syscall 2\n.SH NAME\nrestart_syscall \\- restart a system call\n"
    noted = parse_man("a", head + '.SH SEE ALSO\n.\\" FIXME . lseek(2) should be listed\n')
    linked = parse_man("a", head + ".SH SEE ALSO\n.BR lseek (2)\n")
    assert lseek is not None and noted is not None and linked is not None
    assert seealso_questions(noted, {"lseek(2)": lseek}) == []
    assert [q.answer for q in seealso_questions(linked, {"lseek(2)": lseek})] == ["lseek(2)"]


def test_questions_read_a_man_page_as_its_chunks_do() -> None:
    """One troff reader (:func:`~podium.context.corpus.troff_text`): NAME's names and
    description, and every prototype a header question is built from, are words of the
    page's chunks, with no troff left in them."""
    source = "man2/open.2"
    text = read_document(path_of(source))
    page = parse_man(source, text)
    assert page is not None
    assert page.names == ("open", "openat", "creat")
    assert page.description == "open and possibly create a file"
    chunks = chunk_file(source, path_of(source))
    assert chunks[0].text.endswith("open, openat, creat - open and possibly create a file")
    first, end = page.sections["SYNOPSIS"]
    synopsis = [troff_text(line.text) for line in page.lines[first:end]]
    assert "int creat(const char *pathname, mode_t mode);" in synopsis
    joined = "\n".join(c.text for c in chunks)
    for words in filter(None, synopsis):
        assert words in joined and "\\f" not in words
