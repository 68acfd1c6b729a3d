"""SessionService over real gRPC on loopback: health, sessions, errors, deadlines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from svc_helpers import LOGIN_TASK, SUBMIT_DEADLINE_S

from orchestrator_svc.grpc_api import FIELD_METADATA_KEY
from podium import codec, topics
from podium.bus import InProcBus
from podium.v1 import reward_pb2, task_pb2, trajectory_pb2
from podium.v1 import session_service_pb2 as ss


def _trailing_field(exc: grpc.aio.AioRpcError) -> str:
    return dict(exc.trailing_metadata() or ()).get(FIELD_METADATA_KEY, "")


async def test_health_serving(inproc_bus: InProcBus, stack_factory: Callable[..., Any]) -> None:
    async with stack_factory(inproc_bus) as stack:
        health = health_pb2_grpc.HealthStub(stack.channel)
        for service in ("", "podium.v1.SessionService"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await health.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        # Reflection is opt-in (PODIUM_GRPC_REFLECTION): test_grpc_edge.py tests both ways.


async def test_submit_and_stream_to_the_end(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    async with stack_factory(inproc_bus, workers=2) as stack:
        # The trajectory topic is read back as any consumer would, to compare with the stream.
        reader = inproc_bus.subscriber([topics.TRAJECTORIES], "test.trajectory-reader")
        await reader.start()
        sid = (
            await stack.stub.SubmitTask(
                ss.SubmitTaskRequest(task_spec_text=LOGIN_TASK, seed=11), timeout=5
            )
        ).session_id
        assert sid
        events = [
            e
            async for e in stack.stub.StreamSession(
                ss.StreamSessionRequest(session_id=sid), timeout=20
            )
        ]
        assert [e.seq for e in events] == list(range(len(events)))
        assert all(e.session_id == sid for e in events)
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds[-1] == "result" and kinds.count("result") == 1
        result = events[-1].result
        assert result.state == ss.SESSION_STATE_SUCCEEDED
        assert result.completed_subtasks == result.total_subtasks == 6
        # Every started execution finished, and the counts agree with the result.
        started = {
            e.subagent_started.execution_id for e in events if kinds[e.seq] == "subagent_started"
        }
        finished = {
            e.subagent_finished.execution_id for e in events if kinds[e.seq] == "subagent_finished"
        }
        assert started == finished and len(started) == result.executions
        assert kinds.count("decision") == result.decisions
        assert result.latency >= result.lower_bound > 0

        records = await reader.fetch(timeout_s=2.0)
        trajectories = [codec.decode_event(r.value, trajectory_pb2.Trajectory)[1] for r in records]
        mine = [t for t in trajectories if t.session_id == sid]
        assert len(mine) == 1
        traj = mine[0]
        assert traj.latency == pytest.approx(result.latency)
        assert len(traj.executions) == result.executions
        # Context sharding: an execution is given exactly its dependencies' outputs.
        by_unit = {x.subtask_id: x for x in traj.executions if x.outcome == 1}
        api = by_unit["api"]
        assert sorted(d.subtask_id for d in api.context.dependency_results) == [
            "creds",
            "form",
            "session",
        ]
        await reader.stop()

        got = await stack.stub.GetSession(ss.GetSessionRequest(session_id=sid), timeout=5)
        assert got.state == ss.SESSION_STATE_SUCCEEDED
        assert got.result.summary.startswith("login-system: completed 6/6")
        assert got.task.name == "login-system"

        fb = await stack.stub.SendFeedback(
            ss.SendFeedbackRequest(feedback=reward_pb2.Feedback(session_id=sid, rating=0.5)),
            timeout=5,
        )
        assert fb.event_id


async def test_client_request_id_makes_submit_idempotent(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    async with stack_factory(inproc_bus) as stack:
        req = ss.SubmitTaskRequest(task_spec_text=LOGIN_TASK, client_request_id="ide-42")
        a = await stack.stub.SubmitTask(req, timeout=SUBMIT_DEADLINE_S)
        b = await stack.stub.SubmitTask(req, timeout=SUBMIT_DEADLINE_S)
        assert a.session_id == b.session_id


@pytest.mark.parametrize(
    ("request_", "field", "fragment"),
    [
        (
            ss.SubmitTaskRequest(
                task_spec_text="name: x\nsubtasks:\n  - {id: a, kind: ui, work: 1, deps: [b]}\n"
                "  - {id: b, kind: ui, work: 1, deps: [a]}\n"
            ),
            "a,b",
            "dependency cycle",
        ),
        (
            ss.SubmitTaskRequest(
                task=task_pb2.TaskSpec(
                    name="x", subtasks=[task_pb2.SubtaskSpec(id="a", kind="ui", work=-1)]
                )
            ),
            "a",
            "work must be > 0",
        ),
        (
            ss.SubmitTaskRequest(
                task_spec_text="name: x\nsubtasks:\n  - {id: a, kind: ui, work: 1, colour: red}\n"
            ),
            "subtask 'a'.colour",
            "unknown field 'colour'",
        ),
        (
            ss.SubmitTaskRequest(
                task_spec_text="name: x\nsubtasks:\n  - {id: a, kind: ui, work: 1, deps: [ghost]}\n"
            ),
            "a",
            "depends on unknown subtask 'ghost'",
        ),
        (
            ss.SubmitTaskRequest(task_spec_text="name: [unclosed"),
            "task_spec_text",
            "invalid JSON/YAML",
        ),
        (ss.SubmitTaskRequest(), "task", "no task"),
    ],
)
async def test_invalid_spec_is_invalid_argument_naming_the_field(
    inproc_bus: InProcBus,
    stack_factory: Callable[..., Any],
    request_: ss.SubmitTaskRequest,
    field: str,
    fragment: str,
) -> None:
    async with stack_factory(inproc_bus) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.stub.SubmitTask(request_, timeout=SUBMIT_DEADLINE_S)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"(field {field})" in (info.value.details() or "")
        assert fragment in (info.value.details() or "")
        assert _trailing_field(info.value) == field
        # Nothing was published for a rejected task.
        assert sum(inproc_bus.end_offsets(topics.TASKS).values()) == 0


async def test_unknown_session_is_not_found(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    async with stack_factory(inproc_bus) as stack:
        for call in (
            stack.stub.GetSession(ss.GetSessionRequest(session_id="nope"), timeout=5),
            stack.stub.StreamSession(ss.StreamSessionRequest(session_id="nope"), timeout=5).read(),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.stub.SendFeedback(
                ss.SendFeedbackRequest(feedback=reward_pb2.Feedback(session_id="x", rating=3)),
                timeout=5,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _trailing_field(info.value) == "feedback.rating"


async def test_stream_deadline_is_honoured(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    # Paced sub-agents: the session takes over a second of wall time, the deadline 0.3 s.
    async with stack_factory(inproc_bus, time_scale=0.05) as stack:
        sid = (
            await stack.stub.SubmitTask(
                ss.SubmitTaskRequest(task_spec_text=LOGIN_TASK), timeout=SUBMIT_DEADLINE_S
            )
        ).session_id
        seen = 0
        t0 = time.perf_counter()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stack.stub.StreamSession(
                ss.StreamSessionRequest(session_id=sid), timeout=0.3
            ):
                seen += 1
        elapsed = time.perf_counter() - t0
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0.25 < elapsed < 1.0
        assert seen >= 1  # events flowed until the deadline
        handle = stack.orchestrator.session(sid)
        assert handle is not None and not handle.finished  # the session itself goes on
        # An already-expired deadline fails fast without touching the session state.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.stub.SubmitTask(
                ss.SubmitTaskRequest(task_spec_text=LOGIN_TASK), timeout=0.0001
            )
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.sleep(0)
