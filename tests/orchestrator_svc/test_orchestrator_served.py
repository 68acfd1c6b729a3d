"""orchestrator_svc deciding through a real KServe-V2 server (``PODIUM_POLICY_BACKEND=v2://``).

Versions are made exactly as the learner makes them: weights saved with ``save_policy``, the
ONNX export written into the server's model repository with ``export_swarm_policy``, and the
``PolicyUpdated`` event built by ``swarm_policy_updated``, published on the bus. The
orchestrator verifies the export, has the server load it through the repository API, and
decides through tritonclient; sub-agents run as ``subagent_svc`` workers on the same bus, and
sessions are submitted and followed over real gRPC on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc.aio
import numpy as np
import pytest
import torch
from signing_helpers import key_pair, signed
from svc_helpers import LOGIN_TASK

from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from orchestrator_svc.learned import SCOUTED_LABEL
from podium import topics
from podium.bus import InProcBus
from podium.bus.consumer import EventPublisher
from podium.envs.swarm import EnvConfig, SwarmEnv, TaskSpec, default_pool, default_tasks
from podium.envs.swarm.generator import generate_suite
from podium.envs.swarm.trajectory import task_to_proto
from podium.policy.agent import SwarmAgent
from podium.policy.decisions import episode_from_trajectory
from podium.policy.swarm import (
    MODEL_NAME,
    export_swarm_policy,
    save_policy,
    serving_signature,
    swarm_policy_updated,
)
from podium.serving.backends import LocalPolicy, ServedPolicy
from podium.serving.contract import PolicyInputs
from podium.v1 import reward_pb2, task_pb2, trajectory_pb2
from podium.v1 import session_service_pb2 as ss
from podium.v1 import session_service_pb2_grpc as ss_grpc
from subagent_svc import SubagentApp, SubagentConfig

pytestmark = pytest.mark.serving

"""A task with dependencies and splittable subtasks, submitted as text over gRPC."""


@pytest.fixture
def first_version(v2_grpc: str, v2_repository: Path) -> Iterator[int]:
    """A version number newer than any ``swarm_policy`` version already in the repository.

    These tests serve the real model name (the orchestrator's), so they cannot take a name of
    their own as the other server tests do; versions are immutable, so each test numbers its
    versions after whatever earlier runs left there. The model is unloaded afterwards.
    """
    import tritonclient.grpc as grpcclient

    model_dir = v2_repository / MODEL_NAME
    existing = [int(d.name) for d in model_dir.glob("*") if d.name.isdigit()]
    yield max(existing, default=0) + 1
    client = grpcclient.InferenceServerClient(v2_grpc)
    try:
        client.unload_model(MODEL_NAME)
    except Exception:
        pass  # never loaded
    finally:
        client.close()


def layout_agent(seed: int) -> SwarmAgent:
    """A freshly initialised policy for the default pool (distinct weights per seed)."""
    env = SwarmEnv(tasks(), default_pool(), EnvConfig(max_subtasks=64))
    torch.manual_seed(seed)
    return SwarmAgent(env.layout)


def tasks() -> list[TaskSpec]:
    return generate_suite(4, seed=21, sizes=(5, 12))


def publish_version(
    agent: SwarmAgent, artifacts: Path, repository: Path, version: int
) -> reward_pb2.PolicyUpdated:
    """What the learner does for a version: weights, ONNX export, the event."""
    agents = tuple(agent.layout.agents)
    ref = save_policy(agent.net, artifacts, version, agents, max_subtasks="64")
    return swarm_policy_updated(ref, export_swarm_policy(agent.net, repository, version))


_KEYS_DIR = tempfile.TemporaryDirectory(prefix="served-keys-")
KEYS = key_pair(Path(_KEYS_DIR.name))
"""The learner's signing pair; the orchestrators trust its public half."""


async def announce(bus: InProcBus, event: reward_pb2.PolicyUpdated) -> None:
    """Publish ``event`` signed by the learner's key (as the learner signs what it announces,
    even a hash its file turns out not to have)."""
    await EventPublisher(bus, producer_name="test-learner").publish(
        topics.POLICY_UPDATES, signed(event, KEYS), key=MODEL_NAME
    )


@contextlib.asynccontextmanager
async def orchestrator(
    backend: str,
    *,
    grpc: bool = False,
    time_scale: float = 0.0,
    group: str = "srv",
    scout: bool = False,
) -> AsyncIterator[tuple[InProcBus, OrchestratorApp]]:
    """A learned-policy orchestrator on ``backend`` and two sub-agent workers, on a bus
    (``scout``: ``PODIUM_SCOUT=on``)."""
    bus = InProcBus()
    await bus.start()
    orch = OrchestratorApp(
        OrchestratorConfig(
            bus_url="embedded",
            group_id=f"{group}.orchestrator",
            grpc_host="127.0.0.1",
            grpc_port=0,
            policy="learned",
            # The newest loaded version serves (no rollout controller here): hot swap.
            rollout="latest",
            policy_trusted_keys=str(KEYS.public_path),
            policy_backend=backend,
            scout=scout,
            serving_timeout_s=10.0,
            serving_ready_timeout_s=10.0,
            session_timeout_s=60.0,
            shutdown_timeout_s=10.0,
        ),
        bus,
        serve_grpc=grpc,
    )
    workers = [
        SubagentApp(
            SubagentConfig(
                bus_url="embedded",
                group_id=f"{group}.subagent",
                instance=f"w{i}",
                time_scale=time_scale,
                shutdown_timeout_s=10.0,
            ),
            bus,
        )
        for i in range(2)
    ]
    started: list[OrchestratorApp | SubagentApp] = []
    try:
        for app in [*workers, orch]:
            await app.start()
            started.append(app)
        yield bus, orch
    finally:
        for app in reversed(started):
            await app.stop()
        await bus.stop()


async def wait_for(predicate: object, what: str, timeout_s: float = 60.0) -> None:
    assert callable(predicate)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def run_bus_session(
    bus: InProcBus, orch: OrchestratorApp, task: TaskSpec, seed: int, submitted_by: str
) -> trajectory_pb2.Trajectory:
    sid = f"{submitted_by}-{seed}-{id(orch)}"
    await EventPublisher(bus, producer_name="test").publish(
        topics.TASKS,
        task_pb2.TaskSubmitted(
            session_id=sid, task=task_to_proto(task), submitted_by=submitted_by, seed=seed
        ),
        key=sid,
    )
    await wait_for(
        lambda: (h := orch.session(sid)) is not None and h.trajectory is not None, f"session {sid}"
    )
    handle = orch.session(sid)
    assert handle is not None and handle.trajectory is not None
    return handle.trajectory


async def test_served_sessions_decide_exactly_as_local_torch(
    v2_grpc: str, v2_repository: Path, first_version: int, tmp_path: Path
) -> None:
    """Same weights, same sessions (seeds): same actions; logits within 1e-4."""
    agent = layout_agent(seed=31)
    version = first_version
    event = publish_version(agent, tmp_path / "artifacts", v2_repository, version)
    assert event.onnx_uri.endswith(f"/{MODEL_NAME}/{version}/model.onnx")
    async with (
        orchestrator("local", group="parity-local") as (bus_l, local),
        orchestrator(f"v2://{v2_grpc}", group="parity-served") as (bus_s, served),
    ):
        assert local.learned is not None and served.learned is not None
        assert served.learned.backend is not None and local.learned.backend is None
        for bus in (bus_l, bus_s):
            await announce(bus, event)
        await wait_for(lambda: local.learned.version == served.learned.version == version, "v")
        assert served.learned.backend.served_versions() == [str(version)]

        compared = 0
        # Both stacks' sessions read their statistics stores (fed by their own sessions'
        # trajectories): each session starts once both hold what a mirror fed the same
        # trajectories holds, so both read the same estimates.
        assert local.stats is not None and served.stats is not None
        mirror = local.stats.copy()
        for i, task in enumerate(tasks()):
            # argmax (live traffic) and sampled (training) sessions, same seed on both.
            for submitted_by in ("eval:parity", "trainer:parity"):
                seed = 500 + i
                for orch in (local, served):
                    await wait_for(
                        lambda o=orch: o.stats.to_dict() == mirror.to_dict(), "stats store"
                    )
                want = await run_bus_session(bus_l, local, task, seed, submitted_by)
                got = await run_bus_session(bus_s, served, task, seed, submitted_by)
                mirror.record_trajectory(got)
                assert got.policy_version == want.policy_version == str(version)
                assert got.labels["actions"] == want.labels["actions"]
                assert len(got.decisions) == len(want.decisions) > 0
                for d_g, d_w in zip(got.decisions, want.decisions, strict=True):
                    assert d_g.action.index == d_w.action.index, f"{task.name} step {d_g.step}"
                    assert d_g.policy_version == str(version)
                    assert d_g.log_prob == pytest.approx(d_w.log_prob, abs=1e-4)
                    assert d_g.value == pytest.approx(d_w.value, abs=1e-4)
                    # Same observation and mask recorded for training, byte for byte.
                    assert d_g.observation_tensor == d_w.observation_tensor
                    assert d_g.action_mask == d_w.action_mask
                assert got.latency == pytest.approx(want.latency)
                compared += len(got.decisions)

                # The logits themselves, on every observation of the session.
                layout = agent.layout
                ep = episode_from_trajectory(
                    got, layout.slot_features, layout.global_token_features, len(layout.agents)
                )
                inputs = PolicyInputs(
                    subtask_features=np.ascontiguousarray(ep.slots),
                    subtask_mask=np.ascontiguousarray(ep.slots[:, :, 0] > 0.5),
                    global_features=np.ascontiguousarray(ep.globals_),
                    pair_features=np.ascontiguousarray(ep.pairs),
                    action_mask=np.ascontiguousarray(ep.masks),
                )
                remote = served.learned.backend.decide(inputs)
                torch_out = LocalPolicy(agent.net, serving_signature(agent.net)).decide(inputs)
                np.testing.assert_allclose(remote.logits, torch_out.logits, atol=1e-4, rtol=0)
                np.testing.assert_allclose(remote.value, torch_out.value, atol=1e-4, rtol=0)
        assert compared > 40


async def test_served_sessions_scout_exactly_as_local_ones(
    v2_grpc: str, v2_repository: Path, first_version: int, tmp_path: Path
) -> None:
    """``PODIUM_SCOUT=on`` over the server: the scout revises the served network's decisions
    (awaited off the event loop) exactly as it revises local torch's, from a fresh store on."""
    agent = layout_agent(seed=37)
    event = publish_version(agent, tmp_path / "artifacts", v2_repository, first_version)
    async with (
        orchestrator("local", group="scout-local", scout=True) as (bus_l, local),
        orchestrator(f"v2://{v2_grpc}", group="scout-served", scout=True) as (bus_s, served),
    ):
        assert local.learned is not None and served.learned is not None
        for bus in (bus_l, bus_s):
            await announce(bus, event)
        await wait_for(
            lambda: local.learned.version == served.learned.version == first_version, "v"
        )
        assert local.stats is not None and served.stats is not None
        mirror = local.stats.copy()
        scouted = 0
        names = ("layered-15", "layered-5", "layered-30")  # test work off the critical path
        layered = [t for t in default_tasks() if t.name in names]
        for i, task in enumerate(layered):
            for orch in (local, served):
                await wait_for(lambda o=orch: o.stats.to_dict() == mirror.to_dict(), "stats store")
            want = await run_bus_session(bus_l, local, task, 700 + i, "eval:scout")
            got = await run_bus_session(bus_s, served, task, 700 + i, "eval:scout")
            mirror.record_trajectory(got)
            assert got.labels["policy"] == want.labels["policy"] == "learned+scout"
            assert got.labels.get(SCOUTED_LABEL) == want.labels.get(SCOUTED_LABEL)
            assert [d.action.index for d in got.decisions] == [
                d.action.index for d in want.decisions
            ]
            scouted += int(got.labels.get(SCOUTED_LABEL, "0"))
        assert scouted >= 1  # a fresh store: the first sessions scout


async def grpc_session(
    stub: ss_grpc.SessionServiceStub, seed: int
) -> tuple[list[ss.StreamSessionResponse], str]:
    """Submit :data:`LOGIN_TASK` over gRPC and stream the session to its result."""
    reply = await stub.SubmitTask(
        ss.SubmitTaskRequest(task_spec_text=LOGIN_TASK, seed=seed), timeout=10
    )
    events = [
        e
        async for e in stub.StreamSession(
            ss.StreamSessionRequest(session_id=reply.session_id), timeout=120
        )
    ]
    return events, reply.session_id


def decision_versions(events: list[ss.StreamSessionResponse]) -> list[str]:
    return [e.decision.policy_version for e in events if e.WhichOneof("event") == "decision"]


def assert_not_failed(events: list[ss.StreamSessionResponse]) -> None:
    """The session ran to its end on its own terms: a result, no timeout or crash."""
    assert events and events[-1].WhichOneof("event") == "result"
    result = events[-1].result
    assert result.decisions > 0 and "timeout" not in result.summary
    assert result.state in (ss.SESSION_STATE_SUCCEEDED, ss.SESSION_STATE_FAILED)


async def test_policy_updated_goes_live_on_the_server_while_grpc_sessions_run(
    v2_grpc: str, v2_repository: Path, first_version: int, tmp_path: Path
) -> None:
    artifacts = tmp_path / "artifacts"
    v1, v2 = first_version, first_version + 1
    # Sub-agents paced at 0.1 s per simulated time unit: sessions last seconds, so several
    # are in flight while the server swaps versions.
    async with orchestrator(f"v2://{v2_grpc}", grpc=True, time_scale=0.1) as (bus, orch):
        assert orch.learned is not None and orch.learned.backend is not None
        backend: ServedPolicy = orch.learned.backend
        async with grpc.aio.insecure_channel(f"127.0.0.1:{orch.grpc_port}") as channel:
            stub = ss_grpc.SessionServiceStub(channel)

            # Cold start: nothing announced yet, the rule engine decides; nothing is loaded.
            events, _ = await grpc_session(stub, seed=1)
            assert_not_failed(events)
            assert set(decision_versions(events)) == {"rules:cpls"}
            assert not backend.model_ready()

            # A freshly saved and exported version goes live through the repository API.
            await announce(bus, publish_version(layout_agent(41), artifacts, v2_repository, v1))
            await wait_for(lambda: orch.learned.version == v1, f"v{v1}")
            assert backend.model_ready() and backend.served_versions() == [str(v1)]
            events, sid = await grpc_session(stub, seed=2)
            assert_not_failed(events)
            assert set(decision_versions(events)) == {str(v1)}
            handle = orch.session(sid)
            assert handle is not None and handle.trajectory is not None
            assert handle.trajectory.policy_version == str(v1)

            # Version 2 is announced while sessions run: none fails, sessions in flight move
            # to it at their next decision, sessions started later run on it alone.
            running = [asyncio.create_task(grpc_session(stub, seed=10 + i)) for i in range(4)]
            await wait_for(
                lambda: (
                    sum(len(h.events) > 2 for h in orch.handles.values() if not h.finished) >= 4
                ),
                "four sessions in flight",
            )
            await announce(bus, publish_version(layout_agent(42), artifacts, v2_repository, v2))
            await wait_for(lambda: orch.learned.version == v2, f"v{v2}")
            in_flight = {sid for sid, h in orch.handles.items() if not h.finished}
            assert in_flight, "every session ended before the swap: nothing was tested"
            assert backend.served_versions() == [str(v2)]
            later = [asyncio.create_task(grpc_session(stub, seed=20 + i)) for i in range(2)]
            results = await asyncio.gather(*running, *later)
            for events, sid in results:
                assert_not_failed(events)
                versions = decision_versions(events)
                assert set(versions) <= {str(v1), str(v2)}
                # Never back to the old version once the new one decided.
                assert versions == sorted(versions, key=int), versions
                if sid in in_flight:
                    assert versions[-1] == str(v2), f"{sid} did not move to v{v2}: {versions}"
            for events, _ in results[len(running) :]:
                assert set(decision_versions(events)) == {str(v2)}
            # A session decided by both versions is attributed to the older one.
            mixed = [
                orch.handles[sid].trajectory
                for events, sid in results
                if set(decision_versions(events)) == {str(v1), str(v2)}
            ]
            assert mixed, "no session was decided by both versions"
            for traj in mixed:
                assert traj is not None and traj.policy_version == str(v1)
                assert traj.labels["policy_versions"] == f"{v1},{v2}"


def overwrite_tail(path: Path) -> None:
    """Damage an exported file (its last 64 bytes zeroed), leaving its sidecar alone."""
    path.write_bytes(path.read_bytes()[:-64] + b"\0" * 64)


def replace_with_garbage(path: Path) -> str:
    """Replace an exported file with bytes that are no ONNX model, with a matching sidecar;
    return their sha256 (as a learner that exported garbage would announce it)."""
    path.write_bytes(b"this is not an onnx model")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name("model.onnx.sha256").write_text(f"{digest}  model.onnx\n")
    return digest


async def test_corrupt_onnx_keeps_the_previous_version_serving(
    v2_grpc: str, v2_repository: Path, first_version: int, tmp_path: Path
) -> None:
    artifacts = tmp_path / "artifacts"
    v1, v2, v3, v4 = (first_version + i for i in range(4))
    async with orchestrator(f"v2://{v2_grpc}", group="corrupt") as (bus, orch):
        assert orch.learned is not None and orch.learned.backend is not None
        backend = orch.learned.backend
        await announce(bus, publish_version(layout_agent(51), artifacts, v2_repository, v1))
        await wait_for(lambda: orch.learned.version == v1, f"v{v1}")

        # Tampered after export: the file no longer hashes to what the learner announced.
        # The orchestrator refuses it before the server is asked to load anything.
        tampered = publish_version(layout_agent(52), artifacts, v2_repository, v2)
        path = Path(tampered.onnx_uri.removeprefix("file://"))
        overwrite_tail(path)
        await announce(bus, tampered)
        await wait_for(lambda: orch.learned.holder.last_error is not None, "the rejection")
        assert "sha256 mismatch" in str(orch.learned.holder.last_error)
        assert str(path) in str(orch.learned.holder.last_error)
        assert backend.served_versions() == [str(v1)]
        traj = await run_bus_session(bus, orch, tasks()[0], 7, "eval:x")
        assert {d.policy_version for d in traj.decisions} == {str(v1)}

        # Garbage announced with matching hashes (event and sidecar): the client check passes
        # and the server's load fails; the server keeps serving v1, so do the sessions.
        garbage = publish_version(layout_agent(53), artifacts, v2_repository, v3)
        path = Path(garbage.onnx_uri.removeprefix("file://"))
        garbage.onnx_sha256 = replace_with_garbage(path)
        orch.learned.holder.last_error = None
        await announce(bus, garbage)
        await wait_for(lambda: orch.learned.holder.last_error is not None, "the failed load")
        assert f"version {v3}" in str(orch.learned.holder.last_error)
        assert orch.learned.version == v1 and backend.served_versions() == [str(v1)]
        traj = await run_bus_session(bus, orch, tasks()[0], 8, "eval:x")
        assert {d.policy_version for d in traj.decisions} == {str(v1)}

        # A good version after the bad ones goes live as usual.
        await announce(bus, publish_version(layout_agent(54), artifacts, v2_repository, v4))
        await wait_for(lambda: orch.learned.version == v4, f"v{v4}")
        traj = await run_bus_session(bus, orch, tasks()[0], 9, "eval:x")
        assert {d.policy_version for d in traj.decisions} == {str(v4)}
