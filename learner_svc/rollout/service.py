"""RolloutService: how operators drive rollouts (``podium rollout ...``), on a grpc.aio server
with health, authenticated with the ``operator`` role when ``PODIUM_GRPC_TOKENS`` is set.

Every command goes through the controller's writer loop (:meth:`RolloutController.command`),
so it is serialised with the batches and written with its transition. Errors: a command that
does not apply to the state, or a stale ``rollout_id``, is ``FAILED_PRECONDITION`` with the
state machine's message; a ``version`` that is not one at all (neither decimal nor
``rules:<name>``) is ``INVALID_ARGUMENT`` with a ``google.rpc.BadRequest`` naming the field
(:mod:`podium.service.rich_status`); a version that cannot be a candidate now (an unknown rule
engine, no verified announcement yet) is ``FAILED_PRECONDITION`` naming why; a controller that is not the writer now is ``UNAVAILABLE`` (retry: the writer is
the one holding every input partition; commands and GetStatus wait up to
:data:`~learner_svc.rollout.controller.WRITER_WAIT_S` for it first); a broker failure is
``UNAVAILABLE``.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, NoReturn

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2_grpc

from learner_svc.rollout.config import ControllerSettings
from learner_svc.rollout.controller import (
    WRITER_WAIT_S,
    Command,
    NotWriter,
    RolloutController,
    Step,
    status_evidence,
)
from learner_svc.rollout.twins import RULE_PREFIX
from podium.errors import BusError, RolloutConflict
from podium.policy.versions import is_version_number
from podium.rollout import advance, pause, propose, resume, rollback
from podium.service import health_status
from podium.service.auth import OPERATOR, principal
from podium.service.rich_status import abort_bad_request
from podium.telemetry import server_interceptor
from podium.v1 import rollout_pb2, rollout_pb2_grpc

_log = logging.getLogger(__name__)

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
"""``podium.v1.RolloutService``."""
METHOD_ROLES = {f"/{SERVICE_NAME}/*": OPERATOR}
"""Every method needs the operator role."""


def actor_of(context: grpc.aio.ServicerContext) -> str:
    """``operator:<principal>`` (``operator:anonymous`` when authentication is off)."""
    return f"operator:{principal(context) or 'anonymous'}"


def result_of(transition: rollout_pb2.RolloutTransition) -> rollout_pb2.RolloutCommandResult:
    """What a command returns: the state it produced and its transition."""
    return rollout_pb2.RolloutCommandResult(state=transition.state, transition=transition)


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    """The handlers; the controller does the work."""

    def __init__(self, controller: RolloutController) -> None:
        self.controller = controller

    async def _run(
        self, context: grpc.aio.ServicerContext, name: str, apply: Command, rollout_id: str = ""
    ) -> rollout_pb2.RolloutCommandResult:
        try:
            return result_of(await self.controller.command(name, apply, rollout_id))
        except RolloutConflict as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except (NotWriter, BusError) as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    def _evidence(self, state: rollout_pb2.RolloutState) -> rollout_pb2.Evidence:
        return status_evidence(self.controller.evidence, state)

    async def GetStatus(
        self, request: rollout_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> rollout_pb2.GetStatusResponse:
        # Only the writer's view is current: a standby (or a controller still taking over)
        # would show a state that may already have moved on.
        if not await self.controller.wait_writer(WRITER_WAIT_S):
            await _abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                f"{self.controller.instance} is not the rollout writer now; try again shortly",
            )
        return self.controller.status(request.transitions)

    async def Propose(
        self, request: rollout_pb2.ProposeRequest, context: grpc.aio.ServicerContext
    ) -> rollout_pb2.ProposeResponse:
        why = self.controller.runner.candidates.check(request.version)
        if why is not None and not _well_formed(request.version):
            # Not a version at all: the request is wrong whatever the state, so the field is named.
            await abort_bad_request(context, f"propose: {why}", [("version", why)])
        if why is not None:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"propose: {why}")
        actor, version, reason = actor_of(context), request.version, request.reason

        def apply(state: rollout_pb2.RolloutState, now: datetime) -> Step:
            return propose(state, version, reason or f"proposed by {actor}", actor, now)

        return rollout_pb2.ProposeResponse(result=await self._run(context, "propose", apply))

    async def Promote(
        self, request: rollout_pb2.PromoteRequest, context: grpc.aio.ServicerContext
    ) -> rollout_pb2.PromoteResponse:
        actor, cmd, stages = actor_of(context), request.command, self.controller.rules.stages

        def apply(state: rollout_pb2.RolloutState, now: datetime) -> Step:
            ev = self._evidence(state)
            if cmd.reason:
                ev.summary = f"{cmd.reason} ({ev.summary})"
            return advance(state, ev, now, actor=actor, override=True, stages=stages)

        result = await self._run(context, "promote", apply, cmd.rollout_id)
        return rollout_pb2.PromoteResponse(result=result)

    async def Pause(
        self, request: rollout_pb2.PauseRequest, context: grpc.aio.ServicerContext
    ) -> rollout_pb2.PauseResponse:
        actor, cmd = actor_of(context), request.command

        def apply(state: rollout_pb2.RolloutState, now: datetime) -> Step:
            return pause(state, cmd.reason or f"paused by {actor}", actor, now)

        result = await self._run(context, "pause", apply, cmd.rollout_id)
        return rollout_pb2.PauseResponse(result=result)

    async def Resume(
        self, request: rollout_pb2.ResumeRequest, context: grpc.aio.ServicerContext
    ) -> rollout_pb2.ResumeResponse:
        actor, cmd = actor_of(context), request.command

        def apply(state: rollout_pb2.RolloutState, now: datetime) -> Step:
            return resume(state, cmd.reason or f"resumed by {actor}", actor, now)

        result = await self._run(context, "resume", apply, cmd.rollout_id)
        return rollout_pb2.ResumeResponse(result=result)

    async def Rollback(
        self, request: rollout_pb2.RollbackRequest, context: grpc.aio.ServicerContext
    ) -> rollout_pb2.RollbackResponse:
        actor, cmd = actor_of(context), request.command

        def apply(state: rollout_pb2.RolloutState, now: datetime) -> Step:
            reason = cmd.reason or f"rolled back by {actor}"
            return rollback(state, reason, self._evidence(state), now, actor)

        result = await self._run(context, "rollback", apply, cmd.rollout_id)
        return rollout_pb2.RollbackResponse(result=result)


def _well_formed(version: str) -> bool:
    """Whether ``version`` has the form of one (decimal, or ``rules:<name>``), known or not."""
    return is_version_number(version) or (
        version.startswith(RULE_PREFIX) and len(version) > len(RULE_PREFIX)
    )


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class RolloutServer:
    """RolloutService + health on one grpc.aio server (TLS and tokens per the settings).

    The settings are checked when it is built (a bad token table or TLS file fails the
    process before it connects); the grpc.aio server itself is made in :meth:`start`, since
    it belongs to the event loop it is created in."""

    def __init__(self, controller: RolloutController, settings: ControllerSettings) -> None:
        self.security = settings.server_security(settings.grpc_host)
        self.controller = controller
        self.address = f"{settings.grpc_host}:{settings.grpc_port}"
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0)."""
        # Traced first (the global provider: a standalone process installs it), then checked.
        interceptors = [server_interceptor(), *self.security.interceptors(METHOD_ROLES)]
        server = grpc.aio.server(interceptors=interceptors)
        # The generated registration function carries no annotations (protoc's grpc plugin).
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(  # type: ignore[no-untyped-call]
            RolloutServicer(self.controller), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.port = self.security.bind(server, self.address)
        if self.port == 0:
            raise OSError(f"PODIUM_ROLLOUT_GRPC_PORT: could not bind {self.address}")
        await server.start()
        self.server = server
        await self.set_serving(True)
        return self.port

    async def set_serving(self, serving: bool) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_status(serving))

    async def stop(self, grace_s: float) -> None:
        await self.set_serving(False)
        if self.server is not None:
            await self.server.stop(grace_s)


__all__: list[Any] = ["METHOD_ROLES", "SERVICE_NAME", "RolloutServer", "RolloutServicer"]
