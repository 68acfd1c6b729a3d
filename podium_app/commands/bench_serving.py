"""``podium bench serving``: policy-decision latency and throughput, local torch vs served.

Four timed phases, ``--seconds`` each: the in-process torch policy and the same weights
exported to ONNX and served by a KServe-V2 server (called with ``tritonclient`` over gRPC), each
at batch 1 (one decision per call: an orchestrator deciding for one session) and batched
(``--batch`` observations per call: one decision for each of many concurrent sessions). Calls
are sequential from one client, so latency is the full round trip of a decision and throughput
is decisions per wall-clock second.

The server is ``--server v2://HOST:PORT`` (with ``--repository``, the directory it serves), else
``$PODIUM_V2_GRPC`` / ``$PODIUM_V2_REPOSITORY``, else a private MLServer started with
``scripts/v2server.sh`` for the run and stopped afterwards.

Targets on a 2-core CPU machine: served p99 <= 5 ms at batch 1 and >= 1,000 decisions/s batched.
JSON (``--json OUT``)::

    {"local":  {"batch1": {"p50_ms", "p99_ms", "per_s"}, "batched": {...}},
     "served": {"batch1": {...}, "batched": {...}}}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from podium.errors import ConfigError, PodiumError
from podium.serving.backends import LocalPolicy, PolicyBackend, ServedPolicy, parse_backend
from podium.serving.contract import PolicyInputs, PolicySignature, random_inputs

PROG = "podium bench serving"
TARGET_SERVED_P99_MS = 5.0
"""Acceptance target: served p99 latency at batch 1, milliseconds."""
TARGET_SERVED_BATCHED_PER_S = 1000.0
"""Acceptance target: served decisions per second, batched."""
DEFAULT_AGENTS = 9
"""Agents per observation by default: the shipped default pool's size."""
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "v2server.sh"
"""The project script that runs a private V2 server when none is given."""


@dataclass(frozen=True, slots=True)
class Timing:
    """Latency percentiles and throughput of one phase."""

    p50_ms: float
    """Median latency of one call, milliseconds."""
    p99_ms: float
    """99th percentile latency of one call, milliseconds."""
    per_s: float
    """Decisions per second (observations decided, not calls)."""
    calls: int
    """Calls made in the phase."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium bench serving``."""
    parser.add_argument("--json", metavar="OUT", help="write the result as JSON here")
    parser.add_argument(
        "--server", metavar="v2://HOST:PORT", help="KServe-V2 gRPC server (default: see above)"
    )
    parser.add_argument(
        "--repository", metavar="DIR", help="model repository the server serves (with --server)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--batch", type=int, default=64, help="observations per batched call")
    parser.add_argument("--subtasks", type=int, default=20, help="subtasks per observation")
    parser.add_argument(
        "--agents",
        type=int,
        default=DEFAULT_AGENTS,
        help=f"agents in the pool of each observation (default {DEFAULT_AGENTS}: the shipped "
        "default pool's size; the policy reads agents by features, so any count is served)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads for the local policy (default 1, as the server's onnxruntime)",
    )
    parser.add_argument("--seed", type=int, default=0)


def measure(backend: PolicyBackend, pool: list[PolicyInputs], seconds: float) -> Timing:
    """Call ``backend.decide`` on ``pool`` round-robin for ``seconds`` (after a warm-up)."""
    for obs in pool[:5]:
        backend.decide(obs)
    latencies: list[float] = []
    decided = 0
    start = time.perf_counter()
    end = start + seconds
    now = start
    i = 0
    while now < end:
        obs = pool[i % len(pool)]
        t0 = time.perf_counter()
        backend.decide(obs)
        now = time.perf_counter()
        latencies.append(now - t0)
        decided += obs.batch
        i += 1
    elapsed = now - start
    ms = np.asarray(latencies) * 1e3
    return Timing(
        p50_ms=float(np.percentile(ms, 50)),
        p99_ms=float(np.percentile(ms, 99)),
        per_s=decided / elapsed,
        calls=len(latencies),
    )


@contextlib.contextmanager
def _private_server() -> Iterator[tuple[str, Path]]:
    """Start MLServer with scripts/v2server.sh on a temporary repository; always stop it."""
    if not SCRIPT.is_file():
        raise ConfigError(
            f"no V2 server given and {SCRIPT} is missing: pass --server v2://HOST:PORT "
            "and --repository DIR, or set PODIUM_V2_GRPC and PODIUM_V2_REPOSITORY"
        )
    with tempfile.TemporaryDirectory(prefix="podium-bench-serving-") as tmp:
        repo, state = Path(tmp) / "models", Path(tmp) / "state"
        repo.mkdir()
        env = {**os.environ, "PODIUM_V2_STATE": str(state)}
        try:
            proc = subprocess.run(
                ["bash", str(SCRIPT), "start", str(repo)],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise ConfigError(f"{SCRIPT} start failed: {proc.stderr.strip()[-2000:]}")
            values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
            yield values["PODIUM_V2_GRPC"], repo
        finally:
            subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, check=False)


def _server(args: argparse.Namespace) -> contextlib.AbstractContextManager[tuple[str, Path]]:
    spec = args.server or (
        f"v2://{os.environ['PODIUM_V2_GRPC']}" if os.environ.get("PODIUM_V2_GRPC") else None
    )
    if spec is None:
        return _private_server()
    try:
        address = parse_backend(spec)
    except ConfigError:
        address = None
    repo = args.repository or os.environ.get("PODIUM_V2_REPOSITORY")
    if address is None or not repo:
        raise ConfigError(
            f"--server {spec!r}: need a v2://HOST:PORT address and --repository (or "
            "$PODIUM_V2_REPOSITORY), the directory the server serves, where the benchmark "
            "exports its model"
        )
    return contextlib.nullcontext((address, Path(repo)))


def _row(t: Timing) -> dict[str, float]:
    return {"p50_ms": round(t.p50_ms, 4), "p99_ms": round(t.p99_ms, 4), "per_s": round(t.per_s, 1)}


def _valid(args: argparse.Namespace) -> bool:
    """Whether the numeric arguments are in range."""
    return bool(
        args.seconds > 0
        and args.batch >= 2
        and args.subtasks >= 1
        and args.agents >= 1
        and args.torch_threads >= 1
    )


def _policy(signature: PolicySignature, seed: int) -> Any:
    """A freshly initialised default-size policy network for ``signature`` (eval mode)."""
    import torch

    from podium.policy.network import NetworkConfig, SwarmPolicyNet

    torch.manual_seed(seed)
    return SwarmPolicyNet(
        NetworkConfig(
            slot_features=signature.subtask_features,
            global_features=signature.global_features,
            pair_features=signature.pair_features,
        )
    ).eval()


def run(args: argparse.Namespace) -> int:
    """Run the four phases; 0 if the served targets are met, 1 if not, 2 on bad input."""
    if not _valid(args):
        print(
            f"{PROG}: need --seconds > 0, --batch >= 2, --subtasks >= 1, --agents >= 1, "
            "--torch-threads >= 1",
            file=sys.stderr,
        )
        return 2
    import torch

    # Small decisions on a busy machine: a second intra-op thread buys nothing and, when the
    # other core is taken, its spin-wait barrier makes a 1 ms forward take tens of ms.
    torch.set_num_threads(args.torch_threads)

    from podium.serving.export import default_swarm_signature, export_policy

    signature: PolicySignature = default_swarm_signature()
    net = _policy(signature, args.seed)
    rng = np.random.default_rng(args.seed)
    shape = {"n_subtasks": args.subtasks, "n_agents": args.agents}
    pools = {
        "batch1": [random_inputs(signature, 1, rng=rng, **shape) for _ in range(64)],
        "batched": [random_inputs(signature, args.batch, rng=rng, **shape) for _ in range(8)],
    }
    results: dict[str, dict[str, Timing]] = {}
    try:
        server = _server(args)  # bad --server is reported before ten seconds are spent
        local = LocalPolicy(net, signature)
        results["local"] = {k: measure(local, p, args.seconds) for k, p in pools.items()}
        with server as (address, repository):
            name = f"bench_policy_{uuid.uuid4().hex[:8]}"
            export_policy(net, signature, repository, name, 1)
            served = ServedPolicy(address, name, signature, timeout_s=30.0)
            try:
                served.load(version=1)
                results["served"] = {k: measure(served, p, args.seconds) for k, p in pools.items()}
            finally:
                with contextlib.suppress(PodiumError):
                    served.unload()
                served.close()
    except PodiumError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    report = {
        backend: {k: _row(t) for k, t in phases.items()} for backend, phases in results.items()
    }
    print(
        f"policy decisions, {args.subtasks} subtasks x {args.agents} agents/observation, "
        f"batched = {args.batch}/call, "
        f"{args.seconds:g} s per phase, torch threads {torch.get_num_threads()}"
    )
    print(f"{'':8} {'':8} {'p50 ms':>9} {'p99 ms':>9} {'decisions/s':>12} {'calls':>8}")
    for backend, phases in results.items():
        for k, t in phases.items():
            print(
                f"{backend:8} {k:8} {t.p50_ms:9.3f} {t.p99_ms:9.3f} {t.per_s:12,.0f} {t.calls:8,}"
            )
    served_t = results["served"]
    ok = (
        served_t["batch1"].p99_ms <= TARGET_SERVED_P99_MS
        and served_t["batched"].per_s >= TARGET_SERVED_BATCHED_PER_S
    )
    print(
        f"targets: served p99 <= {TARGET_SERVED_P99_MS:g} ms at batch 1, "
        f">= {TARGET_SERVED_BATCHED_PER_S:,.0f} decisions/s batched: {'met' if ok else 'NOT met'}"
    )
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"{PROG}: --json {args.json}: cannot write ({exc.strerror})", file=sys.stderr)
            return 2
    return 0 if ok else 1
