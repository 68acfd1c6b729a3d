"""Scouting: untried agents are tried only where the schedule has slack, and only until the
store has seen them; the benchmark and its command take ``NAME+scout``."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

import pytest

from podium.envs.swarm import EnvConfig, SwarmEnv, default_tasks, load_pool, make_policy
from podium.envs.swarm.baselines import CplsOnlinePolicy
from podium.envs.swarm.benchmark import bench_scheduling, warm_up
from podium.envs.swarm.scheduling import PolicyStep, Rng, SchedulingPolicy
from podium.envs.swarm.scouting import ScoutConfig, Scouting, slack
from podium.envs.swarm.spec import TaskSpec, default_pool_path, parse_task, split_truth
from podium.errors import ConfigError
from podium.observed import AgentStats
from podium_app.commands.bench_scheduling import _policies

ROOT = Path(__file__).resolve().parents[4]
MISADVERTISED = load_pool(default_pool_path().parent / "misadvertised.yaml")


def _env(task: TaskSpec | None = None, *, stats: AgentStats | None = None) -> SwarmEnv:
    """The misadvertised pool (qa-fast truly reliable, advertised flaky), store warmed by cpls
    as the benchmark warms it: cpls never routes a test subtask to qa-fast."""
    advertised, truth = split_truth(MISADVERTISED, None)
    tasks = [task] if task is not None else default_tasks()
    return SwarmEnv(tasks, advertised, EnvConfig(), true_pool=truth, stats=stats)


def _latency(env: SwarmEnv, policy: SchedulingPolicy, task: str, seed: int) -> float:
    env.reset(seed=seed, options={"task": task})
    done, info = False, {}
    while not done:
        _, _, term, trunc, info = env.step(policy.act(env).action)
        done = term or trunc
    return float(info["latency"])


def _warmed() -> tuple[SwarmEnv, AgentStats]:
    """The environment with a store fed by its episodes, warmed as the benchmark warms it."""
    stats = AgentStats()
    env = _env(stats=stats)
    warm_up(env, default_tasks(), 10, 0)
    return env, stats


def test_an_agent_better_than_it_says_is_tried_where_there_is_slack_then_left_to_the_store() -> (
    None
):
    """layered-15 has test subtasks off its critical path: the scout tries qa-fast there, the
    store learns it is reliable, and cpls-online then routes tests to it by itself. Paired
    seeds: the same sub-agent luck for both (0.944x here; 0.966x over the 12 shipped tasks x 25
    seeds, docs/training.md)."""
    env, stats = _warmed()
    assert stats.observed("qa-fast", "test") == 0  # the warm-up's cpls never tried it
    scouting = Scouting(CplsOnlinePolicy())
    ours = [_latency(env, scouting, "layered-15", seed) for seed in range(12)]
    assert scouting.scouted >= 1
    assert stats.observed("qa-fast", "test") > 10  # tried, then chosen on its own merits
    # Every capable agent seen enough: later sessions scout no more.
    tried = scouting.scouted
    for seed in range(12, 24):
        _latency(env, scouting, "layered-15", seed)
    assert scouting.scouted == tried
    plain_env, plain_stats = _warmed()
    online = CplsOnlinePolicy()
    theirs = [_latency(plain_env, online, "layered-15", seed) for seed in range(12)]
    assert plain_stats.observed("qa-fast", "test") == 0  # cpls-online alone never tries it
    ratio = statistics.fmean(ours) / statistics.fmean(theirs)
    assert ratio < 0.97, f"scouting / cpls-online = {ratio:.3f}"


def test_a_chain_has_no_slack_so_nothing_is_scouted() -> None:
    chain = next(t for t in default_tasks() if t.name == "chain-8")
    env = _env(chain, stats=AgentStats())
    scouting = Scouting(CplsOnlinePolicy())
    for seed in range(3):
        _latency(env, scouting, "chain-8", seed)
    assert scouting.scouted == 0


def test_slack_is_the_critical_rank_less_the_subtasks_and_running_work_counts_as_ending_now() -> (
    None
):
    # a (long) and b (short) both feed c: b has slack of about a's extra work.
    task = parse_task(
        {
            "name": "two-branches",
            "subtasks": [
                {"id": "a", "kind": "api", "work": 10.0},
                {"id": "b", "kind": "api", "work": 2.0},
                {"id": "c", "kind": "api", "work": 1.0, "deps": ["a", "b"]},
            ],
        }
    )
    ranks, weights = [11.0, 3.0, 1.0], [10.0, 2.0, 1.0]
    env = _env(task)
    env.reset(seed=0, options={"task": "two-branches"})
    state = env.state
    assert slack(state, ranks, weights, 1) == pytest.approx(8.0)
    assert slack(state, ranks, weights, 0) == 0.0
    state.start(
        0, 1, 1
    )  # a runs (on backend): taken to end now, so b's slack shrinks to what c needs
    assert slack(state, ranks, weights, 1) == pytest.approx(0.0)


def test_without_a_store_decisions_pass_through_and_it_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = _env()
    scouting, plain = Scouting(CplsOnlinePolicy()), CplsOnlinePolicy()
    with caplog.at_level(logging.WARNING):
        for seed in range(2):
            assert _latency(env, scouting, "layered-5", seed) == _latency(
                env, plain, "layered-5", seed
            )
    assert scouting.scouted == 0
    assert sum("nothing is scouted" in r.getMessage() for r in caplog.records) == 1


def test_names_and_config() -> None:
    scouting = Scouting(make_policy("cpls"))
    assert scouting.name == "cpls+scout" and scouting.version == "rules:cpls"
    with pytest.raises(ConfigError, match="margin must be >= 1"):
        ScoutConfig(margin=0.5)
    with pytest.raises(ConfigError, match="min_observations must be > 0"):
        ScoutConfig(min_observations=0)


def test_the_benchmark_and_its_command_take_scout_names() -> None:
    tasks = [t for t in default_tasks() if t.name in ("layered-5", "chain-8")]
    result = bench_scheduling(tasks, MISADVERTISED, ["cpls-online", "cpls-online+scout"], 3, 0)
    assert result["config"]["policies"] == ["sequential", "cpls-online", "cpls-online+scout"]
    assert "warmup" in result["config"]  # a scouting policy reads the store, so stores are made
    chain = next(t for t in result["tasks"] if t["name"] == "chain-8")["policies"]
    assert chain["cpls-online+scout"]["latency_mean"] == chain["cpls-online"]["latency_mean"]
    with pytest.raises(ConfigError, match=r"unknown policy 'nope\+scout'.*NAME\+scout"):
        bench_scheduling(tasks, MISADVERTISED, ["nope+scout"], 1, 0)
    assert _policies("cpls,learned+scout") == ["cpls", "learned+scout"]


def test_the_committed_misadvertised_policy_loads_and_scouts_on_the_pool() -> None:
    """bench/policies/misadvertised-v8, the policy issue 14's (b) figures are measured with,
    stays loadable (sha256-checked) as the network code changes, and decides with scouting
    on the pool it was trained for."""
    from podium.policy.swarm import LearnedPolicy

    path = ROOT / "bench" / "policies" / "misadvertised-v8" / "policy.safetensors"
    env, stats = _warmed()
    scouting = Scouting(LearnedPolicy.from_checkpoint(path))
    latencies = [_latency(env, scouting, "layered-15", seed) for seed in range(3)]
    assert all(0 < latency < float("inf") for latency in latencies)
    assert scouting.scouted >= 1 and stats.observed("qa-fast", "test") >= 1


class _Remote:
    """A policy deciding "elsewhere": only its ``act_async`` may be awaited (the served path)."""

    def __init__(self, inner: SchedulingPolicy) -> None:
        self.inner, self.awaited = inner, 0
        self.name, self.version = inner.name, inner.version

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        raise AssertionError("a remote policy's act must not block the event loop")

    async def act_async(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        self.awaited += 1
        return self.inner.act(env, rng)


async def test_a_remote_policy_is_awaited_and_scouted_as_the_local_one_is() -> None:
    """``act_async`` awaits a remote policy's decision and revises it exactly as ``act`` does."""
    env, stats = _warmed()
    twin_stats = stats.copy()
    remote = _Remote(CplsOnlinePolicy())
    local_scout, remote_scout = Scouting(CplsOnlinePolicy()), Scouting(remote)
    twin = _env(stats=twin_stats)
    for seed in range(6):
        for e in (env, twin):
            e.reset(seed=seed, options={"task": "layered-15"})
        done = False
        while not done:
            a = local_scout.act(env).action
            assert (await remote_scout.act_async(twin)).action == a
            _, _, term, trunc, _ = env.step(a)
            twin.step(a)
            done = term or trunc
    assert remote.awaited > 0
    assert remote_scout.scouted == local_scout.scouted >= 1
