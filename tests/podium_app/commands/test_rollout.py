"""``podium rollout`` against a RolloutService over real gRPC on loopback, with bearer-token
auth (:class:`podium.service.auth.AuthInterceptor`, operator role): the walk of a candidate
driven from the command line, and each failure's one-line message and exit code.

The servicer here keeps the state in memory and moves it with :mod:`podium.rollout.machine`
(what the controller records for each command); the controller's own servicer, with its bus
and evidence, is tested with the controller.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from podium.errors import RolloutConflict
from podium.rollout import RolloutSettings, advance, initial_state, pause, propose, resume, rollback
from podium.service.auth import AuthInterceptor, TokenTable, principal, token_digest
from podium.v1 import rollout_pb2, rollout_pb2_grpc
from podium_app.cli import main
from podium_app.commands import rollout as cmd

OPERATOR = "operator-token-0123456789"
REVIEWER = "reviewer-token-0123456789"
ROLES = {"/podium.v1.RolloutService/*": "operator"}


@dataclass
class _Servicer(rollout_pb2_grpc.RolloutServiceServicer):  # type: ignore[misc]
    """RolloutService over an in-memory state, moved by the machine functions."""

    state: rollout_pb2.RolloutState = field(
        default_factory=lambda: initial_state(RolloutSettings(), datetime.now(UTC), "test")
    )
    transitions: list[rollout_pb2.RolloutTransition] = field(default_factory=list)
    actors: list[str] = field(default_factory=list)

    async def GetStatus(self, request: Any, context: Any) -> rollout_pb2.GetStatusResponse:
        evidence = rollout_pb2.Evidence(
            summary="canary 120 sessions, no breach", figures={"stage_sessions": 120.0}
        )
        evidence.guardrails.add(
            name="incomplete", canary_mean=0.02, baseline_mean=0.01, canary_n=120, baseline_n=60
        )
        n = request.transitions or 20
        return rollout_pb2.GetStatusResponse(
            state=self.state,
            evidence=evidence,
            transitions=self.transitions[-n:],
            arm_sessions={"live:rules:cpls": 900, "baseline:rules:cpls": 50},
        )

    async def _apply(
        self, context: Any, rollout_id: str, step: Any
    ) -> rollout_pb2.RolloutCommandResult:
        if rollout_id and rollout_id != self.state.rollout_id:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"rollout {rollout_id} is not the current one ({self.state.rollout_id or 'none'})",
            )
        actor = f"operator:{principal(context)}"
        self.actors.append(actor)
        try:
            self.state, transition = step(actor, datetime.now(UTC))
        except RolloutConflict as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        self.transitions.append(transition)
        return rollout_pb2.RolloutCommandResult(state=self.state, transition=transition)

    async def Propose(self, request: Any, context: Any) -> rollout_pb2.ProposeResponse:
        if not request.version:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "version is empty")
        result = await self._apply(
            context, "", lambda a, now: propose(self.state, request.version, request.reason, a, now)
        )
        return rollout_pb2.ProposeResponse(result=result)

    async def Promote(self, request: Any, context: Any) -> rollout_pb2.PromoteResponse:
        c = request.command
        result = await self._apply(
            context,
            c.rollout_id,
            lambda a, now: advance(
                self.state, rollout_pb2.Evidence(summary=c.reason), now, actor=a, override=True
            ),
        )
        return rollout_pb2.PromoteResponse(result=result)

    async def Pause(self, request: Any, context: Any) -> rollout_pb2.PauseResponse:
        c = request.command
        step = lambda a, now: pause(self.state, c.reason, a, now)  # noqa: E731
        return rollout_pb2.PauseResponse(result=await self._apply(context, c.rollout_id, step))

    async def Resume(self, request: Any, context: Any) -> rollout_pb2.ResumeResponse:
        c = request.command
        step = lambda a, now: resume(self.state, c.reason, a, now)  # noqa: E731
        return rollout_pb2.ResumeResponse(result=await self._apply(context, c.rollout_id, step))

    async def Rollback(self, request: Any, context: Any) -> rollout_pb2.RollbackResponse:
        c = request.command
        step = lambda a, now: rollback(self.state, c.reason, None, now, a)  # noqa: E731
        return rollout_pb2.RollbackResponse(result=await self._apply(context, c.rollout_id, step))


@dataclass
class Controller:
    address: str
    servicer: _Servicer
    operator_file: Path
    reviewer_file: Path


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    """The servicer on 127.0.0.1 in a thread of its own (the CLI runs its own event loop)."""
    table = TokenTable.parse(
        {
            "tokens": [
                {"name": "alice", "sha256": token_digest(OPERATOR), "roles": ["operator"]},
                {"name": "bob", "sha256": token_digest(REVIEWER), "roles": ["reviewer"]},
            ]
        }
    )
    servicer = _Servicer()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=[AuthInterceptor(table, ROLES)])
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    (op := tmp_path / "operator.token").write_text(OPERATOR + "\n")
    (rv := tmp_path / "reviewer.token").write_text(REVIEWER)
    try:
        yield Controller(f"127.0.0.1:{port}", servicer, op, rv)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _rollout(c: Controller | RealController, *argv: str, token: Path | None = None) -> int:
    return main(
        ["rollout", *argv, "--address", c.address, "--token-file", str(token or c.operator_file)]
    )


def test_an_operator_walks_a_candidate_to_promotion_from_the_cli(
    controller: Controller, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _rollout(controller, "propose", "7", "--reason", "cycle 1 candidate") == 0
    out = capsys.readouterr().out
    assert "candidate_proposed" in out and "offline" in out
    rollout_id = controller.servicer.state.rollout_id
    assert rollout_id == "1:7"
    # offline -> shadow -> 1% -> 5% -> 20% -> 100% -> promoted, each forced by the operator.
    for _ in range(6):
        assert (
            _rollout(controller, "promote", "--reason", "by hand", "--rollout-id", rollout_id) == 0
        )
    state = controller.servicer.state
    assert (state.live_version, state.previous_version, state.candidate_version) == (
        "7",
        "rules:cpls",
        "",
    )
    # Every command carried the operator's identity from the token, not from an argument.
    assert set(controller.servicer.actors) == {"operator:alice"}
    capsys.readouterr()
    assert _rollout(controller, "status") == 0
    status = capsys.readouterr().out
    for part in (
        "stage:      idle",
        "live:       7",
        "previous:   rules:cpls",
        "traffic (target share",
        "baseline:rules:cpls",
        "live:7",
        "canary 120 sessions, no breach",
        "incomplete",
        "recent transitions (7):",
        "promoted",
        "operator:alice: operator override: advanced by operator:alice; by hand",
    ):
        assert part in status, part
    assert _rollout(controller, "status", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["state"]["live_version"] == "7"
    assert len(data["transitions"]) == 7
    assert _rollout(controller, "rollback", "--reason", "pager") == 0
    assert controller.servicer.state.live_version == "rules:cpls"
    assert _rollout(controller, "pause", "--reason", "freeze") == 0
    assert controller.servicer.state.paused
    assert _rollout(controller, "resume") == 0
    assert not controller.servicer.state.paused


def test_the_environment_gives_the_defaults(
    controller: Controller, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PODIUM_ROLLOUT_ADDRESS", controller.address)
    monkeypatch.setenv("PODIUM_TOKEN_FILE", str(controller.operator_file))
    assert main(["rollout", "status"]) == 0
    assert "stage:      idle" in capsys.readouterr().out


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err


def test_no_token_is_unauthenticated(
    controller: Controller, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PODIUM_TOKEN_FILE", raising=False)
    assert main(["rollout", "status", "--address", controller.address]) == cmd.EXIT_AUTH
    assert _error(capsys).startswith("podium rollout status: UNAUTHENTICATED: missing")


def test_an_unknown_token_is_unauthenticated(
    controller: Controller, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (bad := tmp_path / "bad.token").write_text("not-a-known-token")
    assert _rollout(controller, "status", token=bad) == cmd.EXIT_AUTH
    assert "UNAUTHENTICATED: unknown bearer token" in _error(capsys)


def test_a_reviewer_token_is_permission_denied(
    controller: Controller, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = _rollout(controller, "rollback", "--reason", "x", token=controller.reviewer_file)
    assert rc == cmd.EXIT_AUTH
    err = _error(capsys)
    assert err.startswith("podium rollout rollback: PERMISSION_DENIED:")
    assert "'bob'" in err and "operator" in err
    assert controller.servicer.transitions == []


def test_a_command_that_does_not_apply_is_failed_precondition(
    controller: Controller, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _rollout(controller, "promote", "--reason", "too early") == cmd.EXIT_CONFLICT
    err = _error(capsys)
    assert err.startswith("podium rollout promote: FAILED_PRECONDITION:")
    assert "idle" in err.lower()


def test_a_stale_rollout_id_is_failed_precondition(
    controller: Controller, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _rollout(controller, "propose", "7") == 0
    capsys.readouterr()
    rc = _rollout(controller, "promote", "--reason", "r", "--rollout-id", "0:3")
    assert rc == cmd.EXIT_CONFLICT
    assert "FAILED_PRECONDITION: rollout 0:3 is not the current one (1:7)" in _error(capsys)
    assert controller.servicer.state.candidate_version == "7"
    assert len(controller.servicer.transitions) == 1


def test_an_empty_version_is_bad_input_before_any_call(
    controller: Controller, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _rollout(controller, "propose", "") == cmd.EXIT_USAGE
    assert "VERSION is empty" in _error(capsys)
    assert controller.servicer.actors == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_controller_is_unavailable_naming_the_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{_free_port()}"
    (tok := tmp_path / "t").write_text(OPERATOR)
    rc = main(
        ["rollout", "status", "--address", address, "--token-file", str(tok), "--timeout", "5"]
    )
    assert rc == cmd.EXIT_UNAVAILABLE
    err = _error(capsys)
    assert err.startswith(
        f"podium rollout status: UNAVAILABLE: the rollout controller at {address} is unavailable"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), ("  \n", "the file is empty")],
)
def test_a_bad_token_file_is_bad_input(
    controller: Controller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    content: str | None,
    message: str,
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    assert _rollout(controller, "status", token=path) == cmd.EXIT_USAGE
    err = _error(capsys)
    assert f"--token-file {path}" in err and message in err


def test_a_missing_ca_file_is_bad_input(
    controller: Controller, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ca = tmp_path / "no-ca.pem"
    assert _rollout(controller, "status", "--ca", str(ca)) == cmd.EXIT_USAGE
    assert f"--ca {ca}: no such file" in _error(capsys)


def test_overrides_need_a_reason_and_tokens_never_go_on_the_command_line(
    controller: Controller, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _rollout(controller, "rollback")
    assert exc.value.code == 2
    assert "--reason" in capsys.readouterr().err
    assert _rollout(controller, "pause", "--reason", "  ") == cmd.EXIT_USAGE
    assert "--reason is empty" in _error(capsys)
    with pytest.raises(SystemExit):
        main(["rollout", "status", "--token", OPERATOR])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_help_names_the_kubectl_form_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["rollout", "--help"])
    text = capsys.readouterr().out
    assert "kubectl exec deploy/rollout -- podium rollout" in text
    assert "exit codes:" in text and "5 UNAVAILABLE" in text


# -- against the rollout controller itself ---------------------------------------------------


@dataclass
class RealController:
    address: str
    app: Any
    operator_file: Path
    reviewer_file: Path


@pytest.fixture
def real_controller(tmp_path: Path) -> Iterator[RealController]:
    """learner_svc's RolloutApp (controller, candidates, RolloutService with bearer tokens on
    loopback) on an in-process bus, in a thread with its own event loop."""
    from learner_svc.rollout.app import RolloutApp
    from learner_svc.rollout.config import ControllerSettings
    from podium.bus import InProcBus

    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "alice", "sha256": token_digest(OPERATOR), "roles": ["operator"]},
                    {"name": "bob", "sha256": token_digest(REVIEWER), "roles": ["reviewer"]},
                ]
            }
        )
    )
    settings = ControllerSettings(
        stage_min_s=1e9,  # nothing advances by itself during the test: the operator drives
        cycle_s=1e9,
        tick_s=0.05,
        grpc_host="127.0.0.1",
        grpc_port=0,
        grpc_tokens=str(tokens),
        grpc_plaintext_tokens=True,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    bus = InProcBus()

    async def start() -> RolloutApp:
        await bus.start()
        app = RolloutApp(settings, bus, instance="rollout-cli-test", shutdown_timeout_s=10)
        await app.start()
        for _ in range(200):  # the controller writes its first state once it is the writer
            if app.controller.state is not None:
                break
            await asyncio.sleep(0.05)
        return app

    async def stop(app: RolloutApp) -> None:
        await app.stop()
        await bus.stop()

    app = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    (op := tmp_path / "operator.token").write_text(OPERATOR)
    (rv := tmp_path / "reviewer.token").write_text(REVIEWER)
    try:
        yield RealController(f"127.0.0.1:{app.grpc_port}", app, op, rv)
    finally:
        asyncio.run_coroutine_threadsafe(stop(app), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_the_cli_drives_the_real_controller(
    real_controller: RealController, capsys: pytest.CaptureFixture[str]
) -> None:
    c = real_controller
    assert _rollout(c, "status") == 0
    status = capsys.readouterr().out
    assert "stage:      idle" in status and "live:       rules:cpls" in status
    assert _rollout(c, "promote", "--reason", "nothing to promote") == cmd.EXIT_CONFLICT
    assert "FAILED_PRECONDITION" in _error(capsys)
    rc = _rollout(c, "rollback", "--reason", "x", token=c.reviewer_file)
    assert rc == cmd.EXIT_AUTH
    assert "PERMISSION_DENIED" in _error(capsys)
    assert _rollout(c, "propose", "rules:greedy", "--reason", "try greedy") == 0
    out = capsys.readouterr().out
    assert "candidate_proposed" in out and "operator:alice" in out
    rc = _rollout(c, "promote", "--reason", "r", "--rollout-id", "9:stale")
    assert rc == cmd.EXIT_CONFLICT
    assert "FAILED_PRECONDITION" in _error(capsys)
    assert _rollout(c, "rollback", "--reason", "changed my mind") == 0
    assert "rolled_back" in capsys.readouterr().out
    assert _rollout(c, "status", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    kinds = [t["kind"] for t in data["transitions"]]
    # Between the two, the controller may have run the offline check (nothing recorded: passes).
    assert "TRANSITION_KIND_CANDIDATE_PROPOSED" in kinds
    assert kinds[-1] == "TRANSITION_KIND_ROLLED_BACK"
    assert data["transitions"][-1]["actor"] == "operator:alice"
    assert data["state"]["live_version"] == "rules:cpls"


def test_the_real_controller_answers_invalid_argument_as_bad_input(
    real_controller: RealController, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a version at all is the request's fault (INVALID_ARGUMENT naming the field, exit
    2); a well-formed version that cannot be a candidate now is the state's (exit 4)."""
    c = real_controller
    assert _rollout(c, "propose", "not a version", "--reason", "r") == cmd.EXIT_USAGE
    err = _error(capsys)
    assert "INVALID_ARGUMENT" in err and "version" in err
    assert _rollout(c, "propose", "rules:no-such-engine", "--reason", "r") == cmd.EXIT_CONFLICT
    assert "FAILED_PRECONDITION" in _error(capsys)
    assert _rollout(c, "status", "--json") == 0
    assert json.loads(capsys.readouterr().out)["state"]["stage"] == "ROLLOUT_STAGE_IDLE"
