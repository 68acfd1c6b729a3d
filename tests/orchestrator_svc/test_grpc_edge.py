"""The hardened gRPC edge, over real gRPC on loopback: limits before parsing, parsing off the
event loop, undecodable bytes, the transport limit, reflection opt-in (issue 12)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from process_helpers import worker_children

from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from orchestrator_svc.grpc_api import FIELD_METADATA_KEY, LIMIT_METADATA_KEY
from orchestrator_svc.specs import SpecWorkers, TaskLimits
from podium import topics
from podium.bus import InProcBus
from podium.envs.swarm.spec import default_pool
from podium.v1 import session_service_pb2 as ss
from podium.v1 import session_service_pb2_grpc, task_pb2


@contextlib.asynccontextmanager
async def orchestrator(
    bus: InProcBus, **settings: Any
) -> AsyncIterator[tuple[OrchestratorApp, grpc.aio.Channel]]:
    """The real orchestrator app on ``bus`` (no sub-agents: these tests stop at intake)."""
    app = OrchestratorApp(
        OrchestratorConfig(
            bus_url="embedded",
            group_id="edge.orchestrator",
            grpc_host="127.0.0.1",
            grpc_port=0,
            shutdown_timeout_s=1.0,
            **settings,
        ),
        bus,
    )
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            yield app, channel
    finally:
        await app.stop()


def _trailing_field(exc: grpc.aio.AioRpcError) -> str:
    return dict(exc.trailing_metadata() or ()).get(FIELD_METADATA_KEY, "")


def _padded_spec(size: int) -> str:
    """A well-formed task whose description pads it to ``size`` bytes."""
    head = "name: big\nsubtasks:\n  - {id: a, kind: ui, work: 1.0}\ndescription: "
    return head + "x" * (size - len(head))


def _flat_list_spec(size: int) -> str:
    """About ``size`` bytes of the slowest YAML to parse per byte, a flat list of scalars,
    in the one place a task allows free content (its description)."""
    head = "name: slow\nsubtasks: [{id: a, kind: ui, work: 1}]\ndescription: ["
    return head + ",".join(["1"] * ((size - len(head)) // 2)) + "]\n"


def _yaml_bomb(levels: int) -> str:
    """A billion-laughs task: each subtask's description is nine copies of the previous one's
    (YAML aliases), so a few hundred bytes stand for 9**levels scalars once expanded."""
    lines = [
        "name: bomb",
        "subtasks:",
        "  - {id: s0, kind: ui, work: 1, description: &d0 [x, x, x, x, x, x, x, x, x]}",
    ]
    for i in range(1, levels):
        copies = ", ".join([f"*d{i - 1}"] * 9)
        lines.append(f"  - {{id: s{i}, kind: ui, work: 1, description: &d{i} [{copies}]}}")
    return "\n".join(lines) + "\n"


async def _submit_error(channel: grpc.aio.Channel, request: Any) -> grpc.aio.AioRpcError:
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.SubmitTask(request, timeout=10)
    return info.value


# -- limits before parsing -------------------------------------------------------------------


async def test_task_over_the_byte_limit_is_invalid_argument_naming_the_setting(
    inproc_bus: InProcBus,
) -> None:
    async with orchestrator(inproc_bus) as (app, channel):
        limit = app.config.max_task_bytes
        t0 = time.perf_counter()
        err = await _submit_error(
            channel, ss.SubmitTaskRequest(task_spec_text=_padded_spec(limit + 1000))
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "PODIUM_MAX_TASK_BYTES" in (err.details() or "")
        assert str(limit) in (err.details() or "")
        assert _trailing_field(err) == "task_spec_text"
        assert time.perf_counter() - t0 < 1.0
        # Just under the limit is parsed (and accepted: the padding is a description).
        ok = await session_service_pb2_grpc.SessionServiceStub(channel).SubmitTask(
            ss.SubmitTaskRequest(task_spec_text=_padded_spec(limit - 1000)), timeout=10
        )
        assert ok.session_id
        assert sum(inproc_bus.end_offsets(topics.TASKS).values()) == 1


async def test_transport_never_accepts_what_the_broker_cannot_take(
    inproc_bus: InProcBus,
) -> None:
    # Seen: gRPC accepted 4 MiB while Kafka takes 1 MB; a 1.5 MB task got as far as publishing.
    async with orchestrator(inproc_bus) as (app, channel):
        err = await _submit_error(
            channel, ss.SubmitTaskRequest(task_spec_text=_padded_spec(1_500_000))
        )
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert sum(inproc_bus.end_offsets(topics.TASKS).values()) == 0
        assert app.config.grpc_max_receive_bytes < 1_000_000


async def test_too_many_subtasks_is_invalid_argument_naming_the_setting(
    inproc_bus: InProcBus,
) -> None:
    async with orchestrator(inproc_bus, max_subtasks=4) as (_, channel):
        message = task_pb2.TaskSpec(
            name="wide",
            subtasks=[task_pb2.SubtaskSpec(id=f"s{i}", kind="ui", work=1.0) for i in range(5)],
        )
        text = "name: wide\nsubtasks:\n" + "".join(
            f"  - {{id: s{i}, kind: ui, work: 1}}\n" for i in range(5)
        )
        for request, field in (
            (ss.SubmitTaskRequest(task=message), "subtasks"),
            (ss.SubmitTaskRequest(task_spec_text=text), "subtasks"),
        ):
            err = await _submit_error(channel, request)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "5 subtasks" in (err.details() or "")
            assert "PODIUM_MAX_SUBTASKS=4" in (err.details() or "")
            assert _trailing_field(err) == field
        assert sum(inproc_bus.end_offsets(topics.TASKS).values()) == 0


def test_a_task_limit_the_broker_cannot_take_is_a_config_error() -> None:
    from podium.errors import ConfigError

    with pytest.raises(ConfigError, match="PODIUM_MAX_TASK_BYTES"):
        OrchestratorConfig(bus_url="embedded", max_task_bytes=900_000)


# -- parsing off the event loop --------------------------------------------------------------


async def test_health_answers_while_maximal_specs_are_parsed(inproc_bus: InProcBus) -> None:
    # Seen: a 2 MB YAML spec froze the event loop for 14 s, health checks included.
    async with orchestrator(inproc_bus) as (_, channel):
        # Just under the default PODIUM_MAX_TASK_BYTES (256 KiB).
        spec = _flat_list_spec(250_000)
        stub = session_service_pb2_grpc.SessionServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        submits = [
            asyncio.ensure_future(
                stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=spec), timeout=60)
            )
            for _ in range(4)
        ]
        latencies: list[float] = []
        t0 = time.perf_counter()
        while not all(s.done() for s in submits):
            start = time.perf_counter()
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            latencies.append(time.perf_counter() - start)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            await asyncio.sleep(0.02)
        parsing_s = time.perf_counter() - t0
        # Whether the environment's parser takes a list as a description is not the point
        # here; each spec was parsed to the end and answered.
        for outcome in await asyncio.gather(*submits, return_exceptions=True):
            if isinstance(outcome, grpc.aio.AioRpcError):
                assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT, outcome
            else:
                assert isinstance(outcome, ss.SubmitTaskResponse) and outcome.session_id
        # The parses took long enough that a blocked loop would have shown in the checks.
        assert parsing_s > 0.3, parsing_s
        assert max(latencies) < 0.2, (max(latencies), parsing_s, len(latencies))


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (_yaml_bomb(8), "YAML aliases expand the spec beyond the limit PODIUM_MAX_TASK_BYTES"),
        # An alias inside its own anchor: a list that contains itself.
        (
            "name: loop\nsubtasks:\n  - {id: a, kind: ui, work: 1, description: &d [x, *d]}\n",
            "YAML aliases expand the spec beyond the limit PODIUM_MAX_TASK_BYTES",
        ),
        ("[" * 100_000 + "]" * 100_000, "invalid JSON/YAML"),
    ],
    ids=["billion-laughs", "self-reference", "deep-nesting"],
)
async def test_hostile_yaml_under_the_byte_limit_is_rejected_quickly(
    inproc_bus: InProcBus, spec: str, fragment: str
) -> None:
    async with orchestrator(inproc_bus) as (app, channel):
        assert len(spec.encode()) < app.config.max_task_bytes
        # The parser processes start with the first spec; the hostile one is timed on its own.
        await _submit_error(channel, ss.SubmitTaskRequest(task_spec_text="name: [unclosed"))
        t0 = time.perf_counter()
        err = await _submit_error(channel, ss.SubmitTaskRequest(task_spec_text=spec))
        assert time.perf_counter() - t0 < 1.0
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in (err.details() or "")
        assert _trailing_field(err) == "task_spec_text"
        assert sum(inproc_bus.end_offsets(topics.TASKS).values()) == 0


async def test_the_open_session_limit_is_resource_exhausted_naming_it(
    inproc_bus: InProcBus,
) -> None:
    # No sub-agents run here, so the first session stays open and fills the one slot.
    async with orchestrator(inproc_bus, max_open_sessions=1) as (_, channel):
        stub = session_service_pb2_grpc.SessionServiceStub(channel)
        task = "name: t\nsubtasks:\n  - {id: a, kind: ui, work: 1}\n"
        first = await stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=task), timeout=10)
        assert first.session_id
        err = await _submit_error(channel, ss.SubmitTaskRequest(task_spec_text=task))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "PODIUM_MAX_OPEN_SESSIONS=1" in (err.details() or "")
        assert dict(err.trailing_metadata() or ()).get(LIMIT_METADATA_KEY) == (
            "PODIUM_MAX_OPEN_SESSIONS"
        )
        assert sum(inproc_bus.end_offsets(topics.TASKS).values()) == 1


async def test_a_flood_of_specs_is_resource_exhausted_naming_the_limit(
    inproc_bus: InProcBus,
) -> None:
    # One spec may wait or parse at a time: the others are refused at once, not queued.
    async with orchestrator(inproc_bus, max_pending_specs=1) as (_, channel):
        stub = session_service_pb2_grpc.SessionServiceStub(channel)
        spec = _flat_list_spec(250_000)
        outcomes = await asyncio.gather(
            *(
                stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=spec), timeout=30)
                for _ in range(3)
            ),
            return_exceptions=True,
        )
        refused = [
            o
            for o in outcomes
            if isinstance(o, grpc.aio.AioRpcError)
            and o.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        ]
        assert 1 <= len(refused) <= 2, outcomes
        for err in refused:
            assert "PODIUM_MAX_PENDING_SPECS=1" in (err.details() or "")
            assert dict(err.trailing_metadata() or ()).get(LIMIT_METADATA_KEY) == (
                "PODIUM_MAX_PENDING_SPECS"
            )


async def test_a_dead_parser_process_is_replaced(inproc_bus: InProcBus) -> None:
    async with orchestrator(inproc_bus) as (app, channel):
        stub = session_service_pb2_grpc.SessionServiceStub(channel)
        task = "name: t\nsubtasks:\n  - {id: a, kind: ui, work: 1}\n"
        assert (
            await stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=task), timeout=30)
        ).session_id
        assert app.grpc is not None
        workers = app.grpc.specs.pids()
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        for _ in range(100):  # up to 10 s
            if not any(_alive(p) for p in workers):
                break
            await asyncio.sleep(0.1)
        reply = await stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=task), timeout=30)
        assert reply.session_id
        assert app.grpc.specs.pids() and not set(app.grpc.specs.pids()) & set(workers)


async def test_a_parser_starts_with_the_server_and_takes_the_first_spec(
    inproc_bus: InProcBus,
) -> None:
    async with orchestrator(inproc_bus) as (app, channel):
        assert app.grpc is not None
        for _ in range(300):  # up to 30 s for the process to start
            if app.grpc.specs.pids():
                break
            await asyncio.sleep(0.1)
        warm = app.grpc.specs.pids()
        assert len(warm) == 1, "no parser was started ahead of the first spec"
        stub = session_service_pb2_grpc.SessionServiceStub(channel)
        task = "name: t\nsubtasks:\n  - {id: a, kind: ui, work: 1}\n"
        assert (
            await stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=task), timeout=30)
        ).session_id
        assert app.grpc.specs.pids() == warm  # parsed there: no second process was needed


async def test_closing_while_the_first_parser_starts_leaves_no_process() -> None:
    workers = SpecWorkers(default_pool(), TaskLimits(1000, 8), max_pending=4)
    workers.warm()
    await asyncio.sleep(0)  # the start is under way
    await workers.close()
    # close() waited for that start and ended its process: none runs now, and none appears
    # later (a start left behind would spawn its parser after close() returned).
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert not worker_children(), "a spec parser runs after close()"
        await asyncio.sleep(0.05)


PARENT = """
import asyncio, sys
from orchestrator_svc.specs import SpecWorkers, TaskLimits
from podium.envs.swarm.spec import default_pool

async def main() -> None:
    workers = SpecWorkers(default_pool(), TaskLimits(1000, 8), max_pending=4)
    await workers.validate(text="name: t\\nsubtasks:\\n  - {id: a, kind: ui, work: 1}\\n")
    print(*workers.pids(), flush=True)
    await asyncio.sleep(60)

if __name__ == "__main__":
    asyncio.run(main())
"""


async def test_parser_processes_do_not_outlive_a_killed_service(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    out = tmp_path / "pids"
    # Output to a file, not a pipe: a surviving worker would hold a pipe open forever.
    with out.open("wb") as sink:
        parent = await asyncio.create_subprocess_exec(sys.executable, str(script), stdout=sink)
    try:
        for _ in range(600):  # the worker process starts in up to 60 s
            if out.read_text().endswith("\n"):
                break
            await asyncio.sleep(0.1)
        pids = [int(p) for p in out.read_text().split()]
        assert pids and all(_alive(p) for p in pids)
    finally:
        parent.kill()  # kill -9: no shutdown code runs in the parent
        await parent.wait()
    for _ in range(100):  # up to 10 s
        if not any(_alive(p) for p in pids):
            break
        await asyncio.sleep(0.1)
    survivors = [p for p in pids if _alive(p)]
    for pid in survivors:  # leave nothing behind, then fail
        os.kill(pid, signal.SIGKILL)
    assert not survivors


STDIN_SCRIPT = """
import asyncio
from orchestrator_svc.specs import SpecWorkers, TaskLimits
from podium.envs.swarm.spec import default_pool

async def main():
    workers = SpecWorkers(default_pool(), TaskLimits(1000, 8), max_pending=4)
    try:
        task = await workers.validate(text="name: piped\\nsubtasks:\\n  - {id: a, kind: ui, work: 1}\\n")
        print(task.name, [s.id for s in task.subtasks], flush=True)
    finally:
        await workers.close()

asyncio.run(main())
"""


async def test_a_service_started_from_a_stdin_script_parses_specs(tmp_path: Path) -> None:
    # `python -` has no main module file: parsers must not need one (multiprocessing's spawn
    # re-imported it and every parser died). No __main__ guard either, on purpose.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
    )
    out, err = await asyncio.wait_for(proc.communicate(STDIN_SCRIPT.encode()), timeout=120)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "piped ['a']"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by init, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


# -- undecodable requests --------------------------------------------------------------------


@pytest.mark.parametrize("method", ["SubmitTask", "GetSession", "StreamSession", "SendFeedback"])
async def test_undecodable_bytes_are_invalid_argument(inproc_bus: InProcBus, method: str) -> None:
    # Seen: garbage bytes returned UNKNOWN.
    async with orchestrator(inproc_bus) as (_, channel):
        path = f"/podium.v1.SessionService/{method}"
        garbage = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            if method == "StreamSession":
                call = channel.unary_stream(path)(garbage, timeout=5)
                await call.read()
            else:
                await channel.unary_unary(path)(garbage, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        details = info.value.details() or ""
        assert "podium.v1." in details and "Request" in details
        assert "malformed" in details
        assert sum(inproc_bus.end_offsets(topics.TASKS).values()) == 0


# -- reflection opt-in -----------------------------------------------------------------------


async def _list_services(channel: grpc.aio.Channel) -> set[str]:
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    # Requests from an iterator: a server without reflection may end the call before a
    # request written by hand would have gone out (that write fails INTERNAL, not the call).
    call = refl.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
    )
    names: set[str] = set()
    async for response in call:
        names |= {s.name for s in response.list_services_response.service}
    return names


async def test_reflection_is_off_by_default(inproc_bus: InProcBus) -> None:
    async with orchestrator(inproc_bus) as (app, channel):
        assert app.config.grpc_reflection is False
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _list_services(channel)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_reflection_when_enabled(inproc_bus: InProcBus) -> None:
    async with orchestrator(inproc_bus, grpc_reflection=True) as (_, channel):
        names = await _list_services(channel)
        assert {"podium.v1.SessionService", "grpc.health.v1.Health"} <= names


def test_edge_settings_are_read_from_the_environment() -> None:
    from podium.config import from_env

    config = from_env(
        OrchestratorConfig,
        {
            "PODIUM_BUS": "kafka://127.0.0.1:9092",
            "PODIUM_GRPC_REFLECTION": "on",
            "PODIUM_MAX_TASK_BYTES": "100000",
            "PODIUM_MAX_SUBTASKS": "9",
            "PODIUM_MAX_PENDING_SPECS": "3",
        },
    )
    assert config.grpc_reflection is True
    assert (config.max_task_bytes, config.max_subtasks, config.max_pending_specs) == (
        100_000,
        9,
        3,
    )
    assert config.grpc_max_receive_bytes == 200_000
