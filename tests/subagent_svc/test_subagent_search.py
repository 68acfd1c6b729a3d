"""subagent_svc running the real search sub-agents (``bm25-search``, ``read-chunk``) named in
the pool spec: a real index over small documents, a search's hits feeding a read through the
dependency outputs, real wall-clock times and tool calls in the results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium import codec, topics
from podium.bus import EventPublisher, InProcBus, Subscriber
from podium.context.index import ContextIndex
from podium.v1 import subtask_pb2, task_pb2
from subagent_svc import SubagentApp, SubagentConfig

DOCS = {
    "strings.md": "# strlen\n\nstrlen computes the length of a string, not counting the "
    "terminating null byte.\n",
    "signals.md": "# sigprocmask\n\nsigprocmask examines and changes the blocked signals of "
    "the calling thread.\n",
    "files.md": "# open\n\nopen opens the file named by pathname and returns a file descriptor.\n",
}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = tmp_path_factory.mktemp("docs")
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    out = tmp_path_factory.mktemp("index") / "i"
    ContextIndex.build([docs], out)
    return out


def pool(index: Path) -> str:
    profile = "{speed: 1.0, success: 0.95, noise: 0.1}"
    return f"""
agents:
  - name: bm25
    kinds: {{search: {profile}}}
    runner: plugin
    plugin: bm25-search
    options: {{index: "{index}", k: 2}}
  - name: reader
    kinds: {{read: {profile}}}
    runner: plugin
    plugin: read-chunk
    options: {{index: "{index}"}}
"""


def assigned(
    n: int, agent: str, kind: str, description: str, deps: dict[str, str]
) -> subtask_pb2.SubtaskAssigned:
    return subtask_pb2.SubtaskAssigned(
        session_id="search",
        execution_id=f"search.{n}",
        subtask_id=f"s{n}",
        kind=kind,
        agent=agent,
        attempt=1,
        split_k=1,
        context=subtask_pb2.ExecutionContext(
            subtask=task_pb2.SubtaskSpec(id=f"s{n}", kind=kind, work=1.0, description=description),
            dependency_results=[
                subtask_pb2.DependencyResult(subtask_id=k, output=v) for k, v in deps.items()
            ],
        ),
        sim_time=0.5,
        seed=n,
    )


async def run(
    publisher: EventPublisher, reader: Subscriber, a: subtask_pb2.SubtaskAssigned
) -> subtask_pb2.SubtaskResult:
    await publisher.publish(topics.SUBTASKS_ASSIGNED, a, key=a.execution_id)
    for _ in range(200):
        for record in await reader.fetch(timeout_s=0.05):
            _, result = codec.decode_event(record.value, subtask_pb2.SubtaskResult)
            if result.execution_id == a.execution_id:
                return result
    raise AssertionError(f"no result for {a.execution_id}")


async def test_a_search_then_a_read_through_the_worker(
    inproc_bus: InProcBus, index_dir: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "pool.yaml"
    spec.write_text(pool(index_dir))
    worker = SubagentApp(
        SubagentConfig(bus_url="embedded", group_id="search", pool_spec=str(spec)), inproc_bus
    )
    reader = inproc_bus.subscriber([topics.SUBTASK_RESULTS], "search.reader")
    await reader.start()
    await worker.start()
    publisher = EventPublisher(inproc_bus, producer_name="search-test")
    try:
        search = assigned(1, "bm25", "search", "length of a string", {})
        found = await run(publisher, reader, search)
        hits = json.loads(found.output)["hits"]
        read = assigned(2, "reader", "read", hits[0]["id"], {"s1": found.output})
        chunk = await run(publisher, reader, read)
    finally:
        await worker.stop()
        await reader.stop()
    assert found.outcome == subtask_pb2.OUTCOME_SUCCESS and found.runner == "plugin"
    # k: 2 from the options, as text; BM25 answers only the chunks that share a term.
    assert 1 <= len(hits) <= 2 and hits[0]["rank"] == 0 and hits[0]["source"] == "strings.md"
    (call,) = found.tool_calls
    assert call.name == "bm25.search" and found.wall_start <= call.started_at
    assert call.ended_at <= found.wall_end
    assert found.start_time >= 0.5
    assert found.end_time - found.start_time == pytest.approx(found.wall_end - found.wall_start)

    assert chunk.outcome == subtask_pb2.OUTCOME_SUCCESS
    text = json.loads(chunk.output)
    assert text["id"] == hits[0]["id"] and "strlen computes the length" in text["text"]
    # The read was given the search's output, and its result says so.
    assert chunk.context.dependency_results[0].output == found.output
    assert worker.plugins == {}  # closed at stop
