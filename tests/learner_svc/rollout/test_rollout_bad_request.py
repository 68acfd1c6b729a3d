"""RolloutService: a Propose whose version is not a version at all is INVALID_ARGUMENT with a
google.rpc.BadRequest naming the field (real gRPC on loopback, decoded with
grpc_status.rpc_status.from_call); one that could be a version but is not a candidate now
stays FAILED_PRECONDITION."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio
import pytest
from google.rpc import code_pb2, error_details_pb2
from grpc_status import rpc_status
from rollout_helpers import app, settings, until

from learner_svc.rollout.app import RolloutApp
from podium.bus import InProcBus
from podium.v1 import rollout_pb2, rollout_pb2_grpc


@pytest.fixture
async def served(inproc_bus: InProcBus, unique: Callable[[str], str]) -> AsyncIterator[RolloutApp]:
    a = app(settings(unique, tick_s=0.02), inproc_bus, serve_grpc=True)
    await a.start()
    await until(lambda: a.controller.writer, what="the writer role")
    try:
        yield a
    finally:
        await a.stop()


async def _propose(a: RolloutApp, version: str) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{a.grpc_port}") as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Propose(rollout_pb2.ProposeRequest(version=version), timeout=10)
    return info.value


@pytest.mark.parametrize("version", ["", "v7", "rules:", "12a"])
async def test_malformed_version_is_a_bad_request(served: RolloutApp, version: str) -> None:
    error = await _propose(served, version)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error)
    assert status is not None and status.code == code_pb2.INVALID_ARGUMENT
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    (violation,) = bad.field_violations
    assert violation.field == "version"
    assert "neither a decimal version nor rules:<name>" in violation.description or (
        "no rule engine" in violation.description
    )


@pytest.mark.parametrize("version", ["rules:nope", "41"])
async def test_well_formed_but_unavailable_stays_failed_precondition(
    served: RolloutApp, version: str
) -> None:
    error = await _propose(served, version)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert rpc_status.from_call(error) is None
