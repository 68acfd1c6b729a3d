"""``podium rollout``: drive and inspect the rollout of a candidate policy.

Subcommands ``status | propose VERSION | promote | pause | resume | rollback`` call the rollout
controller's gRPC ``RolloutService`` (``learner_svc`` in rollout mode, operator role); ``report``
reads the rollout and scored-trajectory topics and writes an HTML report; ``bootstrap`` is a
new deployment's cold start (:mod:`podium_app.bootstrap`: an initial behaviour clone published
with the learner's settings and key and made live, once; the Kubernetes Job ``bootstrap`` runs
it with the learner's settings, ``PODIUM_BUS`` and ``PODIUM_BOOTSTRAP_*`` in its env).

Inside a cluster the controller's own image has the CLI, so the usual form is
``kubectl exec deploy/rollout -- podium rollout status`` (the address then defaults to the local
port). The bearer token is read from a file (``--token-file`` / ``$PODIUM_TOKEN_FILE``, a
mounted secret), never from the command line, where ``ps`` and shell history would show it.

Exit codes (the same for every subcommand):

* 0 — done;
* 1 — the controller failed in another way (INTERNAL, UNKNOWN...);
* 2 — bad input: arguments, the token or CA file, or INVALID_ARGUMENT / NOT_FOUND from the
  controller (e.g. an unknown version);
* 3 — UNAUTHENTICATED (no or unknown token) or PERMISSION_DENIED (not an operator);
* 4 — FAILED_PRECONDITION: the command does not apply to the rollout's state (e.g. promote
  while idle), or ``--rollout-id`` names a rollout that is no longer the current one;
* 5 — UNAVAILABLE / DEADLINE_EXCEEDED: the controller could not be reached at the address, or
  is not the rollout writer at the moment (retry).

Errors are one line on stderr: ``podium rollout <cmd>: <GRPC CODE>: <message>``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.config import env, from_env, positive_float
from podium.errors import ConfigError, PodiumError

if TYPE_CHECKING:
    import grpc.aio
    from google.protobuf.message import Message
    from google.protobuf.timestamp_pb2 import Timestamp

    from podium.v1 import rollout_pb2

PROG = "podium rollout"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_CONFLICT = 4
EXIT_UNAVAILABLE = 5

COMMANDS = ("promote", "pause", "resume", "rollback")
"""Operator commands that carry a :class:`rollout_pb2.RolloutCommand`."""
REASON_REQUIRED = frozenset({"promote", "pause", "rollback"})
"""Commands that override the controller: the transition records why, so a reason is required."""

EPILOG = """\
examples:
  podium rollout status
  podium rollout bootstrap        # a new deployment's cold start (the Job k8s/base/bootstrap.yaml)
  podium rollout promote --reason "canary clean for a week" --rollout-id 3:12
  kubectl exec deploy/rollout -- podium rollout rollback --reason "pager: latency"

settings: --address ($PODIUM_ROLLOUT_ADDRESS, default localhost:50061), --token-file
($PODIUM_TOKEN_FILE: a file holding the operator's bearer token; never pass a token as an
argument), --ca ($PODIUM_GRPC_CA: CA certificate; TLS when set).

exit codes: 0 done, 1 other controller error, 2 bad input, 3 UNAUTHENTICATED or
PERMISSION_DENIED, 4 FAILED_PRECONDITION (does not apply now / stale --rollout-id),
5 UNAVAILABLE (controller not reachable)."""


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How the CLI reaches the rollout controller (flags override the environment)."""

    address: str = env("PODIUM_ROLLOUT_ADDRESS", default="localhost:50061")
    """HOST:PORT of the controller's RolloutService."""
    token_file: str = env("PODIUM_TOKEN_FILE", default="")
    """File holding the operator's bearer token (empty: call without a token)."""
    ca_file: str = env("PODIUM_GRPC_CA", default="")
    """CA certificate that signed the controller's TLS certificate (empty: plaintext)."""
    timeout_s: float = env("PODIUM_ROLLOUT_TIMEOUT_S", default=10.0, parse=positive_float)
    """Deadline of one call, seconds."""


class CliError(PodiumError):
    """A failure the CLI reports in one line with its exit code."""

    retriable = False

    def __init__(self, code: str, message: str, exit_code: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.exit_code = exit_code


# -- arguments -------------------------------------------------------------------------------


def _client_options() -> argparse.ArgumentParser:
    """Options every gRPC subcommand takes."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--address", metavar="HOST:PORT", help="controller (default: see below)")
    p.add_argument("--token-file", metavar="FILE", help="file with the operator's bearer token")
    p.add_argument("--ca", metavar="FILE", help="CA certificate for TLS")
    p.add_argument("--timeout", type=float, metavar="S", help="deadline per call, seconds")
    p.add_argument("--json", action="store_true", help="print the response as protobuf JSON")
    return p


def _command_options(reason_required: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--reason", required=reason_required, default="", help="why (recorded)")
    p.add_argument(
        "--rollout-id",
        default="",
        metavar="ID",
        help="act only while this is the current rollout (<cycle>:<candidate>, see status)",
    )
    return p


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Subcommands of ``podium rollout``."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    client = _client_options()
    # No abbreviations: "--token SECRET" must be refused, not taken for --token-file.
    common: dict[str, Any] = {
        "formatter_class": argparse.RawDescriptionHelpFormatter,
        "epilog": EPILOG,
        "allow_abbrev": False,
    }
    status = sub.add_parser(
        "status", parents=[client], help="stage, versions, traffic shares, evidence", **common
    )
    status.add_argument("--transitions", type=int, default=20, help="recent transitions shown")
    propose = sub.add_parser(
        "propose", parents=[client], help="nominate VERSION as the candidate", **common
    )
    propose.add_argument("version", metavar="VERSION", help='"12" or "rules:<name>"')
    propose.add_argument("--reason", default="", help="why (recorded)")
    helps = {
        "promote": "advance the candidate one step now, whatever the evidence (an override)",
        "pause": "stop automatic transitions (routing stays as it is)",
        "resume": "resume automatic transitions",
        "rollback": "send new sessions back to the previous version now",
    }
    for name in COMMANDS:
        sub.add_parser(
            name,
            parents=[client, _command_options(name in REASON_REQUIRED)],
            help=helps[name],
            **common,
        )
    boot = sub.add_parser(
        "bootstrap",
        parents=[client],
        help="cold start: publish a behaviour clone of cpls and make it live (once)",
        **common,
    )
    boot.add_argument("--init", metavar="FILE", help="policy to publish ($PODIUM_BOOTSTRAP_INIT)")
    boot.add_argument("--work-dir", metavar="DIR", help="scratch ($PODIUM_BOOTSTRAP_WORK_DIR)")
    report = sub.add_parser(
        "report", help="HTML report from the rollout and scored-trajectory topics"
    )
    from podium_app.rollout_report import add_report_arguments

    add_report_arguments(report)


# -- the call --------------------------------------------------------------------------------


def client_config(args: argparse.Namespace) -> ClientConfig:
    """The environment's settings with the flags given on the command line over them."""
    overrides: dict[str, Any] = {}
    for flag, name in (
        ("address", "address"),
        ("token_file", "token_file"),
        ("ca", "ca_file"),
        ("timeout", "timeout_s"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[name] = value
    config = from_env(ClientConfig, **overrides)
    if not config.address.strip():
        raise ConfigError("--address is empty: give HOST:PORT of the rollout controller")
    if config.timeout_s <= 0:
        raise ConfigError(f"--timeout must be > 0, got {config.timeout_s}")
    return config


def read_token(path: str) -> str | None:
    """The bearer token in ``path`` (surrounding whitespace dropped); None when no file is set."""
    if not path:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--token-file {path}: not UTF-8 text") from exc
    if not token:
        raise ConfigError(f"--token-file {path}: the file is empty")
    return token


def _check_ca(path: str) -> str | None:
    if not path:
        return None
    if not Path(path).is_file():
        raise ConfigError(f"--ca {path}: no such file")
    return path


def build_request(args: argparse.Namespace) -> tuple[str, Message]:
    """The RPC method name and its request for the subcommand in ``args``."""
    from podium.v1 import rollout_pb2

    if args.action == "status":
        if args.transitions < 0:
            raise ConfigError(f"--transitions must be >= 0, got {args.transitions}")
        return "GetStatus", rollout_pb2.GetStatusRequest(transitions=args.transitions)
    if args.action == "propose":
        if not args.version.strip():
            raise ConfigError("VERSION is empty: give a learned version (12) or rules:<name>")
        return "Propose", rollout_pb2.ProposeRequest(version=args.version, reason=args.reason)
    if args.action in REASON_REQUIRED and not args.reason.strip():
        raise ConfigError(f"--reason is empty: {args.action} is recorded with why it was done")
    command = rollout_pb2.RolloutCommand(reason=args.reason, rollout_id=args.rollout_id)
    request_types: Mapping[str, Callable[..., Message]] = {
        "promote": rollout_pb2.PromoteRequest,
        "pause": rollout_pb2.PauseRequest,
        "resume": rollout_pb2.ResumeRequest,
        "rollback": rollout_pb2.RollbackRequest,
    }
    return args.action.capitalize(), request_types[args.action](command=command)


def rpc_error(exc: grpc.aio.AioRpcError, address: str) -> CliError:
    """The one-line report and exit code of a failed call."""
    import grpc

    code = exc.code()
    details = " ".join((exc.details() or "").split()) or "(no details)"
    name = code.name if code is not None else "UNKNOWN"
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return CliError(
            name,
            f"the rollout controller at {address} is unavailable (retry later): {details}",
            EXIT_UNAVAILABLE,
        )
    exits = {
        grpc.StatusCode.UNAUTHENTICATED: EXIT_AUTH,
        grpc.StatusCode.PERMISSION_DENIED: EXIT_AUTH,
        grpc.StatusCode.FAILED_PRECONDITION: EXIT_CONFLICT,
        grpc.StatusCode.INVALID_ARGUMENT: EXIT_USAGE,
        grpc.StatusCode.NOT_FOUND: EXIT_USAGE,
    }
    return CliError(name, details, exits.get(code, EXIT_ERROR))


async def call(config: ClientConfig, method: str, request: Message) -> Message:
    """Send ``request`` to ``RolloutService/<method>``; a :class:`CliError` on failure."""
    import grpc.aio

    from podium.service.auth import client_channel
    from podium.v1 import rollout_pb2_grpc

    token = read_token(config.token_file)
    channel = client_channel(config.address, token=token, ca_file=_check_ca(config.ca_file))
    try:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)  # type: ignore[no-untyped-call]
        response: Message = await getattr(stub, method)(request, timeout=config.timeout_s)
        return response
    except grpc.aio.AioRpcError as exc:
        raise rpc_error(exc, config.address) from exc
    finally:
        await channel.close()


# -- output ----------------------------------------------------------------------------------


def _when(ts: Timestamp) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return ts.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S")


def role_name(role: int) -> str:
    """``ARM_ROLE_CANARY`` -> ``canary``."""
    from podium.v1 import trajectory_pb2

    try:
        return trajectory_pb2.ArmRole.Name(role).removeprefix("ARM_ROLE_").lower()  # type: ignore[arg-type]
    except ValueError:
        return f"role{role}"


def role_version(state: rollout_pb2.RolloutState, role: int) -> str:
    """The version serving ``role`` under ``state`` (as :func:`podium.rollout.route` routes)."""
    from podium.v1 import trajectory_pb2

    if role == trajectory_pb2.ARM_ROLE_CANARY:
        return state.candidate_version
    if role == trajectory_pb2.ARM_ROLE_BASELINE:
        return state.previous_version or state.live_version
    return state.live_version


def _shares_lines(resp: rollout_pb2.GetStatusResponse) -> list[str]:
    from podium.rollout import target_shares

    lines = ["traffic (target share of new sessions per arm):"]
    for role, share in sorted(target_shares(resp.state).items()):
        label = f"{role_name(role)}:{role_version(resp.state, role)}"
        lines.append(f"  {label:<24} {share:7.2%}")
    total = sum(resp.arm_sessions.values())
    if total:
        lines.append(f"sessions seen per arm since the rollout began ({total}):")
        for arm, n in sorted(resp.arm_sessions.items()):
            lines.append(f"  {arm:<24} {n:>9,}  {n / total:7.2%}")
    return lines


def evidence_lines(evidence: rollout_pb2.Evidence, indent: str = "  ") -> list[str]:
    """Figures, summary and guardrail table of ``evidence`` (nothing if it is empty)."""
    lines = []
    if evidence.summary:
        lines.append(f"{indent}{evidence.summary}")
    for name, value in sorted(evidence.figures.items()):
        lines.append(f"{indent}{name:<24} {value:.6g}")
    if evidence.guardrails:
        lines.append(
            f"{indent}{'guardrail':<28} {'canary':>9} {'baseline':>9} {'n c/b':>13} "
            f"{'margin':>8} {'log LR':>8} {'thresh':>7}  breached"
        )
        for g in evidence.guardrails:
            lines.append(
                f"{indent}{g.name:<28} {g.canary_mean:9.4f} {g.baseline_mean:9.4f} "
                f"{f'{g.canary_n}/{g.baseline_n}':>13} {g.margin:8.4f} {g.statistic:8.3f} "
                f"{g.threshold:7.3f}  {'YES' if g.breached else 'no'}"
            )
    return lines


def transition_line(t: rollout_pb2.RolloutTransition) -> str:
    """One transition: seq, time, kind, where it left the rollout, who and why."""
    from podium.rollout import stage_name
    from podium.v1 import rollout_pb2

    kind = rollout_pb2.TransitionKind.Name(t.kind).removeprefix("TRANSITION_KIND_").lower()
    summary = t.evidence.summary
    why = t.reason + (f" [{summary}]" if summary and summary != t.reason else "")
    return (
        f"  #{t.seq:<5} {_when(t.at)}  {kind:<18} -> {stage_name(t.state):<12} "
        f"{t.actor or '-'}: {why}"
    )


def format_status(resp: rollout_pb2.GetStatusResponse) -> str:
    """The human-readable ``podium rollout status``."""
    from podium.rollout import stage_name

    s = resp.state
    lines = [
        f"stage:      {stage_name(s)}{'  (PAUSED)' if s.paused else ''}"
        f"   since {_when(s.stage_started_at)}",
        f"rollout:    {s.rollout_id or '-'}   cycle {s.cycle} (began {_when(s.cycle_started_at)})",
        f"live:       {s.live_version or '-'}",
        f"candidate:  {s.candidate_version or '-'}",
        f"previous:   {s.previous_version or '-'}",
        f"state:      seq {s.seq}, writer {s.writer or '-'} (epoch {s.writer_epoch}), "
        f"changed {_when(s.changed_at)}: {s.reason or '-'}",
        *_shares_lines(resp),
    ]
    evidence = evidence_lines(resp.evidence)
    lines += ["evidence so far:", *evidence] if evidence else ["evidence so far: none"]
    if resp.review_queue:
        lines.append(f"sessions sampled for human review: {len(resp.review_queue)}")
    lines.append(f"recent transitions ({len(resp.transitions)}):")
    lines += [transition_line(t) for t in resp.transitions]
    return "\n".join(lines)


def format_result(result: rollout_pb2.RolloutCommandResult) -> str:
    """What an operator command did."""
    return "\n".join(
        [
            transition_line(result.transition).strip(),
            f"live {result.state.live_version or '-'}, "
            f"candidate {result.state.candidate_version or '-'}, "
            f"previous {result.state.previous_version or '-'}",
        ]
    )


def render(args: argparse.Namespace, response: Message) -> str:
    """The text printed for ``response``: protobuf JSON with ``--json``, else for people."""
    from podium.codec import message_to_json
    from podium.v1 import rollout_pb2

    if args.json:
        return message_to_json(response)
    if isinstance(response, rollout_pb2.GetStatusResponse):
        return format_status(response)
    return format_result(response.result)  # type: ignore[attr-defined]


# -- entry point -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Run one ``podium rollout`` subcommand; the exit code as documented above."""
    if args.action == "report":
        from podium_app.rollout_report import run_report

        return run_report(args)
    prog = f"{PROG} {args.action}"
    try:
        config = client_config(args)
        if args.action == "bootstrap":
            return asyncio.run(run_bootstrap(args, config, prog))
        method, request = build_request(args)
        response = asyncio.run(call(config, method, request))
    except CliError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(render(args, response))
    return EXIT_OK


async def run_bootstrap(args: argparse.Namespace, config: ClientConfig, prog: str) -> int:
    """``podium rollout bootstrap``: :func:`podium_app.bootstrap.bootstrap` with the settings of
    the environment (the learner's, ``PODIUM_BOOTSTRAP_*``) and the flags; progress on stdout.
    A gRPC failure is one line with the exit code of the other subcommands; anything else
    that stops it (the broker, a file) is 1."""
    import grpc.aio

    from learner_svc.algorithms.swarm import SwarmSettings
    from podium.bus import KafkaBus, KafkaConfig
    from podium.service.auth import client_channel
    from podium_app import bootstrap as boot

    overrides = {
        name: value
        for name, value in (("init", args.init), ("work_dir", args.work_dir))
        if value is not None
    }
    settings = from_env(boot.BootstrapSettings, **overrides)
    learner = from_env(SwarmSettings)
    token = read_token(config.token_file)
    channel = client_channel(config.address, token=token, ca_file=_check_ca(config.ca_file))
    bus = KafkaBus(KafkaConfig.from_url(settings.bus))

    def make_init() -> Path:
        if settings.init:
            return Path(settings.init)
        return boot.behaviour_clone(Path(settings.work_dir), settings.seed, _say)

    try:
        await boot.start_bus(bus, settings.timeout_s, _say)
        outcome = await boot.bootstrap(bus, channel, learner, make_init, settings.timeout_s, _say)
    except grpc.aio.AioRpcError as exc:
        raise rpc_error(exc, config.address) from exc
    except PodiumError as exc:
        if isinstance(exc, ConfigError):
            raise
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        await channel.close()
        await bus.stop()
    live = outcome.version or "none (rules:cpls)"
    print(f"{prog}: {outcome.decision.action}; learned version live: {live}")
    return EXIT_OK


def _say(line: str) -> None:
    print(line, flush=True)
