"""Sessions over the bus behave exactly like the simulator, and fail visibly, never silently."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import LOGIN_TASK, SUBMIT_DEADLINE_S

from orchestrator_svc.policy import make_policy
from orchestrator_svc.specs import parse_task_text
from podium import codec, topics
from podium.bus import InProcBus
from podium.envs.swarm import EnvConfig, SwarmEnv
from podium.envs.swarm.baselines import make_policy as make_baseline
from podium.envs.swarm.simulator import SwarmSimulator
from podium.envs.swarm.spec import default_pool, default_tasks_dir, load_task
from podium.envs.swarm.state import StateConfig
from podium.errors import ConfigError
from podium.v1 import session_service_pb2 as ss
from podium.v1 import subtask_pb2, trajectory_pb2


def simulate(
    task_text: str, seed: int, policy: str
) -> tuple[float, list[tuple[str, str, float, float, bool]]]:
    """The same session in the in-process simulator: latency and (unit, agent, start, end, ok)."""
    task = parse_task_text(task_text)
    pool = default_pool()
    env = SwarmEnv(
        [task], pool, EnvConfig(max_subtasks=64, invalid_action="raise", max_steps=10_000)
    )
    env.reset(seed=0, options={"task": task})
    # The orchestrator seeds its executor with the session seed directly; do the same here.
    env.use_simulator(
        SwarmSimulator(
            task,
            env.pool,
            seed=seed,
            config=StateConfig(loop_retry_limit=env.config.loop_retry_limit),
        )
    )
    engine = make_baseline(policy)
    while True:
        _, _, terminated, truncated, info = env.step(engine.act(env).action)
        if terminated or truncated:
            break
    st = env.state
    execs = [
        (st.unit_id(r.unit), pool.agents[r.agent].name, r.start, r.end, bool(r.success))
        for r in st.executions
    ]
    return float(info["latency"]), execs


@pytest.mark.parametrize(
    ("task_file", "seed", "policy"),
    [
        (None, 1, "cpls"),
        (None, 2, "greedy"),
        ("login-system.yaml", 5, "cpls"),
        ("diamond-10.yaml", 9, "cpls"),
        ("chain-8.yaml", 4, "sequential"),
    ],
)
async def test_bus_session_reproduces_the_simulator(
    inproc_bus: InProcBus,
    stack_factory: Callable[..., Any],
    task_file: str | None,
    seed: int,
    policy: str,
) -> None:
    text = LOGIN_TASK if task_file is None else (default_tasks_dir() / task_file).read_text()
    expected_latency, expected_execs = simulate(text, seed, policy)
    async with stack_factory(inproc_bus, workers=2) as stack:
        stack.orchestrator.policy = make_policy(policy)
        sid = (
            await stack.stub.SubmitTask(
                ss.SubmitTaskRequest(task_spec_text=text, seed=seed), timeout=5
            )
        ).session_id
        events = [
            e
            async for e in stack.stub.StreamSession(
                ss.StreamSessionRequest(session_id=sid), timeout=30
            )
        ]
        handle = stack.orchestrator.session(sid)
        assert handle is not None and handle.trajectory is not None
        traj = handle.trajectory
    assert events[-1].result.latency == expected_latency  # bit for bit: same seeds, same order
    got = [
        (x.subtask_id, x.agent, x.start_time, x.end_time, x.outcome == subtask_pb2.OUTCOME_SUCCESS)
        for x in traj.executions
    ]
    assert got == expected_execs
    assert traj.policy_version == f"rules:{policy}"


MIXED_POOL = """
name: mixed
agents:
  - name: qa
    kinds: {test: {speed: 1.0, success: 1.0, noise: 0.0}}
  - name: digest
    kinds: {search: {speed: 1.0, success: 1.0, noise: 0.0}}
    runner: plugin
    plugin: context-digest
"""
MIXED_TASK = """
name: mixed
subtasks:
  - {id: find, kind: search, work: 1.0, description: find the login docs}
  - {id: check, kind: test, work: 2.0, deps: [find]}
  - {id: again, kind: test, work: 1.0}
"""


async def test_the_trajectory_records_who_ran_each_execution_and_when(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any], tmp_path: Path
) -> None:
    # A simulated agent's wall span is its pacing: the simulated duration times
    # PODIUM_SUBAGENT_TIME_SCALE (slept by the worker), so it is at least that long; a
    # plug-in's is its real run. Both are stamped by the worker that ran them.
    pool = tmp_path / "pool.yaml"
    pool.write_text(MIXED_POOL)
    scale = 0.01
    before = time.time()
    async with stack_factory(inproc_bus, workers=2, time_scale=scale, pool_spec=str(pool)) as stack:
        sid = (
            await stack.stub.SubmitTask(
                ss.SubmitTaskRequest(task_spec_text=MIXED_TASK), timeout=SUBMIT_DEADLINE_S
            )
        ).session_id
        async for _ in stack.stub.StreamSession(
            ss.StreamSessionRequest(session_id=sid), timeout=30
        ):
            pass
        handle = stack.orchestrator.session(sid)
        assert handle is not None and handle.trajectory is not None
        traj = handle.trajectory
    after = time.time()
    assert traj.completed
    runners = {x.subtask_id: x.runner for x in traj.executions}
    assert runners == {"find": "plugin", "check": "simulated", "again": "simulated"}
    for x in traj.executions:
        assert x.executor in {"worker-0", "worker-1"}
        assert before <= x.wall_start <= x.wall_end <= after
        if x.runner == "simulated":
            # (less a millisecond: the event loop may wake a sleeper a clock tick early)
            assert x.wall_end - x.wall_start >= (x.end_time - x.start_time) * scale - 1e-3
    # The dependent started (wall clock) after what it depends on had ended.
    by_id = {x.subtask_id: x for x in traj.executions}
    assert by_id["check"].wall_start >= by_id["find"].wall_end


async def test_missing_subagents_time_the_session_out_visibly(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    reader = inproc_bus.subscriber([topics.TRAJECTORIES], "test.timeout-reader")
    await reader.start()
    async with stack_factory(inproc_bus, workers=0, session_timeout_s=0.3) as stack:
        sid = (
            await stack.stub.SubmitTask(
                ss.SubmitTaskRequest(task_spec_text=LOGIN_TASK), timeout=SUBMIT_DEADLINE_S
            )
        ).session_id
        events = [
            e
            async for e in stack.stub.StreamSession(
                ss.StreamSessionRequest(session_id=sid), timeout=10
            )
        ]
    result = events[-1].result
    assert result.state == ss.SESSION_STATE_FAILED
    assert "timeout: no result within 0.3s" in result.summary
    records = await reader.fetch(timeout_s=1.0)
    (traj,) = [codec.decode_event(r.value, trajectory_pb2.Trajectory)[1] for r in records]
    assert traj.session_id == sid and not traj.completed
    assert traj.labels["end_reason"].startswith("timeout")
    assert traj.executions and all(
        x.outcome == subtask_pb2.OUTCOME_CANCELLED for x in traj.executions
    )
    await reader.stop()


async def test_stale_and_duplicate_results_are_ignored(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    async with stack_factory(inproc_bus, workers=0, session_timeout_s=1.0) as stack:
        sid = (
            await stack.stub.SubmitTask(
                ss.SubmitTaskRequest(task_spec_text=LOGIN_TASK, seed=3), timeout=5
            )
        ).session_id
        stream = stack.stub.StreamSession(ss.StreamSessionRequest(session_id=sid), timeout=10)
        first_start = None
        async for event in stream:
            if event.HasField("subagent_started"):
                first_start = event.subagent_started
                break
        assert first_start is not None
        session = stack.orchestrator.running[sid]
        # A result from an earlier run of the session (other run id) is not taken.
        stale = subtask_pb2.SubtaskResult(
            session_id=sid,
            execution_id=first_start.execution_id.replace(session.run_id, "deadbeef"),
            outcome=subtask_pb2.OUTCOME_SUCCESS,
            end_time=first_start.sim_time + 1,
        )
        assert not await session.on_result(stale)
        fresh = subtask_pb2.SubtaskResult(
            session_id=sid,
            execution_id=first_start.execution_id,
            outcome=subtask_pb2.OUTCOME_SUCCESS,
            end_time=first_start.sim_time + 1,
            output="ok",
        )
        assert await session.on_result(fresh)
        assert not await session.on_result(fresh)  # the duplicate is dropped
        stream.cancel()


def test_unknown_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown policy 'telepathic'"):
        make_policy("telepathic")


def test_shipped_tasks_parse_as_service_input() -> None:
    task = load_task(default_tasks_dir() / "login-system.yaml")
    assert parse_task_text((default_tasks_dir() / "login-system.yaml").read_text()) == task


async def test_invalid_task_on_the_topic_is_dead_lettered_and_intake_goes_on(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    from podium.bus import EventPublisher
    from podium.bus.consumer import DLQ_ERROR
    from podium.v1 import task_pb2

    async with stack_factory(inproc_bus) as stack:
        bad = task_pb2.TaskSubmitted(
            session_id="bad-1",
            task=task_pb2.TaskSpec(
                name="bad", subtasks=[task_pb2.SubtaskSpec(id="a", kind="ui", work=0)]
            ),
        )
        await EventPublisher(inproc_bus, producer_name="driver").publish(
            topics.TASKS, bad, key="bad-1"
        )
        # A valid session submitted after it still runs to the end.
        sid = (
            await stack.stub.SubmitTask(
                ss.SubmitTaskRequest(task_spec_text=LOGIN_TASK), timeout=SUBMIT_DEADLINE_S
            )
        ).session_id
        events = [
            e
            async for e in stack.stub.StreamSession(
                ss.StreamSessionRequest(session_id=sid), timeout=10
            )
        ]
        assert events[-1].result.state == ss.SESSION_STATE_SUCCEEDED
    dlq = inproc_bus.subscriber([topics.dead_letter(topics.TASKS)], "test.dlq-reader")
    await dlq.start()
    (record,) = await dlq.fetch(timeout_s=1.0)
    error = (record.header(DLQ_ERROR) or b"").decode()
    assert "session bad-1: invalid task (a)" in error and "work must be > 0" in error
    await dlq.stop()


PLUGIN_POOL = """
name: digests
agents:
  - name: digest
    kinds: {search: {speed: 1.0, success: 1.0, noise: 0.0}}
    runner: plugin
    plugin: context-digest
"""
THREE_SEARCHES = "name: three\nsubtasks:\n" + "".join(
    f"  - {{id: s{i}, kind: search, work: 1.0, description: query {i}}}\n" for i in range(3)
)


async def test_real_agents_start_at_once_on_different_partitions(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any], tmp_path: Path
) -> None:
    # No simulated agent: the session decides as results arrive, so with no worker to
    # answer, cpls still starts the three searches of each session; each session's land on
    # three different partitions (workers of the group), where hashing the execution ids
    # alone would often put two on one (all three sessions spread by chance: 1%).
    pool = tmp_path / "pool.yaml"
    pool.write_text(PLUGIN_POOL)
    reader = inproc_bus.subscriber([topics.SUBTASKS_ASSIGNED], "test.assigned-reader")
    await reader.start()
    async with stack_factory(
        inproc_bus, workers=0, session_timeout_s=2.0, pool_spec=str(pool)
    ) as stack:
        assert stack.orchestrator.config.topic_partitions == 3
        for seed in (1, 2, 3):
            request = ss.SubmitTaskRequest(task_spec_text=THREE_SEARCHES, seed=seed)
            await stack.stub.SubmitTask(request, timeout=SUBMIT_DEADLINE_S)
        records = []
        for _ in range(50):
            records += await reader.fetch(timeout_s=0.1)
            if len(records) >= 9:
                break
    await reader.stop()
    sessions: dict[str, set[int]] = {}
    for record in records:
        a = codec.decode_event(record.value, subtask_pb2.SubtaskAssigned)[1]
        assert (record.key or b"").decode().split("#")[0] == a.execution_id
        sessions.setdefault(a.session_id, set()).add(record.partition)
    assert len(records) == 9 and len(sessions) == 3
    assert all(len(partitions) == 3 for partitions in sessions.values()), sessions
