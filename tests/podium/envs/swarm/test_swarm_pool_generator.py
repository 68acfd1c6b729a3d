"""The sub-agent pool's pure sampling function and the task generator."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from podium.envs.swarm.generator import SHAPES, generate_suite, generate_task, held_out_split
from podium.envs.swarm.pool import SubagentPool, splitmix64_uniforms
from podium.envs.swarm.spec import default_pool, parse_pool
from podium.errors import ConfigError, SpecError

POOL = SubagentPool(
    parse_pool(
        {
            "agents": [
                {"name": "a", "kinds": {"x": {"speed": 2.0, "success": 0.7, "noise": 0.5}}},
                {"name": "det", "kinds": {"*": {"speed": 0.5, "success": 1.0, "noise": 0.0}}},
            ]
        }
    )
)


def test_sample_is_a_pure_function_of_its_arguments() -> None:
    assert POOL.sample("a", "x", 3.0, 42) == POOL.sample(0, "x", 3.0, 42)
    assert POOL.sample("a", "x", 3.0, 42) != POOL.sample("a", "x", 3.0, 43)
    assert POOL.sample("det", "y", 3.0, 1).duration == 6.0  # noise 0: exactly work / speed
    assert POOL.sample("det", "y", 3.0, 1).success


def test_sample_statistics_match_profile() -> None:
    draws = [POOL.sample("a", "x", 3.0, s) for s in range(20_000)]
    mean = statistics.fmean(d.duration for d in draws)
    assert mean == pytest.approx(3.0 / 2.0, rel=0.03)  # mean-one lognormal factor
    logs = [math.log(d.duration / 1.5) for d in draws]
    assert statistics.pstdev(logs) == pytest.approx(0.5, rel=0.03)
    assert statistics.fmean(d.success for d in draws) == pytest.approx(0.7, abs=0.015)


def test_splitmix_uniforms_in_range_and_reference_values() -> None:
    us = [u for s in range(1000) for u in splitmix64_uniforms(s)]
    assert all(0.0 <= u < 1.0 for u in us)
    # First SplitMix64 output for seed 0 is 0xE220A8397B1DCDAF (Vigna's reference).
    assert splitmix64_uniforms(0)[0] == (0xE220A8397B1DCDAF >> 11) / 2**53


def test_sample_rejects_impossible_work() -> None:
    with pytest.raises(SpecError, match="agent 'a' cannot do kind 'y'"):
        POOL.sample("a", "y", 1.0, 0)
    with pytest.raises(SpecError, match="work must be > 0"):
        POOL.sample("a", "x", 0.0, 0)
    assert POOL.sample("a", "x", 1.0, random.Random(3)) == POOL.sample(
        "a", "x", 1.0, random.Random(3)
    )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", [2, 5, 30, 60])
def test_generated_tasks_are_valid_and_sized(shape: str, n: int) -> None:
    t = generate_task(shape, n, 3)
    assert len(t.subtasks) == n
    assert t == generate_task(shape, n, 3)
    ids = [s.id for s in t.subtasks]
    for i, s in enumerate(t.subtasks):
        assert all(ids.index(d) < i for d in s.deps)  # generated in topological order
    if shape == "chain":
        assert all(s.deps == (ids[i - 1],) for i, s in enumerate(t.subtasks) if i)


def test_suite_is_seeded_and_split_is_stable() -> None:
    a = generate_suite(30, seed=5, sizes=(5, 20))
    assert a == generate_suite(30, seed=5, sizes=(5, 20))
    assert a != generate_suite(30, seed=6, sizes=(5, 20))
    assert all(5 <= len(t.subtasks) <= 20 for t in a)
    assert len({t.name for t in a}) == 30
    train, held = held_out_split(a, 0.3)
    assert train and held and len(train) + len(held) == 30
    # Adding tasks never moves an existing one across the split.
    train2, held2 = held_out_split([*a, *generate_suite(10, seed=9)], 0.3)
    assert {t.name for t in held} <= {t.name for t in held2}
    assert {t.name for t in train} <= {t.name for t in train2}
    default_kinds = set(default_pool().kinds)
    assert {s.kind for t in a for s in t.subtasks} <= default_kinds


def test_generator_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="unknown shape 'star'"):
        generate_task("star", 5, 0)
    with pytest.raises(ConfigError, match="at least 2 subtasks"):
        generate_task("chain", 1, 0)
    with pytest.raises(ConfigError, match="sizes must satisfy"):
        generate_suite(3, 0, sizes=(10, 5))
    with pytest.raises(ConfigError, match="fraction"):
        held_out_split([], 1.5)


def test_extra_kinds_are_mixed_in_at_their_rate_and_change_nothing_when_off() -> None:
    from podium.envs.swarm.generator import DEFAULT_KINDS, GENERALIST_ONLY_KINDS

    plain = generate_suite(40, seed=3, sizes=(10, 30))
    assert plain == generate_suite(40, seed=3, sizes=(10, 30), extra_kinds=(), extra_kind_p=0.5)
    mixed = generate_suite(
        40, seed=3, sizes=(10, 30), extra_kinds=GENERALIST_ONLY_KINDS, extra_kind_p=0.2
    )
    kinds = [s.kind for t in mixed for s in t.subtasks]
    share = sum(k in GENERALIST_ONLY_KINDS for k in kinds) / len(kinds)
    assert 0.15 < share < 0.25, share
    assert set(kinds) <= set(DEFAULT_KINDS) | set(GENERALIST_ONLY_KINDS)
    # The default pool covers those kinds with its generalist alone.
    pool = SubagentPool(default_pool())
    for kind in GENERALIST_ONLY_KINDS:
        able = [a for a in range(pool.num_agents) if pool.can_do(a, kind)]
        assert able == [pool.generalist()], kind
