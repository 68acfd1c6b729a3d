"""gRPC errors with machine-readable details: Google's richer error model.

An invalid request is answered ``INVALID_ARGUMENT`` with a ``google.rpc.Status`` whose
details hold a ``google.rpc.BadRequest``: one ``field_violations`` entry per offending field,
each naming the field and what is wrong with it. The status travels in the standard
``grpc-status-details-bin`` trailing metadata entry, so any gRPC client decodes it with its
own library (Python: ``grpc_status.rpc_status.from_call(error)``; Go: ``status.FromError``;
Java: ``StatusProto.fromThrowable``) rather than parsing the message text. The message
stays human-readable for clients that only print it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import grpc
import grpc.aio
from google.protobuf import any_pb2

# Neither package ships type stubs; their messages are typed Any here.
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status  # type: ignore[import-untyped]

FieldViolation = tuple[str, str]
"""(field, description): the request field at fault (a path such as ``feedback.rating``) and
what is wrong with it."""


def bad_request_status(message: str, violations: Sequence[FieldViolation]) -> status_pb2.Status:
    """``google.rpc.Status`` INVALID_ARGUMENT with one ``BadRequest`` detail listing
    ``violations``; a request can only be invalid because of some field, so one is required."""
    if not violations:
        raise ValueError("a BadRequest names at least one field violation")
    detail = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description=description)
            for field, description in violations
        ]
    )
    packed = any_pb2.Any()
    packed.Pack(detail)
    return status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=message, details=[packed])


async def abort_bad_request(
    context: grpc.aio.ServicerContext,
    message: str,
    violations: Sequence[FieldViolation],
    *,
    metadata: Sequence[tuple[str, str]] = (),
) -> NoReturn:
    """End the call INVALID_ARGUMENT with ``message`` and a ``BadRequest`` of ``violations``.

    ``metadata`` adds trailing entries of the service's own (kept for clients that read them);
    they are sent with the status's ``grpc-status-details-bin`` in one set, because aborting
    replaces any trailing metadata set before.
    """
    status = rpc_status.to_status(bad_request_status(message, violations))
    await context.abort(
        status.code, status.details, trailing_metadata=(*status.trailing_metadata, *metadata)
    )
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover
