"""``podium bench cycle`` without a broker: flags, the planned load, the rule engines'
reference under drift, the windows and verdicts, and the report (the end-to-end run over Kafka
is tests/podium_app/test_cycle_kafka.py)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from podium import codec, topics
from podium.bus import InProcBus
from podium.envs.swarm import EnvConfig, SwarmEnv, default_tasks, make_policy
from podium.envs.swarm.drift import DriftChange, DriftSchedule, load_drift
from podium.envs.swarm.spec import default_pool, default_pool_path, load_pool, parse_pool
from podium.envs.swarm.trajectory import episode_trajectory
from podium.observed import AgentStats
from podium.rollout.twins import rule_twin
from podium.v1 import reward_pb2
from podium_app.bootstrap import next_version
from podium_app.cli import main
from podium_app.cycle.config import CycleConfig, validate
from podium_app.cycle.deploy import learner_train_config
from podium_app.cycle.driver import RunResult, learner_of, retrain
from podium_app.cycle.load import Tail, index_of, session_id
from podium_app.cycle.measure import (
    FROZEN_STORE,
    Replayed,
    cycle_tasks,
    drift_time,
    frozen_store_arm,
    plan_sessions,
    preferred_drift,
    ratio,
    reference_ratios,
    replay_ratios,
    store_at_drift,
    verdicts,
    window_of,
    window_table,
)
from podium_app.cycle.report import table_text, write_report

POOLS = default_pool_path().parent
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--duration-s", "0"], "--duration-s"),
        (["--duration-s", "60", "--drift-at-s", "60"], "--drift-at-s"),
        (["--rate", "-1"], "--rate"),
        (["--window-s", "0"], "--window-s"),
        (["--replicas", "0"], "--replicas"),
        (["--explore-share", "1"], "--explore-share"),
        (["--runs", "frozen,warm"], "--runs"),
        (["--bus", "inproc://"], "--bus"),
        (["--checkpoint", "/nonexistent/policy.safetensors"], "--checkpoint"),
        (["--drift", "no-such-scenario"], "--drift"),
        (["--pool", "/nonexistent/pool.yaml"], "--pool"),
        (["--drift-target", "busiest"], "--drift-target"),
        (["--retrain-after-s", "-5"], "--retrain-after-s"),
        (
            ["--duration-s", "60", "--drift-at-s", "20", "--retrain-after-s", "40"],
            "--retrain-after-s",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["bench", "cycle", "--work-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and named in err[0], err
    assert not (tmp_path / "kafka").exists()  # nothing was started


def test_a_pool_that_does_not_parse_or_lacks_the_drifting_agent_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\nagents: []\n")
    no_qa = tmp_path / "no-qa.yaml"
    no_qa.write_text(
        "name: no-qa\nagents:\n  - name: tester\n    kinds:\n"
        "      test: {speed: 1.0, success: 0.9, noise: 0.1}\n"
    )
    flags = ["bench", "cycle", "--work-dir", str(tmp_path), "--drift", "flaky-agent"]
    for pool, named, problem in [(broken, "--pool", "agents"), (no_qa, "--drift", "qa")]:
        code = main([*flags, "--pool", str(pool)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2
        assert len(err) == 1 and named in err[0] and problem in err[0], err
    assert not (tmp_path / "kafka").exists()


def test_a_pool_of_the_shipped_kinds_gets_the_shipped_tasks_and_others_their_own() -> None:
    misadvertised = load_pool(POOLS / "misadvertised.yaml")
    assert [t.name for t in cycle_tasks(4, 3, misadvertised)] == [t.name for t in cycle_tasks(4, 3)]
    assert [t.subtasks for t in cycle_tasks(4, 3, misadvertised)] == [
        t.subtasks for t in cycle_tasks(4, 3)
    ]
    odd = parse_pool(
        {
            "name": "odd",
            "agents": [
                {"name": "a", "kinds": {"test": {"speed": 1.0, "success": 0.9, "noise": 0.1}}},
                {"name": "b", "kinds": {"lint": {"speed": 1.0, "success": 0.9, "noise": 0.1}}},
            ],
        }
    )
    kinds = {s.kind for t in cycle_tasks(6, 0, odd) for s in t.subtasks}
    assert kinds == {"test", "lint"}


def test_every_service_and_the_learner_get_the_pool(tmp_path: Path) -> None:
    pool = POOLS / "misadvertised.yaml"
    config = CycleConfig(work_dir=tmp_path, pool=pool)
    assert config.pool_spec().name == "misadvertised"
    assert learner_train_config(config, tmp_path).pool == pool
    assert CycleConfig().pool_spec().name == default_pool().name
    assert learner_train_config(CycleConfig(), tmp_path).pool is None


def test_the_references_draw_from_the_pools_true_profiles() -> None:
    # On the misadvertised pool cpls believes backend's advertisement (truly flaky) while
    # cpls-online learns it from its store: the replay must use the truth to show that.
    pool = load_pool(POOLS / "misadvertised.yaml")
    plan = plan_sessions(cycle_tasks(4, 0, pool), 48, 4.0, 0)
    refs = reference_ratios(plan, pool, load_drift("none"), 6.0)
    on_default = reference_ratios(
        plan_sessions(cycle_tasks(4, 0), 48, 4.0, 0), default_pool(), load_drift("none"), 6.0
    )
    assert sum(refs["cpls"]) > 1.2 * sum(on_default["cpls"])
    assert sum(refs["cpls-online"]) < sum(refs["cpls"])


def test_default_config_is_valid() -> None:
    validate(CycleConfig())
    assert CycleConfig(duration_s=100, window_s=30).windows == 4


def test_session_ids_round_trip() -> None:
    assert index_of("frozen", session_id("frozen", 42)) == 42
    assert index_of("continuous", session_id("frozen", 42)) is None
    assert index_of("frozen", "frozen-warmup") is None


def test_plan_is_paired_and_steady() -> None:
    tasks = cycle_tasks(4, 3)
    a, b = plan_sessions(tasks, 10, 2.0, 3), plan_sessions(tasks, 10, 2.0, 3)
    assert a == b
    assert [s.at_s for s in a] == [i / 2 for i in range(10)]
    assert len({s.seed for s in a}) == 10
    assert plan_sessions(tasks, 10, 2.0, 4)[0].seed != a[0].seed


def test_explored_sessions_are_spread_and_never_measured() -> None:
    tasks = cycle_tasks(4, 3)
    plan = plan_sessions(tasks, 200, 4.0, 3, explore_share=0.25)
    for w in range(5):  # every 10 s window holds its share of explored sessions
        share = sum(s.sampled for s in plan if window_of(s.at_s, 10.0, 5) == w) / 40
        assert 0.2 <= share <= 0.3, (w, share)
    ratios = {s.index: (9.0 if s.sampled else 1.0) for s in plan}
    rows = window_table(
        plan, {"frozen": ratios}, {"cpls": [ratios[s.index] for s in plan]}, 10.0, 5
    )
    assert all(r["frozen"]["mean"] == r["cpls"]["mean"] == 1.0 for r in rows)
    assert sum(r["frozen"]["sessions"] for r in rows) == sum(not s.sampled for s in plan)


def test_ratio_caps_incomplete_sessions() -> None:
    assert ratio(3.0, 2.0, True) == 1.5
    assert ratio(3.0, 2.0, False) == ratio(1e9, 1.0, True) == 4.0


def test_drift_time_places_the_first_change_at_drift_at() -> None:
    schedule = load_drift("slow-specialist")
    assert drift_time(25.0, 25.0, schedule) == schedule.changes[0].at_s
    assert schedule.phase(drift_time(24.9, 25.0, schedule)) == 0
    assert schedule.phase(drift_time(25.0, 25.0, schedule)) == 1


def test_reference_sees_the_drift_and_cpls_online_adapts() -> None:
    """The slow specialist hurts cpls (it reads the advertised speed) after the drift, while
    cpls-online, reading its own observations, recovers: the bar the live policy must meet."""
    plan = plan_sessions(cycle_tasks(6, 0), 96, 4.0, 0)
    refs = reference_ratios(plan, default_pool(), load_drift("slow-specialist"), 12.0)
    pre = [r for s, r in zip(plan, refs["cpls"], strict=True) if s.at_s < 12]
    post = [r for s, r in zip(plan, refs["cpls"], strict=True) if s.at_s >= 12]
    online_post = [r for s, r in zip(plan, refs["cpls-online"], strict=True) if s.at_s >= 12]
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    assert mean(post) > 1.2 * mean(pre)
    assert mean(online_post) < mean(post)
    assert len(refs["cpls"]) == len(refs["cpls-online"]) == 96


def _rows(cont: list[float], frozen: list[float], rules: tuple[float, float]) -> list[Any]:
    plan = plan_sessions(cycle_tasks(2, 0), len(cont), 1.0, 0)
    runs = {
        "continuous": dict(enumerate(cont)),
        "frozen": dict(enumerate(frozen)),
    }
    refs = {"cpls": [rules[0]] * len(cont), "cpls-online": [rules[1]] * len(cont)}
    return window_table(plan, runs, refs, 1.0, len(cont))


def test_verdicts_accept_a_recovery_and_refuse_a_frozen_policy() -> None:
    rows = _rows([1.4, 1.4, 2.0, 1.6, 1.42], [1.4, 1.4, 2.0, 2.0, 2.0], (2.2, 1.45))
    v = verdicts(rows, drift_at_s=2.0)
    assert v["continuous_recovered"] and v["continuous_at_or_below_rules"]
    assert v["frozen_fails"] and v["drift_visible"] and v["accepted"]
    assert v["better_rule_end"] == 1.45


def test_verdicts_refuse_when_the_rules_do_better() -> None:
    rows = _rows([1.4, 1.4, 2.0, 1.6, 1.46], [1.4, 1.4, 2.0, 2.0, 2.0], (2.2, 1.45))
    v = verdicts(rows, drift_at_s=2.0)
    assert v["continuous_recovered"] is True
    assert v["continuous_at_or_below_rules"] is False and v["accepted"] is False


def test_verdicts_without_a_run_are_undecided() -> None:
    plan = plan_sessions(cycle_tasks(2, 0), 4, 1.0, 0)
    rows = window_table(plan, {"frozen": {0: 1.0}}, {"cpls": [1.0] * 4}, 1.0, 4)
    assert verdicts(rows, 2.0)["accepted"] is None
    assert rows[3]["frozen"] == {"mean": None, "sessions": 0}


def test_window_of_clamps_to_the_load() -> None:
    assert window_of(0.0, 10.0, 3) == 0
    assert window_of(29.99, 10.0, 3) == 2
    assert window_of(35.0, 10.0, 3) == 2


def test_report_and_table(tmp_path: Path) -> None:
    rows = _rows([1.4, 1.4, 2.0, 1.6, 1.42], [1.4, 1.4, 2.0, 2.0, 2.0], (2.2, 1.45))
    run = {
        "finished": 5,
        "submitted": 5,
        "run_twice": 0,
        "incomplete": 0,
        "by_arm": {"live": 5},
        "controller_proposed": 1,
        "promoted": 1,
        "load_started_at": 1000.0,
        "transitions": [
            {
                "seq": 3,
                "kind": "PROMOTED",
                "actor": "controller",
                "live": "2",
                "candidate": "",
                "summary": "<evidence>",
                "at": 1003.0,
            }
        ],
    }
    result = {
        "config": {
            "drift": "slow-specialist",
            "drift_at_s": 2.0,
            "duration_s": 5.0,
            "rate": 1.0,
            "replicas": 1,
            "cycle_s": 1.0,
            "seed": 0,
        },
        "windows": rows,
        "runs": {"continuous": run, "frozen": run},
        "verdicts": verdicts(rows, 2.0),
    }
    json.dumps(result)  # the JSON is plain data
    html = write_report(result, tmp_path / "r").read_text()
    assert (tmp_path / "r" / "latency.png").stat().st_size > 1000
    assert "&lt;evidence&gt;" in html and "cpls_online" in html
    text = table_text(result)
    assert "accepted=True" in text and len(text.splitlines()) == 2 + len(rows)
    # A retraining job's run says so, with its figures; a failed one says it left no candidate.
    assert "Retraining job" not in html
    retrain = {"started_at_s": 3.0, "merges_observed": 271.3, "observed_merge_factor": 6.187}
    run["retrain"] = retrain | {"version": 2, "train_s": 209.0, "announced_at_s": 4.0}
    html = write_report(result, tmp_path / "r").read_text()
    assert "271.3 merges at 6.187&times;" in html and "v2 announced at 4 s" in html
    run["retrain"] = retrain | {"failed": 1}
    html = write_report(result, tmp_path / "r").read_text()
    assert "training failed (exit 1): no candidate" in html


def test_a_store_frozen_at_the_drift_stops_learning_the_agents() -> None:
    """The same rule engine on a store fed throughout (cpls-online) and on one fed only until
    the drift: identical before it, and after it the frozen store's sessions keep sending work
    to the slowed specialist, so they are slower — what the frozen arm of the acceptance is."""
    plan = plan_sessions(cycle_tasks(6, 0), 160, 4.0, 0)
    online = rule_twin("rules:cpls-online")
    refs = replay_ratios(
        plan,
        default_pool(),
        load_drift("slow-specialist"),
        12.0,
        {"live": Replayed(online, "live"), "frozen": Replayed(online, "until-drift")},
    )
    pre = [i for i, s in enumerate(plan) if s.at_s < 12]
    post = [i for i, s in enumerate(plan) if s.at_s >= 20]  # the live store has seen the drift
    assert [refs["live"][i] for i in pre] == [refs["frozen"][i] for i in pre]
    mean = lambda idx, arm: sum(refs[arm][i] for i in idx) / len(idx)  # noqa: E731
    assert mean(post, "frozen") > 1.05 * mean(post, "live")


def test_the_frozen_store_arm_replays_a_learned_policy_and_bad_stores_are_refused() -> None:
    import torch

    from podium.envs.swarm import EnvConfig
    from podium.envs.swarm.env import SwarmEnv
    from podium.errors import ConfigError
    from podium.policy.agent import SwarmAgent

    plan = plan_sessions(cycle_tasks(3, 0), 12, 4.0, 0)
    layout = SwarmEnv(cycle_tasks(3, 0), default_pool(), EnvConfig(max_subtasks=10)).layout
    torch.manual_seed(0)
    net = SwarmAgent(layout).net  # untrained: the arm's mechanics, not its figures
    arms = frozen_store_arm(net)
    assert arms[FROZEN_STORE].store == "until-drift" and arms[FROZEN_STORE].policy.net is net
    got = replay_ratios(plan, default_pool(), load_drift("slow-specialist"), 1.0, arms)
    assert len(got[FROZEN_STORE]) == 12 and all(0 < r <= 4.0 for r in got[FROZEN_STORE])
    with pytest.raises(ConfigError, match="store must be one of none, live, until-drift"):
        Replayed(rule_twin("rules:cpls"), "sometimes")


def test_the_acceptance_reads_the_frozen_store_arm_when_there_is_one() -> None:
    """A frozen run that recovers through its live store no longer decides the verdict: the
    frozen policy of the acceptance is the one whose store stopped at the drift."""
    plan = plan_sessions(cycle_tasks(2, 0), 5, 1.0, 0)
    runs = {
        "continuous": dict(enumerate([1.4, 1.4, 2.0, 1.6, 1.42])),
        "frozen": dict(enumerate([1.4, 1.4, 2.0, 1.5, 1.40])),  # recovers: the store
    }
    refs = {"cpls": [2.2] * 5, "cpls-online": [1.45] * 5}
    rows = window_table(plan, runs, refs, 1.0, 5)
    assert verdicts(rows, 2.0)["accepted"] is False  # the frozen run holds
    stale = {**refs, FROZEN_STORE: [1.4, 1.4, 2.0, 2.0, 2.0]}
    v = verdicts(window_table(plan, runs, stale, 1.0, 5), 2.0)
    assert v["frozen_fails"] is False and v["frozen_store_fails"] is True
    assert v["frozen_store_recovered"] is False and v["accepted"] is True
    assert v["levels"]["frozen_store_end"] == 2.0


def _observed(counts: dict[tuple[str, str], int]) -> AgentStats:
    stats = AgentStats()
    for (agent, kind), n in counts.items():
        for _ in range(n):
            stats.record(agent, kind, work=1.0, duration=1.0, success=True)
    return stats


def test_a_drift_aimed_at_the_preferred_agent_moves_each_kind_to_its_busiest_agent() -> None:
    pool = load_pool(POOLS / "misadvertised.yaml")
    flaky = load_drift("flaky-agent")  # qa, every kind it does (test)
    aimed, said = preferred_drift(
        flaky, pool, _observed({("qa-fast", "test"): 9, ("qa", "test"): 2})
    )
    assert aimed.name == "flaky-agent@preferred"
    assert [(c.agent, c.kind, c.success_factor, c.at_s) for c in aimed.changes] == [
        ("qa-fast", "test", 0.2, 60.0)
    ]
    assert len(said) == 1 and "qa/test -> qa-fast/test" in said[0] and "qa-fast 9" in said[0]
    # A tie (here: nothing observed) keeps the scenario's own agent.
    kept, _ = preferred_drift(flaky, pool, AgentStats())
    assert [(c.agent, c.kind) for c in kept.changes] == [("qa", "test")]
    # A change of every kind of its agent is aimed kind by kind: backend's api work went to
    # api-fast, its db work to infra-specialist.
    backend = DriftSchedule("slow-backend", (DriftChange(10.0, "backend", speed_factor=0.3),))
    busy = _observed({("api-fast", "api"): 5, ("backend", "api"): 3, ("infra-specialist", "db"): 4})
    moved, said = preferred_drift(backend, pool, busy)
    assert [(c.agent, c.kind, c.speed_factor) for c in moved.changes] == [
        ("api-fast", "api", 0.3),
        ("infra-specialist", "db", 0.3),
    ]
    assert len(said) == 2
    moved.check(pool)  # every aimed change names an agent and a kind the pool has


def test_the_preferred_agent_depends_on_what_the_initial_policy_ran_before_the_drift() -> None:
    """On the misadvertised pool the committed policy sends the test work of seed 0's task mix
    to qa and of seed 1's to qa-fast (the stores learnt that qa-fast is better than it
    advertises): a drift of qa bites only the first, the aimed drift both."""
    from podium.policy.swarm import load_policy

    net, _ = load_policy(ROOT / "bench" / "policies" / "misadvertised-v8" / "policy.safetensors")
    pool = load_pool(POOLS / "misadvertised.yaml")
    flaky = load_drift("flaky-agent")
    targets = []
    for seed in (0, 1):
        config = CycleConfig(seed=seed, duration_s=600, drift_at_s=200)
        plan = plan_sessions(
            cycle_tasks(config.tasks, seed, pool),
            config.sessions,
            config.rate,
            seed,
            config.explore_share,
        )
        stats = store_at_drift(plan, pool, flaky, config.drift_at_s, net)
        assert stats.observed("qa", "test") + stats.observed("qa-fast", "test") > 100
        aimed, _ = preferred_drift(flaky, pool, stats)
        targets.append([(c.agent, c.kind) for c in aimed.changes])
    assert targets == [[("qa", "test")], [("qa-fast", "test")]]


def test_a_drift_made_in_code_round_trips_through_its_document(tmp_path: Path) -> None:
    import yaml

    from podium.envs.swarm.drift import drift_document

    schedule = DriftSchedule(
        "two",
        (DriftChange(5.0, "qa", "test", 1.0, 0.2), DriftChange(9.0, "backend", None, 0.5, 1.0)),
        "made here",
    )
    path = tmp_path / "drift.yaml"
    path.write_text(yaml.safe_dump(drift_document(schedule)))
    assert load_drift(path) == schedule


def test_the_tail_feeds_a_store_once_per_session_and_skips_what_it_refuses() -> None:
    """The retraining job's store: every session's trajectory recorded once (a session run
    twice is not counted twice), a trajectory the store refuses skipped, the tail going on."""
    env = SwarmEnv(default_tasks(), config=EnvConfig(rule_advice=False))
    env.reset(seed=3, options={"task": "diamond-10"})
    engine = make_policy("cpls")
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(engine.act(env).action)
        done = terminated or truncated
    traj = episode_trajectory(env)
    traj.session_id = session_id("continuous", 4)
    tail = Tail(bus=None, run="continuous", stats=AgentStats())  # type: ignore[arg-type]
    data = codec.encode_event(traj, producer="test")[1]
    tail._note(topics.TRAJECTORIES, data)
    once = tail.stats.to_dict() if tail.stats is not None else {}
    assert tail.stats is not None and tail.stats.version > 0
    tail._note(topics.TRAJECTORIES, data)  # the same session again: run twice
    assert tail.stats.to_dict() == once and tail.records == {4: 2}
    bad = type(traj)()
    bad.CopyFrom(traj)
    bad.session_id = session_id("continuous", 5)
    bad.executions[0].subtask_id = "nope"
    tail._note(topics.TRAJECTORIES, codec.encode_event(bad, producer="test")[1])
    assert tail.stats.to_dict() == once and 5 in tail.finished


def _store_of_a_costly_world(merge_factor: float, episodes: int) -> AgentStats:
    """A store fed by cpls sessions in a world whose merges cost ``merge_factor`` x their plan
    (what the run's tail records from the trajectory stream after such a drift)."""
    pool = default_pool()
    truth = replace(pool, split_overhead=pool.split_overhead * merge_factor)
    stats = AgentStats()
    env = SwarmEnv(
        default_tasks(pool),
        pool,
        EnvConfig(rule_advice=False, feed_stats=True),
        true_pool=truth,
        stats=stats,
    )
    engine = make_policy("cpls")
    for seed in range(episodes):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(engine.act(env).action)
            done = terminated or truncated
    return stats


QUICK_RETRAIN = (
    "--teacher", "planner-online", "--bc-demos-per-task", "2", "--dagger-rounds", "0",
    "--iterations", "0", "--suite-size", "8", "--sizes", "5", "6", "--test-suite-size", "2",
    "--test-sizes", "5", "6", "--test-episodes", "1", "--bc-epochs", "4", "--curriculum", "6",
    "--env-advice", "online", "--store-warmup", "1",
)  # fmt: skip
"""The retraining job's recipe, as small as ``podium train`` takes (the job, not the clone's
quality, is under test: docs/cycle.md measures that)."""


async def test_the_retraining_job_trains_on_the_world_the_store_saw_and_announces_it(
    tmp_path: Path,
) -> None:
    """``--retrain-after-s``: the store's world written as a pool (advertised as the spec
    says, merges at the cost the store saw), a policy trained there by ``podium train``,
    published signed as the next version and announced on the policy topic; a training that
    fails leaves no candidate and says so."""
    stats = _store_of_a_costly_world(8.0, 30)
    tail = Tail(bus=None, run="continuous", stats=stats)  # type: ignore[arg-type]
    config = CycleConfig(work_dir=tmp_path, drift_at_s=0.0, retrain_after_s=1.0)
    learner = learner_of(config, "frozen", tmp_path / "frozen", tmp_path / "unused")
    said: list[str] = []
    bus = InProcBus()
    await bus.start()
    try:
        result = RunResult("continuous")
        await retrain(
            config, bus, tail, learner, tmp_path / "one", time.monotonic() - 1.0, result,
            said.append, QUICK_RETRAIN,
        )  # fmt: skip
        assert result.retrain["version"] == 1 and "failed" not in result.retrain, said
        assert result.retrain["observed_merge_factor"] == round(stats.merge_factor(), 3)
        assert result.retrain["merges_observed"] == pytest.approx(stats.merges_observed, abs=0.1)
        world = load_pool(tmp_path / "one" / "retrain" / "observed.yaml")
        pool = default_pool()
        assert world.split_overhead == pool.split_overhead  # what planners are told
        assert world.true_split_overhead == pytest.approx(
            pool.split_overhead * stats.merge_factor()
        )
        assert stats.merge_factor() == pytest.approx(8.0, rel=0.25)
        sub = bus.subscriber([topics.POLICY_UPDATES], "test")
        await sub.start()
        try:
            records = await sub.fetch(timeout_s=2.0)
        finally:
            await sub.stop()
        assert len(records) == 1
        _, event = codec.decode_event(records[0].value, reward_pb2.PolicyUpdated)
        assert event.version == 1 and event.signature
        assert next_version(learner.artifacts_dir) == 2  # version 1 is in the artifacts root
        # A training that fails: reported, nothing published or announced.
        failed = RunResult("continuous")
        await retrain(
            config, bus, tail, learner, tmp_path / "two", time.monotonic() - 1.0, failed,
            said.append, ("--suite-size", "0"),
        )  # fmt: skip
        assert failed.retrain["failed"] != 0 and "version" not in failed.retrain
        assert "retraining failed" in said[-1] and "no candidate" in said[-1]
        assert sum(bus.end_offsets(topics.POLICY_UPDATES).values()) == 1
    finally:
        await bus.stop()
