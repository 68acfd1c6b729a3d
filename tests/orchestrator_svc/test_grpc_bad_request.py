"""Invalid requests to the orchestrator's gRPC API answer INVALID_ARGUMENT with a rich status:
a google.rpc.BadRequest whose field violations name the field and the problem, decoded here
over real gRPC on loopback with grpc_status.rpc_status.from_call as any client would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from google.rpc import code_pb2, error_details_pb2
from grpc_status import rpc_status
from svc_helpers import SUBMIT_DEADLINE_S

from orchestrator_svc.grpc_api import _REVIEW, FIELD_METADATA_KEY, service_handler
from orchestrator_svc.review import ReviewServicer
from podium import topics
from podium.bus import InProcBus
from podium.v1 import review_pb2, review_pb2_grpc, reward_pb2
from podium.v1 import session_service_pb2 as ss
from podium.v1 import session_service_pb2_grpc as ss_grpc


def violations(error: grpc.RpcError) -> list[tuple[str, str]]:
    """(field, description) of the BadRequest in ``error``'s rich status; fails without one."""
    status = rpc_status.from_call(error)
    assert status is not None, f"no rich status in {error}"
    assert status.code == code_pb2.INVALID_ARGUMENT
    assert status.message == error.details()
    (detail,) = status.details
    bad = error_details_pb2.BadRequest()
    assert detail.Unpack(bad), f"detail is {detail.type_url}, not a BadRequest"
    return [(v.field, v.description) for v in bad.field_violations]


@pytest.mark.parametrize(
    ("request_", "field", "fragment"),
    [
        (ss.SubmitTaskRequest(), "task", "no task"),
        (ss.SubmitTaskRequest(task_spec_text="name: [unclosed"), "task_spec_text", "JSON/YAML"),
        (
            ss.SubmitTaskRequest(
                task_spec_text="name: t\nsubtasks:\n  - {id: a, kind: ui, work: 1, deps: [ghost]}\n"
            ),
            "a",
            "ghost",
        ),
        (
            ss.SubmitTaskRequest(
                task_spec_text="name: t\nsubtasks:\n  - {id: a, kind: ui, work: -1}\n"
            ),
            "a",
            "work must be > 0",
        ),
    ],
)
async def test_invalid_task_is_a_bad_request_naming_the_field(
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
        ((named, problem),) = violations(info.value)
        assert named == field and fragment in problem
        # The older podium-field trailer still names the same field.
        assert dict(info.value.trailing_metadata() or ()).get(FIELD_METADATA_KEY) == field
        assert sum(inproc_bus.end_offsets(topics.TASKS).values()) == 0


async def test_feedback_and_session_fields(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    async with stack_factory(inproc_bus) as stack:
        cases = [
            (
                stack.stub.SendFeedback(
                    ss.SendFeedbackRequest(feedback=reward_pb2.Feedback(session_id="s", rating=3)),
                    timeout=5,
                ),
                ("feedback.rating", "feedback.rating must be in [-1, 1], got 3"),
            ),
            (
                stack.stub.SendFeedback(
                    ss.SendFeedbackRequest(feedback=reward_pb2.Feedback(rating=0.5)), timeout=5
                ),
                ("feedback.session_id", "feedback.session_id is empty"),
            ),
            (
                stack.stub.GetSession(ss.GetSessionRequest(), timeout=5),
                ("session_id", "session_id is empty"),
            ),
        ]
        for call, expected in cases:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert violations(info.value) == [expected]
        # A stream's error carries the same detail.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.stub.StreamSession(ss.StreamSessionRequest(), timeout=5).read()
        assert violations(info.value) == [("session_id", "session_id is empty")]


async def test_undecodable_bytes_name_the_request(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    async with stack_factory(inproc_bus) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.channel.unary_unary("/podium.v1.SessionService/SubmitTask")(
                b"\xff" * 11, timeout=5
            )
        ((field, problem),) = violations(info.value)
        assert field == "request" and "not a podium.v1.SubmitTaskRequest" in problem


async def test_a_plain_synchronous_client_decodes_the_detail(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    """The generated sync stub, as a third-party Python client would use it."""
    async with stack_factory(inproc_bus) as stack:
        port = stack.orchestrator.grpc_port

        def call() -> grpc.RpcError:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                try:
                    ss_grpc.SessionServiceStub(channel).GetSession(
                        ss.GetSessionRequest(), timeout=5
                    )
                except grpc.RpcError as exc:
                    return exc
            raise AssertionError("GetSession without a session id succeeded")

        error = await asyncio.to_thread(call)
        assert violations(error) == [("session_id", "session_id is empty")]


class _NoGate:
    """Stands where the review gate would be: these requests must be refused before it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"an invalid request reached the review gate ({name})")


@contextlib.asynccontextmanager
async def _review_server() -> AsyncIterator[review_pb2_grpc.ReviewServiceStub]:
    server = grpc.aio.server()
    servicer = ReviewServicer(_NoGate())  # type: ignore[arg-type]
    server.add_generic_rpc_handlers((service_handler(servicer, _REVIEW, review_pb2),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield review_pb2_grpc.ReviewServiceStub(channel)
    finally:
        await server.stop(None)


async def test_review_service_bad_requests() -> None:
    async with _review_server() as reviews:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await reviews.Reject(review_pb2.RejectRequest(review_id="r1"), timeout=5)
        assert violations(info.value) == [("reason", "required to reject")]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await reviews.Approve(review_pb2.ApproveRequest(), timeout=5)
        assert violations(info.value) == [("review_id", "empty")]
