"""The corpus: reading documents of every format, and chunks located in the decoded text."""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import pytest

from podium.context.corpus import (
    Chunk,
    ChunkingConfig,
    chunk_document,
    chunk_file,
    document_format,
    iter_documents,
    read_document,
    troff_text,
)
from podium.errors import CorpusError
from podium.tokens import count_tokens

DOCS = Path(__file__).parent / "fixtures" / "b-docs"
JSON_DOC = DOCS / "py" / "library" / "json.rst.txt"
STRLEN = DOCS / "man" / "man3" / "strlen.3.gz"


def chunks_of(path: Path) -> list[Chunk]:
    return chunk_file(path.name, path)


def covering(chunks: list[Chunk], text: str, needle: str) -> list[Chunk]:
    """The chunks whose span in ``text`` covers the first occurrence of ``needle``."""
    at = text.index(needle)
    return [c for c in chunks if c.start <= at and at + len(needle) <= c.end]


def test_count_tokens_counts_words_and_punctuation() -> None:
    assert count_tokens("os.path(x) is") == 7
    assert count_tokens("") == 0
    assert count_tokens("naïve café") == 2


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("library/os.rst.txt", "rst"),
        ("README.md", "markdown"),
        ("index.html", "html"),
        ("printf.3.gz", "man"),
        ("openssl.1ssl.gz", "man"),
        ("notes.txt.gz", "rst"),
        ("logo.png", None),
        ("Makefile", None),
    ],
)
def test_document_format_from_the_name(name: str, fmt: str | None) -> None:
    assert document_format(name) == fmt


def test_read_document_decompresses_and_replaces_bad_utf8(tmp_path: Path) -> None:
    assert read_document(STRLEN) == gzip.decompress(STRLEN.read_bytes()).decode()
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 au lait\n")
    assert read_document(bad) == "caf\ufffd au lait\n"


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [
        ("broken.3.gz", b"\x1f\x8b\x08\x00not really gzip", "cannot read document"),
        ("truncated.3.gz", gzip.compress(b".TH X 3\nhello\n")[:-6], "cannot read document"),
        ("binary.md", b"# title\n\x00\x01\x02", "NUL bytes"),
    ],
)
def test_unreadable_documents_name_the_file(
    tmp_path: Path, name: str, data: bytes, why: str
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(CorpusError, match=why) as caught:
        read_document(path)
    assert str(path) in str(caught.value) and caught.value.path == str(path)
    assert not caught.value.retriable


def test_missing_file_is_a_corpus_error(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"gone\.md"):
        read_document(tmp_path / "gone.md")


def test_iter_documents_walks_sorted_and_skips_links_hidden_and_non_documents(
    tmp_path: Path,
) -> None:
    shutil.copytree(DOCS, tmp_path / "docs")
    root = tmp_path / "docs"
    (root / "man" / "man3" / "strlen_alias.3.gz").symlink_to("strlen.3.gz")
    (root / "web" / "logo.png").write_bytes(b"\x89PNG")
    (root / ".git").mkdir()
    (root / ".git" / "notes.md").write_text("# not docs\n")
    found = [source for source, _ in iter_documents([root])]
    assert found == [
        "man/man3/strlen.3.gz",
        "py/library/json.rst.txt",
        "web/guide.md",
        "web/page.html",
    ]


def test_iter_documents_refuses_missing_roots_and_clashing_sources(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="not a directory"):
        list(iter_documents([tmp_path / "nowhere"]))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.md").write_text("# A\n")
    (tmp_path / "b" / "x.md").write_text("# B\n")
    with pytest.raises(CorpusError, match=r"share the source name 'x\.md'"):
        list(iter_documents([tmp_path / "a", tmp_path / "b"]))


def test_rst_chunks_strip_markup_keep_versions_and_locate_the_text() -> None:
    text = read_document(JSON_DOC)
    chunks = chunks_of(JSON_DOC)
    assert [c.id for c in chunks] == [f"json.rst.txt#{i}" for i in range(len(chunks))]
    assert all(c.text.startswith("json --- JSON encoder and decoder") for c in chunks)
    for c in chunks:
        assert not re.search(r":(func|mod|class|ref):`|^\.\. |={5,}", c.text, re.M), c.text
    # A version directive becomes words a question can be answered from, in every chunk whose
    # span covers the directive itself (two here: the paragraph is repeated as the overlap).
    where = covering(chunks, text, ".. versionchanged:: 3.4")
    assert len(where) == 2 and where[0].end > where[1].start
    for chunk in where:
        assert "Changed in version 3.4." in chunk.text
        assert "Basic Usage" in chunk.text.split("\n")[0]
    [intro] = covering(chunks, text, "lightweight data interchange format")
    assert "lightweight data interchange format" in intro.text


INDEXED_FUNCTION = """\
os --- Miscellaneous interfaces
===============================

.. function:: cpu_count()

   Return the number of logical CPUs in the system.

   .. index::
      single: CPU; count
      pair: processor; count

   Returns None when the count is undetermined.

   .. index:: single: affinity

   Use len(os.sched_getaffinity(0)) for the usable ones.

.. index:: module: os

The module text after a top-level index.
"""


def test_text_after_an_indented_silent_directive_is_in_a_chunk() -> None:
    """An ``.. index::`` inside a function's description hides its own body only; the rest
    of the description (a gold span's text) is still chunked."""
    chunks = chunk_document("os.rst", INDEXED_FUNCTION, "rst")
    for needle in (
        "Returns None when the count is undetermined.",
        "Use len(os.sched_getaffinity(0)) for the usable ones.",
        "The module text after a top-level index.",
    ):
        [chunk] = covering(chunks, INDEXED_FUNCTION, needle)
        assert needle in chunk.text
    joined = "\n".join(c.text for c in chunks)
    assert (
        "single:" not in joined and "processor; count" not in joined and "module: os" not in joined
    )


def test_man_page_chunks_follow_sections_without_troff() -> None:
    text = read_document(STRLEN)
    chunks = chunks_of(STRLEN)
    heads = [c.text.split("\n")[0] for c in chunks]
    assert heads[:3] == ["strlen(3) › NAME", "strlen(3) › LIBRARY", "strlen(3) › SYNOPSIS"]
    assert chunks[0].text.endswith("strlen - calculate the length of a string")
    [synopsis] = covering(chunks, text, 'size_t strlen(const char *" s );')
    assert "size_t strlen(const char *s);" in synopsis.text
    joined = "\n".join(c.text for c in chunks)
    assert "\\f" not in joined and "\\-" not in joined and ".BR" not in joined
    assert "lbx lb lb" not in joined  # tbl's layout lines are not text
    assert "MT-Safe" in joined


@pytest.mark.parametrize(
    ("line", "words"),
    [
        # Lines of real pages (open(2), getent(1), errno(3), setenv(3)), read the same by the
        # chunker and the question generator.
        (".BR open (2),", "open(2),"),
        ('.BI "int open(const char *" pathname ", int " flags );', "int open(const char *pathname, int flags);"),
        ("open, openat, creat \\- open and possibly create a file", "open, openat, creat - open and possibly create a file"),
        (".B #include <fcntl.h>", "#include <fcntl.h>"),
        ('.SH "SEE ALSO"', "SEE ALSO"),
        ("/* Documented separately, in \\fBopenat2\\fP(2): */", "/* Documented separately, in openat2(2): */"),
        (".TP", ""),
        ('.\\" SPDX-License-Identifier: Linux-man-pages-copyleft', ""),
        ("T{", ""),
        # What the generator's own reader left as troff.
        ("contains an \\[aq]=\\[aq] character", "contains an '=' character"),
        ("For pciconfig_iobase(), \"hose\" value is NULL", 'For pciconfig_iobase(), "hose" value is NULL'),
        # What both readers got wrong: an escaped space inside an argument, a trailing comment.
        ('.BR \\-s\\ \\fIservice\\fP ", " \\-\\-service\\ \\fIservice\\fP', "-s service, --service service"),
        ('.BR errno (1), \\" In the moreutils package', "errno(1),"),
    ],
)  # fmt: skip
def test_troff_text_is_the_words_a_line_prints(line: str, words: str) -> None:
    assert troff_text(line) == words


def test_markdown_and_html_chunks() -> None:
    md = DOCS / "web" / "guide.md"
    md_chunks = chunks_of(md)
    assert [c.text.split("\n")[0] for c in md_chunks] == [
        "Deploying the Podium stack",
        "Deploying the Podium stack › Rolling back a policy",
        "Deploying the Podium stack › Scaling workers",
    ]
    assert "kustomize overlays" in md_chunks[0].text and "https://" not in md_chunks[0].text
    page = DOCS / "web" / "page.html"
    text = read_document(page)
    html_chunks = chunks_of(page)
    joined = " ".join(c.text for c in html_chunks)
    assert "do-not-index-this-script" not in joined and "<code>" not in joined
    assert "¶" not in joined and "block signals & examine" in joined
    [blocking] = covering(html_chunks, text, "<code>sigprocmask()</code> to block")
    assert blocking.text.startswith("Signal handling › Blocking signals")


def test_chunks_respect_the_token_limit_and_repeat_a_short_last_paragraph() -> None:
    paragraphs = [f"Paragraph {i} " + "word " * 12 for i in range(6)]
    text = "Title\n=====\n\n" + "\n\n".join(paragraphs) + "\n"
    config = ChunkingConfig(max_tokens=30, overlap_tokens=20)
    chunks = chunk_document("t.rst", text, "rst", config)
    bodies = [c.text.split("\n", 1)[1] for c in chunks]
    assert all(count_tokens(body) <= 30 for body in bodies)
    # 14 tokens a paragraph: two fit; the next chunk opens with the previous one's last.
    assert bodies[0].startswith("Paragraph 0") and bodies[1].startswith("Paragraph 1")
    for c in chunks:
        assert text[c.start : c.end].startswith("Paragraph")
    assert {p.split()[1] for p in paragraphs} <= {w for b in bodies for w in b.split()}
    no_overlap = chunk_document("t.rst", text, "rst", ChunkingConfig(30, 0))
    assert len(no_overlap) == 3 and len(chunks) > len(no_overlap)


def test_a_long_paragraph_is_cut_between_lines() -> None:
    text = "\n".join(f"line {i} " + "x " * 10 for i in range(20)) + "\n"
    chunks = chunk_document("long.txt", text, "rst", ChunkingConfig(50, 0))
    assert len(chunks) == 5
    assert [c.start for c in chunks] == sorted(c.start for c in chunks)
    assert chunks[0].start == 0 and chunks[-1].end == len(text) - 1


def test_chunking_settings_are_checked() -> None:
    with pytest.raises(CorpusError, match="PODIUM_CONTEXT_CHUNK_OVERLAP"):
        ChunkingConfig(max_tokens=10, overlap_tokens=10)
    with pytest.raises(CorpusError, match="PODIUM_CONTEXT_CHUNK_TOKENS"):
        ChunkingConfig(max_tokens=0, overlap_tokens=0)
