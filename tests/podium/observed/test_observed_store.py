"""The statistics store: blending, decay, the speed estimator's bias, trajectories, files."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import pytest

from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool, default_tasks, make_policy
from podium.envs.swarm.pool import mix64, sample_execution
from podium.envs.swarm.spec import KindProfile, PoolSpec
from podium.envs.swarm.state import MERGE_PART
from podium.envs.swarm.trajectory import episode_trajectory
from podium.errors import ConfigError, DecodeError, ProcessingError
from podium.observed import AgentStats, Estimate
from podium.observed.store import default_split_overhead
from podium.v1 import subtask_pb2

ADVERTISED = KindProfile(speed=1.0, success=0.9, noise=0.3)


def _feed(stats: AgentStats, true: KindProfile, n: int, seed: int, agent: str = "a") -> None:
    """``n`` executions of random work drawn from ``true`` (the simulator's outcome function)."""
    for i in range(n):
        work = 0.5 + (mix64(seed * 1_000_003 + i) % 1000) / 500.0
        out = sample_execution(true, work, mix64(seed * 7_919 + i))
        stats.record(agent, "k", work, out.duration, out.success)


def test_nothing_observed_is_the_advertisement_with_no_confidence() -> None:
    est = AgentStats().estimate("a", "k", ADVERTISED)
    assert est == Estimate(speed=1.0, success=0.9, noise=0.3, confidence=0.0, observations=0.0)
    assert AgentStats().estimate("a", "k", None) is None  # cannot do it: never routed


def test_the_prior_is_worth_prior_weight_executions() -> None:
    stats = AgentStats(prior_weight=4.0, half_life=1e9)
    for _ in range(4):
        stats.record("a", "k", work=2.0, duration=1.0, success=False)  # pace 0.5, all failed
    est = stats.estimate("a", "k", ADVERTISED)
    assert est is not None
    assert est.confidence == pytest.approx(0.5)
    assert est.success == pytest.approx(0.45)  # halfway between 0.9 and 0
    assert 1.0 / est.speed == pytest.approx(0.75)  # halfway between pace 1 and 0.5
    assert est.observations == pytest.approx(4.0)


@pytest.mark.parametrize(
    "true",
    [
        KindProfile(speed=1.6, success=0.55, noise=0.45),
        KindProfile(speed=0.5, success=0.97, noise=0.2),
        KindProfile(speed=2.5, success=0.3, noise=0.8),
    ],
)
def test_estimates_converge_to_the_true_profile(true: KindProfile) -> None:
    """From samples of the simulator's own outcome function, whatever the advertisement."""
    stats = AgentStats(half_life=1e6, prior_weight=5.0)
    _feed(stats, true, 20_000, seed=int(true.speed * 100))
    est = stats.estimate("a", "k", ADVERTISED)
    assert est is not None and est.confidence > 0.999
    assert est.speed == pytest.approx(true.speed, rel=0.03)
    assert est.success == pytest.approx(true.success, abs=0.015)


def test_the_speed_estimator_is_unbiased_where_the_naive_one_is_not() -> None:
    """Mean duration/work estimates 1/speed without bias; mean work/duration overstates the
    speed by e^{σ²}. Over many small independent stores the average estimate of the pace sits
    on 1/speed, and the naive one sits on speed × e^{σ²}."""
    true = KindProfile(speed=1.5, success=1.0, noise=0.6)
    paces, naive = [], []
    for rep in range(400):
        stats = AgentStats(half_life=1e9, prior_weight=1e-9)  # the observations alone
        ratios = []
        for i in range(10):
            work = 1.0 + i % 3
            out = sample_execution(true, work, mix64(rep * 100 + i + 1))
            stats.record("a", "k", work, out.duration, True)
            ratios.append(work / out.duration)
        est = stats.estimate("a", "k", ADVERTISED)
        assert est is not None
        paces.append(1.0 / est.speed)
        naive.append(statistics.fmean(ratios))
    se = statistics.stdev(paces) / math.sqrt(len(paces))
    assert abs(statistics.fmean(paces) - 1.0 / true.speed) < 3 * se
    bias = math.exp(true.noise**2)  # 1.43
    assert statistics.fmean(naive) == pytest.approx(true.speed * bias, rel=0.05)
    assert statistics.fmean(naive) > true.speed * 1.3  # what the store does not do


def test_decay_tracks_a_drift_within_two_half_lives() -> None:
    before = KindProfile(speed=1.0, success=0.95, noise=0.3)
    after = KindProfile(speed=0.5, success=0.5, noise=0.3)
    h = 100
    stats = AgentStats(half_life=h, prior_weight=5.0)
    _feed(stats, before, 10 * h, seed=1)  # saturated on the old behaviour
    est = stats.estimate("a", "k", before)
    assert est is not None and est.success == pytest.approx(0.95, abs=0.03)
    _feed(stats, after, 2 * h, seed=2)
    est = stats.estimate("a", "k", before)
    assert est is not None
    # Three quarters of the old evidence is gone, so the estimates are about 3/4 of the way
    # to the new values (0.62 and pace 1.72 expected): more than half of the way, whatever the
    # luck of these 200 draws.
    assert est.success < 0.95 - 0.5 * 0.45
    assert 1.0 / est.speed > 1.0 + 0.5 * 1.0
    _feed(stats, after, 6 * h, seed=3)
    est = stats.estimate("a", "k", before)
    assert est is not None
    # The decayed evidence is worth ~2.9 h = 290 independent draws: SE 0.03 on the success.
    assert est.success == pytest.approx(0.5, abs=0.1)
    assert est.speed == pytest.approx(0.5, rel=0.08)
    # The effective count saturates at 1 / (1 - 2^(-1/h)) ≈ 1.44 h.
    assert est.observations == pytest.approx(1.0 / (1.0 - 2 ** (-1 / h)), rel=0.01)


def test_decay_is_per_pair() -> None:
    stats = AgentStats(half_life=2.0)
    stats.record("a", "k", 1.0, 1.0, True)
    for _ in range(50):
        stats.record("b", "k", 1.0, 1.0, True)
    assert stats.observed("a", "k") == 1.0  # other pairs' executions age nothing here


@pytest.mark.parametrize(
    ("work", "duration", "named"),
    [
        (0.0, 1.0, "work"),
        (-1.0, 1.0, "work"),
        (math.nan, 1.0, "work"),
        (math.inf, 1.0, "work"),
        (1.0, -0.1, "duration"),
        (1.0, math.inf, "duration"),
        (1.0, math.nan, "duration"),
    ],
)
def test_bad_executions_are_refused_and_nothing_is_recorded(
    work: float, duration: float, named: str
) -> None:
    stats = AgentStats()
    with pytest.raises(ProcessingError, match=named):
        stats.record("a", "k", work, duration, True)
    assert stats.version == 0 and stats.pairs() == []


def test_bad_settings_are_refused() -> None:
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ConfigError, match="half_life"):
            AgentStats(half_life=bad)
        with pytest.raises(ConfigError, match="prior_weight"):
            AgentStats(prior_weight=bad)


def test_version_bumps_on_every_record_and_copies_are_independent() -> None:
    stats = AgentStats()
    stats.record("a", "k", 1.0, 1.0, True)
    stats.record("a", "k", 1.0, 2.0, False)
    assert stats.version == 2
    twin = stats.copy()
    twin.record("a", "k", 1.0, 1.0, True)
    assert stats.version == 2 and stats.observed("a", "k") < twin.observed("a", "k")


def test_to_dict_round_trips_through_json() -> None:
    stats = AgentStats(half_life=50.0, prior_weight=3.0)
    _feed(stats, ADVERTISED, 30, seed=5)
    _feed(stats, ADVERTISED, 7, seed=6, agent="b")
    back = AgentStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert back.to_dict() == stats.to_dict()
    assert back.estimate("a", "k", ADVERTISED) == stats.estimate("a", "k", ADVERTISED)
    assert back.version == stats.version


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (lambda d: d.update(format=99), "format"),
        (lambda d: d.update(half_life=-1), "half_life"),
        (lambda d: d.update(version=-1), "version"),
        (lambda d: d["pairs"][0].update(n="x"), r"pairs\[0\]\.n"),
        (lambda d: d["pairs"][0].update(successes=1e9), "exceed"),
        (lambda d: d["pairs"].append(dict(d["pairs"][0])), "twice"),
    ],
)
def test_from_dict_names_the_problem(mutate: object, named: str) -> None:
    stats = AgentStats()
    stats.record("a", "k", 1.0, 1.0, True)
    data = stats.to_dict()
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=named):
        AgentStats.from_dict(data)


def test_estimated_pool_replaces_every_profile_and_keeps_the_layout() -> None:
    spec = default_pool()
    stats = AgentStats(prior_weight=1.0, half_life=1e9)
    for _ in range(99):
        stats.record("api-fast", "api", 1.0, 2.0, False)  # far slower and flakier than claimed
        stats.record("generalist", "ui", 1.0, 1.0, True)  # a kind it covers only by "*"
    est = stats.estimated_pool(spec)
    assert est.agent_names() == spec.agent_names() and est.kinds == spec.kinds
    fast = est.agents[spec.agent_names().index("api-fast")].kinds["api"]
    assert fast.success == pytest.approx(0.0055, abs=1e-3) and fast.speed < 0.6
    gen = est.agents[spec.agent_names().index("generalist")]
    assert gen.kinds["*"] == spec.agents[-1].kinds["*"]  # unseen kinds: the advertisement
    assert gen.profile("ui") is not None and gen.profile("ui").speed > 0.95  # type: ignore[union-attr]
    untouched = est.agents[spec.agent_names().index("qa")].kinds["test"]
    assert untouched == spec.agents[spec.agent_names().index("qa")].kinds["test"]


def test_estimated_pool_strips_the_truth() -> None:
    spec = default_pool()
    liar = PoolSpec(agents=spec.agents, truth=spec.agents, name="liar", kinds=spec.kinds)
    assert AgentStats().estimated_pool(liar).truth is None


def _episode(policy: str = "cpls", seed: int = 3) -> SwarmEnv:
    env = SwarmEnv(default_tasks(), config=EnvConfig(rule_advice=False))
    env.reset(seed=seed, options={"task": "diamond-10"})
    engine = make_policy(policy)
    done = False
    while not done:
        _, _, term, trunc, _ = env.step(engine.act(env).action)
        done = term or trunc
    return env


def test_record_trajectory_derives_each_executions_work_from_the_task() -> None:
    env = _episode()
    state = env.state
    assert state.splits > 0, "the test needs a split episode (chunks and merges)"
    stats = AgentStats(half_life=1e9)
    n = stats.record_trajectory(
        episode_trajectory(env), split_overhead=state.pool.spec.split_overhead
    )
    finished = [r for r in state.executions if r.success is not None]
    assert n == len(finished)
    direct = AgentStats(half_life=1e9)
    for r in finished:  # the state machine's own unit work: what the sub-agent was given
        direct.record(
            state.pool.agent_names[r.agent],
            state.kind_of(r.slot),
            state.u_work[r.unit],
            r.end - r.start,
            bool(r.success),
            merge=state.u_part[r.unit] == MERGE_PART,
        )
    assert _sums(stats) == _sums(direct)
    assert stats.merges_observed == direct.merges_observed > 0
    assert any(r.unit >= state.num_slots for r in finished)  # chunks and merges were recorded


def _sums(stats: AgentStats) -> dict[tuple[str, str], tuple[float, ...]]:
    return {
        (p["agent"], p["kind"]): tuple(round(p[f], 9) for f in ("n", "successes", "pace"))
        for p in stats.to_dict()["pairs"]
    }


def test_record_trajectory_skips_unfinished_and_refuses_inconsistent_ones() -> None:
    traj = episode_trajectory(_episode())
    assert default_split_overhead() == default_pool().split_overhead
    traj.executions[0].outcome = subtask_pb2.OUTCOME_CANCELLED
    traj.executions[1].outcome = subtask_pb2.OUTCOME_UNSPECIFIED
    stats = AgentStats()
    assert stats.record_trajectory(traj) == len(traj.executions) - 2
    for field, value, named in [
        ("subtask_id", "nope", "no subtask 'nope'"),
        ("end_time", -5.0, "no duration"),
        ("kind", "other", "not its subtask's"),
        ("agent", "", "no agent"),
    ]:
        bad = type(traj)()
        bad.CopyFrom(traj)
        setattr(bad.executions[3], field, value)
        before = stats.to_dict()
        with pytest.raises(DecodeError, match=named):
            stats.record_trajectory(bad)
        assert stats.to_dict() == before  # all or nothing


def test_a_chunk_id_must_fit_its_split_factor() -> None:
    traj = episode_trajectory(_episode())
    chunk = next(e for e in traj.executions if e.split_k > 1 and not e.subtask_id.endswith("merge"))
    chunk.subtask_id = chunk.subtask_id.rsplit("#", 1)[0] + f"#{chunk.split_k}"
    with pytest.raises(DecodeError, match="not a chunk"):
        AgentStats().record_trajectory(traj)


# -- merges: the pool's, kept apart from the agents ---------------------------------------------


def _fed_by_cpls(merge_factor: float, episodes: int = 40) -> AgentStats:
    """A store fed by cpls sessions (it reads no store) on the task library, in a world whose
    merges really cost ``merge_factor`` x the advertised overhead."""
    pool = default_pool()
    truth = replace(pool, split_overhead=pool.split_overhead * merge_factor)
    stats = AgentStats()
    config = EnvConfig(rule_advice=False, feed_stats=True)
    env = SwarmEnv(default_tasks(pool), pool, config, true_pool=truth, stats=stats)
    engine = make_policy("cpls")
    for seed in range(episodes):
        env.reset(seed=seed)
        while True:
            _, _, terminated, truncated, _ = env.step(engine.act(env).action)
            if terminated or truncated:
                break
    return stats


def test_costly_merges_are_estimated_and_leave_the_agents_estimates_alone() -> None:
    """The same sessions in a world whose merges cost 8x: the store estimates the factor from
    the merges (the agents' speeds cancel out), and every agent's estimate is what it is when
    merges cost what the spec says (a merge is never counted as the agent's work)."""
    plain, costly = _fed_by_cpls(1.0), _fed_by_cpls(8.0)
    assert costly.merges_observed > 20 and plain.merges_observed > 20
    assert plain.merge_factor() == pytest.approx(1.0, abs=0.15)
    assert costly.merge_factor() == pytest.approx(8.0, rel=0.2)
    # Longer merges shift a few later decisions, so the sessions are not identical; but no
    # agent looks slower for the merges it did (counted as its work, they would weigh 8x).
    pool = default_pool()
    for agent in pool.agents:
        for kind in plain.pairs():
            if kind[0] != agent.name:
                continue
            before = plain.estimate(agent.name, kind[1], agent.profile(kind[1]))
            after = costly.estimate(agent.name, kind[1], agent.profile(kind[1]))
            assert before is not None and after is not None
            assert after.speed == pytest.approx(before.speed, rel=0.05), kind
    world = costly.estimated_world(pool)
    assert world.split_overhead == pytest.approx(pool.split_overhead * costly.merge_factor())
    assert costly.estimated_pool(pool).split_overhead == pool.split_overhead  # what rules plan on
    assert replace(world, split_overhead=pool.split_overhead) == costly.estimated_pool(pool)


def test_merges_survive_a_copy_and_a_file_and_older_files_have_none() -> None:
    stats = AgentStats()
    stats.record("a", "api", 2.0, 2.0, True)
    stats.record("a", "api", 0.3, 1.5, True, merge=True)  # pace 5 vs the agent's 1
    stats.record("b", "api", 0.3, 9.0, True, merge=True)  # nothing seen of b: says nothing
    assert stats.merges_observed == 1.0
    assert stats.merge_factor() == pytest.approx((5.0 + 5.0) / 6.0)
    for again in (stats.copy(), AgentStats.from_dict(json.loads(json.dumps(stats.to_dict())))):
        assert again.merge_factor() == stats.merge_factor() and again.to_dict() == stats.to_dict()
    older = stats.to_dict()
    del older["merges"]
    assert AgentStats.from_dict(older).merge_factor() == 1.0
    with pytest.raises(ConfigError, match=r"merges\.ratio must be a finite number >= 0"):
        AgentStats.from_dict({**stats.to_dict(), "merges": {"n": 1.0, "ratio": -1.0}})
