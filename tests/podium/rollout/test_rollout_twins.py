"""Shadow twins: a live session replayed in simulation under its seed (common random numbers).

* a twin of a real session (orchestrator + sub-agent worker on the in-process bus, cpls, a
  seed) run by the same policy reproduces its latency exactly, under drift too;
* paired() of a policy with itself is all zeros; cpls against sequential is clearly positive;
* a learned version loaded from its signed announcement runs as a twin and decides as the
  orchestrator's greedy per-session path does; a tampered artifact, an untrusted or missing
  signature, the wrong announcement are refused with the reason;
* with a statistics store that observed a drift, twins meet the sub-agents as observed (its
  estimated pool), cpls-online's twin, planning on the store, beats cpls's, and a learned
  twin reads the store through its observation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from signing_helpers import key_pair, signed, trusted
from svc_helpers import LOGIN_TASK

from podium.bus import InProcBus
from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool, default_tasks
from podium.envs.swarm.drift import DriftingPool, load_drift
from podium.envs.swarm.generator import generate_suite
from podium.envs.swarm.simulator import SwarmSimulator
from podium.envs.swarm.spec import default_pool_path, load_pool
from podium.envs.swarm.state import StateConfig
from podium.envs.swarm.trajectory import task_to_proto
from podium.errors import ArtifactError, ConfigError
from podium.observed import AgentStats
from podium.policy.agent import SwarmAgent
from podium.policy.signing import (
    NO_TRUSTED_KEYS,
    UNSIGNED,
    UNTRUSTED_KEY,
    RefusedAnnouncement,
)
from podium.policy.swarm import LearnedPolicy, save_policy, swarm_policy_updated
from podium.rollout.twins import (
    TwinCase,
    TwinEvaluator,
    TwinPolicy,
    learned_twin,
    rule_twin,
    twin_case,
    twin_policy,
)
from podium.v1 import reward_pb2, trajectory_pb2
from podium.v1 import session_service_pb2 as ss

CPLS = rule_twin("rules:cpls")


async def live_sessions(
    stack_factory: Callable[..., Any], bus: InProcBus, runs: list[tuple[str, int]], **drift: Any
) -> list[trajectory_pb2.Trajectory]:
    """Run each (task text, seed) as a real session (PODIUM_POLICY=cpls, the default)."""
    out = []
    async with stack_factory(bus, workers=1) as stack:
        if drift:  # the worker's true pool, exactly as PODIUM_SUBAGENT_DRIFT[_ORIGIN] build it
            worker = stack.subagents[0]
            worker.true_pool = DriftingPool(worker.pool, drift["schedule"], drift["origin"])
        for text, seed in runs:
            sid = (
                await stack.stub.SubmitTask(
                    ss.SubmitTaskRequest(task_spec_text=text, seed=seed), timeout=5
                )
            ).session_id
            events = [
                e
                async for e in stack.stub.StreamSession(
                    ss.StreamSessionRequest(session_id=sid), timeout=30
                )
            ]
            handle = stack.orchestrator.session(sid)
            assert handle is not None and handle.trajectory is not None
            assert events[-1].result.latency == handle.trajectory.latency
            out.append(handle.trajectory)
    return out


def task_texts() -> list[tuple[str, int]]:
    diamond = (default_tasks_dir_file("diamond-10.yaml"), 9)
    return [(LOGIN_TASK, 5), (LOGIN_TASK, 6), diamond]


def default_tasks_dir_file(name: str) -> str:
    from podium.envs.swarm.spec import default_tasks_dir

    return (default_tasks_dir() / name).read_text()


async def test_a_twin_of_a_live_session_reproduces_its_latency(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    trajectories = await live_sessions(stack_factory, inproc_bus, task_texts())
    cases = [twin_case(t) for t in trajectories]
    assert all(c is not None for c in cases)
    twins = TwinEvaluator(default_pool(), batch=2).run(CPLS, [c for c in cases if c])
    for traj, twin in zip(trajectories, twins, strict=True):
        assert traj.policy_version == "rules:cpls"
        assert twin.session_id == traj.session_id
        assert twin.latency == traj.latency  # bit for bit: same seeds, same decisions
        assert twin.completed == traj.completed and twin.lower_bound == traj.lower_bound
        live_return = sum(d.env_reward for d in traj.decisions)
        assert twin.env_return == pytest.approx(live_return, rel=1e-5)
    # Each twin meets its own session's luck: the two login sessions differ only by seed.
    assert twins[0].latency != twins[1].latency


async def test_a_twin_under_the_true_pool_reproduces_a_drifted_live_session(
    inproc_bus: InProcBus, stack_factory: Callable[..., Any]
) -> None:
    nominal = default_pool()
    schedule = load_drift("slow-specialist")
    runs = [(LOGIN_TASK, 5), (default_tasks_dir_file("microservice-deployment.json"), 3)]
    live = await live_sessions(
        stack_factory, inproc_bus, runs, schedule=schedule, origin=time.time() - 3600
    )
    cases = [c for c in map(twin_case, live) if c is not None]
    drifted = TwinEvaluator(nominal, true_pool=schedule.pool_at(nominal, 3600)).run(CPLS, cases)
    assert [t.latency for t in drifted] == [t.latency for t in live]
    undrifted = TwinEvaluator(nominal).run(CPLS, cases)
    assert all(u.latency < d.latency for u, d in zip(undrifted, drifted, strict=True))


def suite_cases(n: int, seed: int = 0) -> list[TwinCase]:
    tasks = generate_suite(n, seed=seed, sizes=(5, 20))
    return [TwinCase(f"s{i}", t, 1_000_003 * i + 17) for i, t in enumerate(tasks)]


def test_paired_of_a_policy_with_itself_is_zero_and_cpls_beats_sequential() -> None:
    evaluator = TwinEvaluator(default_pool(), batch=16)
    cases = suite_cases(40)
    assert evaluator.paired(CPLS, CPLS, cases) == [0.0] * len(cases)
    diffs = np.array(evaluator.paired(CPLS, rule_twin("rules:sequential"), cases))
    assert diffs.mean() > 0.5 and (diffs > 0).mean() > 0.9
    # Batching changes nothing: one twin at a time gives the same returns.
    one = TwinEvaluator(default_pool(), batch=1)
    assert one.returns(CPLS, cases[:5]) == evaluator.returns(CPLS, cases[:5])


def test_twin_case_refuses_what_cannot_be_twinned() -> None:
    task = default_tasks(default_pool())[0]
    good = trajectory_pb2.Trajectory(
        session_id="s", task=task_to_proto(task), labels={"seed": "42"}
    )
    case = twin_case(good)
    assert case == TwinCase("s", task, 42)
    for seed in ("", "-1", "²", "1e3", " 4", str(1 << 64), "9" * 30):
        bad = trajectory_pb2.Trajectory()
        bad.CopyFrom(good)
        bad.labels["seed"] = seed
        assert twin_case(bad) is None, seed
    no_seed = trajectory_pb2.Trajectory(session_id="s", task=task_to_proto(task))
    assert twin_case(no_seed) is None
    broken = trajectory_pb2.Trajectory()
    broken.CopyFrom(good)
    broken.task.subtasks[0].work = -1.0
    assert twin_case(broken) is None


def test_rule_twins_name_unknown_engines() -> None:
    with pytest.raises(ConfigError, match="unknown policy 'clps'"):
        rule_twin("rules:clps")
    with pytest.raises(ConfigError, match="neither rules:<name> nor a decimal"):
        twin_policy("latest", None, None)
    assert twin_policy("rules:greedy", None, None) == TwinPolicy("rules:greedy", rule="greedy")


# --------------------------------------------------------------------------- learned versions


def publish(root: Path, version: int) -> reward_pb2.PolicyUpdated:
    """A fresh (untrained) network published as ``version`` with its announcement."""
    pool = default_pool()
    env = SwarmEnv(default_tasks(pool)[:1], pool, EnvConfig(max_subtasks=32))
    agent = SwarmAgent(env.layout, d_model=32)
    ref = save_policy(agent.net, root, version, tuple(env.layout.agents), max_subtasks="32")
    return swarm_policy_updated(ref)


def orchestrator_greedy(policy: LearnedPolicy, case: TwinCase, slots: int) -> float:
    """The latency of ``case`` decided one session at a time, as the orchestrator's learned
    sessions decide (greedy, guarded mask), seeded with the session seed."""
    pool = default_pool()
    env = SwarmEnv([case.task], pool, EnvConfig(max_subtasks=slots, invalid_action="raise"))
    env.reset(seed=0, options={"task": case.task})
    env.use_simulator(
        SwarmSimulator(case.task, env.pool, seed=case.seed, config=StateConfig(loop_retry_limit=4))
    )
    while True:
        _, _, terminated, truncated, info = env.step(policy.act(env).action)
        if terminated or truncated:
            return float(info["latency"])


def test_a_signed_learned_version_runs_as_a_twin(tmp_path: Path) -> None:
    keys = key_pair(tmp_path / "keys")
    event = signed(publish(tmp_path / "artifacts", 7), keys)
    twin = twin_policy("7", event, trusted(keys))
    assert twin.version == "7" and twin.max_subtasks == 32 and twin.net is not None
    cases = suite_cases(12, seed=3)
    outcomes = TwinEvaluator(default_pool(), batch=8).run(twin, cases)
    assert len(outcomes) == len(cases) and all(np.isfinite(o.env_return) for o in outcomes)
    # Greedy, as live traffic decides: the lock-step batch agrees with one-at-a-time decisions.
    live_like = LearnedPolicy(twin.net, twin.agents, greedy=True)
    for case, outcome in list(zip(cases, outcomes, strict=True))[:4]:
        assert outcome.latency == orchestrator_greedy(live_like, case, 32)
    # paired() against cpls works across kinds of policy, and with itself is zero.
    evaluator = TwinEvaluator(default_pool())
    assert evaluator.paired(twin, twin, cases[:3]) == [0.0, 0.0, 0.0]
    assert len(evaluator.paired(twin, CPLS, cases[:3])) == 3
    assert learned_twin("7", twin.net, 32).agents == ()


def test_tampered_artifacts_and_bad_signatures_are_refused_with_the_reason(tmp_path: Path) -> None:
    keys, attacker = key_pair(tmp_path / "keys"), key_pair(tmp_path / "attacker")
    event = publish(tmp_path / "artifacts", 3)
    with pytest.raises(RefusedAnnouncement) as unsigned:
        twin_policy("3", event, trusted(keys))
    assert unsigned.value.reason == UNSIGNED
    forged = reward_pb2.PolicyUpdated()
    forged.CopyFrom(event)
    with pytest.raises(RefusedAnnouncement) as untrusted:
        twin_policy("3", signed(forged, attacker), trusted(keys))
    assert untrusted.value.reason == UNTRUSTED_KEY
    genuine = signed(event, keys)
    with pytest.raises(RefusedAnnouncement) as nobody:
        twin_policy("3", genuine, None)
    assert nobody.value.reason == NO_TRUSTED_KEYS
    with pytest.raises(ArtifactError, match="needs its signed PolicyUpdated"):
        twin_policy("3", None, trusted(keys))
    with pytest.raises(ArtifactError, match="not 'swarm_policy' v4"):
        twin_policy("4", genuine, trusted(keys))
    # The weights change after signing: the signed hash no longer matches the file.
    weights = Path(genuine.uri.removeprefix("file://"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256 mismatch") as tampered:
        twin_policy("3", genuine, trusted(keys))
    assert "tampered" in str(tampered.value)


def test_a_version_twins_on_a_pool_it_was_not_trained_on(tmp_path: Path) -> None:
    """Agents are read by features: a version trained on the default pool twins sessions of a
    pool with a renamed agent and one without two of its agents, and keeps the names of its
    training pool for reports."""
    keys = key_pair(tmp_path / "keys")
    twin = twin_policy("7", signed(publish(tmp_path / "a", 7), keys), trusted(keys))
    pool = default_pool()
    assert twin.agents == pool.agent_names()
    renamed = replace(pool.agents[0], name="ui-wizard")
    for other in (
        replace(pool, agents=(renamed, *pool.agents[1:])),
        replace(pool, agents=pool.agents[2:]),  # the generalist still covers every kind
    ):
        outcomes = TwinEvaluator(other).run(twin, suite_cases(3))
        assert len(outcomes) == 3 and all(np.isfinite(o.env_return) for o in outcomes)


def test_twins_read_a_statistics_store_and_never_feed_it(tmp_path: Path) -> None:
    """Twins read the estimates a store holds (as the live sessions read them) but are
    simulations: nothing they do is recorded into it."""
    keys = key_pair(tmp_path / "keys")
    twin = twin_policy("7", signed(publish(tmp_path / "a", 7), keys), trusted(keys))
    store = AgentStats()
    store.record("generalist", "api", 1.0, 40.0, False)  # far worse than advertised
    before = store.to_dict()
    cases = suite_cases(3)
    with_store = TwinEvaluator(default_pool(), stats=store).run(twin, cases)
    assert store.to_dict() == before
    assert len(with_store) == 3 and all(np.isfinite(o.env_return) for o in with_store)
    assert TwinEvaluator(default_pool(), stats=store).run(CPLS, cases)
    assert store.to_dict() == before


# --------------------------------------------------------------------------- observed sub-agents


def drifted_store() -> AgentStats:
    """A store fed the trajectories of cpls sessions run on the sub-agents after the
    ``slow-specialist`` drift (backend runs api at a fifth of its advertised speed), as the
    rollout controller's store is fed by the live sessions it absorbs."""
    nominal = default_pool()
    drifted = load_drift("slow-specialist").pool_at(nominal, 3600)
    live = TwinEvaluator(nominal, true_pool=drifted).trajectories(CPLS, suite_cases(30, seed=11))
    assert all(twin_case(t) is not None for t in live)  # real sessions' shape: task and seed
    store = AgentStats()
    for traj in live:
        store.record_trajectory(traj)
    return store


def test_twins_meet_the_sub_agents_as_the_store_observed_them() -> None:
    nominal = default_pool()
    store = drifted_store()
    api = store.estimate("backend", "api", nominal.agents[1].profile("api"))
    assert api is not None and api.speed < 0.3 and api.confidence > 0.8  # 1.0 advertised
    before = store.to_dict()
    cases = suite_cases(40, seed=4)
    on_nominal = TwinEvaluator(nominal)
    observed = TwinEvaluator(nominal, stats=store)
    uses_backend_api = [
        any(ex.agent == "backend" and ex.kind == "api" for ex in traj.executions)
        for traj in on_nominal.trajectories(CPLS, cases)
    ]
    assert sum(uses_backend_api) >= 20
    cpls_nominal = on_nominal.run(CPLS, cases)
    cpls_observed = observed.run(CPLS, cases)
    for uses, nom, obs in zip(uses_backend_api, cpls_nominal, cpls_observed, strict=True):
        if uses:  # the same luck, backend's api work five times slower
            assert obs.latency > nom.latency, (obs.session_id, obs.latency, nom.latency)
    # cpls-online plans on the store: it routes api work away from backend and wins.
    online = rule_twin("rules:cpls-online")
    diffs = np.array(observed.paired(online, CPLS, cases))
    assert diffs.mean() > 0.3 and (diffs > 0).mean() > 0.6
    # Twins also meet merges at their observed cost, here an estimate of the true 1x from a
    # few dozen merges: a session where cpls-online merges elsewhere may lose a little.
    assert abs(store.merge_factor() - 1.0) < 0.15
    assert diffs.min() > -0.25
    # On the nominal pool without a store, cpls-online is cpls: nothing to tell them apart.
    assert on_nominal.paired(online, CPLS, cases[:5]) == [0.0] * 5
    assert store.to_dict() == before  # twins never feed the store


def test_the_estimate_replaces_a_pool_specs_truth_and_follows_the_store() -> None:
    """Given a store, twins draw from its estimate even when the pool spec carries ``true:``
    profiles (the controller cannot know them); the estimated pool is rebuilt when the store
    changes, and an explicit ``true_pool`` still wins (tests and benches that know the truth)."""
    mis = load_pool(default_pool_path().parent / "misadvertised.yaml")
    assert mis.has_truth
    store = AgentStats()
    evaluator = TwinEvaluator(mis, stats=store)
    first = evaluator.outcome_pool()
    assert first is not None and first.spec == mis.advertised()  # nothing observed yet
    assert evaluator.outcome_pool() is first  # cached while the store is unchanged
    cases = suite_cases(6, seed=2)
    advertised = TwinEvaluator(mis.advertised()).run(CPLS, cases)
    assert [o.latency for o in evaluator.run(CPLS, cases)] == [o.latency for o in advertised]
    store.record("backend", "api", 1.0, 5.0, True)
    second = evaluator.outcome_pool()
    assert second is not first and second is not None
    api = second.profile("backend", "api")
    assert api is not None and api.speed < 1.0
    drifted = load_drift("slow-specialist").pool_at(default_pool(), 3600)
    told = TwinEvaluator(default_pool(), true_pool=drifted, stats=store)
    assert told.outcome_pool() is told.true_pool


def test_a_learned_twin_reads_the_store_through_its_observation(tmp_path: Path) -> None:
    """On the same sub-agents (the nominal pool given as the truth), a learned version decides
    otherwise with the drifted store than without: its observation's estimate columns carry
    what the store observed."""
    keys = key_pair(tmp_path / "keys")
    twin = twin_policy("7", signed(publish(tmp_path / "a", 7), keys), trusted(keys))
    nominal = default_pool()
    cases = suite_cases(10, seed=3)
    blind = TwinEvaluator(nominal, true_pool=nominal).trajectories(twin, cases)
    informed = TwinEvaluator(nominal, true_pool=nominal, stats=drifted_store())
    seeing = informed.trajectories(twin, cases)
    differs = [
        [d.action for d in a.decisions] != [d.action for d in b.decisions]
        for a, b in zip(blind, seeing, strict=True)
    ]
    assert any(differs), "the store changed no decision of the learned twin"
    assert [(t.policy_version, t.session_id) for t in seeing] == [
        ("7", c.session_id) for c in cases
    ]


def test_twins_meet_merges_at_their_observed_cost() -> None:
    """A store that saw merges cost 4x their plan gives twins a world whose merges cost that
    (what the controller knows of them), while every agent keeps its estimated profile."""
    nominal = default_pool()
    store = AgentStats()
    store.record("backend", "api", 2.0, 2.0, True)
    for _ in range(200):
        store.record("backend", "api", 0.3, 1.2, True, merge=True)  # pace 4 vs backend's 1
    outcome = TwinEvaluator(nominal, stats=store).outcome_pool()
    assert outcome is not None
    assert outcome.spec.split_overhead == pytest.approx(nominal.split_overhead * 4, rel=0.05)
    assert outcome.spec.agents == store.estimated_pool(nominal).agents
