"""The rollout suite's moving parts, on top of the fault suite's (tests/faults/harness.py: the
secured broker of the test's own, the services as processes, the load and its tail; and
tests/faults/audit.py: every topic read back under read_committed).

What this adds:

* :class:`RolloutLoad`: the fault suite's load, also following :data:`~podium.topics.ROLLOUT`
  (states and transitions, with when each was seen) and noting each trajectory's arm and the
  version that decided it; sessions run the suite's task mix (:func:`candidates.suite_tasks`)
  under session ids the scenario chooses (:func:`session_ids`);
* :class:`Rig`: the deployment of one scenario (two orchestrator replicas with the learned
  policy under the rollout, a sub-agent pool, the reward service and the rollout controller,
  each a ``python -m`` process as its own Kafka principal), the operator's side (RolloutService
  over gRPC with TLS and an operator token, and the ``podium rollout`` CLI), and a steady
  :class:`Driver` of sessions.

Compressed time: a stage lasts no minimum time (``PODIUM_ROLLOUT_STAGE_MIN_S=0``) and a few
canary sessions; the shadow window is a few dozen comparisons. A 1% canary would need
thousands of random sessions to see a few dozen canary ones, so the driver chooses session ids
by the bucket of their stable hash (:func:`podium.rollout.bucket`, the routing input): a
scenario asks for a mix (some ids in the canary range, some in the baseline range, the rest
anywhere), which the routing then sends where the state says. Shares over random ids are the
traffic-share scenario's subject, with ids drawn at random.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from auth_helpers import GrpcTls, make_grpc_tls, write_tokens
from candidates import Candidate, announce, suite_tasks
from harness import ROOT, Cluster, Load

from podium import codec, topics
from podium.bus import KafkaBus
from podium.bus.consumer import EventPublisher
from podium.envs.swarm import TaskSpec
from podium.envs.swarm.trajectory import task_to_proto
from podium.policy.signing import KeyPair
from podium.rollout.routing import BUCKETS, bucket
from podium.service.auth import client_channel
from podium.v1 import rollout_pb2, rollout_pb2_grpc, task_pb2, trajectory_pb2
from podium_app.kafka_broker import PASSWORD_ENV

STAGED = rollout_pb2.ROLLOUT_STAGE_STAGED
IDLE = rollout_pb2.ROLLOUT_STAGE_IDLE


def kind(name: str) -> int:
    """The transition kind ``name`` ("PROMOTED", "STAGE_ADVANCED", ...)."""
    return rollout_pb2.TransitionKind.Value(f"TRANSITION_KIND_{name}")


def kind_name(value: int) -> str:
    return rollout_pb2.TransitionKind.Name(value).removeprefix("TRANSITION_KIND_")


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- tokens -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Auth:
    """What the gRPC servers of a scenario authenticate with: TLS (a CA of the test's own and a
    certificate for 127.0.0.1) and a token table (sha256 only) with one token per role."""

    table: Path
    tls: GrpcTls
    by_role: dict[str, str]
    """Role -> a token holding only that role (``plugin``, ``reviewer``, ``operator``)."""

    def file(self, role: str) -> Path:
        """A file holding ``role``'s token (for ``--token-file``)."""
        path = self.table.with_name(f"{role}.token")
        if not path.exists():
            path.write_text(self.by_role[role] + "\n")
            path.chmod(0o600)
        return path

    def server_env(self) -> dict[str, str]:
        """A gRPC server's settings: the token table and the certificate."""
        return {
            "PODIUM_GRPC_TOKENS": str(self.table),
            "PODIUM_GRPC_TLS_CERT": str(self.tls.cert),
            "PODIUM_GRPC_TLS_KEY": str(self.tls.key),
        }

    def channel(self, address: str, role: str | None) -> grpc.aio.Channel:
        """A TLS channel to ``address`` presenting ``role``'s token (None: no token)."""
        token = self.by_role[role] if role else None
        return client_channel(address, token=token, ca_file=self.tls.ca)


def make_auth(directory: Path) -> Auth:
    """Fresh TLS material and a fresh token per role under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    by_role = {role: secrets.token_urlsafe(24) for role in ("plugin", "reviewer", "operator")}
    tokens = {f"{role}-1": (token, [role]) for role, token in by_role.items()}
    table = write_tokens(directory / "tokens.json", tokens)
    return Auth(table, make_grpc_tls(directory / "tls"), by_role)


# -- the load ---------------------------------------------------------------------------------


def session_ids(prefix: str, n: int, buckets: range | None = None) -> list[str]:
    """``n`` fresh session ids, each hashing into ``buckets`` (any bucket when None)."""
    out: list[str] = []
    while len(out) < n:
        sid = f"{prefix}-{uuid.uuid4().hex[:12]}"
        if buckets is None or bucket(sid) in buckets:
            out.append(sid)
    return out


@dataclass
class RolloutLoad(Load):
    """The fault suite's :class:`~harness.Load`, also following the rollout topic and noting
    each trajectory's arm (see the module docstring)."""

    tail_topics: tuple[str, ...] = (
        topics.TRAJECTORIES,
        topics.SCORED_TRAJECTORIES,
        topics.ROLLOUT,
    )
    arms: dict[str, trajectory_pb2.Arm] = field(default_factory=dict)
    """Session id -> the arm its trajectory records."""
    decided_by: dict[str, str] = field(default_factory=dict)
    """Session id -> the trajectory's ``policy_version`` (what actually decided)."""
    states: dict[int, rollout_pb2.RolloutState] = field(default_factory=dict)
    """Rollout states by seq, as read."""
    transitions: dict[int, rollout_pb2.RolloutTransition] = field(default_factory=dict)
    """Rollout transitions by seq, as read."""
    seen_at: dict[int, float] = field(default_factory=dict)
    """Seq -> when (monotonic) the harness first read its state."""
    checkpoint: rollout_pb2.ControllerCheckpoint | None = None
    """The controller's newest checkpoint read."""
    _tasks: list[task_pb2.TaskSpec] = field(
        default_factory=lambda: [task_to_proto(t) for t in suite_tasks()]
    )

    def use_tasks(self, tasks: Sequence[TaskSpec]) -> None:
        """Run ``tasks`` (in turn) from now on instead of the suite's mix."""
        self._tasks = [task_to_proto(t) for t in tasks]

    async def submit_ids(self, ids: Iterable[str]) -> list[str]:
        """Submit a session under each id (the suite's tasks in turn, seeds in order)."""
        out = []
        for sid in ids:
            n = len(self.submitted)
            await self.submit_session(sid, self._tasks[n % len(self._tasks)], n)
            out.append(sid)
        return out

    def _note(self, topic: str, value: bytes | None, now: float) -> None:
        if topic != topics.ROLLOUT:
            super()._note(topic, value, now)
        if topic == topics.TRAJECTORIES:
            traj = codec.decode_event(value, trajectory_pb2.Trajectory)[1]
            self.arms.setdefault(traj.session_id, traj.arm)
            self.decided_by.setdefault(traj.session_id, traj.policy_version)
        elif topic == topics.ROLLOUT and value is not None:
            msg = codec.unpack(codec.decode_envelope(value))
            if isinstance(msg, rollout_pb2.RolloutState):
                self.states.setdefault(msg.seq, msg)
                self.seen_at.setdefault(msg.seq, now)
            elif isinstance(msg, rollout_pb2.RolloutTransition):
                self.transitions.setdefault(msg.seq, msg)
            elif isinstance(msg, rollout_pb2.ControllerCheckpoint):
                self.checkpoint = msg

    @property
    def state(self) -> rollout_pb2.RolloutState | None:
        """The newest state read (highest seq)."""
        return self.states[max(self.states)] if self.states else None

    def kinds(self) -> list[str]:
        """The transitions read so far, in seq order, by kind name (with the stage reached)."""
        return [describe(self.transitions[s]) for s in sorted(self.transitions)]

    async def wait_state(
        self, pred: Callable[[rollout_pb2.RolloutState], bool], timeout_s: float, what: str
    ) -> rollout_pb2.RolloutState:
        """Wait until the newest state satisfies ``pred``; AssertionError naming ``what`` and
        the transitions so far when it does not in ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.state
            if state is not None and pred(state):
                return state
            await asyncio.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout_s:.0f}s; transitions: {self.kinds()}")

    async def wait_transition(
        self, name: str, timeout_s: float, *, after: int = 0
    ) -> rollout_pb2.RolloutTransition:
        """Wait for the first transition of kind ``name`` with seq > ``after``."""
        want = kind(name)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for seq in sorted(self.transitions):
                if seq > after and self.transitions[seq].kind == want:
                    return self.transitions[seq]
            await asyncio.sleep(0.1)
        raise AssertionError(f"no {name} within {timeout_s:.0f}s; transitions: {self.kinds()}")


def describe(t: rollout_pb2.RolloutTransition) -> str:
    """``KIND->stage`` of a transition, e.g. ``STAGE_ADVANCED->canary 5%``."""
    s = t.state
    stage = rollout_pb2.RolloutStage.Name(s.stage).removeprefix("ROLLOUT_STAGE_").lower()
    where = f"{stage} {s.canary_percent}%" if s.stage == STAGED else stage
    return f"{t.seq}:{kind_name(t.kind)}->{where}"


# -- the driver -------------------------------------------------------------------------------


@dataclass
class Mix:
    """How the driver picks session ids: per session, ``canary`` of them from the canary range
    of a 1% stage (a canary at every stage), ``baseline`` from the baseline range, the rest
    anywhere."""

    canary: float = 0.0
    baseline: float = 0.0
    baseline_bp: int = 500


def pick_ids(prefix: str, n: int, mix: Mix, counter: Iterable[int]) -> list[str]:
    """``n`` ids by ``mix``, deterministic in the running ``counter`` (no randomness in how
    many of each a batch gets)."""
    canary = range(mix.baseline_bp, mix.baseline_bp + BUCKETS // 100)
    baseline = range(0, mix.baseline_bp)
    out = []
    for i, _ in zip(counter, range(n), strict=False):
        frac = (i * 0.6180339887) % 1.0  # low-discrepancy: the mix holds in every window
        if frac < mix.canary:
            out += session_ids(prefix, 1, canary)
        elif frac < mix.canary + mix.baseline:
            out += session_ids(prefix, 1, baseline)
        else:
            out += session_ids(prefix, 1)
    return out


@dataclass
class Driver:
    """Submits sessions steadily (``rate`` a second, at most ``max_in_flight`` unfinished)
    with ids picked by ``mix`` (changeable while it runs) until stopped."""

    load: RolloutLoad
    prefix: str
    mix: Mix = field(default_factory=Mix)
    rate: float = 20.0
    max_in_flight: int = 40
    _task: asyncio.Task[None] | None = None
    _counter: Any = field(default_factory=itertools.count)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        period = 1.0 / self.rate
        while True:
            if self.load.in_flight() < self.max_in_flight:
                await self.load.submit_ids(pick_ids(self.prefix, 1, self.mix, self._counter))
            await asyncio.sleep(period)


# -- the deployment ---------------------------------------------------------------------------

BASE_CONTROLLER_ENV = {
    "PODIUM_ROLLOUT_STAGE_MIN_S": "0",
    "PODIUM_ROLLOUT_STAGE_MIN_SESSIONS": "12",
    "PODIUM_ROLLOUT_OFFLINE_SESSIONS": "20",
    "PODIUM_ROLLOUT_SHADOW_WINDOW": "40",
    "PODIUM_ROLLOUT_SHADOW_MIN_SESSIONS": "10",
    "PODIUM_ROLLOUT_SHADOW_MAX_SESSIONS": "400",
    "PODIUM_ROLLOUT_GUARDRAIL_MIN_SESSIONS": "15",
    "PODIUM_ROLLOUT_CYCLE_S": "100000",
    "PODIUM_ROLLOUT_TICK_S": "0.2",
}
"""Compressed time: no minimum stage length, a dozen canary sessions per stage, a 40-session
shadow window (10 before the running mean counts), guardrails tested from 15 sessions per
arm, and no automatic cycle during a scenario (the scenarios propose by hand)."""


@dataclass
class Rig:
    """One scenario's deployment and its operator (see the module docstring)."""

    cluster: Cluster
    keys: KeyPair
    candidates: dict[str, Candidate]
    auth: Auth
    load: RolloutLoad
    port: int = field(default_factory=free_port)
    """RolloutService's port."""
    _admin_bus: KafkaBus | None = None
    controller_env: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(
        self,
        *,
        controller: dict[str, str] | None = None,
        subagent: dict[str, str] | None = None,
        replicas: int = 2,
    ) -> None:
        """Start the services, wait for RolloutService, start the harness's tail."""
        svc = self.cluster.services
        svc.subagent(**(subagent or {}))
        svc.reward()
        for i in range(replicas):
            svc.orchestrator(
                f"orch-{i + 1}",
                PODIUM_POLICY="learned",
                PODIUM_POLICY_TRUSTED_KEYS=str(self.keys.public_path),
            )
        self.controller_env = {**BASE_CONTROLLER_ENV, **(controller or {})}
        self.start_controller()
        # The controller creates the registry (one partition, compacted) before it answers.
        await self.wait_controller()
        await self.load.start()
        self._admin_bus = KafkaBus(dataclasses.replace(self.cluster.admin, client_id="rollout-op"))
        await self._admin_bus.start()

    def start_controller(self) -> None:
        """(Re)start the rollout controller: ``python -m learner_svc`` in rollout mode as the
        ``rollout`` principal, RolloutService on :attr:`port` with the token table."""
        self.cluster.services.start(
            "controller",
            "learner_svc",
            "rollout",
            PODIUM_LEARNER_MODE="rollout",
            PODIUM_ROLLOUT_GRPC_HOST="127.0.0.1",
            PODIUM_ROLLOUT_GRPC_PORT=str(self.port),
            **self.auth.server_env(),
            PODIUM_POLICY_TRUSTED_KEYS=str(self.keys.public_path),
            **self.controller_env,
        )

    async def stop(self) -> None:
        """Stop the tail and the services gracefully (orchestrators first, so their last
        trajectories are published)."""
        await self.load.stop()
        if self._admin_bus is not None:
            await self._admin_bus.stop()
        svc = self.cluster.services
        for name in sorted(svc.procs, key=lambda n: (not n.startswith("orch"), n)):
            await asyncio.to_thread(svc.stop, name)

    async def warm_up(self, n: int = 12, timeout_s: float = 120.0) -> None:
        """Submit ``n`` sessions and wait for all of them: every service is up and joined."""
        ids = await self.load.submit_ids(session_ids("warmup", n))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if all(s in self.load.completed_at and s in self.load.scored for s in ids):
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"warm-up sessions did not complete; logs: {self.logs()}")

    async def announce(self, *names: str, timeout_s: float = 60.0) -> None:
        """Publish the named candidates' signed announcements and wait until every
        orchestrator replica has loaded them (its log says so)."""
        assert self._admin_bus is not None
        chosen = [self.candidates[n] for n in names]
        await announce(EventPublisher(self._admin_bus, producer_name="rollout-suite"), *chosen)
        svc = self.cluster.services
        replicas = [n for n in svc.procs if n.startswith("orch")]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            logs = {r: svc.tail(r, 10**7) for r in replicas}
            if all(f"v{c.version} (" in logs[r] for r in replicas for c in chosen):
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"replicas did not load {names}; logs: {self.logs()}")

    def check_alive(self) -> None:
        exited = self.cluster.services.exited()
        assert not exited, f"services exited: {exited}; logs: {self.logs()}"

    def logs(self, chars: int = 2500) -> dict[str, str]:
        svc = self.cluster.services
        return {n: svc.tail(n, chars) for n in svc.procs}

    # -- the operator ---------------------------------------------------------------------

    async def rpc(self, method: str, request: Any, *, role: str | None = "operator") -> Any:
        """Call RolloutService ``method`` with ``role``'s token (None: no token)."""
        async with self.auth.channel(self.address, role) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            return await getattr(stub, method)(request, timeout=30)

    async def wait_controller(self, timeout_s: float = 120.0) -> rollout_pb2.GetStatusResponse:
        """Wait until RolloutService answers (the controller is up and has claimed)."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                return await self.rpc("GetStatus", rollout_pb2.GetStatusRequest())
            except grpc.aio.AioRpcError as exc:
                last = exc
                await asyncio.sleep(0.5)
        raise AssertionError(f"RolloutService never answered ({last}); logs: {self.logs()}")

    async def propose(self, version: str, reason: str = "suite") -> rollout_pb2.RolloutState:
        resp = await self.rpc("Propose", rollout_pb2.ProposeRequest(version=version, reason=reason))
        return resp.result.state

    async def promote_to(
        self, done: Callable[[rollout_pb2.RolloutState], bool], *, limit: int = 8
    ) -> rollout_pb2.RolloutState:
        """Operator overrides (Promote, recorded OPERATOR_PROMOTED) until ``done(state)``;
        each names the rollout it means, so none acts on a later one."""
        for _ in range(limit):
            status = await self.rpc("GetStatus", rollout_pb2.GetStatusRequest())
            if done(status.state):
                return status.state
            command = rollout_pb2.RolloutCommand(
                reason="suite: operator override", rollout_id=status.state.rollout_id
            )
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.rpc("Promote", rollout_pb2.PromoteRequest(command=command))
        status = await self.rpc("GetStatus", rollout_pb2.GetStatusRequest())
        assert done(status.state), f"overrides did not get there: {status.state}"
        return status.state

    async def command(self, method: str, reason: str) -> rollout_pb2.RolloutState:
        """``Pause``, ``Resume`` or ``Rollback`` with ``reason``; the state after it."""
        request = getattr(rollout_pb2, f"{method}Request")(
            command=rollout_pb2.RolloutCommand(reason=reason)
        )
        return (await self.rpc(method, request)).result.state

    async def make_live(self, version: str) -> rollout_pb2.RolloutState:
        """Walk ``version`` to live by operator overrides alone (propose, then Promote until
        it is live), paused meanwhile so that no verdict races the overrides (a pause holds
        every automatic step forward; the overrides are recorded as OPERATOR_PROMOTED)."""
        status = await self.rpc("GetStatus", rollout_pb2.GetStatusRequest())
        if not status.state.paused:
            await self.command("Pause", "suite: overrides follow")
        await self.propose(version, reason=f"suite: make {version} live by overrides")
        return await self.promote_to(lambda s: s.live_version == version and s.stage == IDLE)

    def cli(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """``podium rollout ARGS`` as an operator runs it (a process; --address and the
        operator's --token-file added for the client commands)."""
        podium = Path(sys.executable).with_name("podium")
        extra: list[str] = []
        if args[0] != "report":
            extra = ["--address", self.address, "--ca", str(self.auth.tls.ca)]
            extra += ["--token-file", str(self.auth.file("operator"))]
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        if args[0] == "report":
            env[PASSWORD_ENV] = self.cluster.broker.passwords()["admin"]
        return subprocess.run(
            [str(podium), "rollout", *args, *extra],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def admin_url(self) -> str:
        """The harness's ``kafka://`` URL (admin; the password in the environment)."""
        return self.cluster.broker.client_url("admin")
