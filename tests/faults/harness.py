"""The fault suite's moving parts: the cluster (a broker of its own behind a cuttable proxy),
the services as real processes, the load (sessions submitted as ``TaskSubmitted`` events, each
with a trace of its own) and a tail that notes when each session's trajectory is committed.

The broker is the product's: SASL/SCRAM-SHA-512 over TLS with ACLs. Each service connects
through the proxy as its own principal (its ``credentials/<service>.env``, re-pointed at the
proxy, with test-tuned group timings), so the faults also hit TLS and SASL re-handshakes and
the ACLs are those of production. The test harness itself (load, tail, audit) connects as the
``admin`` super user straight to the broker's client listener, never through the proxy: a
partition cuts the services off, not the observer. Broker kills and stalls do reach the
harness; the load pauses during them (a client that retried a publish would itself create a
second TaskSubmitted, which is not what these scenarios measure).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from aiokafka import AIOKafkaConsumer
from audit import all_partitions
from kafka_helpers import broker_config, credentials_env, kafka_url
from proxy import TcpProxy

from podium import codec, topics
from podium.bus import KafkaBus, KafkaConfig
from podium.bus.base import TopicSpec
from podium.envs.swarm.spec import parse_task
from podium.envs.swarm.trajectory import task_to_proto
from podium.v1 import reward_pb2, task_pb2, trajectory_pb2
from podium_app.kafka_broker import PASSWORD_ENV, KafkaBroker

ROOT = Path(__file__).resolve().parents[2]

SHORT_TASK = {
    "name": "fault-probe",
    "max_parallel": 2,
    "subtasks": [
        {"id": "schema", "kind": "db", "work": 2.0},
        {"id": "api", "kind": "api", "work": 3.0, "deps": ["schema"]},
        {"id": "form", "kind": "ui", "work": 2.0},
        {"id": "tests", "kind": "test", "work": 2.0, "deps": ["api", "form"]},
    ],
}
"""A short session: four sub-agent executions, two of them waiting on others."""

SESSION_TIMEOUT_MS = 6000
"""Consumer session timeout of every service (the broker's minimum): a silent member is
evicted after 6 s, so zombie and churn scenarios settle quickly."""


GROUP_TIMINGS = {
    "session_timeout_ms": SESSION_TIMEOUT_MS,
    "heartbeat_interval_ms": 500,
    "revoke_grace_s": 3.0,
    "request_timeout_ms": 15000,
}
"""Test-tuned settings added to every service's ``PODIUM_BUS``."""


def service_env(broker: KafkaBroker, principal: str, address: str) -> dict[str, str]:
    """A service's connection as ``principal``: its ``PODIUM_BUS`` from the broker's
    ``credentials/<principal>.env`` (SASL_SSL, SCRAM user, CA file) pointed at the proxy's
    ``address`` with :data:`GROUP_TIMINGS`, and its own password."""
    own = credentials_env(broker, principal)
    via_proxy = urlsplit(own["PODIUM_BUS"])._replace(netloc=address).geturl()
    return {"PODIUM_BUS": kafka_url(via_proxy, **GROUP_TIMINGS), PASSWORD_ENV: own[PASSWORD_ENV]}


class Services:
    """``python -m <service>`` processes, each in its own process group, logging to a file,
    connected through the proxy at ``address`` as its own principal of ``broker``;
    :meth:`kill_all` ends every one of them whatever happened."""

    def __init__(self, log_dir: Path, broker: KafkaBroker, address: str) -> None:
        self.log_dir = log_dir
        self.broker = broker
        self.address = address
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self.starts: dict[str, int] = {}
        self._ended: set[str] = set()
        """Processes the test itself killed or stopped (their exit is no crash)."""
        self._specs: dict[str, tuple[str, str, dict[str, str]]] = {}
        self.restarts: list[str] = []
        """``name=status`` of each process that exited by itself and was restarted."""

    def start(self, name: str, module: str, principal: str, **env: str) -> None:
        """Start ``module`` as ``name``, logged in as ``principal`` (a restart appends to the
        same log)."""
        assert name not in self.procs or self.procs[name].poll() is not None, name
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self._logs.get(name) or (self.log_dir / f"{name}.log").open("ab")
        self._logs[name] = log
        self.starts[name] = self.starts.get(name, 0) + 1
        self._ended.discard(name)
        self._specs[name] = (module, principal, dict(env))
        log.write(f"\n===== start {self.starts[name]} of {name} =====\n".encode())
        log.flush()
        full = os.environ | {
            "PYTHONPATH": str(ROOT),
            **service_env(self.broker, principal, self.address),
            "PODIUM_LOG_LEVEL": "INFO",
            "PODIUM_SHUTDOWN_TIMEOUT_S": "5",
            "PODIUM_HEALTH_PORT": "0",
            "PODIUM_INSTANCE": name,
            **env,
        }
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=full,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def orchestrator(self, name: str = "orch-1", **env: str) -> None:
        defaults = {
            "PODIUM_GRPC_HOST": "127.0.0.1",
            "PODIUM_GRPC_PORT": "0",
            "PODIUM_SESSION_TIMEOUT_S": "30",
        }
        self.start(name, "orchestrator_svc", "orchestrator", **(defaults | env))

    def trusted_keys(self) -> str:
        """A fresh policy-signing key pair (``podium keys generate``); the public key's path,
        for ``PODIUM_POLICY_TRUSTED_KEYS`` of a learned-policy orchestrator."""
        out = self.log_dir / "keys"
        if not (out / "policy-signing.pub").exists():
            podium = Path(sys.executable).with_name("podium")
            subprocess.run(
                [str(podium), "keys", "generate", "--out", str(out)],
                check=True,
                capture_output=True,
                timeout=120,
            )
        return str(out / "policy-signing.pub")

    def subagent(self, name: str = "sub-1", time_scale: float = 0.002, **env: str) -> None:
        self.start(
            name, "subagent_svc", "subagent", PODIUM_SUBAGENT_TIME_SCALE=str(time_scale), **env
        )

    def reward(self, name: str = "reward-1", **env: str) -> None:
        self.start(name, "reward_svc", "reward", PODIUM_REWARD_POLL_MS="200", **env)

    def signal(self, name: str, sig: signal.Signals) -> None:
        """Send ``sig`` to the service's process."""
        proc = self.procs[name]
        assert proc.poll() is None, f"{name} already exited ({proc.returncode}):\n{self.tail(name)}"
        proc.send_signal(sig)

    def kill9(self, name: str) -> None:
        """``kill -9``: no shutdown, no commit, no abort."""
        self._ended.add(name)
        self.signal(name, signal.SIGKILL)
        self.procs[name].wait(10)

    def stop(self, name: str, timeout_s: float = 15.0) -> int:
        """SIGTERM (a graceful stop), SIGKILL after ``timeout_s``; the exit status."""
        proc = self.procs[name]
        self._ended.add(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait(10)

    def exited(self) -> dict[str, int]:
        """Services that ended by themselves (a crash), with their status."""
        return {
            n: p.returncode
            for n, p in self.procs.items()
            if p.poll() is not None and n not in self._ended
        }

    def revive(self) -> None:
        """Restart every process that exited by itself, as Kubernetes would (``restartPolicy:
        Always``): a service that exits on a fatal error is part of the design, and what
        matters is that nothing is lost or doubled across the restart. Each is recorded."""
        for name, status in self.exited().items():
            self.restarts.append(f"{name}={status}")
            module, principal, env = self._specs[name]
            self.start(name, module, principal, **env)

    async def supervise(self, period_s: float = 0.5) -> None:
        """:meth:`revive` until cancelled."""
        while True:
            self.revive()
            await asyncio.sleep(period_s)

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def kill_all(self) -> None:
        """SIGCONT (a paused process cannot die of SIGTERM), then SIGKILL every process."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        for log in self._logs.values():
            log.close()


@dataclass
class Cluster:
    """A broker of the test's own, the proxy the services reach it through, the services."""

    broker: KafkaBroker
    proxy: TcpProxy
    services: Services

    @property
    def admin(self) -> KafkaConfig:
        """The harness's way in: the broker's own client listener (never cut by the proxy),
        TLS and SCRAM as the ``admin`` super user."""
        return broker_config(self.broker)

    def kill9_broker(self) -> None:
        self.broker.kill9()

    def restart_broker(self) -> None:
        self.broker.start(120)

    def pause_broker(self) -> None:
        pid = self.broker.pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)

    def resume_broker(self) -> None:
        pid = self.broker.pid()
        assert pid is not None
        os.kill(pid, signal.SIGCONT)


@contextlib.asynccontextmanager
async def running_cluster(root: Path) -> AsyncIterator[Cluster]:
    """A fresh secured broker (SASL_SSL, ACLs) under ``root/kafka`` behind a fresh proxy, and an
    empty set of service processes logging under ``root/logs``; on exit every process is
    killed and the broker too, whatever happened."""
    proxy = TcpProxy()
    proxy.start()
    # The product's broker: SCRAM over TLS with ACLs on both client listeners (the proxied one
    # too); services log in as their own principals, the harness as admin.
    broker = KafkaBroker(root / "kafka", proxy_port=proxy.port)
    services = Services(root / "logs", broker, proxy.address)
    try:
        broker.start(120)
        proxy.target_port = broker.proxied_port
        yield Cluster(broker, proxy, services)
    finally:
        services.kill_all()
        with contextlib.suppress(Exception):
            pid = broker.pid()
            if pid is not None:
                os.kill(pid, signal.SIGCONT)  # a paused broker must wake to die
            broker.kill9()
        proxy.stop()


def _traceparent() -> tuple[str, str]:
    trace = secrets.token_hex(16)
    return trace, f"00-{trace}-{secrets.token_hex(8)}-01"


@dataclass
class Load:
    """Submits sessions as ``TaskSubmitted`` events (straight to the broker) and follows the
    trajectories topic to note when each session's trajectory became visible."""

    config: KafkaConfig
    """How the harness connects (:attr:`Cluster.admin`)."""
    scenario: str
    submitted: dict[str, str] = field(default_factory=dict)
    """Session id -> the trace id it was submitted with."""
    submitted_at: dict[str, float] = field(default_factory=dict)
    completed_at: dict[str, float] = field(default_factory=dict)
    """Session id -> when its trajectory was first seen."""
    scored: set[str] = field(default_factory=set)
    """Sessions whose scored trajectory has been seen."""
    tail_topics: tuple[str, ...] = (topics.TRAJECTORIES, topics.SCORED_TRAJECTORIES)
    """Topics the tail follows from their beginning (each record goes to :meth:`_note`)."""
    _bus: KafkaBus | None = None
    _tail: asyncio.Task[None] | None = None
    _task: task_pb2.TaskSpec = field(default_factory=lambda: task_to_proto(parse_task(SHORT_TASK)))

    async def start(self) -> None:
        self._bus = KafkaBus(dataclasses.replace(self.config, client_id="fault-load"))
        await self._bus.start()
        # The compacted registries (rollout, reviews) are created by the services that own
        # them, with their own partitioning: never as plain 3-partition topics here.
        owned = (topics.ROLLOUT, topics.REVIEWS)
        await self._bus.create_topics([TopicSpec(t, 3) for t in topics.ALL if t not in owned])
        self._tail = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._tail is not None:
            self._tail.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tail
        if self._bus is not None:
            await self._bus.stop()

    async def submit(self, n: int, *, over_s: float = 0.0) -> list[str]:
        """Publish ``n`` sessions, spread evenly over ``over_s`` seconds; their ids."""
        assert self._bus is not None
        ids = []
        t0 = time.monotonic()
        for i in range(n):
            sid = f"{self.scenario}-{len(self.submitted):04d}-{uuid.uuid4().hex[:6]}"
            await self.submit_session(sid, self._task, len(self.submitted))
            ids.append(sid)
            if over_s:
                await asyncio.sleep(max(0.0, t0 + over_s * (i + 1) / n - time.monotonic()))
        return ids

    async def submit_session(self, sid: str, task: task_pb2.TaskSpec, seed: int) -> None:
        """Publish one ``TaskSubmitted`` (a trace of its own) and note it as submitted."""
        assert self._bus is not None
        trace, parent = _traceparent()
        event = task_pb2.TaskSubmitted(session_id=sid, task=task, submitted_by="faults", seed=seed)
        _, data = codec.encode_event(
            event, producer="fault-load", key=sid, trace_context={"traceparent": parent}
        )
        await self._bus.publish(
            topics.TASKS, data, key=sid, headers=(("traceparent", parent.encode()),)
        )
        self.submitted[sid] = trace
        self.submitted_at[sid] = time.monotonic()

    async def publish_raw(self, topic: str, key: str, value: bytes) -> None:
        """Publish ``value`` as it is (poison records)."""
        assert self._bus is not None
        await self._bus.publish(topic, value, key=key)

    def in_flight(self) -> int:
        """Sessions submitted whose trajectory has not been seen yet."""
        return len(set(self.submitted) - set(self.completed_at))

    async def wait_in_flight(self, at_least: int, timeout_s: float = 30.0) -> int:
        """Wait until ``at_least`` sessions have been submitted but not completed... and some
        completed (so the pipeline is live); returns how many are in flight."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.completed_at and self.in_flight() >= at_least:
                break
            await asyncio.sleep(0.1)
        return self.in_flight()

    async def wait_done(self, timeout_s: float = 150.0, idle_s: float = 40.0) -> bool:
        """Wait until every submitted session has a trajectory and a score; give up after
        ``timeout_s``, or once neither has shown up for ``idle_s`` (longer than the orchestrator's
        session timeout, so a session waiting for a lost result still ends first)."""
        deadline = time.monotonic() + timeout_s
        last, seen = time.monotonic(), len(self.completed_at)
        while time.monotonic() < min(deadline, last + idle_s):
            if set(self.submitted) <= set(self.completed_at) and set(self.submitted) <= self.scored:
                return True
            if len(self.completed_at) + len(self.scored) != seen:
                last, seen = time.monotonic(), len(self.completed_at) + len(self.scored)
            await asyncio.sleep(0.2)
        return False

    async def _follow(self) -> None:
        while True:
            try:
                await self._follow_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a broker kill: start over, offsets are re-read from the start
                await asyncio.sleep(1.0)

    async def _follow_once(self) -> None:
        tail = dataclasses.replace(self.config, client_id="fault-tail")
        consumer = AIOKafkaConsumer(
            **tail.client_kwargs(), isolation_level="read_committed", enable_auto_commit=False
        )
        await consumer.start()
        try:
            tps = [tp for t in self.tail_topics for tp in await all_partitions(self.config, t)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            while True:
                batches = await consumer.getmany(timeout_ms=500)
                now = time.monotonic()
                for tp, records in batches.items():
                    for r in records:
                        with contextlib.suppress(Exception):
                            self._note(tp.topic, r.value, now)
        finally:
            await consumer.stop()

    def _note(self, topic: str, value: bytes | None, now: float) -> None:
        if topic == topics.TRAJECTORIES:
            traj = codec.decode_event(value, trajectory_pb2.Trajectory)[1]
            self.completed_at.setdefault(traj.session_id, now)
        else:
            scored = codec.decode_event(value, reward_pb2.ScoredTrajectory)[1]
            self.scored.add(scored.trajectory.session_id)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def recovery(load: Load, ids: list[str], healed_at: float) -> tuple[float, float]:
    """p50 and p99 of (trajectory seen - heal) over sessions submitted at the heal."""
    times = [load.completed_at[s] - healed_at for s in ids if s in load.completed_at]
    return percentile(times, 0.50), percentile(times, 0.99)


def render_table(rows: list[dict[str, object]], columns: Sequence[tuple[str, str]]) -> str:
    """``rows`` as a Markdown table of ``columns`` (row key, title); floats to one decimal."""

    def cell(value: object) -> str:
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    head = "| " + " | ".join(title for _, title in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(cell(r.get(k, "")) for k, _ in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def env_of(mapping: Mapping[str, object]) -> dict[str, str]:
    return {k: str(v) for k, v in mapping.items()}
