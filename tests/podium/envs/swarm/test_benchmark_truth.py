"""``bench_scheduling`` with advertised != true pools, statistics stores and the planner."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from podium.envs.swarm.baselines import CplsPolicy
from podium.envs.swarm.benchmark import bench_scheduling, split_truth
from podium.envs.swarm.env import SwarmEnv
from podium.envs.swarm.scheduling import PolicyStep, Rng
from podium.envs.swarm.spec import (
    default_pool,
    default_pool_path,
    load_pool,
    load_task,
    parse_pool,
    read_document,
)
from podium.errors import ConfigError, SpecError
from podium.observed import AgentStats

MIS = load_pool(default_pool_path().parent / "misadvertised.yaml")
TASKS_DIR = default_pool_path().parent.parent / "tasks"
SMALL = [load_task(TASKS_DIR / f) for f in ("diamond-10.yaml", "layered-5.yaml")]


def _latency(result: dict[str, Any], policy: str) -> float:
    return float(result["summary"][policy]["latency_mean"])


def test_a_pool_with_truth_and_the_same_truth_given_apart_run_the_same_sessions() -> None:
    inline = bench_scheduling(SMALL, MIS, ["cpls"], episodes=4, seed=3)
    apart = bench_scheduling(SMALL, MIS.advertised(), ["cpls"], 4, 3, true_pool=MIS.true_spec())
    assert inline["tasks"] == apart["tasks"]
    assert inline["config"]["true_pool"] == "misadvertised"
    # The bound and cpls read the advertisement; the sub-agents do what true: says.
    told = bench_scheduling(SMALL, MIS.advertised(), ["cpls"], episodes=4, seed=3)
    assert "true_pool" not in told["config"]
    assert [t["lower_bound"] for t in told["tasks"]] == [t["lower_bound"] for t in inline["tasks"]]
    assert _latency(inline, "cpls") > 1.2 * _latency(told, "cpls")


def test_json_config_is_unchanged_without_truth_or_stores() -> None:
    result = bench_scheduling(SMALL, default_pool(), ["cpls"], episodes=2, seed=0)
    assert result["config"] == {
        "episodes": 2,
        "seed": 0,
        "pool": "default",
        "policies": ["sequential", "cpls"],
    }


def test_true_pool_with_other_agents_is_refused_naming_them() -> None:
    doc = read_document(default_pool_path())
    renamed = copy.deepcopy(doc)
    renamed["agents"][0]["name"] = "ui-wizard"
    renamed["agents"].pop()
    with pytest.raises(SpecError) as err:
        bench_scheduling(SMALL, default_pool(), ["cpls"], 1, 0, true_pool=parse_pool(renamed))
    msg = str(err.value)
    assert "missing agents ['ui-specialist', 'generalist']" in msg
    assert "extra agents ['ui-wizard']" in msg
    with pytest.raises(ConfigError, match="give the truth one way"):
        split_truth(MIS, default_pool())


def test_planner_and_cpls_online_in_one_paired_run() -> None:
    result = bench_scheduling(
        SMALL[:1], MIS, ["cpls", "cpls-online", "planner"], episodes=3, seed=0, warmup=3
    )
    assert result["config"]["policies"] == ["sequential", "cpls", "cpls-online", "planner"]
    assert result["config"]["warmup"] == 3 and result["config"]["true_pool"] == "misadvertised"
    lat = {p: _latency(result, p) for p in ("cpls", "cpls-online", "planner")}
    # Reading the truth beats reading the advertisement by far; estimates help cpls.
    assert lat["planner"] < 0.85 * lat["cpls"], lat
    assert lat["cpls-online"] < lat["cpls"], lat
    for row in result["tasks"]:
        assert all(p["completion_rate"] == 1.0 for p in row["policies"].values())


class _Spy:
    """cpls that keeps the statistics stores its environment gave it (a caller's policy, like
    a trained network, reads the store, so the bench gives every policy one)."""

    name = "spy"
    version = "rules:spy"

    def __init__(self) -> None:
        self.cpls = CplsPolicy()
        self.stores: list[AgentStats] = []

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        assert env.stats is not None
        if not self.stores or self.stores[-1] is not env.stats:
            self.stores.append(env.stats)
        return self.cpls.act(env, rng)


def test_each_policy_feeds_its_own_warmed_store() -> None:
    spies = {"spy-a": _Spy(), "spy-b": _Spy()}
    result = bench_scheduling(SMALL, MIS, list(spies), episodes=2, seed=0, warmup=2, extra=spies)
    assert result["config"]["warmup"] == 2
    a, b = spies["spy-a"].stores, spies["spy-b"].stores
    assert len(a) == 1 and len(b) == 1 and a[0] is not b[0]  # one store each, across tasks
    # Same warm-up, same paired episodes of the same rule engine: the same observations,
    # more than the warm-up alone recorded.
    assert a[0].to_dict() == b[0].to_dict()
    assert a[0].version > 0
    est = a[0].estimate("backend", "api", MIS.agents[1].kinds["api"])
    assert est is not None and est.success < 0.8  # it saw the truth (0.45), not the ad (0.95)
    with pytest.raises(ConfigError, match="--warmup must be >= 0"):
        bench_scheduling(SMALL, MIS, ["cpls"], 1, 0, warmup=-1)
