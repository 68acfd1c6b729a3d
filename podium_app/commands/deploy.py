"""``podium deploy local``: a kustomize overlay run on this machine, as the cluster would run it.

Every Deployment/StatefulSet/Job container of a Podium image runs as a local process with
exactly its rendered command, args and env (Service names mapped to loopback ports, volumes to
directories, ports remapped consistently with the probes); Strimzi's Kafka is a local broker
with the same principals, Triton the local KServe-V2 server. Before anything starts, every
env var must be read by some config and the transactional ids must fence; then every
startup, liveness and readiness probe must pass on its rendered port, and every Job (the cold
start, ``bootstrap``) must complete. ``--cycle`` then runs one learning cycle as a client:
sessions through the orchestrator as an ordinary user until a learner version (trained on the
exploration share) is published and served. docs/operations.md says what is substituted and
why.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from podium.errors import PodiumError
from podium_app.commands import fail

PROG = "podium deploy local"

EPILOG = """examples:
  podium deploy local --overlay dev --check-only
  eval "$(scripts/v2server.sh start /tmp/models)"; podium deploy local --overlay dev --cycle
  podium deploy local --overlay dev --kafka "$PODIUM_KAFKA_BOOTSTRAP" --hold 600

exit codes: 0 every check passed, 1 a check failed (each failure on its own line), 2 bad input.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``local`` action and its options."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    local = actions.add_parser(
        "local", help="run an overlay as local processes", description=__doc__, epilog=EPILOG
    )
    local.formatter_class = argparse.RawDescriptionHelpFormatter
    local.add_argument(
        "--overlay", default="dev", help="k8s/overlays/<name> or a directory (default dev)"
    )
    local.add_argument(
        "--patch",
        action="append",
        type=Path,
        default=[],
        help="a kustomize patch file applied over the overlay (repeatable; test-only settings)",
    )
    local.add_argument(
        "--work-dir", type=Path, help="volumes, logs, keys (default: a new temp dir)"
    )
    local.add_argument(
        "--kafka",
        default="",
        help="admin kafka:// URL of a broker started by scripts/kafka.sh (default: a fresh one)",
    )
    local.add_argument("--v2-grpc", default="", help="V2 server gRPC host:port ($PODIUM_V2_GRPC)")
    local.add_argument("--v2-http", default="", help="V2 server HTTP host:port ($PODIUM_V2_HTTP)")
    local.add_argument(
        "--v2-repository", default="", help="its model repository ($PODIUM_V2_REPOSITORY)"
    )
    local.add_argument(
        "--ready-timeout", type=float, default=120.0, help="seconds for every probe to pass"
    )
    local.add_argument("--check-only", action="store_true", help="render and check; start nothing")
    local.add_argument("--cycle", action="store_true", help="then run one learning cycle")
    local.add_argument(
        "--sessions", type=int, default=8, help="sessions per round of the cycle (default 8)"
    )
    local.add_argument("--cycle-timeout", type=float, default=180.0, help="seconds per cycle step")
    local.add_argument(
        "--hold", type=float, default=0.0, help="keep running this many seconds at the end"
    )


def _say(t0: float) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {message}", flush=True)

    return say


def run(args: argparse.Namespace) -> int:
    """Run the action; each failure is printed on its own line."""
    from podium_app.deploy.local import DeploymentError
    from podium_app.deploy.run import LocalSettings, check_only, deploy_local, v2_from_env

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="podium-deploy-"))
    say = _say(time.monotonic())
    try:
        if args.check_only:
            problems = check_only(args.overlay, tuple(args.patch), work)
            if problems:
                raise DeploymentError("check", problems)
            say(
                f"checked {args.overlay}: every env var is read by a config, transactional ids fence"
            )
            return 0
        settings = LocalSettings(
            overlay=args.overlay,
            work_dir=work,
            v2=v2_from_env(args.v2_grpc, args.v2_http, args.v2_repository),
            patches=tuple(args.patch),
            kafka_url=args.kafka,
            ready_timeout_s=args.ready_timeout,
            cycle=args.cycle,
            sessions=args.sessions,
            cycle_timeout_s=args.cycle_timeout,
            hold_s=args.hold,
        )
        say(f"work dir {work} (volumes, logs, tokens)")
        asyncio.run(deploy_local(settings, say))
    except DeploymentError as exc:
        print(f"{PROG}: {exc.stage} failed:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    except PodiumError as exc:
        return fail(PROG, exc)
    except KeyboardInterrupt:
        return 130
    say("done: every check passed")
    return 0
