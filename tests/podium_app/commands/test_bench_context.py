"""``podium bench context``: every policy measured on a real index of small real docs, the
JSON in the documented shape, the index reused when it matches, bad input named; and the
wide-search tasks through the swarm (orchestrator_svc and subagent_svc on the in-process bus,
the real search plug-ins), in parallel and one after another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from podium.context.env import ACTIONS, OBSERVATION_FEATURES, ContextEnv, ContextEnvConfig
from podium.context.generate import all_questions, generate
from podium.context.heuristics import BASELINES, run_episode
from podium.context.index import ContextIndex
from podium.context.learned import save_learned_policy
from podium.context.questions import GoldSpan, Question, load_questions, write_questions
from podium.procpool import resolve_processes
from podium.rl.networks import ActorCritic
from podium_app.bench_context import measure_wide, most_at_once
from podium_app.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "podium" / "context" / "fixtures" / "c-docs"
ROOTS = [FIXTURES / "python", FIXTURES / "man"]
FIGURES = {"answer_found", "precision", "tokens_kept", "p50_ms", "p99_ms", "qps_per_core"}


@pytest.fixture(scope="module")
def questions_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("q") / "questions.jsonl"
    write_questions(path, list(all_questions(generate(ROOTS)))[:12])
    return path


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("idx") / "index"
    ContextIndex.build(ROOTS, out)
    return out


def bench(questions: Path, out: Path, *extra: str) -> list[str]:
    docs = [str(r) for r in ROOTS]
    head = ["bench", "context", "--docs", *docs, "--questions", str(questions)]
    return [*head, "--budget", "300", "--k", "5", "--json", str(out), *extra]


def test_every_baseline_is_measured_and_the_index_reused(
    tmp_path: Path, questions_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, index = tmp_path / "report.json", tmp_path / "index"
    assert main(bench(questions_file, out, "--index", str(index))) == 0
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"bm25", "dense", "hybrid"}
    assert "no --checkpoint" in report["absent"]["learned"]
    assert "learned" in capsys.readouterr().err
    for figures in report["policies"].values():
        assert set(figures) >= FIGURES
        assert 0 <= figures["answer_found"] <= 1 and 0 <= figures["precision"] <= 1
        assert 0 < figures["tokens_kept"] <= 300 and 0 < figures["p50_ms"] <= figures["p99_ms"]
        assert figures["qps_per_core"] > 0 and figures["questions"] == 12
    built = report["index"]
    assert built["reused"] is False and built["build_s"] > 0 and built["bytes"] > 0

    # The same figures as playing the baselines directly (the benchmark adds only timing).
    opened = ContextIndex.open(index)
    questions = load_questions(questions_file)
    env = ContextEnv(opened, questions, ContextEnvConfig(budget_tokens=300, top_k=5))
    for policy in BASELINES:
        found = [run_episode(env, policy, q)["answer_found"] for q in questions]
        assert report["policies"][policy.name]["answer_found"] == round(sum(found) / 12, 4)

    assert main(bench(questions_file, out, "--index", str(index))) == 0
    again = json.loads(out.read_text())
    assert again["index"]["reused"] is True and again["index"]["build_s"] == built["build_s"]
    assert (
        again["policies"]["hybrid"]["answer_found"] == report["policies"]["hybrid"]["answer_found"]
    )


def test_the_learned_agent_is_measured_from_its_checkpoint(
    tmp_path: Path, questions_file: Path, index_dir: Path
) -> None:
    torch.manual_seed(0)
    ref = save_learned_policy(
        ActorCritic(len(OBSERVATION_FEATURES), ACTIONS.size),
        OBSERVATION_FEATURES,
        tmp_path,
        "ctx",
        1,
    )
    out = tmp_path / "report.json"
    argv = bench(questions_file, out, "--index", str(index_dir), "--checkpoint", str(ref.path))
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"bm25", "dense", "hybrid", "learned"}
    assert report["absent"] == {} and report["index"]["reused"] is True


def test_bad_input_is_named(
    tmp_path: Path, questions_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    assert main(bench(tmp_path / "none.jsonl", out)) == 2
    assert "none.jsonl" in capsys.readouterr().err

    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text(questions_file.read_text().splitlines()[0] + "\n{not json\n")
    assert main(bench(malformed, out)) == 2
    assert "malformed.jsonl:2" in capsys.readouterr().err

    elsewhere = tmp_path / "elsewhere.jsonl"
    gold = (GoldSpan("man9/nowhere.9", 0, 10),)
    write_questions(elsewhere, [Question("q-away", "Where is nowhere?", gold)])
    assert main(bench(elsewhere, out)) == 2
    err = capsys.readouterr().err
    assert "q-away" in err and "man9/nowhere.9" in err and "not a document under --docs" in err

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(bench(empty, out)) == 2
    assert "empty.jsonl: no questions" in capsys.readouterr().err
    assert main(bench(questions_file, out, "--wide", "4", "--wide-tasks", "3")) == 2
    assert "needs 16 questions, it has 12" in capsys.readouterr().err

    argv = bench(questions_file, out)
    argv[argv.index("--docs") + 1] = str(tmp_path / "missing-docs")
    assert main(argv) == 2
    assert "missing-docs" in capsys.readouterr().err
    assert not out.exists()  # nothing measured, nothing written


def test_wide_search_runs_its_searches_at_once_through_the_swarm(
    index_dir: Path, questions_file: Path
) -> None:
    index = ContextIndex.open(index_dir)
    wide = measure_wide(index, load_questions(questions_file), width=3, count=1, k=5)
    # Six searches (a BM25 and a dense one per sub-question) were started at once, so
    # several ran side by side (how many overlap depends on how fast each ends); one after
    # another, never more than one at a time.
    assert wide["peak_parallelism"]["parallel"] >= 2
    assert wide["peak_parallelism"]["sequential"] == 1
    # And they really ran at once on the wall clock: orchestrator_svc schedules real agents as
    # their results arrive instead of waiting for every running result before each decision.
    assert wide["wall_parallelism"]["parallel"] >= 2
    assert wide["wall_parallelism"]["sequential"] == 1
    assert wide["parallel_s"] > 0 and wide["sequential_s"] > 0 and wide["direct_s"] > 0
    assert wide["speedup"] == pytest.approx(wide["sequential_s"] / wide["parallel_s"], rel=1e-2)
    # The shipped pool's searches ran in worker processes (processes: auto).
    workers = resolve_processes("auto")
    assert wide["search_processes"] == {"bm25": workers, "dense": workers}


def test_most_at_once_counts_spans_open_at_one_instant() -> None:
    assert most_at_once([]) == 0
    assert most_at_once([(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]) == 1  # back to back
    assert most_at_once([(0.0, 3.0), (1.0, 2.0), (1.5, 4.0), (3.5, 5.0)]) == 3
