"""The codec layer: the only place where bytes become messages and messages become bytes.

Every record on a Podium topic is a serialised :class:`podium.v1.envelope_pb2.Envelope`
whose ``payload`` is a ``google.protobuf.Any``. Producers call :func:`encode_event`;
consumers call :func:`decode_envelope` then :func:`unpack`. Anything that fails here raises
:class:`~podium.errors.DecodeError` (never retriable), which consumer loops route to the
dead-letter topic.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError as _PbDecodeError
from google.protobuf.message import Message

from podium.errors import DecodeError
from podium.v1 import (
    envelope_pb2,
    orchestrator_pb2,
    review_pb2,
    reward_pb2,
    rollout_pb2,
    subtask_pb2,
    task_pb2,
    trajectory_pb2,
)

SCHEMA_VERSION = 1
"""Schema version stamped on every envelope this code writes."""

_TYPE_URL_PREFIX = "type.googleapis.com/"

_REGISTRY: dict[str, type[Message]] = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        task_pb2.TaskSubmitted,
        subtask_pb2.SubtaskAssigned,
        subtask_pb2.SubtaskResult,
        trajectory_pb2.Trajectory,
        reward_pb2.ScoredTrajectory,
        reward_pb2.PolicyUpdated,
        reward_pb2.Feedback,
        orchestrator_pb2.SessionDone,
        rollout_pb2.RolloutState,
        rollout_pb2.RolloutTransition,
        rollout_pb2.ControllerCheckpoint,
        review_pb2.ReviewEvent,
    )
}
"""Event payload types Podium knows, by fully qualified name."""

M = TypeVar("M", bound=Message)


def event_types() -> tuple[str, ...]:
    """Fully qualified names of every event payload type."""
    return tuple(sorted(_REGISTRY))


def encode_event(
    payload: Message,
    *,
    producer: str,
    key: str = "",
    trace_context: Mapping[str, str] | None = None,
    idempotency_key: str = "",
    event_id: str | None = None,
    occurred_at: datetime | None = None,
) -> tuple[envelope_pb2.Envelope, bytes]:
    """Wrap ``payload`` in a new envelope and serialise it.

    Returns the envelope (so callers can log its id) and its wire bytes.
    """
    name = payload.DESCRIPTOR.full_name
    if name not in _REGISTRY:
        raise DecodeError(f"{name} is not a Podium event type; known: {', '.join(event_types())}")
    env = envelope_pb2.Envelope(
        event_id=event_id or str(uuid.uuid4()),
        type=name,
        schema_version=SCHEMA_VERSION,
        producer=producer,
        idempotency_key=idempotency_key,
        key=key,
    )
    now = datetime.now(UTC)
    env.produced_at.FromDatetime(now)
    env.occurred_at.FromDatetime(occurred_at or now)
    if trace_context:
        env.trace_context.update(trace_context)
    env.payload.Pack(payload)
    return env, env.SerializeToString()


def decode_message(data: bytes, cls: type[M]) -> M:
    """Parse the bytes of a plain message (e.g. a gRPC request) as a ``cls``; a
    :class:`DecodeError` naming the type and the size when they are not one."""
    message = cls()
    try:
        message.ParseFromString(data)
    except _PbDecodeError as exc:
        raise DecodeError(
            f"malformed protobuf: {len(data)} bytes are not a {cls.DESCRIPTOR.full_name} ({exc})"
        ) from exc
    return message


def decode_envelope(data: bytes | None) -> envelope_pb2.Envelope:
    """Parse record bytes into an envelope, checking it is a complete Podium event."""
    if not data:
        raise DecodeError("empty record: expected a serialised podium.v1.Envelope")
    env = decode_message(data, envelope_pb2.Envelope)
    if not env.event_id:
        raise DecodeError("envelope has no event_id")
    if not env.payload.type_url:
        raise DecodeError(f"envelope {env.event_id} has no payload")
    payload_name = env.payload.type_url.removeprefix(_TYPE_URL_PREFIX)
    if payload_name not in _REGISTRY:
        raise DecodeError(f"envelope {env.event_id}: unknown payload type {payload_name!r}")
    if env.type and env.type != payload_name:
        raise DecodeError(
            f"envelope {env.event_id}: type {env.type!r} does not match payload {payload_name!r}"
        )
    return env


def unpack(env: envelope_pb2.Envelope, expected: type[M] | None = None) -> Message:
    """Return the payload message of ``env``; if ``expected`` is given it must match."""
    payload_name = env.payload.type_url.removeprefix(_TYPE_URL_PREFIX)
    cls = _REGISTRY.get(payload_name)
    if cls is None:
        raise DecodeError(f"envelope {env.event_id}: unknown payload type {payload_name!r}")
    if expected is not None and cls is not expected:
        raise DecodeError(
            f"envelope {env.event_id}: expected {expected.DESCRIPTOR.full_name}, got {payload_name}"
        )
    msg = cls()
    try:
        msg.ParseFromString(env.payload.value)
    except _PbDecodeError as exc:
        raise DecodeError(
            f"envelope {env.event_id}: malformed {payload_name} payload ({exc})"
        ) from exc
    return msg


def unpack_as(env: envelope_pb2.Envelope, expected: type[M]) -> M:
    """Typed form of :func:`unpack`."""
    msg = unpack(env, expected)
    assert isinstance(msg, expected)
    return msg


def decode_event(data: bytes | None, expected: type[M]) -> tuple[envelope_pb2.Envelope, M]:
    """Decode record bytes straight to ``(envelope, payload)`` of the expected type."""
    env = decode_envelope(data)
    return env, unpack_as(env, expected)


def message_from_json(text: str, cls: type[M]) -> M:
    """Parse the protobuf JSON mapping of ``cls``; unknown fields are an error naming them."""
    msg = cls()
    try:
        json_format.Parse(text, msg, ignore_unknown_fields=False)
    except (json_format.ParseError, json.JSONDecodeError) as exc:
        raise DecodeError(f"invalid {cls.DESCRIPTOR.full_name} JSON: {exc}") from exc
    return msg


def message_to_json(msg: Message) -> str:
    """Protobuf JSON mapping of ``msg`` (field names as in the .proto)."""
    return json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=2)
