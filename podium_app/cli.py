"""The ``podium`` command line.

Each command lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this file only maps command names to modules, so ``podium --help`` stays fast (no torch import)
and commands can be added without touching each other.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from typing import Protocol, cast

# name -> (module, one-line help). Nested groups use "group name".
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "podium_app.commands.demo",
        "Send one task through all four services on the in-process bus and show what each did.",
    ),
    "train": (
        "podium_app.commands.train",
        "Train the orchestrator policy (the main job): BC from cpls, then PPO through the services.",
    ),
    "bench scheduling": (
        "podium_app.commands.bench_scheduling",
        "Compare scheduling policies on task specs against the latency lower bound.",
    ),
    "bench env": (
        "podium_app.commands.bench_env",
        "Measure swarm-environment steps per second with a random valid policy.",
    ),
    "bench ppo": (
        "podium_app.commands.bench_ppo",
        "Run our PPO and Stable-Baselines3's PPO side by side on a Gymnasium env.",
    ),
    "bench serving": (
        "podium_app.commands.bench_serving",
        "Latency and throughput of policy decisions, local torch vs a KServe-V2 server.",
    ),
    "bench rollout": (
        "podium_app.commands.bench_rollout",
        "Shadow twin evaluation throughput and promote propagation to every replica.",
    ),
    "bench cycle": (
        "podium_app.commands.bench_cycle",
        "A drift through the safe-shipping cycle: a live policy that learns vs a frozen one vs the rules.",
    ),
    "bench bus": (
        "podium_app.commands.bench_bus",
        "Event bus throughput and latency (EventPublisher/EventConsumer on Kafka) beside raw aiokafka.",
    ),
    "bench pipeline": (
        "podium_app.commands.bench_pipeline",
        "Sessions and decisions per orchestrator core over Kafka vs embedded; policy version pick-up.",
    ),
    "bench context": (
        "podium_app.commands.bench_context",
        "Context-1 policies (BM25, dense, hybrid top-k, learned) on any docs and questions at one budget.",
    ),
    "rollout": (
        "podium_app.commands.rollout",
        "Drive and inspect the rollout of a candidate policy: status, promote, rollback, report.",
    ),
    "reward explain": (
        "podium_app.commands.reward_explain",
        "Print the full reward breakdown of one trajectory (protobuf JSON) as JSON.",
    ),
    "reward rescore": (
        "podium_app.commands.reward_rescore",
        "Re-score a range of the trajectory topic with a new reward version into another topic.",
    ),
    "spec check": (
        "podium_app.commands.spec_check",
        "Validate task and pool spec files and print their lower bounds.",
    ),
    "keys generate": (
        "podium_app.commands.keys_generate",
        "Make an Ed25519 key pair that signs policy announcements (learner: private, orchestrators: public).",
    ),
    "kafka": (
        "podium_app.commands.kafka",
        "Fetch, start, stop a local single-node Apache Kafka broker (KRaft) for development;"
        " tail any topic as JSON lines.",
    ),
    "context index": (
        "podium_app.commands.context",
        "Index directories of docs (text, reST, Markdown, HTML, man pages) for the search agents.",
    ),
    "context questions": (
        "podium_app.commands.context_questions",
        "Generate train / validation / held-out questions with gold spans from docs' structure.",
    ),
    "deploy": (
        "podium_app.commands.deploy",
        "Run a kustomize overlay as local processes, as the cluster would, and check it comes up.",
    ),
}

GROUP_HELP = {
    "bench": "Benchmarks: each measures against a peer or a bound in the same run.",
    "reward": "Reward service tools: explain and re-score.",
    "spec": "Task and pool spec tools.",
    "keys": "Policy signing keys.",
    "context": "Context-1: the corpus, its search indexes and questions.",
}


class _Command(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...
    def run(self, args: argparse.Namespace) -> int: ...


def _available() -> dict[str, tuple[str, str]]:
    """Commands whose module is present in this checkout."""
    out = {}
    for name, (module, text) in COMMANDS.items():
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is not None:
            out[name] = (module, text)
    return out


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The full parser; subcommand parsers are filled in lazily by :func:`main`."""
    parser = argparse.ArgumentParser(
        prog="podium",
        description=(
            "Podium trains an orchestrator policy that splits composite tasks into subtasks "
            "and runs them on frozen sub-agents in parallel, learning from the stream of sessions."
        ),
    )
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    leaves: dict[str, argparse.ArgumentParser] = {}
    for name, (_module, text) in _available().items():
        parts = name.split()
        if len(parts) == 1:
            leaves[name] = top.add_parser(parts[0], help=text, description=text)
            continue
        group, leaf = parts
        if group not in groups:
            gp = top.add_parser(
                group, help=GROUP_HELP.get(group, ""), description=GROUP_HELP.get(group, "")
            )
            groups[group] = gp.add_subparsers(
                dest="subcommand", metavar="SUBCOMMAND", required=True
            )
        leaves[name] = groups[group].add_parser(leaf, help=text, description=text)
    return parser, leaves


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``podium`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, leaves = build_parser()
    # Only the chosen command's module is imported, so `podium --help` never loads torch.
    words = [a for a in argv if not a.startswith("-")]
    chosen = " ".join(words[:2]) if " ".join(words[:2]) in leaves else (words[0] if words else "")
    modules = _available()
    if chosen in leaves:
        command = cast(_Command, importlib.import_module(modules[chosen][0]))
        command.add_arguments(leaves[chosen])
        leaves[chosen].set_defaults(_command=command)
    args = parser.parse_args(argv)
    command = cast(_Command, args._command)
    return int(command.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
