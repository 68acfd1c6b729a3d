"""One learning cycle through a running local deployment, as a client sees it: no operator.

1. **Cold start**: done by the deployment itself, the ``bootstrap`` Job (k8s/base/bootstrap.yaml,
   :mod:`podium_app.bootstrap`), run to completion by :func:`podium_app.deploy.run.deploy_local`:
   a behaviour clone published with the learner's settings and key and made live through
   RolloutService. :func:`live_version` reads which version it made live, :func:`wait_served`
   waits until the V2 server serves it (the orchestrator loaded it through the repository API).
2. **Sessions** (:func:`run_sessions`): submitted through SessionService over TLS with an
   ordinary client's token (``user``, not ``trainer``), each streamed to its result; the
   orchestrators' exploration share (``PODIUM_EXPLORE_SHARE``) samples some of them, and the
   learner trains on those. Rounds go on until
3. **a new version** (:func:`wait_published`): a ``PolicyUpdated`` above the live one on the
   policy topic, signed by the deployment's key, and (:func:`wait_served`) the V2 server
   reporting that version of the model ready.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc.aio

from podium import topics
from podium.bus import KafkaBus, KafkaConfig
from podium.codec import decode_event
from podium.errors import PodiumError
from podium.policy.signing import TrustedKeys
from podium.policy.swarm import MODEL_NAME
from podium.service.auth import client_channel
from podium.v1 import (
    reward_pb2,
    rollout_pb2,
    rollout_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
)
from podium_app.deploy.plan import Plan

SESSION_TASK = Path(__file__).resolve().parents[2] / "podium" / "data" / "tasks" / "layered-5.yaml"
"""The task every cycle session runs (a shipped one, small)."""
CLIENT = "user"
"""The principal the cycle's sessions are submitted as: an ordinary client (plugin role), not
``trainer``; only the exploration share samples its sessions."""


@dataclass(frozen=True)
class CycleResult:
    bootstrap_version: int
    """The learned version live after the cold-start Job."""
    sessions: int
    """Sessions submitted (in rounds, until the learner published)."""
    published: int
    """The version the learner announced after the sessions."""
    seconds: Mapping[str, float]
    """Time of each step."""


def _channel(plan: Plan, address: str, principal: str) -> grpc.aio.Channel:
    token = plan.operator.tokens[principal].read_text().strip()
    return client_channel(address, token=token, ca_file=plan.operator.grpc_ca)


async def live_version(plan: Plan, address: str, timeout_s: float) -> str:
    """The version the rollout serves now (RolloutService, with the operator's token)."""
    async with _channel(plan, address, "operator") as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status = await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=10)
                return str(status.state.live_version)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


async def run_sessions(
    plan: Plan, address: str, count: int, timeout_s: float, principal: str = CLIENT
) -> list[str]:
    """``count`` sessions submitted as ``principal``, each streamed to its result; their
    outcomes."""
    task = await asyncio.to_thread(SESSION_TASK.read_text)
    async with _channel(plan, address, principal) as channel:
        stub = session_service_pb2_grpc.SessionServiceStub(channel)  # type: ignore[no-untyped-call]

        async def one(i: int) -> str:
            request = session_service_pb2.SubmitTaskRequest(
                task_spec_text=task, client_request_id=f"deploy-{uuid.uuid4()}", seed=1000 + i
            )
            submitted = await stub.SubmitTask(request, timeout=30)
            stream = stub.StreamSession(
                session_service_pb2.StreamSessionRequest(session_id=submitted.session_id),
                timeout=timeout_s,
            )
            async for event in stream:
                if event.HasField("result"):
                    return str(event.result)
            raise PodiumError(f"session {submitted.session_id} ended without a result")

        return await asyncio.gather(*(one(i) for i in range(count)))


async def wait_published(
    admin: KafkaConfig, above: int, trusted: TrustedKeys, timeout_s: float
) -> int:
    """The first version above ``above`` announced on the policy topic and signed by a key of
    ``trusted`` (another deployment sharing the broker is ignored)."""
    bus = KafkaBus(admin)
    await bus.start()
    group = f"podium-deploy.{uuid.uuid4().hex[:8]}"
    sub = bus.subscriber([topics.POLICY_UPDATES], group)
    await sub.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for record in await sub.fetch(timeout_s=1.0):
                _, event = decode_event(record.value, reward_pb2.PolicyUpdated)
                if event.model_name == MODEL_NAME and event.version > above:
                    trusted.verify(event)
                    return int(event.version)
    finally:
        await sub.stop()
        await bus.stop()
    raise PodiumError(f"no version above {above} was announced within {timeout_s:.0f}s")


async def wait_served(grpc_address: str, version: int, timeout_s: float) -> None:
    """Until the V2 server reports the model ready and ``version`` among the versions it
    serves (its metadata)."""
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(grpc_address)
    deadline = time.monotonic() + timeout_s
    last = ""
    try:
        while time.monotonic() < deadline:
            try:
                # MLServer knows a model by name (its metadata lists the version it serves);
                # Triton answers both ways: the name's readiness plus the metadata fits both.
                if await client.is_model_ready(MODEL_NAME):
                    versions = list((await client.get_model_metadata(MODEL_NAME)).versions)
                    if str(version) in versions:
                        return
                    last = f"serving versions {versions}"
                else:
                    last = "not ready"
            except InferenceServerException as exc:
                last = str(exc)  # not loaded yet: the server says it does not know it
            await asyncio.sleep(0.5)
    finally:
        await client.close()
    raise PodiumError(f"the V2 server never reported {MODEL_NAME} v{version} ready: {last}")


__all__ = [
    "CLIENT",
    "CycleResult",
    "live_version",
    "run_sessions",
    "wait_published",
    "wait_served",
]
