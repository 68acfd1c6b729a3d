"""An external agent's assignments executed by a worker written without Podium's Python code:
the Go worker (tools/go-worker, built by scripts/go-worker.sh from protos/), on the real broker
over SASL/SCRAM and TLS, inside a whole session through the orchestrator.

The pool is the shipped default plus one ``runner: external`` agent with a kind of its own
(names unique per run), so this test's orchestrator and subagent_svc answer other runs'
assignments on the shared broker exactly as those runs' own services do. The worker's group
starts at the topic's start (its default: an assignment published before it first joined is
not lost) and skips every agent but its own.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc.aio
import pytest
import yaml
from kafka_helpers import bus_env, kafka_test_config
from svc_helpers import Stack, warm_up

from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from podium.bus import KafkaBus
from podium.envs.swarm.spec import default_pool_path
from podium.subagents.reference import context_digest
from podium.v1 import session_service_pb2 as ss
from podium.v1 import session_service_pb2_grpc, subtask_pb2
from subagent_svc import SubagentApp, SubagentConfig

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:8]
AGENT = f"go-native-{RUN}"
KIND = f"native-{RUN}"

TASK = f"""
name: go-external
max_parallel: 3
subtasks:
  - {{id: form,   kind: ui,      work: 0.5}}
  - {{id: native, kind: {KIND}, work: 0.5, deps: [form]}}
  - {{id: check,  kind: test,    work: 0.5, deps: [native]}}
  - {{id: side,   kind: {KIND}, work: 0.5}}
"""
"""Two executions for the Go worker, one of them between two simulated ones: its input is a
simulated output and its output a simulated execution's input."""


@pytest.fixture(scope="module")
def go_worker_binary() -> Path:
    """scripts/go-worker.sh's binary (built once; cached under PODIUM_CACHE)."""
    if shutil.which("go") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but `go` is not installed")
        pytest.skip("`go` is not installed")
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "go-worker.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    line = next(x for x in built.stdout.splitlines() if x.startswith("PODIUM_GO_WORKER="))
    return Path(line.split("=", 1)[1])


@pytest.fixture
def pool_path(tmp_path: Path) -> Path:
    """The default pool and the external agent, fastest and surest at its kind (the generalist
    could do it too), so the scheduler gives it that work."""
    pool = yaml.safe_load(default_pool_path().read_text())
    pool["agents"].append(
        {
            "name": AGENT,
            "kinds": {KIND: {"speed": 20.0, "success": 1.0, "noise": 0.0}},
            "runner": "external",
        }
    )
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool))
    return path


@pytest.fixture
def go_worker(
    go_worker_binary: Path, kafka_bootstrap: str, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The Go worker as a process of its own, its log in the test's directory."""
    log_path = tmp_path / "go-worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")}
    env |= bus_env(kafka_bootstrap) | {
        "PODIUM_EXTERNAL_AGENTS": AGENT,
        "PODIUM_GROUP_ID": f"test.go-worker.{RUN}",
        "PODIUM_WORKER_ID": f"go-worker/{RUN}",
    }
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(go_worker_binary)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield proc, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
async def stack(kafka_bootstrap: str, pool_path: Path) -> AsyncIterator[Stack]:
    """Orchestrator and subagent_svc embedded on the broker, both with the pool."""
    bus = KafkaBus(kafka_test_config(kafka_bootstrap))
    await bus.start()
    group = f"test.go.{RUN}"
    worker = SubagentApp(
        SubagentConfig(
            bus_url="embedded",
            group_id=f"{group}.subagent",
            instance="py-worker",
            pool_spec=str(pool_path),
            shutdown_timeout_s=10.0,
        ),
        bus,
    )
    orch = OrchestratorApp(
        OrchestratorConfig(
            bus_url="embedded",
            group_id=f"{group}.orchestrator",
            grpc_host="127.0.0.1",
            grpc_port=0,
            pool_spec=str(pool_path),
            session_timeout_s=60.0,
            shutdown_timeout_s=10.0,
        ),
        bus,
    )
    started: list[SubagentApp | OrchestratorApp] = []
    try:
        for app in (worker, orch):
            await app.start()
            started.append(app)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{orch.grpc_port}") as channel:
            stub = session_service_pb2_grpc.SessionServiceStub(channel)
            yield Stack(bus, orch, [worker], None, channel, stub)
    finally:
        for app in reversed(started):
            await app.stop()
        await bus.stop()


async def test_the_go_worker_executes_the_external_agents_assignments(
    stack: Stack, go_worker: tuple[subprocess.Popen[bytes], Path]
) -> None:
    proc, log_path = go_worker
    await warm_up(stack)
    reply = await stack.stub.SubmitTask(
        ss.SubmitTaskRequest(task_spec_text=TASK, seed=11), timeout=10
    )
    events = [
        e
        async for e in stack.stub.StreamSession(
            ss.StreamSessionRequest(session_id=reply.session_id), timeout=90
        )
    ]
    log = log_path.read_text(errors="replace")
    assert events[-1].result.state == ss.SESSION_STATE_SUCCEEDED, log[-3000:]
    handle = stack.orchestrator.session(reply.session_id)
    assert handle is not None and handle.trajectory is not None
    executions = list(handle.trajectory.executions)

    external = [e for e in executions if e.agent == AGENT]
    assert {e.subtask_id for e in external} == {"native", "side"}
    for e in external:
        assert e.outcome == subtask_pb2.OUTCOME_SUCCESS
        (call,) = e.tool_calls
        # Only the Go worker makes this tool call, timed on its wall clock.
        assert call.name == "go.sha256" and 0 < call.started_at <= call.ended_at
        assert call.result_digest == context_digest(e.context)
        assert f"executed {e.execution_id}" in log
    # subagent_svc left them alone (committed past them) and never answered for that agent. Its
    # group is new, so it may still be reading the shared topic's backlog of other runs'
    # assignments when the session ends: it reaches these two in its own time.
    sub = stack.subagents[0]
    for _ in range(600):
        if sub.stats.external >= 2:
            break
        await asyncio.sleep(0.1)
    assert sub.stats.external >= 2, f"{sub.stats.executions} executions so far"
    assert all(r.agent != AGENT for r in sub.stats.results)

    # The Go worker's output crossed into a simulated execution's context: the same digest the
    # Python side computes for the context the Go worker was given.
    native = next(e for e in external if e.subtask_id == "native")
    check = next(e for e in executions if e.subtask_id == "check" and e.outcome == 1)
    (dep,) = [d for d in check.context.dependency_results if d.subtask_id == "native"]
    assert dep.output == f"{KIND}:native:{context_digest(native.context)}"

    # SIGTERM: the batch in hand is finished and committed, the group left, exit 0.
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 20) == 0
    assert "stopped" in log_path.read_text(errors="replace")
