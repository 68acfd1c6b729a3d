"""RolloutService over real gRPC: every command, its errors, and the operator role."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rollout_helpers import K, app, settings, until

from learner_svc.rollout.app import RolloutApp
from podium.bus import InProcBus
from podium.service.auth import client_channel, token_digest
from podium.v1 import rollout_pb2, rollout_pb2_grpc

TOKENS = {"operator": "op-secret", "plugin": "plugin-secret", "reviewer": "rev-secret"}


@pytest.fixture
async def served(
    inproc_bus: InProcBus, unique: Callable[[str], str], tmp_path: Path
) -> AsyncIterator[RolloutApp]:
    table = tmp_path / "tokens.json"
    entries = [
        {"name": f"{role}-1", "sha256": token_digest(tok), "roles": [role]}
        for role, tok in TOKENS.items()
    ]
    table.write_text(json.dumps({"tokens": entries}))
    s = settings(unique, grpc_tokens=str(table), grpc_plaintext_tokens=True, tick_s=0.02)
    a = app(s, inproc_bus, serve_grpc=True)
    await a.start()
    await until(lambda: a.controller.writer, what="the writer role")
    try:
        yield a
    finally:
        await a.stop()


async def call(
    a: RolloutApp, method: str, request: object, role: str | None = "operator"
) -> object:
    token = TOKENS[role] if role else None
    async with client_channel(f"127.0.0.1:{a.grpc_port}", token=token, ca_file=None) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        return await getattr(stub, method)(request, timeout=10)


def command(reason: str = "test", rollout_id: str = "") -> rollout_pb2.RolloutCommand:
    return rollout_pb2.RolloutCommand(reason=reason, rollout_id=rollout_id)


async def test_operator_drives_a_rollout(served: RolloutApp) -> None:
    status = await call(served, "GetStatus", rollout_pb2.GetStatusRequest())
    assert isinstance(status, rollout_pb2.GetStatusResponse)
    assert status.state.live_version == "rules:cpls" and status.state.writer_epoch == 2
    assert [t.kind for t in status.transitions] == [K.TRANSITION_KIND_WRITER_CLAIMED]

    paused = await call(served, "Pause", rollout_pb2.PauseRequest(command=command("hold")))
    assert paused.result.state.paused and paused.result.transition.actor == "operator:operator-1"
    proposed = await call(
        served, "Propose", rollout_pb2.ProposeRequest(version="rules:greedy", reason="try it")
    )
    state = proposed.result.state
    assert state.stage == rollout_pb2.ROLLOUT_STAGE_OFFLINE_CHECK
    assert state.rollout_id == "1:rules:greedy"
    promoted = await call(
        served, "Promote", rollout_pb2.PromoteRequest(command=command("skip", state.rollout_id))
    )
    assert promoted.result.transition.kind == K.TRANSITION_KIND_OPERATOR_PROMOTED
    assert promoted.result.state.stage == rollout_pb2.ROLLOUT_STAGE_SHADOW
    resumed = await call(served, "Resume", rollout_pb2.ResumeRequest(command=command()))
    assert not resumed.result.state.paused
    back = await call(
        served, "Rollback", rollout_pb2.RollbackRequest(command=command("no", state.rollout_id))
    )
    assert back.result.transition.kind == K.TRANSITION_KIND_ROLLED_BACK
    assert back.result.state.stage == rollout_pb2.ROLLOUT_STAGE_IDLE
    assert back.result.transition.reason == "no"
    status = await call(served, "GetStatus", rollout_pb2.GetStatusRequest(transitions=3))
    assert [t.kind for t in status.transitions] == [
        K.TRANSITION_KIND_OPERATOR_PROMOTED,
        K.TRANSITION_KIND_RESUMED,
        K.TRANSITION_KIND_ROLLED_BACK,
    ]


async def test_commands_that_do_not_apply_fail_precondition(served: RolloutApp) -> None:
    async def refused(method: str, request: object) -> str:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(served, method, request)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
        return str(err.value.details())

    assert "resume" in await refused("Resume", rollout_pb2.ResumeRequest(command=command()))
    assert "rules:nope" in await refused(
        "Propose", rollout_pb2.ProposeRequest(version="rules:nope")
    )
    assert "announcement" in await refused("Propose", rollout_pb2.ProposeRequest(version="7"))
    await call(served, "Pause", rollout_pb2.PauseRequest(command=command()))
    proposed = await call(served, "Propose", rollout_pb2.ProposeRequest(version="rules:greedy"))
    await refused("Propose", rollout_pb2.ProposeRequest(version="rules:sequential"))
    stale = await refused(
        "Rollback", rollout_pb2.RollbackRequest(command=command(rollout_id="0:rules:old"))
    )
    assert "stale" in stale and proposed.result.state.rollout_id in stale
    status = await call(served, "GetStatus", rollout_pb2.GetStatusRequest())
    assert status.state.candidate_version == "rules:greedy", "a refused command changed nothing"


@pytest.mark.parametrize(
    ("role", "code"),
    [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        ("plugin", grpc.StatusCode.PERMISSION_DENIED),
        ("reviewer", grpc.StatusCode.PERMISSION_DENIED),
    ],
)
async def test_only_operators_may_call(
    served: RolloutApp, role: str | None, code: grpc.StatusCode
) -> None:
    for method, request in (
        ("GetStatus", rollout_pb2.GetStatusRequest()),
        ("Pause", rollout_pb2.PauseRequest(command=command())),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(served, method, request, role=role)
        assert err.value.code() == code
    status = await call(served, "GetStatus", rollout_pb2.GetStatusRequest())
    assert not status.state.paused


async def test_health_answers_without_a_token(served: RolloutApp) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "podium.v1.RolloutService"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
