"""subagent_svc runs each agent by its pool-spec runner: simulated as before, a plug-in through
its entry point (real wall-clock times, tool calls and the exact context in the result), an
external agent not at all (its worker reads the topic in a group of its own).

On the in-process bus: a worker with this pool on the shared Kafka broker would answer other
tests' assignments too. The Kafka path with a real external worker is test_go_worker_kafka.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from podium import codec, topics
from podium.bus import EventPublisher, InProcBus, Subscriber
from podium.bus.consumer import DEFAULT_MAX_ATTEMPTS
from podium.bus.inproc import partition_for_key
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import load_pool
from podium.errors import ConfigError, IndexUnavailable, PluginError
from podium.subagents import ExecutionReport, ExecutionRequest, ToolCallRecord
from podium.subagents.reference import context_digest
from podium.v1 import subtask_pb2, task_pb2
from subagent_svc import SubagentApp, SubagentConfig
from subagent_svc.app import execute, result_event_id
from subagent_svc.runners import execution_request, plugin_result, run_plugin

POOL = """
name: mixed
agents:
  - name: qa
    kinds: {test: {speed: 1.0, success: 1.0, noise: 0.0}}
  - name: digest
    kinds: {search: {speed: 1.0, success: 0.9, noise: 0.1}}
    runner: plugin
    plugin: context-digest
  - name: outside
    kinds: {native: {speed: 1.0, success: 0.9, noise: 0.1}}
    runner: external
"""


def assignment(
    n: int, agent: str, kind: str, deps: dict[str, str] | None = None
) -> subtask_pb2.SubtaskAssigned:
    return subtask_pb2.SubtaskAssigned(
        session_id="runners",
        execution_id=f"runners.{n}",
        subtask_id=f"t{n}",
        kind=kind,
        agent=agent,
        attempt=1,
        split_k=1,
        context=subtask_pb2.ExecutionContext(
            subtask=task_pb2.SubtaskSpec(
                id=f"t{n}", kind=kind, work=2.0, description=f"find thing {n}"
            ),
            dependency_results=[
                subtask_pb2.DependencyResult(subtask_id=k, output=v)
                for k, v in (deps or {}).items()
            ],
            context_tokens=7,
        ),
        sim_time=3.0,
        seed=n,
    )


def pool_file(tmp_path: Path, text: str = POOL) -> str:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    return str(path)


async def results_of(reader: Subscriber, want: set[str]) -> dict[str, subtask_pb2.SubtaskResult]:
    got: dict[str, subtask_pb2.SubtaskResult] = {}
    for _ in range(100):
        for record in await reader.fetch(timeout_s=0.05):
            envelope, result = codec.decode_event(record.value, subtask_pb2.SubtaskResult)
            assert envelope.event_id == result_event_id(result.execution_id)
            got[result.execution_id] = result
        if want <= set(got):
            return got
    raise AssertionError(f"results missing: {sorted(want - set(got))}")


async def test_each_agent_runs_by_its_runner(inproc_bus: InProcBus, tmp_path: Path) -> None:
    config = SubagentConfig(
        bus_url="embedded", group_id="runners", instance="w-1", pool_spec=pool_file(tmp_path)
    )
    worker = SubagentApp(config, inproc_bus)
    reader = inproc_bus.subscriber([topics.SUBTASK_RESULTS], "runners.reader")
    await reader.start()
    await worker.start()
    publisher = EventPublisher(inproc_bus, producer_name="runners-test")
    sim, plug, ext = (
        assignment(1, "qa", "test", {"d": "x"}),
        assignment(2, "digest", "search", {"t1": "test:t1:abc"}),
        assignment(3, "outside", "native"),
    )
    try:
        before = time.time()
        for a in (ext, sim, plug):
            await publisher.publish(topics.SUBTASKS_ASSIGNED, a, key=a.session_id)
        got = await results_of(reader, {sim.execution_id, plug.execution_id})
        await asyncio.sleep(0.2)  # room for a result of the external agent, which must not come
        got |= {r.execution_id: r for r in await reader_drain(reader)}
        after = time.time()
    finally:
        await worker.stop()
        await reader.stop()
    assert ext.execution_id not in got  # left to its external worker, not lost: committed past
    assert worker.stats.external == 1 and worker.stats.executions == 2

    s = got[sim.execution_id]
    assert s.runner == "simulated" and s.executor == "w-1"
    assert s.context == sim.context  # the exact context given
    assert before <= s.wall_start <= s.wall_end <= after
    expected = execute(SubagentPool(load_pool(config.pool_spec).advertised()), sim)
    assert (s.outcome, s.output, s.end_time) == (
        expected.outcome,
        expected.output,
        expected.end_time,
    )

    p = got[plug.execution_id]
    assert p.runner == "plugin" and p.executor == "w-1"
    assert p.outcome == subtask_pb2.OUTCOME_SUCCESS
    assert p.output == f"search:t2:{context_digest(plug.context)}"
    assert p.context == plug.context
    assert before <= p.wall_start <= p.wall_end <= after
    # Its simulated span is its real one: from the assignment's simulated time plus the time
    # it waited after its publication, for its wall-clock duration.
    assert 3.0 <= p.start_time <= 3.0 + (p.wall_start - before)
    assert p.end_time - p.start_time == pytest.approx(p.wall_end - p.wall_start)
    (call,) = p.tool_calls
    assert call.name == "context.sha256"
    assert p.wall_start <= call.started_at <= call.ended_at <= p.wall_end


async def reader_drain(reader: Subscriber) -> list[subtask_pb2.SubtaskResult]:
    records = await reader.fetch(timeout_s=0.05)
    return [codec.decode_event(r.value, subtask_pb2.SubtaskResult)[1] for r in records]


class Scripted:
    """A plug-in whose behaviour the test sets: a report, or an exception to raise."""

    def __init__(self, outcome: ExecutionReport | Exception, pause_s: float = 0.0) -> None:
        self.outcome = outcome
        self.pause_s = pause_s
        self.calls: list[ExecutionRequest] = []

    async def execute(self, request: ExecutionRequest) -> ExecutionReport:
        self.calls.append(request)
        await asyncio.sleep(self.pause_s)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    async def close(self) -> None:
        pass


def test_a_plugin_is_given_the_assignment_and_nothing_else() -> None:
    a = assignment(4, "digest", "search", {"t1": "one", "t2": "two"})
    req = execution_request(a)
    assert (req.session_id, req.execution_id, req.subtask_id) == ("runners", "runners.4", "t4")
    assert (req.kind, req.agent, req.attempt) == ("search", "digest", 1)
    assert req.description == "find thing 4"
    assert dict(req.dependency_outputs) == {"t1": "one", "t2": "two"}
    assert req.context == a.context


async def test_real_time_and_tool_calls_are_recorded() -> None:
    call = ToolCallRecord("bm25.search", '{"q": "x"}', True, "abc", 10.0, 10.5)
    agent = Scripted(ExecutionReport(True, "hits", (call,)), pause_s=0.05)
    result = await run_plugin(agent, assignment(5, "digest", "search"))
    assert result.outcome == subtask_pb2.OUTCOME_SUCCESS and result.output == "hits"
    assert result.wall_end - result.wall_start >= 0.05
    assert result.end_time - result.start_time == pytest.approx(result.wall_end - result.wall_start)
    (tc,) = result.tool_calls
    assert (tc.name, tc.arguments_json, tc.ok, tc.result_digest) == (
        "bm25.search",
        '{"q": "x"}',
        True,
        "abc",
    )
    assert (tc.started_at, tc.ended_at) == (10.0, 10.5)


def test_the_wait_before_execution_is_part_of_the_simulated_span() -> None:
    result = plugin_result(assignment(9, "d", "k"), ExecutionReport(True, "x"), 100.0, 100.5, 2.0)
    assert (result.start_time, result.end_time) == (5.0, 5.5)  # sim_time 3.0 + 2.0 waited
    early = plugin_result(assignment(9, "d", "k"), ExecutionReport(True, "x"), 100.0, 100.5, -1.0)
    assert early.start_time == 3.0  # a clock skew never moves it before its assignment


async def test_a_reported_failure_is_a_failure_with_its_reason() -> None:
    result = await run_plugin(
        Scripted(ExecutionReport(False, "", error="no hits")), assignment(6, "d", "k")
    )
    assert result.outcome == subtask_pb2.OUTCOME_FAILURE and result.error == "no hits"
    silent = plugin_result(assignment(6, "d", "k"), ExecutionReport(False, ""), 1.0, 2.0)
    assert silent.error == "d reported failure of t6"


async def test_a_broken_plugin_comes_back_malformed_and_named() -> None:
    result = await run_plugin(Scripted(KeyError("chunk-9")), assignment(7, "digest", "search"))
    assert result.outcome == subtask_pb2.OUTCOME_MALFORMED
    assert result.error == "plug-in of agent 'digest' raised KeyError: 'chunk-9'"
    assert result.wall_end >= result.wall_start > 0


async def test_a_retriable_error_is_retried_then_dead_lettered(
    inproc_bus: InProcBus, tmp_path: Path
) -> None:
    """A dead index server: the assignment is retried, then kept on the dead-letter topic,
    never answered with an invented failure."""
    worker = SubagentApp(
        SubagentConfig(bus_url="embedded", group_id="retry", pool_spec=pool_file(tmp_path)),
        inproc_bus,
    )
    down = Scripted(
        IndexUnavailable("chroma at http://127.0.0.1:9 is down", url="http://127.0.0.1:9")
    )
    worker.plugins["digest"] = down
    dead = inproc_bus.subscriber([topics.dead_letter(topics.SUBTASKS_ASSIGNED)], "retry.dlq")
    reader = inproc_bus.subscriber([topics.SUBTASK_RESULTS], "retry.reader")
    await dead.start()
    await reader.start()
    await worker.start()
    a = assignment(8, "digest", "search")
    try:
        await EventPublisher(inproc_bus, producer_name="t").publish(
            topics.SUBTASKS_ASSIGNED, a, key=a.session_id
        )
        dead_records = []
        for _ in range(200):
            dead_records += await dead.fetch(timeout_s=0.05)
            if dead_records:
                break
        results = await reader_drain(reader)
    finally:
        await worker.stop()
        await dead.stop()
        await reader.stop()
    assert len(dead_records) == 1 and not results
    assert len(down.calls) == DEFAULT_MAX_ATTEMPTS


def test_an_unloadable_plugin_fails_start_up_naming_the_agent(
    inproc_bus: InProcBus, tmp_path: Path
) -> None:
    path = pool_file(tmp_path, POOL.replace("plugin: context-digest", "plugin: context-digst"))
    with pytest.raises(
        ConfigError,
        match="PODIUM_POOL_SPEC: agent 'digest': unknown sub-agent plug-in 'context-digst'",
    ) as info:
        SubagentApp(SubagentConfig(bus_url="embedded", pool_spec=path), inproc_bus)
    assert isinstance(info.value.__cause__, PluginError)


def keys_on_each_partition(partitions: int) -> list[str]:
    """One record key per partition of the assignment topic (Kafka's partitioner)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        found.setdefault(partition_for_key(f"k{n}".encode(), partitions), f"k{n}")
        n += 1
    return [found[p] for p in range(partitions)]


@pytest.mark.parametrize(("concurrency", "overlap"), [(3, True), (1, False)])
async def test_members_run_assignments_of_different_partitions_at_once(
    inproc_bus: InProcBus, tmp_path: Path, concurrency: int, overlap: bool
) -> None:
    """PODIUM_SUBAGENT_CONCURRENCY members in one process share its plug-ins and execute
    their partitions' assignments at the same time; one member executes them in turn."""
    config = SubagentConfig(
        bus_url="embedded",
        group_id=f"members{concurrency}",
        pool_spec=pool_file(tmp_path),
        concurrency=concurrency,
    )
    worker = SubagentApp(config, inproc_bus)
    assert len(worker.consumers) == concurrency
    slow = Scripted(ExecutionReport(True, "ok"), pause_s=0.3)
    worker.plugins["digest"] = slow
    reader = inproc_bus.subscriber([topics.SUBTASK_RESULTS], f"members{concurrency}.reader")
    await reader.start()
    await worker.start()
    batch = [assignment(20 + i, "digest", "search") for i in range(3)]
    try:
        publisher = EventPublisher(inproc_bus, producer_name="members-test")
        for key, a in zip(keys_on_each_partition(config.topic_partitions), batch, strict=True):
            await publisher.publish(topics.SUBTASKS_ASSIGNED, a, key=key)
        got = await results_of(reader, {a.execution_id for a in batch})
    finally:
        await worker.stop()
        await reader.stop()
    spans = [(got[a.execution_id].wall_start, got[a.execution_id].wall_end) for a in batch]
    assert (max(s for s, _ in spans) < min(e for _, e in spans)) == overlap
    # The orchestrator's clock sees the same: queued executions start (simulated) later.
    sim = [(got[a.execution_id].start_time, got[a.execution_id].end_time) for a in batch]
    assert (max(s for s, _ in sim) < min(e for _, e in sim)) == overlap
    assert len(slow.calls) == 3  # one plug-in instance served every member
