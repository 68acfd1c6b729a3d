"""The human review gate over real gRPC with TLS and bearer tokens (issue 13).

Sensitive subtasks are held until a reviewer decides through ReviewService: approve (the
subtask runs), reject (it fails cleanly, its dependents never run, the session ends), the
deadline (expired: rejected by default); the wrong role is PERMISSION_DENIED, no token
UNAUTHENTICATED, a plugin reading another plugin's session PERMISSION_DENIED; any replica lists
and decides what any replica holds (two orchestrators on one bus).

The single-replica cases run on the in-process bus (the gate's logic and the gRPC edge are
the same on both); the replicas case runs on both buses, and the rollout suite
(tests/rollout, scenario review_gate_across_processes) repeats approve, reject, deadline,
wrong role and no token between service processes on a secured Kafka broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import grpc.aio
import pytest

from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from orchestrator_svc.review import (
    APPROVED,
    ReviewDecided,
    ReviewGate,
    ReviewNotFound,
    ReviewSettings,
)
from podium import topics
from podium.bus import Bus, InProcBus
from podium.bus.base import TopicSpec
from podium.bus.consumer import EventConsumer, EventPublisher
from podium.config import from_env
from podium.errors import ConfigError
from podium.service.auth import client_channel
from podium.telemetry import client_interceptors
from podium.v1 import review_pb2, review_pb2_grpc, session_service_pb2, session_service_pb2_grpc
from podium.v1 import trajectory_pb2 as tp
from subagent_svc import SubagentApp, SubagentConfig
from tests.auth_helpers import GrpcTls, make_grpc_tls, write_tokens

TASK = """
name: guarded-write
max_parallel: 3
subtasks:
  - {id: schema, kind: db,  work: 2.0}
  - {id: write,  kind: db,  work: 3.0, deps: [schema], sensitive: true, description: "prod rows"}
  - {id: ui,     kind: ui,  work: 4.0}
  - {id: report, kind: api, work: 2.0, deps: [write]}
"""
"""A sensitive write with a dependent (report) and an independent branch (ui)."""

TOKENS = {
    "ide-alice": ("alice-token", ["plugin"]),
    "ide-carol": ("carol-token", ["plugin"]),
    "bob": ("bob-token", ["reviewer"]),
    "dana": ("dana-token", ["reviewer"]),
}
ALICE, CAROL, BOB, DANA = (t for t, _ in TOKENS.values())


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> GrpcTls:
    return make_grpc_tls(tmp_path_factory.mktemp("tls"))


@dataclass
class Cluster:
    """Orchestrator replicas and a sub-agent worker on one bus, TLS and tokens on."""

    apps: list[OrchestratorApp]
    tls: GrpcTls
    channels: list[grpc.aio.Channel]

    def channel(self, token: str | None, replica: int = 0) -> grpc.aio.Channel:
        ch = client_channel(
            f"127.0.0.1:{self.apps[replica].grpc_port}",
            token=token,
            ca_file=self.tls.ca,
            interceptors=client_interceptors(),
        )
        self.channels.append(ch)
        return ch

    def sessions(
        self, token: str | None, replica: int = 0
    ) -> session_service_pb2_grpc.SessionServiceStub:
        return session_service_pb2_grpc.SessionServiceStub(self.channel(token, replica))

    def reviews(self, token: str | None, replica: int = 0) -> review_pb2_grpc.ReviewServiceStub:
        return review_pb2_grpc.ReviewServiceStub(self.channel(token, replica))

    def trajectory(self, session_id: str) -> tp.Trajectory | None:
        for app in self.apps:
            handle = app.session(session_id)
            if handle is not None and handle.trajectory is not None:
                return handle.trajectory
        return None


def _config(
    group: str, name: str, tls: GrpcTls, tokens: Path, deadline_s: float
) -> OrchestratorConfig:
    return OrchestratorConfig(
        bus_url="embedded",
        group_id=group,
        instance=name,
        grpc_host="127.0.0.1",
        grpc_port=0,
        grpc_tokens=str(tokens),
        grpc_tls_cert=str(tls.cert),
        grpc_tls_key=str(tls.key),
        review_deadline_s=deadline_s,
        session_timeout_s=30.0,
        shutdown_timeout_s=5.0,
    )


@contextlib.asynccontextmanager
async def cluster(
    bus: Bus,
    tmp_path: Path,
    tls: GrpcTls,
    unique: Callable[[str], str],
    *,
    replicas: int = 1,
    deadline_s: float = 60.0,
) -> AsyncIterator[Cluster]:
    tokens = write_tokens(tmp_path / "tokens.yaml", TOKENS)
    group = unique("review")
    apps = [
        OrchestratorApp(_config(group, f"orch-{i}", tls, tokens, deadline_s), bus)
        for i in range(replicas)
    ]
    worker = SubagentApp(
        SubagentConfig(bus_url="embedded", group_id=f"{group}.subagent", shutdown_timeout_s=5.0),
        bus,
    )
    started: list[OrchestratorApp | SubagentApp] = []
    c = Cluster(apps, tls, [])
    try:
        for app in [worker, *apps]:
            await app.start()
            started.append(app)
        yield c
    finally:
        for ch in c.channels:
            await ch.close()
        for app in reversed(started):
            await app.stop()


async def _submit(stub: session_service_pb2_grpc.SessionServiceStub, text: str = TASK) -> str:
    reply = await stub.SubmitTask(
        session_service_pb2.SubmitTaskRequest(task_spec_text=text), timeout=30
    )
    return reply.session_id


async def _pending(
    stub: review_pb2_grpc.ReviewServiceStub, session_id: str, timeout_s: float = 30.0
) -> review_pb2.PendingReview:
    """The session's one pending review, once it is listed."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        listed = await stub.ListPending(
            review_pb2.ListPendingRequest(session_id=session_id), timeout=10
        )
        if listed.reviews:
            assert len(listed.reviews) == 1
            return listed.reviews[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no pending review of {session_id} within {timeout_s}s")


async def _result(
    stub: session_service_pb2_grpc.SessionServiceStub, session_id: str
) -> session_service_pb2.SessionResult:
    async for event in stub.StreamSession(
        session_service_pb2.StreamSessionRequest(session_id=session_id), timeout=60
    ):
        if event.HasField("result"):
            return event.result
    raise AssertionError("stream ended without a result")


def _ran(traj: tp.Trajectory) -> set[str]:
    return {ex.subtask_id.split("#")[0] for ex in traj.executions}


async def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code()


async def test_approve_runs_the_subtask(
    inproc_bus: Bus, tmp_path: Path, tls: GrpcTls, unique: Callable[[str], str]
) -> None:
    async with cluster(inproc_bus, tmp_path, tls, unique) as c:
        plugin, reviewer = c.sessions(ALICE), c.reviews(BOB)
        sid = await _submit(plugin)
        pending = await _pending(reviewer, sid)
        assert (pending.subtask_id, pending.kind, pending.description) == (
            "write",
            "db",
            "prod rows",
        )
        assert (
            pending.submitted_by == "ide-alice" and pending.agent and pending.instance == "orch-0"
        )
        await asyncio.sleep(0.2)  # a measurable wait
        approved = await reviewer.Approve(
            review_pb2.ApproveRequest(review_id=pending.review_id, reason="ok"), timeout=30
        )
        assert (
            approved.review.verdict == tp.REVIEW_VERDICT_APPROVED
            and approved.review.reviewer == "bob"
        )
        result = await _result(plugin, sid)
        assert result.state == session_service_pb2.SESSION_STATE_SUCCEEDED, result.summary
        traj = c.trajectory(sid)
        assert traj is not None and traj.completed
        assert _ran(traj) == {"schema", "write", "ui", "report"}
        (review,) = traj.reviews
        assert (review.verdict, review.reviewer, review.reason) == (
            tp.REVIEW_VERDICT_APPROVED,
            "bob",
            "ok",
        )
        assert review.subtask_id == "write" and review.wait_s >= 0.2
        assert traj.review_wait_s >= 0.2
        assert traj.labels["submitted_by"] == "ide-alice"
        # The held START cost one decision of simulated time, never the wall-clock wait.
        assert traj.latency < 60.0
        # A second decision loses: the first one is named.
        code = await _code(
            reviewer.Reject(
                review_pb2.RejectRequest(review_id=pending.review_id, reason="late"), timeout=30
            )
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_reject_fails_cleanly(
    inproc_bus: Bus, tmp_path: Path, tls: GrpcTls, unique: Callable[[str], str]
) -> None:
    async with cluster(inproc_bus, tmp_path, tls, unique) as c:
        plugin, reviewer = c.sessions(ALICE), c.reviews(BOB)
        sid = await _submit(plugin)
        pending = await _pending(reviewer, sid)
        code = await _code(
            reviewer.Reject(review_pb2.RejectRequest(review_id=pending.review_id), timeout=30)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT  # a rejection needs a reason
        rejected = await reviewer.Reject(
            review_pb2.RejectRequest(review_id=pending.review_id, reason="not in prod"), timeout=30
        )
        assert rejected.review.verdict == tp.REVIEW_VERDICT_REJECTED
        result = await _result(plugin, sid)
        assert result.state == session_service_pb2.SESSION_STATE_FAILED
        assert "write rejected by bob" in result.summary
        traj = c.trajectory(sid)
        assert traj is not None and not traj.completed and not traj.loop_detected
        assert _ran(traj) == {"schema", "ui"}  # neither the write nor its dependent ran
        assert "end_reason" not in traj.labels  # a human's decision, not a failure of the run
        assert [r.verdict for r in traj.reviews] == [tp.REVIEW_VERDICT_REJECTED]
        assert traj.decisions[-1].action.type == tp.ACTION_TYPE_FINISH
        listed = await reviewer.ListPending(
            review_pb2.ListPendingRequest(session_id=sid), timeout=10
        )
        assert not listed.reviews
        code = await _code(
            reviewer.Approve(review_pb2.ApproveRequest(review_id=pending.review_id), timeout=30)
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_deadline_expires_as_reject(
    inproc_bus: Bus, tmp_path: Path, tls: GrpcTls, unique: Callable[[str], str]
) -> None:
    async with cluster(inproc_bus, tmp_path, tls, unique, deadline_s=1.5) as c:
        plugin, reviewer = c.sessions(ALICE), c.reviews(BOB)
        sid = await _submit(plugin)
        pending = await _pending(reviewer, sid)
        result = await _result(plugin, sid)
        assert result.state == session_service_pb2.SESSION_STATE_FAILED
        traj = c.trajectory(sid)
        assert traj is not None
        (review,) = traj.reviews
        assert (review.verdict, review.reviewer) == (tp.REVIEW_VERDICT_EXPIRED, "deadline")
        assert review.wait_s >= 1.5 and traj.review_wait_s >= 1.5
        assert _ran(traj) == {"schema", "ui"}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await reviewer.Approve(
                review_pb2.ApproveRequest(review_id=pending.review_id), timeout=30
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "expired" in (err.value.details() or "")


async def test_roles_and_tokens(
    inproc_bus: Bus, tmp_path: Path, tls: GrpcTls, unique: Callable[[str], str]
) -> None:
    async with cluster(inproc_bus, tmp_path, tls, unique) as c:
        sid = await _submit(c.sessions(ALICE))
        request = review_pb2.ListPendingRequest(session_id=sid)
        denied, unauth = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED
        # Wrong role: a plugin cannot review, a reviewer cannot submit.
        assert await _code(c.reviews(ALICE).ListPending(request, timeout=10)) == denied
        pending = await _pending(c.reviews(BOB), sid)
        approve = review_pb2.ApproveRequest(review_id=pending.review_id)
        assert await _code(c.reviews(ALICE).Approve(approve, timeout=10)) == denied
        assert await _code(_submit(c.sessions(BOB))) == denied
        # No token, or one the table does not hold.
        assert await _code(c.reviews(None).Approve(approve, timeout=10)) == unauth
        assert await _code(_submit(c.sessions(None))) == unauth
        assert await _code(_submit(c.sessions("forged"))) == unauth
        get = session_service_pb2.GetSessionRequest(session_id=sid)
        assert await _code(c.sessions(None).GetSession(get, timeout=10)) == unauth
        # A plugin reads its own sessions only.
        assert (await c.sessions(ALICE).GetSession(get, timeout=10)).session_id == sid
        assert await _code(c.sessions(CAROL).GetSession(get, timeout=10)) == denied
        stream = c.sessions(CAROL).StreamSession(
            session_service_pb2.StreamSessionRequest(session_id=sid), timeout=10
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stream:
                pass
        assert err.value.code() == denied
        # Nothing above decided the review.
        assert (await _pending(c.reviews(BOB), sid)).review_id == pending.review_id


async def test_any_replica_lists_and_decides(
    bus: Bus, tmp_path: Path, tls: GrpcTls, unique: Callable[[str], str]
) -> None:
    async with cluster(bus, tmp_path, tls, unique, replicas=2) as c:
        sid = await _submit(c.sessions(ALICE, 0))
        on_0 = await _pending(c.reviews(BOB, 0), sid)
        on_1 = await _pending(c.reviews(DANA, 1), sid)
        assert on_0 == on_1
        owner = 0 if on_0.instance == "orch-0" else 1
        other = 1 - owner
        # Two reviewers at once on both replicas: exactly one decision wins everywhere.
        calls = [
            c.reviews(BOB, other).Approve(
                review_pb2.ApproveRequest(review_id=on_0.review_id), timeout=30
            ),
            c.reviews(DANA, owner).Reject(
                review_pb2.RejectRequest(review_id=on_0.review_id, reason="no"), timeout=30
            ),
        ]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        won = [o for o in outcomes if not isinstance(o, BaseException)]
        lost = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert lost[0].code() == grpc.StatusCode.FAILED_PRECONDITION
        verdict = won[0].review.verdict
        assert verdict_word(verdict) in (lost[0].details() or "")
        result = await _result(c.sessions(ALICE, 0), sid)
        traj = c.trajectory(sid)
        assert traj is not None and [r.verdict for r in traj.reviews] == [verdict]
        expected = session_service_pb2.SESSION_STATE_SUCCEEDED if verdict == tp.REVIEW_VERDICT_APPROVED else session_service_pb2.SESSION_STATE_FAILED  # fmt: skip
        assert result.state == expected
        # Replica 1 never saw the SubmitTask: it knows the session from running it or from
        # the ledger, and either way answers its owner and no one else.
        get = session_service_pb2.GetSessionRequest(session_id=sid)
        for _ in range(100):  # the ledger entry may reach replica 1 after the stream ended
            try:
                got = await c.sessions(ALICE, 1).GetSession(get, timeout=10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
                await asyncio.sleep(0.1)
                continue
            assert got.session_id == sid and got.state == result.state
            break
        else:
            raise AssertionError("replica 1 never learned of the session")
        assert await _code(c.sessions(CAROL, 1).GetSession(get, timeout=10)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        for replica in (0, 1):
            listed = await c.reviews(BOB, replica).ListPending(
                review_pb2.ListPendingRequest(session_id=sid), timeout=10
            )
            assert not listed.reviews


def verdict_word(verdict: int) -> str:
    return (
        tp.ReviewVerdict.Name(tp.ReviewVerdict.ValueType(verdict))
        .removeprefix("REVIEW_VERDICT_")
        .lower()
    )


async def test_tokens_without_tls_refuse_to_start(tmp_path: Path, tls: GrpcTls) -> None:
    tokens = write_tokens(tmp_path / "tokens.yaml", TOKENS)
    config = _config("g", "x", tls, tokens, 60.0)
    bus = InProcBus()
    await bus.start()
    try:
        app = OrchestratorApp(replace(config, grpc_tls_cert="", grpc_tls_key=""), bus)
        with pytest.raises(ConfigError, match="PODIUM_GRPC_TLS_CERT"):
            await app.start()
        await app.stop()
    finally:
        await bus.stop()


def test_review_setting() -> None:
    assert not OrchestratorConfig(bus_url="embedded").review_on  # no tokens: as before
    assert OrchestratorConfig(bus_url="embedded", grpc_tokens="t.yaml").review_on
    assert not OrchestratorConfig(bus_url="embedded", grpc_tokens="t.yaml", review="off").review_on
    assert OrchestratorConfig(bus_url="embedded", review="on").review_on
    environ = {
        "PODIUM_BUS": "kafka://127.0.0.1:9092",
        "PODIUM_REVIEW": "maybe",
        "PODIUM_REVIEW_DEADLINE_S": "0",
    }
    with pytest.raises(ConfigError) as err:
        from_env(OrchestratorConfig, environ)
    assert "PODIUM_REVIEW=" in str(err.value) and "PODIUM_REVIEW_DEADLINE_S" in str(err.value)


async def test_gate_abandon_and_supersede(inproc_bus: Bus) -> None:
    """A hold whose session ended is closed as expired by the orchestrator; a later run of
    the same session and subtask supersedes an older pending review in the listing."""
    await inproc_bus.create_topics([TopicSpec(topics.REVIEWS, 1)])
    publisher = EventPublisher(inproc_bus, producer_name="t")
    gate = ReviewGate(publisher, ReviewSettings("me", deadline_s=60.0))
    follower = EventConsumer(
        inproc_bus, [topics.REVIEWS], "t.reviews", gate.on_event, producer_name="t"
    )
    await follower.start()
    running = asyncio.create_task(follower.run())
    try:
        first = review_pb2.PendingReview(review_id="s.r1.w", session_id="s", subtask_id="w")
        await gate.request(first)
        assert [p.review_id for p in gate.list_pending()] == ["s.r1.w"]
        again = review_pb2.PendingReview(review_id="s.r2.w", session_id="s", subtask_id="w")
        await gate.request(again)
        assert [p.review_id for p in gate.list_pending("s")] == ["s.r2.w"]
        (record,) = await gate.abandon(["s.r2.w"], "session ended before a decision")
        assert (record.verdict, record.reviewer) == (tp.REVIEW_VERDICT_EXPIRED, "orchestrator")
        assert gate.list_pending() == []
        with pytest.raises(ReviewDecided, match="expired by 'orchestrator'"):
            await gate.decide("s.r2.w", APPROVED, "bob", "")
        with pytest.raises(ReviewNotFound):
            await gate.decide("nope", APPROVED, "bob", "")
    finally:
        await follower.stop()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await gate.close()
