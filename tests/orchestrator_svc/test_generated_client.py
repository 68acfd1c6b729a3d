"""A gRPC client generated from the .proto files alone talks to a running orchestrator.

This is the contract an IDE plugin in any language relies on: ``protos/podium/v1/*.proto``
are enough. The test generates Python stubs with ``grpc_tools.protoc`` into a temporary
directory and runs a client script in a *separate* interpreter whose ``sys.path`` holds only
that directory, the standard library and site-packages (``-I -S``: no PYTHONPATH, no cwd, no
``.pth`` files, hence no editable install of this project), from a working directory outside
the repository. The script proves it cannot import the project's ``podium`` package, then
submits the login-system task, streams the session to its result over real gRPC on loopback,
checks health and reflection the way grpcurl would, and prints a JSON summary.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import grpc_health
import pytest
from grpc_tools import protoc  # type: ignore[import-untyped]
from svc_helpers import LOGIN_TASK

from orchestrator_svc.grpc_api import FIELD_METADATA_KEY
from podium.bus import InProcBus

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"

CLIENT = r"""
import json
import sys

stubs, target, task_text, *site_dirs = sys.argv[1:]
# Only the generated stubs, the standard library and the third-party packages (added as plain
# directories, so no .pth file, such as the project's editable install, is processed).
sys.path.insert(0, stubs)
sys.path.extend(site_dirs)

try:
    import podium.bus  # noqa: F401  (the generated namespace package holds only podium.v1)
except ImportError:
    project_importable = False
else:
    project_importable = True

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from podium.v1 import session_service_pb2 as ss
from podium.v1 import session_service_pb2_grpc as ss_grpc

out = {"project_importable": project_importable, "stub_file": ss.__file__}
with grpc.insecure_channel(target) as channel:
    stub = ss_grpc.SessionServiceStub(channel)

    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service="podium.v1.SessionService"), timeout=5)
    out["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    # grpcurl-style: list the services, then fetch the service's descriptor by symbol.
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="podium.v1.SessionService"),
    ]
    listed, by_symbol = list(refl.ServerReflectionInfo(iter(requests), timeout=5))
    out["services"] = sorted(s.name for s in listed.list_services_response.service)
    methods = []
    for raw in by_symbol.file_descriptor_response.file_descriptor_proto:
        fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
        for svc in fd.service:
            if f"{fd.package}.{svc.name}" == "podium.v1.SessionService":
                methods += [m.name for m in svc.method]
    out["reflected_methods"] = sorted(methods)

    sid = stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=task_text, seed=7), timeout=30).session_id
    kinds = []
    seqs = []
    last = None
    for event in stub.StreamSession(ss.StreamSessionRequest(session_id=sid), timeout=30):
        kinds.append(event.WhichOneof("event"))
        seqs.append(event.seq)
        last = event
    result = last.result
    got = stub.GetSession(ss.GetSessionRequest(session_id=sid), timeout=5)
    out.update(
        session_id=sid,
        events=len(kinds),
        seqs_in_order=seqs == list(range(len(seqs))),
        last_kind=kinds[-1],
        result_count=kinds.count("result"),
        decisions=kinds.count("decision"),
        started=kinds.count("subagent_started"),
        finished=kinds.count("subagent_finished"),
        stream_state=ss.SessionState.Name(result.state),
        latency=result.latency,
        lower_bound=result.lower_bound,
        completed=result.completed_subtasks,
        total=result.total_subtasks,
        result_decisions=result.decisions,
        executions=result.executions,
        get_state=ss.SessionState.Name(got.state),
        get_task=got.task.name,
        get_latency=got.result.latency,
        get_summary=got.result.summary,
    )

    bad = "name: bad\nsubtasks:\n  - {id: a, kind: ui, work: 1, deps: [ghost]}\n"
    try:
        stub.SubmitTask(ss.SubmitTaskRequest(task_spec_text=bad), timeout=30)
    except grpc.RpcError as exc:
        # The rich status (google.rpc.BadRequest), decoded with gRPC's own status library.
        from google.rpc import error_details_pb2
        from grpc_status import rpc_status

        bad = error_details_pb2.BadRequest()
        rpc_status.from_call(exc).details[0].Unpack(bad)
        out["invalid"] = {
            "code": exc.code().name,
            "details": exc.details(),
            # Text entries only: "grpc-status-details-bin" is the status itself, as bytes.
            "trailing": {k: v for k, v in exc.trailing_metadata() or () if isinstance(v, str)},
            "violations": [[v.field, v.description] for v in bad.field_violations],
        }
    else:
        out["invalid"] = {"code": "OK"}

print(json.dumps(out))
"""


def generate_stubs(out_dir: Path) -> list[Path]:
    """Python messages and gRPC stubs for every proto, as any user would generate them."""
    sources = sorted(PROTOS.glob("podium/v1/*.proto"))
    assert sources, f"no protos under {PROTOS}"
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *map(str, sources),
        ]
    )
    assert rc == 0, "protoc failed"
    return sorted(out_dir.rglob("*_pb2*.py"))


async def run_client(stubs: Path, target: str, workdir: Path) -> dict[str, Any]:
    """Run :data:`CLIENT` in a separate, isolated interpreter; its JSON summary."""
    # Where the client's dependencies are installed (the shared dependency environment behind
    # this clone's .venv): that directory alone, never the project's source tree.
    site_dirs = sorted({str(Path(m.__file__).parents[1]) for m in (grpc, grpc_health)})
    assert all(not Path(d).is_relative_to(ROOT) for d in site_dirs), site_dirs
    script = workdir / "client.py"
    script.write_text(CLIENT, encoding="utf-8")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",  # isolated: PYTHON* variables, user site and the script's directory are ignored
        "-S",  # no site module, so the editable install's .pth finder never loads
        str(script),
        str(stubs),
        target,
        LOGIN_TASK,
        *site_dirs,
        cwd=workdir,
        env={"PATH": "/usr/bin:/bin"},  # nothing inherited that could point at the repo
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    # The server runs on this event loop, so the client must be awaited, not waited on.
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, stderr.decode()
    summary: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    return summary


async def test_generated_client_submits_and_streams_to_the_end(
    tmp_path: Path, inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    generated = generate_stubs(stubs)
    names = {p.name for p in generated}
    assert {"session_service_pb2.py", "session_service_pb2_grpc.py", "task_pb2.py"} <= names
    workdir = tmp_path / "client"
    workdir.mkdir()
    assert ROOT not in workdir.parents  # the client cannot find the project from its cwd

    async with stack_factory(inproc_bus, workers=2) as stack:
        out = await run_client(stubs, f"127.0.0.1:{stack.orchestrator.grpc_port}", workdir)
        handle = stack.orchestrator.session(out["session_id"])
        assert handle is not None and handle.finished  # the server saw that very session

    # It really ran on the generated code and nothing of the project.
    assert out["project_importable"] is False
    assert Path(out["stub_file"]).is_relative_to(stubs)

    assert out["health"] == "SERVING"
    assert {"podium.v1.SessionService", "grpc.health.v1.Health"} <= set(out["services"])
    assert out["reflected_methods"] == [
        "GetSession",
        "SendFeedback",
        "StreamSession",
        "SubmitTask",
    ]

    assert out["events"] > 0 and out["seqs_in_order"]
    assert out["last_kind"] == "result" and out["result_count"] == 1
    assert out["stream_state"] == "SESSION_STATE_SUCCEEDED"
    assert out["completed"] == out["total"] == 6
    assert out["started"] == out["finished"] == out["executions"] > 0
    assert out["decisions"] == out["result_decisions"] > 0
    assert out["latency"] >= out["lower_bound"] > 0
    assert out["get_state"] == "SESSION_STATE_SUCCEEDED"
    assert out["get_task"] == "login-system"
    assert out["get_latency"] == pytest.approx(out["latency"])
    assert out["get_summary"].startswith("login-system: completed 6/6")

    invalid = out["invalid"]
    assert invalid["code"] == "INVALID_ARGUMENT"
    assert "(field a)" in invalid["details"]
    assert "depends on unknown subtask 'ghost'" in invalid["details"]
    assert invalid["trailing"].get(FIELD_METADATA_KEY) == "a"
    ((field, problem),) = invalid["violations"]
    assert field == "a" and "depends on unknown subtask 'ghost'" in problem
