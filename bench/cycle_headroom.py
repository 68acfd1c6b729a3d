"""Is there a better policy for the learner to ship after the drift? Headroom on a cycle's sessions.

``podium bench cycle`` ships a candidate only when shadow finds that it keeps an advantage
over the live version on twins of live sessions. This bench asks the question before a
22-minute run: on the very sessions ``podium bench cycle`` would submit (the same flags, the
same plan, the same aimed drift), replayed in the simulator on the true pool of each session's
time, how do candidate policies (``--candidate``, e.g. the initial policy fine-tuned on the
post-drift world with ``podium train --pool AFTER.yaml --init ...``) compare with the initial
one (``--checkpoint``), each reading a statistics store of its own that its own sessions feed,
as a deployment's does? And how does the initial policy compare with cpls-online?

It also prints the cycle's verdicts (docs/cycle.md) as they come out if no candidate ships:
both runs then serve the initial weights on a live store, so the replayed initial policy
stands in for the continuous run beside the replayed rule engines and ``frozen_store`` arm.

Per candidate it prints, over the measured (greedy) sessions from the drift on and over the
end windows: the paired mean difference of latency/bound, candidate minus initial (negative:
the candidate is faster), its standard error, and the share of sessions whose latency differs
at all (0: the candidate decides every session as the initial policy does). A candidate whose
post-drift difference is not clearly negative cannot keep an advantage in shadow.

    python bench/cycle_headroom.py --pool podium/data/pools/misadvertised.yaml \\
        --drift flaky-agent --drift-target preferred --duration-s 600 --drift-at-s 200 \\
        --window-s 50 --rate 2 --seed 2 \\
        --checkpoint bench/policies/misadvertised-v8/policy.safetensors \\
        --candidate runs/after-drift/policy.safetensors --json /tmp/headroom.json

The flags of the plan are ``podium bench cycle``'s (its parser), read the same way; the
service flags (replicas, cycle, bus, ...) are accepted and change nothing here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from podium.envs.swarm.drift import load_drift
from podium.errors import ArtifactError
from podium.policy.network import SwarmPolicyNet
from podium.policy.swarm import load_policy, resolve_checkpoint
from podium.rollout.twins import learned_twin
from podium_app.commands.bench_cycle import add_arguments, config_from
from podium_app.cycle.config import CycleConfig
from podium_app.cycle.driver import aim_drift
from podium_app.cycle.measure import (
    FROZEN_STORE,
    REFERENCE_ARMS,
    PlannedSession,
    Replayed,
    cycle_tasks,
    frozen_store_arm,
    plan_sessions,
    replay_ratios,
    verdicts,
    window_table,
)

PROG = "bench/cycle_headroom.py"
INITIAL = "initial"
CPLS_ONLINE = "cpls-online"


def paired(
    plan: list[PlannedSession], a: list[float], b: list[float], since_s: float
) -> dict[str, float]:
    """Mean of ``a - b`` over the measured sessions submitted at or after ``since_s``, its
    standard error, the share of sessions where they differ, and how many sessions."""
    diffs = [
        x - y for s, x, y in zip(plan, a, b, strict=True) if not s.sampled and s.at_s >= since_s
    ]
    if not diffs:
        return {"mean": 0.0, "se": 0.0, "differ": 0.0, "sessions": 0}
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
    differ = sum(abs(d) > 1e-9 for d in diffs) / len(diffs)
    return {"mean": statistics.fmean(diffs), "se": se, "differ": differ, "sessions": len(diffs)}


def _policy(flag: str, path: Path) -> SwarmPolicyNet:
    """The network of a policy file; ValueError naming the flag and the problem."""
    try:
        net, _trained_for = load_policy(resolve_checkpoint(path))
    except (ArtifactError, OSError) as exc:
        raise ValueError(f"{flag} {path}: {exc}") from exc
    return net


def measure(config: CycleConfig, candidates: list[Path]) -> dict[str, Any]:
    """The paired comparisons of the module docstring, as a JSON-able dict."""
    if config.checkpoint is None:
        raise ValueError("--checkpoint: the initial policy is required here")
    pool = config.pool_spec()
    tasks = cycle_tasks(config.tasks, config.seed, pool)
    plan = plan_sessions(tasks, config.sessions, config.rate, config.seed, config.explore_share)
    initial = _policy("--checkpoint", config.checkpoint)
    nets = {str(path): _policy("--candidate", path) for path in candidates}
    aimed: list[str] = []
    if config.drift_target == "preferred":
        config.work_dir.mkdir(parents=True, exist_ok=True)
        config, aimed = aim_drift(config, plan, pool, initial)
    arms = {
        INITIAL: Replayed(learned_twin("1", initial), "live"),
        **REFERENCE_ARMS,
        **frozen_store_arm(initial),
    }
    arms |= {
        name: Replayed(learned_twin(str(i + 2), net), "live")
        for i, (name, net) in enumerate(nets.items())
    }
    ratios = replay_ratios(plan, pool, load_drift(config.drift), config.drift_at_s, arms)
    tail = max(1, config.windows // 6)
    end_s = (config.windows - tail) * config.window_s  # the start of the end windows
    # With no candidate shipped, both runs of the cycle serve the initial weights on a live
    # store: the replayed initial policy stands in for the continuous run.
    as_runs = {
        "continuous": ratios[INITIAL],
        **{name: ratios[name] for name in (*REFERENCE_ARMS, FROZEN_STORE)},
    }
    nothing_ships = verdicts(
        window_table(plan, {}, as_runs, config.window_s, config.windows), config.drift_at_s, tail
    )
    out: dict[str, Any] = {
        "config": {
            "pool": str(config.pool or "default"),
            "drift": config.drift,
            "drift_aimed": aimed,
            "duration_s": config.duration_s,
            "drift_at_s": config.drift_at_s,
            "end_from_s": end_s,
            "rate": config.rate,
            "seed": config.seed,
            "checkpoint": str(config.checkpoint),
        },
        "initial_vs_cpls_online": {
            "post": paired(plan, ratios[INITIAL], ratios[CPLS_ONLINE], config.drift_at_s),
            "end": paired(plan, ratios[INITIAL], ratios[CPLS_ONLINE], end_s),
        },
        "if_nothing_ships": nothing_ships,
        "candidates": {
            name: {
                "post": paired(plan, ratios[name], ratios[INITIAL], config.drift_at_s),
                "end": paired(plan, ratios[name], ratios[INITIAL], end_s),
            }
            for name in nets
        },
    }
    return out


def _line(what: str, figures: dict[str, float]) -> str:
    return (
        f"{what:<44} {figures['mean']:+.4f} ± {figures['se']:.4f}  "
        f"differs on {figures['differ']:.0%} of {figures['sessions']:.0f} sessions"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument(
        "--candidate", type=Path, action="append", default=[], help="a policy to compare (repeat)"
    )
    args = parser.parse_args(argv)
    try:
        config = config_from(args)
        result = measure(config, list(args.candidate))
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    for line in result["config"]["drift_aimed"]:
        print(f"drift aimed: {line}")
    print("paired latency/bound differences (negative: the first is faster)")
    for when in ("post", "end"):
        print(_line(f"initial - cpls-online ({when})", result["initial_vs_cpls_online"][when]))
        for name, figures in result["candidates"].items():
            print(_line(f"{Path(name).parent.name or name} - initial ({when})", figures[when]))
    v = result["if_nothing_ships"]
    levels = v["levels"]
    print(
        "if nothing ships (both runs serve the initial policy): "
        f"end {levels['continuous_end']:.3f} vs pre {levels['continuous_pre']:.3f} and the "
        f"better rule engine's {v['better_rule_end']:.3f}; frozen_store end "
        f"{levels['frozen_store_end']:.3f}; recovered {v['continuous_recovered']}, at or below "
        f"the rules {v['continuous_at_or_below_rules']}, frozen_store fails "
        f"{v['frozen_store_fails']}: accepted {v['accepted']}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
