"""The gRPC face of the orchestrator: SessionService, health and reflection on one grpc.aio server.

Errors are gRPC statuses with a message that names the problem: an invalid task spec is
``INVALID_ARGUMENT`` whose details name the field (also sent as the ``podium-field`` trailing
metadata entry so clients can act on it without parsing text); an unknown session is
``NOT_FOUND``. Deadlines are honoured: SubmitTask gives up with ``DEADLINE_EXCEEDED`` when
publishing outlasts the caller's deadline, and streams end when the caller's deadline passes
(gRPC cancels the handler).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orchestrator_svc.session import SessionHandle
from podium.errors import BusError, SpecError
from podium.service import health_status
from podium.telemetry import TracingServerInterceptor
from podium.v1 import reward_pb2, session_service_pb2, session_service_pb2_grpc, task_pb2

_log = logging.getLogger(__name__)

FIELD_METADATA_KEY = "podium-field"
"""Trailing metadata key naming the offending field of an INVALID_ARGUMENT."""

SERVICE_NAME = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name
"""``podium.v1.SessionService``: the name health checks and reflection use."""


class SessionBackend(Protocol):
    """What the servicer needs from the orchestrator app."""

    async def submit(
        self, request: session_service_pb2.SubmitTaskRequest, submitted_by: str
    ) -> str:
        """Validate and publish a task; returns the session id (raises SpecError / BusError)."""
        ...

    def session(self, session_id: str) -> SessionHandle | None:
        """The session's handle, if this orchestrator knows it."""
        ...

    async def feedback(self, feedback: reward_pb2.Feedback) -> str:
        """Publish feedback; returns its event id."""
        ...


class SessionServicer(session_service_pb2_grpc.SessionServiceServicer):  # type: ignore[misc]
    """SessionService over a :class:`SessionBackend`."""

    def __init__(self, backend: SessionBackend) -> None:
        self.backend = backend

    async def SubmitTask(
        self,
        request: session_service_pb2.SubmitTaskRequest,
        context: grpc.aio.ServicerContext,
    ) -> session_service_pb2.SubmitTaskResponse:
        peer = context.peer() or "grpc"
        remaining = context.time_remaining()
        try:
            submit = self.backend.submit(request, submitted_by=f"grpc:{peer}")
            if remaining is not None:
                session_id = await asyncio.wait_for(submit, remaining)
            else:
                session_id = await submit
        except SpecError as exc:
            field = exc.field or "task"
            context.set_trailing_metadata(((FIELD_METADATA_KEY, field),))
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"invalid task spec (field {field}): {exc}"
            )
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before the task was accepted"
            )
        except BusError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"event bus unavailable: {exc}")
        return session_service_pb2.SubmitTaskResponse(session_id=session_id)

    async def StreamSession(
        self,
        request: session_service_pb2.StreamSessionRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[session_service_pb2.StreamSessionResponse]:
        handle = await self._handle(request.session_id, context)
        async for event in handle.stream():
            yield event

    async def GetSession(
        self,
        request: session_service_pb2.GetSessionRequest,
        context: grpc.aio.ServicerContext,
    ) -> session_service_pb2.GetSessionResponse:
        handle = await self._handle(request.session_id, context)
        response = session_service_pb2.GetSessionResponse(
            session_id=handle.session_id,
            state=session_service_pb2.SessionState.ValueType(handle.state),
            task=handle.task,
        )
        if handle.result is not None:
            response.result.CopyFrom(handle.result)
        return response

    async def SendFeedback(
        self,
        request: session_service_pb2.SendFeedbackRequest,
        context: grpc.aio.ServicerContext,
    ) -> session_service_pb2.SendFeedbackResponse:
        fb = request.feedback
        if not fb.session_id:
            context.set_trailing_metadata(((FIELD_METADATA_KEY, "feedback.session_id"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "feedback.session_id is empty")
        if not -1.0 <= fb.rating <= 1.0:
            context.set_trailing_metadata(((FIELD_METADATA_KEY, "feedback.rating"),))
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"feedback.rating must be in [-1, 1], got {fb.rating:g}",
            )
        if self.backend.session(fb.session_id) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no session {fb.session_id!r}")
        try:
            event_id = await self.backend.feedback(fb)
        except BusError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"event bus unavailable: {exc}")
        return session_service_pb2.SendFeedbackResponse(event_id=event_id)

    async def _handle(self, session_id: str, context: grpc.aio.ServicerContext) -> SessionHandle:
        if not session_id:
            context.set_trailing_metadata(((FIELD_METADATA_KEY, "session_id"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id is empty")
        handle = self.backend.session(session_id)
        if handle is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no session {session_id!r}")
        assert handle is not None
        return handle


class GrpcServer:
    """The orchestrator's grpc.aio server: SessionService + health + reflection + tracing."""

    def __init__(
        self,
        backend: SessionBackend,
        *,
        host: str,
        port: int,
        max_message_bytes: int,
        interceptor: TracingServerInterceptor | None = None,
    ) -> None:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        self.server = grpc.aio.server(
            interceptors=[interceptor] if interceptor is not None else None, options=options
        )
        session_service_pb2_grpc.add_SessionServiceServicer_to_server(  # type: ignore[no-untyped-call]
            SessionServicer(backend), self.server
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.server,
        )
        self.address = f"{host}:{port}"
        self.port = 0

    async def start(self) -> int:
        """Bind and start serving; returns the bound port (useful with port 0)."""
        self.port = self.server.add_insecure_port(self.address)
        if self.port == 0:
            raise OSError(f"could not bind gRPC server to {self.address}")
        await self.server.start()
        await self.set_serving(True)
        return self.port

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING / NOT_SERVING for the whole server and for SessionService."""
        status = health_status(serving)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING first (so load balancers drain), then stop with a grace period."""
        await self.set_serving(False)
        await self.server.stop(grace_s)


def task_message(request: session_service_pb2.SubmitTaskRequest) -> task_pb2.TaskSpec | None:
    """The structured task of a request, or None when it only has text."""
    return request.task if request.HasField("task") else None
