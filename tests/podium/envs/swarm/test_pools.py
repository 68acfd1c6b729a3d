"""Pool variants: renamed, reshaped, perturbed pools whose hidden true profiles are wrong in
different ways (slower, flakier, better than advertised), deterministic given the seed, and
covering every kind the base covers."""

from __future__ import annotations

import pytest

from podium.envs.swarm import SwarmEnv, default_pool, default_tasks
from podium.envs.swarm.pools import (
    MIN_TRUE_SUCCESS,
    WRONG_WAYS,
    Deviation,
    deviations,
    pool_variants,
)
from podium.envs.swarm.spec import WILDCARD_KIND, AgentSpec, KindProfile, PoolSpec, parse_pool
from podium.errors import ConfigError


def _covered(pool: PoolSpec) -> set[str]:
    return {k for a in pool.agents for k, p in a.kinds.items() if p.success > 0}


def test_same_seed_same_variants_and_a_variant_depends_only_on_its_index() -> None:
    base = default_pool()
    first = pool_variants(base, 4, seed=7)
    assert first == pool_variants(base, 4, seed=7)
    assert pool_variants(base, 2, seed=7) == first[:2]
    assert pool_variants(base, 4, seed=8) != first
    assert pool_variants(base, 0, seed=7) == []
    with pytest.raises(ConfigError, match=">= 0"):
        pool_variants(base, -1, seed=7)


@pytest.mark.parametrize("seed", range(8))
def test_every_kind_the_base_covers_stays_covered_advertised_and_true(seed: int) -> None:
    base = default_pool()
    for variant in pool_variants(base, 6, seed):
        assert _covered(variant) >= _covered(base)  # the wildcard "*" included
        assert _covered(variant.true_spec()) >= _covered(base)
        assert variant.kinds == base.kinds
        for kind in (*base.kinds, "state"):  # "state": only the generalist covers it
            assert variant.can_do(kind) and variant.true_spec().can_do(kind)
        for task in default_tasks(base):
            SwarmEnv(task, variant.advertised(), true_pool=variant.true_spec())


def test_variants_are_renamed_and_differ_in_size_and_advertisement() -> None:
    base = default_pool()
    variants = pool_variants(base, 8, seed=0)
    base_names = set(base.agent_names())
    for i, v in enumerate(variants, start=1):
        assert v.name == f"default-v{i}"
        assert not base_names & set(v.agent_names())
        assert len(set(v.agent_names())) == len(v.agents)
        assert [a.name for a in v.true_spec().agents] == list(v.agent_names())
        assert v.max_parallel == base.max_parallel
    # The agent count varies (one redundant agent dropped, a near-copy added), so a mixed
    # suite exercises the agent axis as a free dimension.
    assert len({len(v.agents) for v in variants}) > 1
    advertised = {
        tuple(sorted((k, p.speed) for a in v.agents for k, p in a.kinds.items())) for v in variants
    }
    assert len(advertised) == len(variants)


@pytest.mark.parametrize("seed", range(5))
def test_each_variant_is_wrong_in_every_way_and_the_variants_differ_in_where(seed: int) -> None:
    variants = pool_variants(default_pool(), 5, seed)
    where: set[tuple[str, ...]] = set()
    for v in variants:
        assert v.has_truth
        dev = deviations(v)
        for way in WRONG_WAYS:
            assert way in dev.values(), (v.name, way)
        where.add(tuple(d.value for d in dev.values()))
        truth = {a.name: a for a in v.true_spec().agents}
        for adv in v.agents:
            true = truth[adv.name]
            assert set(true.kinds) == set(adv.kinds)
            for kind, a in adv.kinds.items():
                t = true.kinds[kind]
                if dev[adv.name] is Deviation.SLOWER:
                    assert 0.44 * a.speed <= t.speed < 0.76 * a.speed
                    assert t.success == a.success
                elif dev[adv.name] is Deviation.FLAKIER:
                    assert t.speed == a.speed
                    assert min(a.success, MIN_TRUE_SUCCESS) <= t.success <= a.success
                    assert t.noise >= a.noise
                elif dev[adv.name] is Deviation.BETTER:
                    assert t.speed > 1.24 * a.speed and t.success >= a.success
                else:
                    assert t == a
    assert len(where) == len(variants)


def test_the_base_truth_is_not_inherited_and_a_tiny_pool_keeps_its_only_agent() -> None:
    """A variant's truth is drawn around its own advertisement; an agent no other covers is
    never dropped (a one-agent pool keeps it, and may only gain a copy)."""
    solo = PoolSpec(
        agents=(AgentSpec("only", {WILDCARD_KIND: KindProfile(1.0, 0.9, 0.2)}),),
        name="solo",
    )
    for v in pool_variants(solo, 10, seed=3):
        assert 1 <= len(v.agents) <= 2
        assert WILDCARD_KIND in _covered(v) and WILDCARD_KIND in _covered(v.true_spec())
    lying = parse_pool(
        {
            "name": "lying",
            "agents": [
                {
                    "name": "a",
                    "kinds": {"ui": {"speed": 1.0}},
                    "true": {"ui": {"speed": 0.1}},
                },
                {"name": "b", "kinds": {"api": {"speed": 1.0}}},
            ],
        }
    )
    honest = PoolSpec(agents=lying.agents, name="lying", kinds=lying.kinds)
    assert pool_variants(lying, 3, seed=1) == pool_variants(honest, 3, seed=1)
