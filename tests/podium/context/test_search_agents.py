"""The search sub-agents as plug-ins: loaded by name, real searches, timed tool calls, JSON
outputs a dependent can read, failures as reports."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from process_helpers import gone_within

from podium.context.index import ContextIndex
from podium.context.search_agents import SearchAgent
from podium.errors import PluginError, WorkerError
from podium.subagents import ExecutionRequest, SubAgent, load_subagent, registered
from podium.v1 import subtask_pb2, task_pb2

DOCS = Path(__file__).parent / "fixtures" / "b-docs"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> ContextIndex:
    return ContextIndex.build([DOCS / "man", DOCS / "web"], tmp_path_factory.mktemp("agents") / "i")


def request(description: str, subtask: str = "q1") -> ExecutionRequest:
    spec = task_pb2.SubtaskSpec(id=subtask, kind="search", description=description)
    return ExecutionRequest(
        session_id="s1",
        execution_id=f"e-{subtask}",
        subtask_id=subtask,
        kind="search",
        agent="searcher",
        attempt=1,
        description=description,
        dependency_outputs={},
        context=subtask_pb2.ExecutionContext(subtask=spec),
    )


def agent(plugin: str, index: ContextIndex, **options: str) -> SubAgent:
    return load_subagent(plugin, {"index": str(index.path), **options})


def test_the_three_agents_are_registered() -> None:
    assert {"bm25-search", "dense-search", "read-chunk"} <= set(registered())


@pytest.mark.parametrize("plugin", ["bm25-search", "dense-search"])
async def test_search_agents_answer_with_located_hits_and_a_timed_call(
    plugin: str, index: ContextIndex
) -> None:
    searcher = agent(plugin, index, k="3")
    before = time.time()
    report = await searcher.execute(request("calculate the length of a string"))
    after = time.time()
    await searcher.close()
    assert report.success and report.error == ""
    out = json.loads(report.output)
    retriever = plugin.split("-")[0]
    assert out["retriever"] == retriever and out["query"] == "calculate the length of a string"
    assert len(out["hits"]) == 3 and [h["rank"] for h in out["hits"]] == [0, 1, 2]
    top = out["hits"][0]
    chunk = index.chunk(top["id"])
    assert top["source"] == "man3/strlen.3.gz" == chunk.source
    assert (top["start"], top["end"]) == (chunk.start, chunk.end) and top["tokens"] > 0
    expected = getattr(index, retriever)("calculate the length of a string", 3)
    assert [h["id"] for h in out["hits"]] == [h.chunk.id for h in expected]
    [call] = report.tool_calls
    assert call.name == f"{retriever}.search" and call.ok
    assert json.loads(call.arguments_json) == {"query": "calculate the length of a string", "k": 3}
    assert before <= call.started_at <= call.ended_at <= after
    assert len(call.result_digest) == 12


async def test_read_chunk_returns_the_chunk_a_search_found(index: ContextIndex) -> None:
    searcher, reader = agent("bm25-search", index), agent("read-chunk", index)
    found = await searcher.execute(request("sigprocmask"))
    chunk_id = json.loads(found.output)["hits"][0]["id"]
    report = await reader.execute(request(chunk_id, "read1"))
    out = json.loads(report.output)
    assert report.success and out["id"] == chunk_id
    assert out["text"] == index.chunk(chunk_id).text and "sigprocmask" in out["text"]
    assert report.tool_calls[0].name == "chunk.read"
    missing = await reader.execute(request("page.html#99", "read2"))
    assert not missing.success and "page.html#99" in missing.error
    assert missing.tool_calls[0].ok is False
    await searcher.close()
    await reader.close()


async def test_an_empty_query_is_a_failed_execution(index: ContextIndex) -> None:
    report = await agent("bm25-search", index).execute(request("   ", "blank"))
    assert not report.success and "blank" in report.error and "empty" in report.error


async def test_concurrent_searches_run_in_threads_and_all_answer(index: ContextIndex) -> None:
    searcher = agent("dense-search", index, k="2")
    queries = ["signal mask", "rollback", "string length", "Kafka consumer group"]
    reports = await asyncio.gather(
        *(searcher.execute(request(q, f"q{i}")) for i, q in enumerate(queries))
    )
    assert all(r.success for r in reports)
    assert [json.loads(r.output)["query"] for r in reports] == queries


async def test_a_dead_chroma_server_fails_dense_search_naming_it(index: ContextIndex) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    report = await agent("dense-search", index, chroma_url=url).execute(request("signals"))
    assert not report.success and url in report.error


@pytest.mark.parametrize(
    ("plugin", "options", "message"),
    [
        ("bm25-search", {}, "option 'index'"),
        ("bm25-search", {"index": "X", "colour": "red"}, "unknown option"),
        ("dense-search", {"index": "X", "k": "many"}, "option k must be a positive integer"),
        ("bm25-search", {"index": "X", "processes": "-1"}, "option processes must be"),
        ("dense-search", {"index": "X", "processes": "two"}, "option processes must be"),
        ("read-chunk", {"index": "X", "processes": "2"}, "unknown option"),
        ("read-chunk", {"index": "X", "k": "3"}, "unknown option"),
        ("read-chunk", {"index": "/nonexistent/index"}, "no context index at"),
    ],
)
def test_bad_options_are_refused_by_name(
    plugin: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(PluginError, match=message) as caught:
        load_subagent(plugin, options)
    assert plugin in str(caught.value)


# -- searches in worker processes (option processes) ----------------------------------------


def searcher_in_processes(plugin: str, index: ContextIndex, processes: str) -> SearchAgent:
    found = agent(plugin, index, k="4", processes=processes)
    assert isinstance(found, SearchAgent)
    return found


def reaped(pids: tuple[int, ...]) -> bool:
    children = {p.pid for p in multiprocessing.active_children()}
    return not any(pid in children or Path(f"/proc/{pid}").exists() for pid in pids)


@pytest.mark.parametrize("plugin", ["bm25-search", "dense-search"])
async def test_a_search_in_a_worker_process_finds_what_one_in_process_finds(
    plugin: str, index: ContextIndex
) -> None:
    queries = ["calculate the length of a string", "block signals", "rollback a deployment"]
    here, there = agent(plugin, index, k="4"), searcher_in_processes(plugin, index, "1")
    try:
        local = [json.loads((await here.execute(request(q))).output) for q in queries]
        reports = [await there.execute(request(q)) for q in queries]
        [pid] = there.worker_pids
        assert pid != os.getpid()
    finally:
        await here.close()
        await there.close()
    assert all(r.success for r in reports)
    remote = [json.loads(r.output) for r in reports]
    for mine, theirs in zip(local, remote, strict=True):
        assert [(h["id"], h["rank"], h["tokens"]) for h in theirs["hits"]] == [
            (h["id"], h["rank"], h["tokens"]) for h in mine["hits"]
        ]
        assert [h["score"] for h in theirs["hits"]] == pytest.approx(
            [h["score"] for h in mine["hits"]], abs=1e-5
        )
    [call] = reports[0].tool_calls
    assert call.name == f"{plugin.split('-')[0]}.search" and call.ok
    assert reaped((pid,))


async def test_dense_searches_waiting_for_a_worker_are_embedded_together_with_the_same_hits(
    index: ContextIndex,
) -> None:
    queries = ["signal mask", "rollback", "string length", "Kafka consumer group", "sigprocmask"]
    here, there = (
        agent("dense-search", index, k="4"),
        searcher_in_processes("dense-search", index, "1"),
    )
    try:
        local = [json.loads((await here.execute(request(q))).output) for q in queries]
        reports = await asyncio.gather(
            *(there.execute(request(q, f"q{i}")) for i, q in enumerate(queries))
        )
        assert isinstance(there, SearchAgent) and there.largest_batch >= 2
    finally:
        await here.close()
        await there.close()
    for mine, report in zip(local, reports, strict=True):
        theirs = json.loads(report.output)
        assert theirs["query"] == mine["query"]
        assert [h["id"] for h in theirs["hits"]] == [h["id"] for h in mine["hits"]]
        assert [h["score"] for h in theirs["hits"]] == pytest.approx(
            [h["score"] for h in mine["hits"]], abs=1e-5
        )


async def test_a_worker_killed_mid_search_is_a_retriable_error_and_an_idle_one_is_replaced(
    index: ContextIndex,
) -> None:
    searcher = searcher_in_processes("bm25-search", index, "1")
    try:
        first = await searcher.execute(request("sigprocmask"))
        [pid] = searcher.worker_pids
        # Stopped, the worker takes the next request in and cannot answer it: it dies with the
        # search in hand, whatever the machine's load.
        os.kill(pid, signal.SIGSTOP)
        pending = asyncio.create_task(searcher.execute(request("sigprocmask", "q2")))
        await asyncio.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match=f"bm25-search: worker process {pid} died") as caught:
            await pending
        assert caught.value.retriable  # subagent_svc redelivers the assignment
        again = await searcher.execute(request("sigprocmask", "q3"))
        assert again.success and again.output == first.output
        [second] = searcher.worker_pids
        assert second != pid
        # Dead while idle, before a search reached it: the search goes to a new worker.
        os.kill(second, signal.SIGKILL)
        assert await gone_within((second,), 30)
        third = await searcher.execute(request("sigprocmask", "q4"))
        assert third.success and third.output == first.output
        assert searcher.worker_pids and second not in searcher.worker_pids
    finally:
        await searcher.close()


async def test_failures_in_a_worker_are_failed_executions_and_close_ends_every_worker(
    index: ContextIndex,
) -> None:
    searcher = searcher_in_processes("bm25-search", index, "2")
    queries = ["signal mask", "rollback", "string length", "Kafka consumer group"]
    reports = await asyncio.gather(
        *(searcher.execute(request(q, f"q{i}")) for i, q in enumerate(queries))
    )
    assert [json.loads(r.output)["query"] for r in reports] == queries
    pids = searcher.worker_pids
    assert len(pids) == 2
    blank = await searcher.execute(request("  ", "blank"))
    assert not blank.success and "empty" in blank.error
    await searcher.close()
    assert searcher.worker_pids == () and reaped(pids)
