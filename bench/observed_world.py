"""The world as a deployment's statistics store sees it some time after a cycle's drift.

A retraining job after a drift must not read the truth. What a deployment has is its store:
the agents' estimated profiles and the merges' estimated cost (``AgentStats.estimated_world``).
This bench replays the sessions ``podium bench cycle`` would submit with the same flags (the
same plan and seeds, the drift aimed the same way) under the initial policy (``--checkpoint``)
on a live store, as the orchestrators serve them, up to ``--after-s`` seconds past the drift,
and writes that store's world as a pool file (``--out``): the advertisement of ``--pool``,
with the estimates as its ``true:`` fields (an agent's profiles, the pool's merge cost). A
candidate trained on it (``podium train --pool OUT --teacher planner-online ...``) has seen
only what the post-drift sessions showed.

    python bench/observed_world.py --pool podium/data/pools/misadvertised.yaml \\
        --drift costly-merges --duration-s 600 --drift-at-s 200 --rate 2 --seed 0 \\
        --checkpoint bench/policies/misadvertised-v8/policy.safetensors \\
        --after-s 150 --out /tmp/observed.yaml

The flags of the plan are ``podium bench cycle``'s (its parser); the service flags are
accepted and change nothing here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from podium.envs.swarm.drift import load_drift
from podium.envs.swarm.spec import PoolSpec, pool_to_dict
from podium.errors import ArtifactError, SpecError
from podium.observed import AgentStats
from podium.observed.store import observed_pool
from podium.policy.swarm import load_policy, resolve_checkpoint
from podium.rollout.twins import learned_twin
from podium_app.commands.bench_cycle import add_arguments, config_from
from podium_app.cycle.config import CycleConfig
from podium_app.cycle.driver import aim_drift
from podium_app.cycle.measure import Replayed, cycle_tasks, plan_sessions, replay_ratios

PROG = "bench/observed_world.py"
LIVE = "live"


def observed_store(config: CycleConfig, after_s: float) -> tuple[AgentStats, PoolSpec, str]:
    """The initial policy's live store ``after_s`` past the drift, the pool, and the drift
    scenario the plan ran (aimed when ``--drift-target preferred``)."""
    if after_s < 0:
        raise ValueError(f"--after-s: must be >= 0, got {after_s:g}")
    pool = config.pool_spec()
    try:
        net, _ = load_policy(resolve_checkpoint(config.checkpoint or Path()))
    except (ArtifactError, OSError) as exc:
        raise ValueError(f"--checkpoint {config.checkpoint}: {exc}") from exc
    tasks = cycle_tasks(config.tasks, config.seed, pool)
    plan = plan_sessions(tasks, config.sessions, config.rate, config.seed, config.explore_share)
    if config.drift_target == "preferred":
        config.work_dir.mkdir(parents=True, exist_ok=True)
        config, _ = aim_drift(config, plan, pool, net)
    schedule = load_drift(config.drift)
    upto = [s for s in plan if s.at_s < config.drift_at_s + after_s]
    stores: dict[str, AgentStats | None] = {}
    arms = {LIVE: Replayed(learned_twin("1", net), "live")}
    replay_ratios(upto, pool, schedule, config.drift_at_s, arms, stores=stores)
    store = stores.get(LIVE) or AgentStats()
    return store, pool, schedule.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument(
        "--after-s", type=float, default=150.0, help="seconds past the drift the store has seen"
    )
    parser.add_argument("--out", type=Path, required=True, help="the pool file to write")
    args = parser.parse_args(argv)
    try:
        config = config_from(args)
        if config.checkpoint is None:
            raise ValueError("--checkpoint: the initial policy the sessions are replayed with")
        store, pool, drift = observed_store(config, args.after_s)
    except (ValueError, SpecError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    name = f"{pool.name}-as-observed-{args.after_s:g}s-after-{drift}"
    observed = observed_pool(store, pool, name)
    doc: dict[str, Any] = pool_to_dict(observed)
    header = (
        f"# {pool.name} as a live store saw it {args.after_s:g} s after the {drift} drift "
        f"({PROG}, seed {config.seed}): the advertisement, with the store's estimates as true:\n"
    )
    args.out.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    print(
        f"{args.out}: {store.merges_observed:.0f} merges observed, merge cost x"
        f"{store.merge_factor():.2f} (split_overhead {observed.split_overhead:g} advertised, "
        f"{observed.true_split_overhead:.3g} observed)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
