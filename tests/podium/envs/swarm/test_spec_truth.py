"""Pool specs whose agents behave otherwise than they advertise (``true:``), with ``drift:``,
and the shipped pools that use them."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from podium.envs.swarm.drift import load_drift
from podium.envs.swarm.spec import (
    KindProfile,
    check_true_pool,
    default_pool,
    default_pool_path,
    default_tasks,
    load_pool,
    parse_pool,
    pool_to_dict,
    read_document,
)
from podium.errors import SpecError

POOLS = default_pool_path().parent
ROOT = Path(__file__).resolve().parents[4]

POOL: dict[str, Any] = {
    "name": "p",
    "agents": [
        {
            "name": "fast",
            "kinds": {"api": {"speed": 2.0, "success": 0.9, "noise": 0.2}},
            "true": {"api": {"success": 0.3}},
        },
        {"name": "slow", "kinds": {"api": {"speed": 1.0, "success": 0.95}}},
        {
            "name": "gen",
            "kinds": {"*": {"speed": 0.5, "success": 0.8, "noise": 0.3}},
            "true": {"*": {"speed": 0.9, "noise": 0.1}},
        },
    ],
}


def _pool(**agent_changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(POOL)
    doc["agents"][0].update(agent_changes)
    return doc


def test_true_profiles_override_only_the_fields_given() -> None:
    pool = parse_pool(POOL)
    assert pool.has_truth and pool.truth is not None
    # The advertisement is what the agents say, untouched.
    assert pool.agents[0].kinds["api"] == KindProfile(2.0, 0.9, 0.2)
    true = pool.true_spec()
    assert true.agents[0].kinds["api"] == KindProfile(2.0, 0.3, 0.2)  # speed, noise advertised
    assert true.agents[1] == pool.agents[1]  # no true: behaves as advertised
    assert true.agents[2].kinds["*"] == KindProfile(0.9, 0.8, 0.1)
    assert true.agent_names() == pool.agent_names() and true.kinds == pool.kinds
    assert not true.has_truth and true.truth is None


def test_advertised_strips_the_truth() -> None:
    pool = parse_pool(POOL)
    adv = pool.advertised()
    assert adv.truth is None and adv.drift is None and not adv.has_truth
    assert adv.agents == pool.agents
    # A pool without truth is its own advertisement and its own truth.
    plain = default_pool()
    assert plain.advertised() is plain and plain.true_spec() is plain and not plain.has_truth


def test_a_true_kind_the_agent_does_not_advertise_is_an_error_naming_it() -> None:
    with pytest.raises(SpecError) as err:
        parse_pool(_pool(true={"db": {"speed": 1.0}}), source="p.yaml")
    msg = str(err.value)
    assert msg.startswith("p.yaml: ") and "'fast'" in msg and "'db'" in msg
    assert "true" in msg


@pytest.mark.parametrize(
    ("true", "needle"),
    [
        ({"api": {"success": 1.5}}, "success must be in [0, 1], got 1.5"),
        ({"api": {"speed": 0}}, "speed must be > 0"),
        ({"api": {"noise": -1}}, "noise must be >= 0"),
        ({"api": {"sped": 1.0}}, "unknown field 'sped'"),
        ({"api": {"speed": "fast"}}, "must be a number"),
        ({}, "true must be a non-empty mapping"),
        ([1], "true must be a non-empty mapping"),
        ({"api": 3}, "must be a mapping"),
    ],
)
def test_bad_true_profiles_are_named(true: Any, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_pool(_pool(true=true), source="p.yaml")
    assert needle in str(err.value) and "agent 'fast'" in str(err.value)


def test_unquoted_yaml_true_key_is_the_field(tmp_path: Path) -> None:
    # YAML 1.1 reads a bare `true:` key as a boolean: it must still mean the field.
    path = tmp_path / "p.yaml"
    path.write_text(
        "agents:\n"
        "  - name: a\n"
        "    kinds: {api: {speed: 1.0, success: 0.9}}\n"
        "    true:\n"
        "      api: {speed: 0.25}\n",
        encoding="utf-8",
    )
    pool = load_pool(path)
    assert pool.true_spec().agents[0].kinds["api"] == KindProfile(0.25, 0.9, 0.0)


def test_drift_by_name_by_relative_path_and_errors(tmp_path: Path) -> None:
    doc = {**read_document(default_pool_path()), "drift": "slow-specialist"}
    assert parse_pool(doc).drift == load_drift("slow-specialist")
    (tmp_path / "mine.yaml").write_text(
        "name: mine\nchanges: [{at_s: 5, agent: qa, speed_factor: 0.5}]\n", encoding="utf-8"
    )
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(
        "agents: [{name: qa, kinds: {test: {speed: 1.0}}}]\ndrift: ./mine.yaml\n", encoding="utf-8"
    )
    pool = load_pool(pool_file)
    assert pool.drift is not None and pool.drift.name == "mine"
    assert pool.advertised().drift is None and pool.true_spec().drift is None
    with pytest.raises(SpecError, match=r"p\.yaml: pool\.drift: unknown drift scenario 'nope'"):
        parse_pool({**doc, "drift": "nope"}, source="p.yaml")
    (tmp_path / "typo.yaml").write_text(
        "name: typo\nchanges: [{at_s: 5, agent: nobody}]\n", encoding="utf-8"
    )
    pool_file.write_text(
        "agents: [{name: qa, kinds: {test: {speed: 1.0}}}]\ndrift: typo.yaml\n", encoding="utf-8"
    )
    with pytest.raises(SpecError, match=r"pool\.yaml: pool\.drift: .*no agent 'nobody'"):
        load_pool(pool_file)


def test_check_true_pool_names_missing_extra_and_uncovered() -> None:
    adv = parse_pool(POOL).advertised()
    renamed = copy.deepcopy(POOL)
    renamed["agents"][1]["name"] = "other"
    with pytest.raises(SpecError) as err:
        check_true_pool(adv, parse_pool(renamed), source="t.yaml")
    assert "missing agents ['slow']" in str(err.value) and "extra agents ['other']" in str(
        err.value
    )
    narrow = copy.deepcopy(POOL)
    narrow["agents"][0]["kinds"] = {"db": {"speed": 1.0}}
    del narrow["agents"][0]["true"]
    with pytest.raises(SpecError, match="agent 'fast' cannot do kind 'api'"):
        check_true_pool(adv, parse_pool(narrow))
    check_true_pool(adv, parse_pool(POOL).true_spec())  # its own truth fits


def test_shipped_misadvertised_pool_is_wrong_in_several_ways() -> None:
    pool = load_pool(POOLS / "misadvertised.yaml")
    default = default_pool()
    assert pool.advertised().agents == default.agents  # advertised exactly as the default
    true = {a.name: a for a in pool.true_spec().agents}
    adv = {a.name: a for a in pool.agents}

    def ets(p: KindProfile | None) -> float:
        assert p is not None
        return p.speed * p.success

    worse = [
        (n, k) for n, a in adv.items() for k, p in a.kinds.items() if ets(true[n].kinds[k]) < ets(p)
    ]
    better = [
        (n, k) for n, a in adv.items() for k, p in a.kinds.items() if ets(true[n].kinds[k]) > ets(p)
    ]
    flakier = [(n, k) for n, k in worse if true[n].kinds[k].success < adv[n].kinds[k].success]
    slower = [(n, k) for n, k in worse if true[n].kinds[k].speed < adv[n].kinds[k].speed]
    assert flakier and slower and better, (flakier, slower, better)
    assert len(default_tasks(pool)) == len(default_tasks())


def test_shipped_unseen_pool_has_other_agents_over_the_library_kinds() -> None:
    pool = load_pool(POOLS / "unseen.yaml")
    assert not set(pool.agent_names()) & set(default_pool().agent_names())
    kinds = {s.kind for t in default_tasks() for s in t.subtasks}
    assert all(pool.can_do(k) for k in kinds)
    # Specialists for the same kinds as the default pool (the rest only the generalist does).
    assert set(pool.kinds) == set(default_pool().kinds)
    assert len(default_tasks(pool)) == len(default_tasks())


def test_a_pools_own_true_merge_cost(tmp_path: Path) -> None:
    """``true: {split_overhead: ...}`` at the pool's level: what merges really cost. Planners
    keep the advertised overhead; the simulator's truth has the true one."""
    path = tmp_path / "p.yaml"
    path.write_text(
        "split_overhead: 0.2\n"
        "true:\n"
        "  split_overhead: 0.9\n"
        "agents:\n"
        "  - name: a\n"
        "    kinds: {api: {speed: 1.0, success: 0.9}}\n",
        encoding="utf-8",
    )
    pool = load_pool(path)
    assert pool.has_truth and pool.truth is None
    assert pool.advertised().split_overhead == 0.2 and not pool.advertised().has_truth
    truth = pool.true_spec()
    assert truth.split_overhead == 0.9 and truth.agents == pool.agents and not truth.has_truth
    shipped = load_pool(ROOT / "bench" / "pools" / "misadvertised-after-costly-merges.yaml")
    assert shipped.advertised().split_overhead == 0.15 and shipped.true_spec().split_overhead == 1.2


@pytest.mark.parametrize(
    ("true", "needle"),
    [
        ({"split_overhead": -0.1}, "pool.true.split_overhead must be >= 0"),
        ({"split_overhead": "x"}, "pool.true.split_overhead must be a number"),
        ({"overhead": 1.0}, "pool.true: unknown field 'overhead' (allowed: split_overhead)"),
        ({}, "pool.true must be a non-empty mapping"),
    ],
)
def test_bad_pool_truths_are_named(true: Any, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_pool({**POOL, "true": true}, source="p.yaml")
    assert str(err.value).startswith("p.yaml: ") and needle in str(err.value)


@pytest.mark.parametrize(
    "path",
    [
        POOLS / "default.yaml",
        POOLS / "misadvertised.yaml",
        POOLS / "unseen.yaml",
        ROOT / "bench" / "pools" / "misadvertised-after-costly-merges.yaml",
    ],
)
def test_a_pool_written_out_reads_back_the_same(path: Path) -> None:
    pool = load_pool(path)
    assert parse_pool(copy.deepcopy(pool_to_dict(pool))) == pool


def test_a_truth_of_a_kind_not_advertised_is_left_out() -> None:
    """A store's estimate of a generalist's kind has no place in ``true:`` (it may only correct
    advertised kinds): written out, it is dropped and the rest reads back."""
    pool = parse_pool(POOL)
    gen = pool.agents[2]
    assert pool.truth is not None
    extra = replace(pool.truth[2], kinds={**pool.truth[2].kinds, "db": KindProfile(3.0, 1.0, 0.0)})
    doc = pool_to_dict(replace(pool, truth=(*pool.truth[:2], extra)))
    assert set(doc["agents"][2]["true"]) == {"*"} and gen.name == "gen"
    assert parse_pool(doc) == pool
