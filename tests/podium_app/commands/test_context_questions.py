"""``podium context questions``: splits written, counts printed, bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.context.questions import load_questions
from podium_app.cli import main

FIXTURES = Path(__file__).parents[2] / "podium" / "context" / "fixtures" / "c-docs"
DOCS = [str(FIXTURES / "python"), str(FIXTURES / "man")]


def test_writes_every_split_and_reports_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q"
    assert main(["context", "questions", "--docs", *DOCS, "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["documents"] == 6  # creat.2 only sources open.2
    loaded = {s: load_questions(out / f"{s}.jsonl") for s in ("train", "validation", "held-out")}
    assert sum(len(q) for q in loaded.values()) == sum(
        sum(row.values()) for row in report["counts"].values()
    )
    assert report["counts"]["header"]["train"] == sum(
        1 for q in loaded["train"] if q.kind == "header"
    )


def test_kinds_and_cap_are_applied(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["context", "questions", "--docs", *DOCS, "--out", str(tmp_path), "--json"]
    assert main([*argv, "--kinds", "header", "--max-per-document", "1"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert sum(counts["header"].values()) == 2  # open(2) and lseek(2), one each
    assert all(sum(counts[k].values()) == 0 for k in counts if k != "header")


def test_bad_arguments_exit_2_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["context", "questions", "--out", str(tmp_path)]
    assert main([*argv, "--docs", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main([*argv, "--docs", *DOCS, "--held-out-percent", "95"]) == 2
    assert "held_out_percent" in capsys.readouterr().err
    assert not (tmp_path / "train.jsonl").exists()


def test_unreadable_document_exits_1_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs"
    (docs / "man1").mkdir(parents=True)
    (docs / "man1" / "broken.1.gz").write_bytes(b"not gzip at all")
    out = tmp_path / "out"
    assert main(["context", "questions", "--docs", str(docs), "--out", str(out)]) == 1
    assert "broken.1.gz" in capsys.readouterr().err
    assert not out.exists()
