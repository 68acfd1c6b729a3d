"""One learning cycle through a running local deployment, as an operator and a client do it.

1. **Cold start** (:func:`bootstrap`): the learner publishes only versions trained on sessions
   sampled by a learned version, and the rollout serves ``rules:cpls`` until a learned version
   is live; a new cluster therefore needs a first version, made live by an operator. It is
   published with the learner's own code and settings (the learner container's resolved env:
   its artifacts directory, model repository and signing key; ``SwarmPPO.publish`` on a fresh
   network) as version ``B``, one above any version already in the model repository (the V2
   server's repository may be shared), announced on the policy topic.
2. **Made live** (:func:`make_live`): the operator's override through RolloutService (the
   operator token, TLS with the deployment's CA): pause, propose ``B``, promote until live,
   resume, each recorded on the registry. The learner follows the registry and resets to ``B``.
3. **Sessions** (:func:`run_sessions`): submitted through SessionService with the ``trainer``
   token (so the orchestrator samples their actions and the learner may train on them),
   each streamed to its result.
4. **A new version** (:func:`wait_published`): a ``PolicyUpdated`` above ``B`` on the policy
   topic, signed by the deployment's key, and (:func:`wait_served`) the V2 server reporting
   that version of the model ready (the orchestrator loaded it through the repository API).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio

from podium import topics
from podium.bus import KafkaBus, KafkaConfig
from podium.bus.consumer import EventPublisher
from podium.codec import decode_event
from podium.config import from_env
from podium.errors import PodiumError
from podium.policy.signing import TrustedKeys, announcement_event_id
from podium.policy.swarm import MODEL_NAME
from podium.service.auth import client_channel
from podium.v1 import (
    reward_pb2,
    rollout_pb2,
    rollout_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
)
from podium_app.deploy.plan import LocalContainer, Plan

IDLE = rollout_pb2.ROLLOUT_STAGE_IDLE
SESSION_TASK = Path(__file__).resolve().parents[2] / "podium" / "data" / "tasks" / "layered-5.yaml"
"""The task every cycle session runs (a shipped one, small)."""


@dataclass(frozen=True)
class CycleResult:
    bootstrap_version: int
    sessions: int
    published: int
    """The version the learner announced after the sessions."""
    seconds: Mapping[str, float]
    """Time of each step."""


def container_of(plan: Plan, module: str, mode: str = "") -> LocalContainer:
    """The first container running ``python -m module`` (with ``PODIUM_LEARNER_MODE=mode``)."""
    for c in plan.containers:
        if module in c.argv and (not mode or c.env.get("PODIUM_LEARNER_MODE") == mode):
            return c
    raise PodiumError(
        f"the overlay runs no {module} container" + (f" in mode {mode}" if mode else "")
    )


def next_version(repository: Path) -> int:
    """One above every version directory of the model in ``repository``."""
    model = repository / MODEL_NAME
    versions = [int(p.name) for p in model.iterdir() if p.name.isdigit()] if model.is_dir() else []
    return max(versions, default=0) + 1


def publish_initial(learner_env: Mapping[str, str], version: int) -> reward_pb2.PolicyUpdated:
    """A fresh network published as ``version`` by the learner's own code and settings."""
    from learner_svc.algorithms.swarm import SwarmPPO, SwarmSettings

    algorithm = SwarmPPO.from_settings(from_env(SwarmSettings, learner_env))
    return algorithm.publish(version, 0, {})


async def bootstrap(plan: Plan, admin: KafkaConfig) -> int:
    """Publish and announce the initial version; its number."""
    learner = container_of(plan, "learner_svc", "swarm")
    repository = Path(learner.env["PODIUM_MODEL_REPOSITORY"])
    version = next_version(repository)
    event = await asyncio.to_thread(publish_initial, learner.env, version)
    bus = KafkaBus(admin)
    await bus.start()
    try:
        await EventPublisher(bus, producer_name="podium-deploy").publish(
            topics.POLICY_UPDATES, event, key=MODEL_NAME, event_id=announcement_event_id(event)
        )
    finally:
        await bus.stop()
    return version


def _channel(plan: Plan, address: str, principal: str) -> grpc.aio.Channel:
    token = plan.operator.tokens[principal].read_text().strip()
    return client_channel(address, token=token, ca_file=plan.operator.grpc_ca)


async def make_live(plan: Plan, address: str, version: int, timeout_s: float) -> None:
    """The operator's override: pause, propose, promote until ``version`` is live, resume."""
    reason = "podium deploy local: the initial policy made live by the operator (cold start)"
    async with _channel(plan, address, "operator") as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)  # type: ignore[no-untyped-call]
        command = rollout_pb2.RolloutCommand
        await _retry(
            lambda: stub.Pause(
                rollout_pb2.PauseRequest(command=command(reason=reason)), timeout=10
            ),
            timeout_s,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            state = (await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=10)).state
            if state.live_version == str(version) and state.stage == IDLE:
                break
            if time.monotonic() > deadline:
                raise PodiumError(f"version {version} could not be made live; state: {state}")
            try:
                if state.stage == IDLE:
                    await stub.Propose(
                        rollout_pb2.ProposeRequest(version=str(version), reason=reason), timeout=10
                    )
                else:
                    cmd = command(reason=reason, rollout_id=state.rollout_id)
                    await stub.Promote(rollout_pb2.PromoteRequest(command=cmd), timeout=10)
            except grpc.aio.AioRpcError:
                pass  # not yet read the announcement / a stage moved under us: look again
            await asyncio.sleep(0.5)
        await stub.Resume(rollout_pb2.ResumeRequest(command=command(reason=reason)), timeout=10)


async def _retry(call: Callable[[], Any], timeout_s: float) -> Any:
    """``call()`` until it does not fail with UNAVAILABLE (a server still binding)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def run_sessions(plan: Plan, address: str, count: int, timeout_s: float) -> list[str]:
    """``count`` sessions submitted as ``trainer``, each streamed to its result; their outcomes."""
    task = await asyncio.to_thread(SESSION_TASK.read_text)
    async with _channel(plan, address, "trainer") as channel:
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
    "CycleResult",
    "bootstrap",
    "container_of",
    "make_live",
    "next_version",
    "publish_initial",
    "run_sessions",
    "wait_published",
    "wait_served",
]
