"""The search indexes: BM25 and dense (Chroma, embedded and a real server) over a real-format
corpus; atomic builds; clear errors for unreadable documents and dead servers."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from podium.context.index import ContextIndex, Hit
from podium.errors import CorpusError, IndexUnavailable

DOCS = Path(__file__).parent / "fixtures" / "b-docs"
ROOTS = [DOCS / "py", DOCS / "man", DOCS / "web"]
REPO = Path(__file__).resolve().parents[3]
QUERIES = [
    "how long is a string in bytes",
    "serialize a Python object as JSON to a file",
    "block signals with the signal mask",
    "roll back the policy on every replica",
]


def dead_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def chroma_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Chroma server: $PODIUM_CHROMA_URL, else one started by scripts/chroma.sh."""
    given = os.environ.get("PODIUM_CHROMA_URL", "").strip()
    if given:
        yield given
        return
    state = tmp_path_factory.mktemp("chroma-state")
    env = {**os.environ, "PODIUM_CHROMA_STATE": str(state)}
    script = str(REPO / "scripts" / "chroma.sh")
    started = subprocess.run(
        ["bash", script, "start", str(state / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    try:
        yield started.stdout.strip().split("=", 1)[1]
    finally:
        subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> ContextIndex:
    return ContextIndex.build(ROOTS, tmp_path_factory.mktemp("embedded") / "index")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, chroma_url: str) -> ContextIndex:
    return ContextIndex.build(
        ROOTS, tmp_path_factory.mktemp("served") / "index", chroma_url=chroma_url
    )


def summary(hits: list[Hit]) -> list[tuple[str, int, str]]:
    return [(h.chunk.id, h.rank, h.retriever) for h in hits]


def test_build_writes_a_complete_index_that_reopens(embedded: ContextIndex) -> None:
    stats = embedded.stats()
    assert stats.documents == 4 and stats.chunks == len(embedded.chunks()) > 20
    assert stats.build_s > 0 and stats.bytes > 100_000 and stats.skipped == ()
    names = {p.name for p in embedded.path.iterdir()}
    assert {"manifest.json", "chunks.jsonl", "bm25", "chroma"} <= names
    # Nothing of the build is left beside the index.
    assert [p.name for p in embedded.path.parent.iterdir()] == ["index"]
    again = ContextIndex.open(embedded.path)
    assert again.chunks() == embedded.chunks()
    assert summary(again.dense(QUERIES[0], 3)) == summary(embedded.dense(QUERIES[0], 3))
    first = embedded.chunks()[0]
    assert embedded.chunk(first.id) == first


def test_bm25_and_dense_find_the_right_documents(embedded: ContextIndex) -> None:
    expected = ["man3/strlen.3.gz", "library/json.rst.txt", "page.html", "guide.md"]
    for query, source in zip(QUERIES, expected, strict=True):
        for hits in (embedded.bm25(query, 5), embedded.dense(query, 5)):
            assert hits and hits[0].chunk.source == source, (query, summary(hits))
            assert [h.rank for h in hits] == list(range(len(hits)))
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert {h.retriever for h in embedded.bm25(QUERIES[0], 3)} == {"bm25"}
    assert all(-1.0 <= h.score <= 1.0 for h in embedded.dense(QUERIES[1], 5))


def test_results_are_deterministic(embedded: ContextIndex) -> None:
    for query in QUERIES:
        assert embedded.bm25(query, 8) == embedded.bm25(query, 8)
        assert embedded.dense(query, 8) == embedded.dense(query, 8)


def test_bm25_without_a_known_term_finds_nothing_and_k_is_checked(
    embedded: ContextIndex,
) -> None:
    assert embedded.bm25("zyzzyva qwxptl", 5) == []
    assert len(embedded.dense("zyzzyva qwxptl", 5)) == 5  # dense always has neighbours
    assert len(embedded.bm25("the string", 1000)) <= len(embedded.chunks())
    with pytest.raises(ValueError, match="k must be >= 1"):
        embedded.bm25("string", 0)


def test_embedded_and_server_give_the_same_results(
    embedded: ContextIndex, served: ContextIndex, chroma_url: str
) -> None:
    assert served.chroma_url == chroma_url and not (served.path / "chroma").exists()
    assert served.chunks() == embedded.chunks()
    for query in QUERIES:
        mine, theirs = embedded.dense(query, 10), served.dense(query, 10)
        assert summary(mine) == summary(theirs)
        assert [h.score for h in mine] == pytest.approx([h.score for h in theirs], abs=1e-6)
        assert served.bm25(query, 10) == embedded.bm25(query, 10)
    # Reopened without a URL, the index finds its server from its manifest.
    assert summary(ContextIndex.open(served.path).dense(QUERIES[2], 3)) == summary(
        served.dense(QUERIES[2], 3)
    )


def test_a_dead_chroma_server_names_its_url_and_leaves_nothing(tmp_path: Path) -> None:
    url = dead_url()
    with pytest.raises(IndexUnavailable, match=url) as caught:
        ContextIndex.build(ROOTS, tmp_path / "index", chroma_url=url)
    assert caught.value.retriable and caught.value.url == url
    assert list(tmp_path.iterdir()) == []


def test_a_server_that_dies_fails_queries_with_its_url(embedded: ContextIndex) -> None:
    url = dead_url()
    index = ContextIndex.open(embedded.path, chroma_url=url)
    assert index.bm25(QUERIES[0], 3)  # BM25 needs no server
    with pytest.raises(IndexUnavailable, match=url):
        index.dense(QUERIES[0], 3)


def test_an_unreadable_document_stops_the_build_and_keeps_the_previous_index(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS / "web", docs)
    out = tmp_path / "index"
    before = ContextIndex.build([docs], out)
    broken = docs / "zz-broken.3.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(CorpusError, match=str(broken)):
        ContextIndex.build([docs], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs", "index"]
    kept = ContextIndex.open(out)
    assert kept.chunks() == before.chunks() and kept.stats() == before.stats()


def test_skip_unreadable_indexes_the_rest_and_lists_what_it_skipped(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS / "web", docs)
    (docs / "zz-broken.md").write_bytes(b"# x\x00")
    index = ContextIndex.build([docs], tmp_path / "index", skip_unreadable=True)
    stats = index.stats()
    assert stats.documents == 2 and len(stats.skipped) == 1
    assert stats.skipped[0].startswith("zz-broken.md: ") and "NUL bytes" in stats.skipped[0]
    assert {c.source for c in index.chunks()} == {"guide.md", "page.html"}


def test_build_refuses_to_replace_a_directory_that_is_not_an_index(tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    with pytest.raises(CorpusError, match="refusing to replace"):
        ContextIndex.build([DOCS / "web"], out)
    assert (out / "thesis.tex").read_text() == "do not delete"


def test_open_without_an_index_and_unknown_chunks_are_clear_errors(
    tmp_path: Path, embedded: ContextIndex
) -> None:
    with pytest.raises(IndexUnavailable, match="no context index at") as caught:
        ContextIndex.open(tmp_path)
    assert not caught.value.retriable
    with pytest.raises(CorpusError, match="no chunk 'nope#3'"):
        embedded.chunk("nope#3")
