"""The gRPC face of the orchestrator: SessionService, health and (opt-in) reflection on one
grpc.aio server.

Errors are gRPC statuses with a message that names the problem: an invalid request (a task
spec, an empty id, a rating out of range, undecodable bytes) is ``INVALID_ARGUMENT`` with a
rich status whose ``google.rpc.BadRequest`` detail names the field and the problem
(:mod:`podium.service.rich_status`; decoded by any client with its gRPC status library, e.g.
``grpc_status.rpc_status.from_call``), the field also sent as the ``podium-field`` trailing
metadata entry; an unknown session is ``NOT_FOUND``. Deadlines are honoured: SubmitTask gives up with ``DEADLINE_EXCEEDED`` when
parsing and publishing outlast the caller's deadline, and streams end when the caller's
deadline passes (gRPC cancels the handler).

The edge is hardened (issue 12): gRPC accepts at most twice ``PODIUM_MAX_TASK_BYTES``
(so never more than the broker carries); a request over ``PODIUM_MAX_TASK_BYTES`` or with more
than ``PODIUM_MAX_SUBTASKS`` subtasks is ``INVALID_ARGUMENT`` naming the setting before the
spec is parsed; specs are parsed in :class:`~orchestrator_svc.specs.SpecWorkers` processes, off
the event loop; request bytes are decoded in the handlers (the methods are registered with
no deserializer), so undecodable bytes are ``INVALID_ARGUMENT`` rather than gRPC's
``UNKNOWN``; a reached capacity limit (:class:`~podium.errors.AdmissionError`) is
``RESOURCE_EXHAUSTED`` naming the limit, also sent as ``podium-limit`` trailing metadata.

The same server serves the ReviewService (:mod:`orchestrator_svc.review`). With
``PODIUM_GRPC_TOKENS`` every call is authenticated (:mod:`podium.service.auth`; TLS required):
SessionService needs the ``plugin`` role and ReviewService ``reviewer``; a session is recorded
as submitted by the caller's principal, and a plugin reads only the sessions it submitted
(another's is ``PERMISSION_DENIED``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orchestrator_svc.config import OrchestratorConfig
from orchestrator_svc.review import ReviewServicer
from orchestrator_svc.session import SessionHandle
from orchestrator_svc.specs import (
    TEXT_FIELD,
    SpecWorkers,
    TaskLimits,
    check_request_size,
)
from podium.codec import decode_message
from podium.envs.swarm.spec import PoolSpec
from podium.envs.swarm.trajectory import task_to_proto
from podium.errors import AdmissionError, BusError, DecodeError, SpecError
from podium.service import health_status
from podium.service.auth import PLUGIN, REVIEWER, principal
from podium.service.rich_status import abort_bad_request
from podium.v1 import review_pb2, reward_pb2, session_service_pb2, task_pb2

_log = logging.getLogger(__name__)

FIELD_METADATA_KEY = "podium-field"
"""Trailing metadata key naming the offending field of an INVALID_ARGUMENT."""

LIMIT_METADATA_KEY = "podium-limit"
"""Trailing metadata key naming the setting whose limit a RESOURCE_EXHAUSTED hit."""

REQUEST_FIELD = "request"
"""Field named when the request as a whole could not be decoded."""

_SERVICE = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"]

M = TypeVar("M", bound=Message)

SERVICE_NAME = _SERVICE.full_name
"""``podium.v1.SessionService``: the name health checks and reflection use."""

_REVIEW = review_pb2.DESCRIPTOR.services_by_name["ReviewService"]

METHOD_ROLES = {f"/{SERVICE_NAME}/*": PLUGIN, f"/{_REVIEW.full_name}/*": REVIEWER}
"""The role each service needs when ``PODIUM_GRPC_TOKENS`` turns authentication on."""


class SessionBackend(Protocol):
    """What the servicer needs from the orchestrator app."""

    async def submit(
        self, request: session_service_pb2.SubmitTaskRequest, submitted_by: str
    ) -> str:
        """Validate and publish a task; returns the session id (raises SpecError /
        AdmissionError / BusError). The servicer hands over requests whose task has been
        checked against the limits and parsed already, as a ``task`` message."""
        ...

    def session(self, session_id: str) -> SessionHandle | None:
        """The session's handle, if this orchestrator knows it."""
        ...

    async def feedback(self, feedback: reward_pb2.Feedback) -> str:
        """Publish feedback; returns its event id."""
        ...


class SessionServicer:
    """SessionService over a :class:`SessionBackend`; specs are parsed by ``specs``."""

    def __init__(self, backend: SessionBackend, specs: SpecWorkers) -> None:
        self.backend = backend
        self.specs = specs

    async def SubmitTask(
        self,
        request: session_service_pb2.SubmitTaskRequest,
        context: grpc.aio.ServicerContext,
    ) -> session_service_pb2.SubmitTaskResponse:
        # The authenticated principal owns the session; without auth, the peer as before.
        submitted_by = principal(context) or f"grpc:{context.peer() or 'grpc'}"
        remaining = context.time_remaining()
        try:
            submit = self._submit(request, submitted_by=submitted_by)
            if remaining is not None:
                session_id = await asyncio.wait_for(submit, remaining)
            else:
                session_id = await submit
        except SpecError as exc:
            field = exc.field or "task"
            await _invalid(context, field, str(exc), f"invalid task spec (field {field}): {exc}")
        except AdmissionError as exc:
            await _abort_exhausted(context, exc)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before the task was accepted"
            )
        except BusError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"event bus unavailable: {exc}")
        return session_service_pb2.SubmitTaskResponse(session_id=session_id)

    async def _submit(
        self, request: session_service_pb2.SubmitTaskRequest, submitted_by: str
    ) -> str:
        """Size check, then parse in a worker process, then hand the backend the parsed task
        as a message, so nothing costly is parsed on the event loop."""
        field = TEXT_FIELD if request.task_spec_text else "task"
        check_request_size(request.ByteSize(), self.specs.limits, field=field)
        task = await self.specs.validate(message=task_message(request), text=request.task_spec_text)
        parsed = session_service_pb2.SubmitTaskRequest()
        parsed.CopyFrom(request)
        parsed.ClearField("task_spec_text")
        parsed.task.CopyFrom(task_to_proto(task))
        return await self.backend.submit(parsed, submitted_by=submitted_by)

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
            await _invalid(context, "feedback.session_id", "feedback.session_id is empty")
        if not -1.0 <= fb.rating <= 1.0:
            await _invalid(
                context, "feedback.rating", f"feedback.rating must be in [-1, 1], got {fb.rating:g}"
            )
        await self._handle(fb.session_id, context)
        try:
            event_id = await self.backend.feedback(fb)
        except BusError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"event bus unavailable: {exc}")
        return session_service_pb2.SendFeedbackResponse(event_id=event_id)

    async def _handle(self, session_id: str, context: grpc.aio.ServicerContext) -> SessionHandle:
        if not session_id:
            await _invalid(context, "session_id", "session_id is empty")
        handle = self.backend.session(session_id)
        if handle is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no session {session_id!r}")
        assert handle is not None
        caller = principal(context)
        if caller and handle.submitted_by != caller:
            # Same answer whether the owner is another principal or unknown here.
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"session {session_id!r} was not submitted by {caller!r}",
            )
        return handle


async def _abort_exhausted(context: grpc.aio.ServicerContext, exc: AdmissionError) -> None:
    """RESOURCE_EXHAUSTED naming the limit (in the message and as ``podium-limit``)."""
    if exc.limit:
        context.set_trailing_metadata(((LIMIT_METADATA_KEY, exc.limit),))
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"not admitted: {exc}")


async def _decode(raw: bytes, cls: type[M], context: grpc.aio.ServicerContext) -> M:
    """``raw`` as a ``cls``, or the call aborted INVALID_ARGUMENT naming the problem."""
    try:
        return decode_message(raw, cls)
    except DecodeError as exc:
        await _invalid(context, REQUEST_FIELD, str(exc), f"undecodable request: {exc}")


async def _invalid(
    context: grpc.aio.ServicerContext, field: str, problem: str, message: str = ""
) -> NoReturn:
    """INVALID_ARGUMENT naming ``field``: a ``google.rpc.BadRequest`` detail (``field``,
    ``problem``) for any gRPC client's status library, and ``field`` again as the
    ``podium-field`` trailing entry; ``message`` (default: ``problem``) for humans."""
    await abort_bad_request(
        context, message or problem, [(field, problem)], metadata=((FIELD_METADATA_KEY, field),)
    )


Unary = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Message]]
Streaming = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Message]]


def _unary(behaviour: Unary, cls: type[Message], reply: type[Message]) -> grpc.RpcMethodHandler:
    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
        return await behaviour(await _decode(raw, cls, context), context)

    return grpc.unary_unary_rpc_method_handler(handle, response_serializer=reply.SerializeToString)


def _streaming(
    behaviour: Streaming, cls: type[Message], reply: type[Message]
) -> grpc.RpcMethodHandler:
    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        async for item in behaviour(await _decode(raw, cls, context), context):
            yield item

    return grpc.unary_stream_rpc_method_handler(handle, response_serializer=reply.SerializeToString)


def service_handler(
    servicer: object, service: Any = _SERVICE, module: Any = session_service_pb2
) -> grpc.GenericRpcHandler:
    """A service's methods (SessionService unless ``service``, a descriptor of ``module``'s
    file, says otherwise) with no request deserializer: each handler decodes its own bytes
    (:func:`_decode`), because a deserializer that raises makes gRPC answer UNKNOWN.

    Methods come from the contract's descriptor; one the servicer does not implement is left
    out, so gRPC answers UNIMPLEMENTED for it.
    """
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        behaviour = getattr(servicer, method.name, None)
        cls = getattr(module, method.input_type.name)
        reply = getattr(module, method.output_type.name)
        if method.server_streaming and inspect.isasyncgenfunction(behaviour):
            handlers[method.name] = _streaming(behaviour, cls, reply)
        elif not method.server_streaming and inspect.iscoroutinefunction(behaviour):
            handlers[method.name] = _unary(behaviour, cls, reply)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


class GrpcServer:
    """The orchestrator's grpc.aio server: SessionService, ReviewService (when given), health
    and tracing, reflection when ``PODIUM_GRPC_REFLECTION`` is on, authentication and TLS as
    ``PODIUM_GRPC_TOKENS`` / ``PODIUM_GRPC_TLS_*`` say; specs are checked against ``pool``.
    Raises ConfigError (naming the setting) for an unreadable token table or TLS file, or
    tokens without TLS."""

    def __init__(
        self,
        backend: SessionBackend,
        config: OrchestratorConfig,
        *,
        pool: PoolSpec,
        interceptor: grpc.aio.ServerInterceptor | None = None,
        review: ReviewServicer | None = None,
    ) -> None:
        options = [
            ("grpc.max_receive_message_length", config.grpc_max_receive_bytes),
            ("grpc.max_send_message_length", config.grpc_max_message_bytes),
        ]
        self.security = config.server_security(config.grpc_host)
        interceptors = [interceptor] if interceptor is not None else []
        self.server = grpc.aio.server(
            interceptors=[*interceptors, *self.security.interceptors(METHOD_ROLES)],
            options=options,
        )
        self.specs = SpecWorkers(pool, TaskLimits.of(config), max_pending=config.max_pending_specs)
        self.server.add_generic_rpc_handlers(
            (service_handler(SessionServicer(backend, self.specs)),)
        )
        self.services = [SERVICE_NAME]
        if review is not None:
            self.server.add_generic_rpc_handlers((service_handler(review, _REVIEW, review_pb2),))
            self.services.append(_REVIEW.full_name)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if config.grpc_reflection:
            reflection.enable_server_reflection(
                (
                    *self.services,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    reflection.SERVICE_NAME,
                ),
                self.server,
            )
        self.address = f"{config.grpc_host}:{config.grpc_port}"
        self.port = 0

    async def start(self) -> int:
        """Bind and start serving; returns the bound port (useful with port 0)."""
        self.port = self.security.bind(self.server, self.address)
        if self.port == 0:
            raise OSError(f"could not bind gRPC server to {self.address}")
        await self.server.start()
        self.specs.warm()
        await self.set_serving(True)
        return self.port

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING / NOT_SERVING for the whole server and for each service."""
        status = health_status(serving)
        for name in ("", *self.services):
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING first (so load balancers drain), then stop with a grace period."""
        await self.set_serving(False)
        await self.server.stop(grace_s)
        await self.specs.close()


def task_message(request: session_service_pb2.SubmitTaskRequest) -> task_pb2.TaskSpec | None:
    """The structured task of a request, or None when it only has text."""
    return request.task if request.HasField("task") else None
