"""Run a :class:`~podium_app.deploy.plan.Plan`: checks, processes, readiness probes.

:func:`check` is the static part (env vars no config reads, transactional ids that do not
fence); :class:`LocalDeployment` starts every Podium container as a process (init containers
first, each to completion, as the kubelet runs them; Jobs' containers beside the others, each
waited for to completion by :meth:`LocalDeployment.wait_jobs`: a Job does what its
dependencies allow when they are up, retrying until then, as a Job in a cluster must), then
sends each container's startup,
liveness and readiness probes to their rendered ports mapped through its pod's table
(``grpc``: ``grpc.health.v1`` Check must answer SERVING; ``http``: a 2xx/3xx answer; ``tcp``: a
connection) until every probe of every container passes, one exits, or the deadline passes;
:meth:`LocalDeployment.stop` gives each process its pod's termination grace period. Each failure names its container, its probe and what the
probe or the process said; :class:`DeploymentError` carries them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from podium.errors import PodiumError
from podium_app.deploy.checks import (
    fencing_problems,
    read_variables,
    runs_cli,
    unread_variables,
)
from podium_app.deploy.manifest import Probe
from podium_app.deploy.plan import LocalContainer, Plan
from podium_app.deploy.render import ROOT

_log = logging.getLogger(__name__)


class DeploymentError(PodiumError):
    """The deployment check failed; ``problems`` lists each failure, one line each."""

    def __init__(self, stage: str, problems: Sequence[str]) -> None:
        self.stage = stage
        self.problems = list(problems)
        super().__init__(f"{stage}: " + "; ".join(self.problems))


def check(plan: Plan) -> list[str]:
    """The static problems of the plan (empty = none)."""
    everything = [c for c in (*plan.init, *plan.containers, *plan.jobs) if c.podium]
    services = [c.container for c in everything if not runs_cli(c.argv)]
    commands = [c.container for c in everything if runs_cli(c.argv)]
    problems = unread_variables(services, read_variables())
    problems += unread_variables(commands, read_variables(top_floor=True))
    envs = {c.where: c.env for c in everything}
    problems += fencing_problems([c.container for c in everything], envs)
    return problems


async def probe_once(c: LocalContainer) -> str:
    """Empty when every probe of ``c`` passes now, else what the first failing one said."""
    for probe, address in c.probes:
        answer = await _probe(probe, address)
        if answer:
            return (
                f"{probe.which} probe {probe.kind} on port {probe.port} (local {address}): {answer}"
            )
    return ""


async def _probe(probe: Probe, address: str) -> str:
    try:
        if probe.kind == "grpc":
            return await _grpc_probe(address, probe.service)
        if probe.kind == "http":
            return await _http_probe(address, probe.path or "/")
        _, writer = await asyncio.wait_for(_connect(address), 2.0)
        writer.close()
        return ""
    except (OSError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"


async def _connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def _grpc_probe(address: str, service: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        try:
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
        except grpc.aio.AioRpcError as exc:
            return f"grpc.health.v1 Check: {exc.code().name} {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    return "" if status == "SERVING" else f"grpc.health.v1 Check: {status}"


async def _http_probe(address: str, path: str) -> str:
    reader, writer = await asyncio.wait_for(_connect(address), 2.0)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        await writer.drain()
        line = (await asyncio.wait_for(reader.readline(), 2.0)).decode(errors="replace")
    finally:
        writer.close()
    parts = line.split()
    ok = len(parts) >= 2 and parts[1].isdigit() and 200 <= int(parts[1]) < 400
    return "" if ok else f"GET {path}: {line.strip() or 'no answer'}"


class LocalDeployment:
    """The plan's containers as processes (see the module docstring)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.log_dir = plan.work_dir / "logs"
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self._logs: list[IO[bytes]] = []

    def log_path(self, c: LocalContainer) -> Path:
        return self.log_dir / f"{c.container.pod}.{c.container.name}.log"

    def log_tail(self, c: LocalContainer, chars: int = 1500) -> str:
        path = self.log_path(c)
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    async def _spawn(self, c: LocalContainer) -> asyncio.subprocess.Process:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(c).open("ab")
        self._logs.append(log)
        proc = await asyncio.create_subprocess_exec(
            *c.argv,
            env=dict(c.env),
            cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[c.where] = proc
        return proc

    async def start(self, init_timeout_s: float = 120.0) -> None:
        """The stand-ins run as processes (the trace backend) first, so every span is
        received; then init containers to completion (in order), then every container."""
        for c in self.plan.containers:
            if not c.podium:
                await self._spawn(c)
        failed = []
        for c in self.plan.init:
            proc = await self._spawn(c)
            try:
                code = await asyncio.wait_for(proc.wait(), init_timeout_s)
            except TimeoutError:
                proc.kill()
                code = await proc.wait()
            if code != 0:
                failed.append(f"init container {c.where} exited {code}: {self.log_tail(c)}")
        if failed:
            raise DeploymentError("init containers", failed)
        for c in (*self.plan.containers, *self.plan.jobs):
            if c.podium:
                await self._spawn(c)

    async def rerun_jobs(self) -> None:
        """Start every Job's container again, as a Job deleted and applied again would."""
        for c in self.plan.jobs:
            await self._spawn(c)

    async def wait_jobs(self, timeout_s: float) -> dict[str, float]:
        """Seconds until each Job's container exited 0; raises naming every Job that failed
        (its exit and log) or did not finish within ``timeout_s`` (then killed)."""
        t0 = time.monotonic()
        done: dict[str, float] = {}
        failed: list[str] = []
        for c in self.plan.jobs:
            proc = self.procs[c.where]
            try:
                code = await asyncio.wait_for(
                    proc.wait(), max(timeout_s - (time.monotonic() - t0), 0.1)
                )
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                failed.append(
                    f"job {c.where} did not finish within {timeout_s:.0f}s: {self.log_tail(c)}"
                )
                continue
            if code != 0:
                failed.append(f"job {c.where} exited {code}: {self.log_tail(c)}")
            else:
                done[c.where] = time.monotonic() - t0
        if failed:
            raise DeploymentError("jobs", failed)
        return done

    async def wait_ready(self, timeout_s: float) -> dict[str, float]:
        """Seconds until each container's readiness probe passed; raises naming every
        container that did not pass (its probe, the probe's last answer, or its exit and log)."""
        t0 = time.monotonic()
        ready: dict[str, float] = {}
        last: dict[str, str] = {}
        pending = list(self.plan.containers)
        while pending:
            for c in list(pending):
                exited = self.procs[c.where].returncode
                if exited is not None:
                    last[c.where] = f"exited with status {exited}: {self.log_tail(c)}"
                    continue
                answer = await probe_once(c)
                if not answer:
                    ready[c.where] = time.monotonic() - t0
                    pending.remove(c)
                else:
                    last[c.where] = answer
            if not pending:
                break
            if time.monotonic() - t0 > timeout_s or all(
                self.procs[c.where].returncode is not None for c in pending
            ):
                raise DeploymentError(
                    "readiness", [_not_ready(c, last.get(c.where, "")) for c in pending]
                )
            await asyncio.sleep(0.5)
        return ready

    def exited(self) -> dict[str, int]:
        """Containers (not init containers, which end by design) whose process has ended."""
        running = {c.where for c in self.plan.containers}
        return {
            w: p.returncode
            for w, p in self.procs.items()
            if w in running and p.returncode is not None
        }

    async def stop(self) -> dict[str, int]:
        """SIGTERM every process, SIGKILL what is left after its pod's grace period, as the
        kubelet does; the exit statuses. The stand-ins (the trace backend) stop after the
        Podium processes, which export their last spans as they stop."""
        everything = (*self.plan.init, *self.plan.containers, *self.plan.jobs)
        grace = {c.where: c.container.grace_s for c in everything}
        last = {c.where for c in everything if not c.podium}
        codes: dict[str, int] = {}
        for stage in (False, True):
            procs = {w: p for w, p in self.procs.items() if (w in last) == stage}
            for proc in procs.values():
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGTERM)
            reaped = await asyncio.gather(*(self._reap(w, p, grace[w]) for w, p in procs.items()))
            codes.update(zip(procs, reaped, strict=True))
        for log in self._logs:
            log.close()
        return codes

    async def _reap(self, where: str, proc: asyncio.subprocess.Process, grace_s: float) -> int:
        try:
            return await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            _log.error("%s did not stop within its %.0fs grace; killing it", where, grace_s)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return await proc.wait()


def _not_ready(c: LocalContainer, last: str) -> str:
    return f"{c.where}: never passed its probes: {last or 'no answer'}"


__all__ = ["DeploymentError", "LocalDeployment", "check", "probe_once"]
