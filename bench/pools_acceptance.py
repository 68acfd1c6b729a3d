"""Issue 14's policy acceptance figures: pools the policy never saw, and pools that lie.

Runs ``podium bench scheduling`` (its CLI, unchanged, so every figure comes with the exact
command that reproduces it) and reads the paired ratios out of its JSON:

* **(a) unseen pool** (``podium/data/pools/unseen.yaml``: other agent names and profiles):
  the ``--zero-shot`` policy (trained on other pools) and the ``--finetuned`` one (one cycle
  of ``podium train --pool unseen.yaml --init ...``) against cpls. Targets: zero-shot
  <= 1.05x cpls, fine-tuned <= 1.00x cpls.
* **(b) advertised != true** (``podium/data/pools/misadvertised.yaml`` and ``--variants``
  held-out variants of it, drawn with ``--variant-seed``, never a training seed): the
  ``--misadvertised`` policy against cpls on the advertisement and cpls-online (cpls on the
  statistics store's estimates). Targets: <= 0.85x cpls-advertised, <= 0.95x cpls-online.
  With ``--scout``, also ``learned+scout`` (the policy trying untried agents where the
  schedule has slack, :mod:`podium.envs.swarm.scouting`) against both, and
  ``cpls-online+scout`` against cpls-online as a reference line.

A ratio is the mean over tasks of the per-task ratio of mean latencies (each task's
sessions paired by seed across policies), the figure the issue quotes; the ratio of the
mean latencies over all tasks is printed beside it.

    python bench/pools_acceptance.py --zero-shot runs/base --finetuned runs/unseen-ft \\
        --misadvertised runs/base --episodes 25 --out /tmp/acceptance
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from podium.envs.swarm import load_pool
from podium.envs.swarm.pools import pool_variants
from podium.envs.swarm.spec import pool_to_dict

POOLS = Path(__file__).resolve().parent.parent / "podium" / "data" / "pools"


@dataclass(frozen=True, slots=True)
class Figure:
    """One acceptance figure: a policy against a reference on one pool."""

    case: str
    pool: str
    policy: str
    reference: str
    target: float
    per_task: float
    """Mean over tasks of latency(policy) / latency(reference)."""
    overall: float
    """Mean latency over tasks of the policy / that of the reference."""
    command: str

    @property
    def met(self) -> bool:
        """Whether the per-task figure meets its target."""
        return self.per_task <= self.target


def paired_ratio(result: dict[str, Any], policy: str, reference: str) -> tuple[float, float]:
    """(mean over tasks of the per-task latency ratio, ratio of the mean latencies)."""
    per_task = [
        t["policies"][policy]["latency_mean"] / t["policies"][reference]["latency_mean"]
        for t in result["tasks"]
    ]
    overall = (
        result["summary"][policy]["latency_mean"] / result["summary"][reference]["latency_mean"]
    )
    return statistics.fmean(per_task), overall


def held_out_variants(base: Path, n: int, seed: int, out: Path) -> list[Path]:
    """Write ``n`` variants of ``base`` (seeded by ``seed``) as pool files under ``out``."""
    paths = []
    for v in pool_variants(load_pool(base), n, seed):
        path = out / f"{v.name}-s{seed}.json"
        path.write_text(json.dumps(pool_to_dict(v), indent=2) + "\n")
        paths.append(path)
    return paths


def bench(
    pool: Path, policies: str, checkpoint: str, episodes: int, out: Path, tag: str
) -> tuple[dict[str, Any], str]:
    """Run ``podium bench scheduling`` (its JSON, and the command as run)."""
    json_out = out / f"{tag}.json"
    cmd = [
        "podium",
        "bench",
        "scheduling",
        "--pool",
        str(pool),
        "--policies",
        policies,
        "--checkpoint",
        checkpoint,
        "--episodes",
        str(episodes),
        "--json",
        str(json_out),
    ]
    line = shlex.join(cmd)
    print(f"$ {line}", file=sys.stderr, flush=True)
    argv = [
        sys.executable,
        "-c",
        "import sys; from podium_app.cli import main; sys.exit(main())",
        *cmd[1:],
    ]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return json.loads(json_out.read_text()), line


def unseen_figures(args: argparse.Namespace) -> list[Figure]:
    """(a): the zero-shot and the fine-tuned policy against cpls on the unseen pool."""
    figures = []
    pool = POOLS / "unseen.yaml"
    for case, run, target in (
        ("a zero-shot", args.zero_shot, 1.05),
        ("a fine-tuned", args.finetuned, 1.0),
    ):
        if run is None:
            continue
        tag = case.replace(" ", "-")
        result, cmd = bench(pool, "cpls,learned", run, args.episodes, args.out, tag)
        per_task, overall = paired_ratio(result, "learned", "cpls")
        figures.append(Figure(case, pool.name, "learned", "cpls", target, per_task, overall, cmd))
    return figures


def misadvertised_figures(args: argparse.Namespace) -> list[Figure]:
    """(b): the policy against cpls-advertised and cpls-online on the misadvertised pool and
    on held-out variants of it."""
    base = POOLS / "misadvertised.yaml"
    pools = [base, *held_out_variants(base, args.variants, args.variant_seed, args.out)]
    policies = "cpls,cpls-online,learned" + (",planner" if args.planner else "")
    if args.scout:
        policies += ",learned+scout,cpls-online+scout"
    learned = ["learned", "learned+scout"] if args.scout else ["learned"]
    figures = []
    for pool in pools:
        tag = f"b-{pool.stem}"
        result, cmd = bench(pool, policies, args.misadvertised, args.episodes, args.out, tag)
        for policy in learned:
            for ref, target in (("cpls", 0.85), ("cpls-online", 0.95)):
                per_task, overall = paired_ratio(result, policy, ref)
                figures.append(Figure("b", pool.name, policy, ref, target, per_task, overall, cmd))
        if args.scout:
            per_task, overall = paired_ratio(result, "cpls-online+scout", "cpls-online")
            figures.append(
                Figure(
                    "b ref",
                    pool.name,
                    "cpls-online+scout",
                    "cpls-online",
                    1.0,
                    per_task,
                    overall,
                    cmd,
                )
            )
        if args.planner:
            per_task, overall = paired_ratio(result, "planner", "cpls")
            figures.append(
                Figure("b ref", pool.name, "planner", "cpls", 1.0, per_task, overall, cmd)
            )
        per_task, overall = paired_ratio(result, "cpls-online", "cpls")
        figures.append(
            Figure("b ref", pool.name, "cpls-online", "cpls", 1.0, per_task, overall, cmd)
        )
    return figures


def table(figures: list[Figure]) -> str:
    """The figures as a markdown table."""
    rows = [
        "| case | pool | policy / reference | per task | overall | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        met = "yes" if f.met else "**no**"
        target = f"<= {f.target:.2f}x" if f.case != "b ref" else "(reference)"
        rows.append(
            f"| {f.case} | {f.pool} | {f.policy} / {f.reference} | {f.per_task:.3f}x | "
            f"{f.overall:.3f}x | {target} | {met if f.case != 'b ref' else ''} |"
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zero-shot", help="(a) a policy trained on other pools (checkpoint/run)")
    p.add_argument("--finetuned", help="(a) the policy fine-tuned on the unseen pool")
    p.add_argument("--misadvertised", help="(b) the policy trained for advertised != true")
    p.add_argument("--episodes", type=int, default=25, help="sessions per task (default 25)")
    p.add_argument("--variants", type=int, default=2, help="(b) held-out pool variants (2)")
    p.add_argument(
        "--variant-seed", type=int, default=1000, help="(b) their seed (1000; not a training seed)"
    )
    p.add_argument("--planner", action="store_true", help="(b) the planner as a reference line")
    p.add_argument(
        "--scout",
        action="store_true",
        help="(b) also the policy with scouting (learned+scout), and cpls-online+scout as a "
        "reference line (podium.envs.swarm.scouting)",
    )
    p.add_argument("--out", type=Path, required=True, help="directory for the JSON results")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the requested figures, print the table, write ``<out>/figures.{md,json}``."""
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    figures = unseen_figures(args)
    if args.misadvertised:
        figures += misadvertised_figures(args)
    text = table(figures)
    print(text)
    (args.out / "figures.md").write_text(text + "\n")
    rows = [asdict(f) | {"met": f.met} for f in figures]
    (args.out / "figures.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
