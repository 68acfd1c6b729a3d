"""Wide-search tasks: their shape, the shipped pool pointed at an index, the RRF merge
plug-in, and the subtasks run one after another on the real search plug-ins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.context.index import ContextIndex
from podium.context.questions import GoldSpan, Question
from podium.context.wide import (
    LEXICAL,
    MERGE,
    MERGE_ID,
    SEMANTIC,
    MergeAgent,
    fuse,
    make_merge,
    request_of,
    run_direct,
    task_text,
    wide_pool,
    wide_task,
    wide_tasks,
)
from podium.envs.swarm.spec import parse_task
from podium.errors import ConfigError, PluginError
from podium.subagents import load_subagent

DOCS = Path(__file__).parent / "fixtures" / "c-docs"
GOLD = (GoldSpan("x", 0, 1),)


def question(i: int, text: str) -> Question:
    return Question(f"q{i}", text, GOLD)


def test_a_wide_task_searches_each_sub_question_twice_then_merges() -> None:
    task = wide_task(
        [question(0, "Which header declares lseek()?"), question(1, "What is\nos?")], "w"
    )
    ids = [s.id for s in task.subtasks]
    assert ids == ["q00.bm25", "q00.dense", "q01.bm25", "q01.dense", MERGE_ID]
    assert [s.kind for s in task.subtasks] == [LEXICAL, SEMANTIC, LEXICAL, SEMANTIC, MERGE]
    assert task.subtasks[2].description == "What is os?"  # one line: it is a query
    assert task.subtasks[-1].deps == tuple(ids[:-1]) and task.max_parallel == 4
    assert parse_task(json.loads(task_text(task))) == task  # what SubmitTask carries


def test_wide_tasks_take_questions_in_order_and_refuse_too_few() -> None:
    qs = [question(i, f"question {i}") for i in range(7)]
    tasks = wide_tasks(qs, 3, 2)
    assert [t.name for t in tasks] == ["wide-000", "wide-001"]
    assert tasks[1].subtasks[0].description == "question 3"
    with pytest.raises(ConfigError, match="need 9 questions, the file has 7"):
        wide_tasks(qs, 3, 3)
    with pytest.raises(ConfigError, match="at least one sub-question"):
        wide_task([], "empty")


def test_the_shipped_pool_is_pointed_at_the_index() -> None:
    pool = wide_pool("/srv/idx", chroma_url="http://h:1", k=7, width=5)
    by_name = {a.name: a.runner for a in pool.agents}
    assert by_name["bm25"].plugin == "bm25-search" and by_name["dense"].plugin == "dense-search"
    shipped = {"index": "/srv/idx", "chroma_url": "http://h:1", "k": "7", "processes": "auto"}
    assert by_name["bm25"].options == shipped and by_name["dense"].options == shipped
    in_process = wide_pool("/srv/idx", processes="0")
    assert {a.runner.options.get("processes") for a in in_process.agents} == {"0", None}
    assert by_name["merger"].options == {"k": "5"} and pool.max_parallel == 10
    assert {a.name: sorted(a.kinds) for a in pool.agents} == {
        "bm25": [LEXICAL],
        "dense": [SEMANTIC],
        "merger": [MERGE],
    }


def search_output(query: str, ids: list[str]) -> str:
    hits = [{"id": c, "rank": r} for r, c in enumerate(ids)]
    return json.dumps({"retriever": "bm25", "query": query, "hits": hits})


def test_fuse_ranks_by_reciprocal_rank_fusion_per_query() -> None:
    outputs = {
        "q00.bm25": search_output("a", ["x", "y", "z"]),
        "q00.dense": search_output("a", ["y", "w"]),
        "q01.bm25": search_output("b", ["p"]),
    }
    assert fuse(outputs, 2) == [{"query": "a", "hits": ["y", "x"]}, {"query": "b", "hits": ["p"]}]
    with pytest.raises(ValueError, match=r"q02\.dense: not a search agent.s output"):
        fuse({"q02.dense": "{}"}, 2)


async def test_the_merge_plug_in_reports_fused_hits_or_names_a_bad_input() -> None:
    agent = load_subagent("wide-merge", {"k": "1"})
    assert isinstance(agent, MergeAgent) and agent.k == 1
    task = wide_task([question(0, "a")], "w")
    merge = task.subtasks[-1]
    outputs = {"q00.bm25": search_output("a", ["x", "y"]), "q00.dense": search_output("a", ["y"])}
    report = await agent.execute(request_of(task, merge, "merger", outputs))
    assert report.success and json.loads(report.output) == {
        "answers": [{"query": "a", "hits": ["y"]}]
    }
    (call,) = report.tool_calls
    assert call.name == "rrf.merge" and call.ok and call.started_at <= call.ended_at
    bad = await agent.execute(request_of(task, merge, "merger", {**outputs, "q00.dense": "oops"}))
    assert not bad.success and "q00.dense" in bad.error
    with pytest.raises(PluginError, match="unknown option"):
        make_merge({"index": "/x"})
    with pytest.raises(PluginError, match="positive integer"):
        make_merge({"k": "0"})


async def test_run_direct_runs_the_real_search_plug_ins_one_after_another(tmp_path: Path) -> None:
    index = tmp_path / "index"
    ContextIndex.build([DOCS / "python", DOCS / "man"], index)
    pool = wide_pool(index, k=3, width=2, processes="0")  # worker processes: test_search_agents
    agents = {a.name: load_subagent(a.runner.plugin, a.runner.options) for a in pool.agents}
    by_kind = {kind: a.name for a in pool.agents for kind in a.kinds}
    qs = [question(0, "Which header declares lseek()?"), question(1, "What does EACCES mean?")]
    task = wide_task(qs, "w")
    try:
        outputs = await run_direct(task, agents, by_kind)
    finally:
        for agent in agents.values():
            await agent.close()
    assert json.loads(outputs["q00.dense"])["retriever"] == "dense"
    answers = json.loads(outputs[MERGE_ID])["answers"]
    assert [a["query"] for a in answers] == [q.question for q in qs]
    assert any("lseek" in hit for hit in answers[0]["hits"])
    empty = wide_task([question(0, " ")], "blank")
    agents = {"bm25": load_subagent("bm25-search", {"index": str(index)})}
    with pytest.raises(PluginError, match=r"blank: q00\.bm25 on bm25 failed: .*empty"):
        await run_direct(empty, agents, by_kind)
