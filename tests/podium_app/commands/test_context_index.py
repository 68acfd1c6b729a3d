"""``podium context index``: builds an index from docs directories and prints its figures;
an unreadable document or a dead Chroma server is named and leaves --out as it was."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from podium.context.index import ContextIndex
from podium_app.cli import main

DOCS = Path(__file__).resolve().parents[2] / "podium" / "context" / "fixtures" / "b-docs"


def test_indexes_docs_and_prints_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "index"
    argv = ["context", "index", "--docs", str(DOCS / "man"), str(DOCS / "web"), "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    index = ContextIndex.open(out)
    stats = index.stats()
    assert f"documents: 3  chunks: {stats.chunks}" in captured.out
    assert f"({stats.bytes} bytes)" in captured.out and "build: " in captured.out
    assert "embedding chunks" in captured.err  # progress, one line per phase off a terminal
    assert index.bm25("sigprocmask", 1)[0].chunk.source == "page.html"

    assert main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["documents"] == 3 and summary["chunks"] == stats.chunks
    assert summary["path"] == str(out) and summary["chroma_url"] is None


def test_an_unreadable_document_is_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS / "web", docs)
    (docs / "bad.1.gz").write_bytes(b"not gzip at all")
    out = tmp_path / "index"
    assert main(["context", "index", "--docs", str(docs), "--out", str(out)]) == 1
    assert str(docs / "bad.1.gz") in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]

    argv = ["context", "index", "--docs", str(docs), "--out", str(out), "--skip-unreadable"]
    assert main(argv) == 0
    assert "skipped: bad.1.gz: cannot read document" in capsys.readouterr().out


def test_a_dead_chroma_server_and_missing_docs_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    out = tmp_path / "index"
    argv = ["context", "index", "--docs", str(DOCS / "web"), "--out", str(out), "--chroma", url]
    assert main(argv) == 1
    assert f"Chroma server {url} is unavailable" in capsys.readouterr().err
    assert not out.exists()
    assert main(["context", "index", "--docs", str(tmp_path / "none"), "--out", str(out)]) == 2
    assert "--docs: not a directory" in capsys.readouterr().err


def test_index_and_bench_share_one_docs_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--docs`` is defined once: same help, type and check in both commands."""
    import argparse

    from podium_app.commands import bench_context, context

    def docs_action(add: Callable[[argparse.ArgumentParser], None]) -> argparse.Action:
        parser = argparse.ArgumentParser()
        add(parser)
        return next(a for a in parser._actions if "--docs" in a.option_strings)

    index_docs = docs_action(context.add_arguments)
    bench_docs = docs_action(bench_context.add_arguments)
    fields = ("help", "type", "nargs", "required", "metavar")
    assert [getattr(index_docs, f) for f in fields] == [getattr(bench_docs, f) for f in fields]

    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory")
    questions = tmp_path / "q.jsonl"
    questions.write_text("{}\n")
    out = tmp_path / "out"
    assert main(["context", "index", "--docs", str(DOCS), str(a_file), "--out", str(out)]) == 2
    index_err = capsys.readouterr().err
    bench = ["bench", "context", "--docs", str(DOCS), str(a_file), "--questions", str(questions)]
    assert main([*bench, "--budget", "100", "--json", str(out)]) == 2
    bench_err = capsys.readouterr().err
    expected = f"--docs: not a directory: {a_file}"
    assert expected in index_err and expected in bench_err
    assert not out.exists()
