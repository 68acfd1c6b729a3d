"""The lower bound on hand-computed cases, and that no policy beats it."""

from __future__ import annotations

from typing import Any

import pytest

from podium.envs.swarm.bound import lower_bound, topological_order, upward_ranks
from podium.envs.swarm.spec import parse_pool, parse_task


def _pool(max_parallel: int, **extra: Any) -> Any:
    return parse_pool(
        {
            "max_parallel": max_parallel,
            "split_overhead": 0.25,
            "agents": [
                {"name": "x-fast", "kinds": {"x": {"speed": 2.0, "success": 0.5, "noise": 0.3}}},
                # success 0 never counts as "achievable", however fast.
                {"name": "x-broken", "kinds": {"x": {"speed": 100.0, "success": 0.0}}},
                {"name": "generalist", "kinds": {"*": {"speed": 1.0, "success": 0.8}}},
            ],
            **extra,
        }
    )


TASK = parse_task(
    {
        "name": "hand",
        "subtasks": [
            {"id": "x1", "kind": "x", "work": 4.0},
            {"id": "x2", "kind": "x", "work": 2.0, "deps": ["x1"], "splittable": True},
            {"id": "y", "kind": "y", "work": 3.0},
        ],
    }
)


def test_critical_path_dominates() -> None:
    # x1: 4/2 = 2. x2: k=1 2/2 = 1; k=2 2/(2·2) + 0.25·2/2 = 0.75; k=4 0.25 + 0.25 = 0.5 -> 0.5.
    # y: only the generalist, 3/1 = 3. Path x1 -> x2 = 2.5; y alone = 3 -> critical path 3.
    # Work: (4/2 + 2/2 + 3/1) / 3 = 2.
    b = lower_bound(TASK, _pool(3))
    assert b.critical_path == pytest.approx(3.0)
    assert b.work == pytest.approx(2.0)
    assert b.value == pytest.approx(3.0)
    assert b.max_parallel == 3


def test_work_term_dominates_and_task_override() -> None:
    # max_parallel 1: work = 6 / 1 = 6 > 3.
    b = lower_bound(TASK, _pool(1))
    assert (b.value, b.work, b.max_parallel) == pytest.approx((6.0, 6.0, 1))
    # The task's max_parallel overrides the pool's.
    t = parse_task(
        {
            **{"name": "o", "max_parallel": 2},
            "subtasks": [
                {"id": "a", "kind": "y", "work": 10.0},
                {"id": "b", "kind": "y", "work": 10.0},
            ],
        }
    )
    b2 = lower_bound(t, _pool(8))
    assert (b2.max_parallel, b2.work, b2.critical_path) == pytest.approx((2, 10.0, 10.0))


def test_longer_chain() -> None:
    # x1 -> x2 with x2 not worth splitting when overhead is huge: k=1 is kept.
    t = parse_task(
        {
            "name": "c",
            "subtasks": [
                {"id": "a", "kind": "x", "work": 4.0},
                {"id": "b", "kind": "x", "work": 2.0, "deps": ["a"], "splittable": True},
                {"id": "c", "kind": "y", "work": 1.0, "deps": ["b"]},
            ],
        }
    )
    p = _pool(4)
    p = parse_pool(
        {
            **{"split_overhead": 5.0, "max_parallel": 4},
            "agents": [
                {
                    "name": a.name,
                    "kinds": {
                        k: {"speed": v.speed, "success": v.success, "noise": v.noise}
                        for k, v in a.kinds.items()
                    },
                }
                for a in p.agents
            ],
        }
    )
    b = lower_bound(t, p)
    assert b.critical_path == pytest.approx(2.0 + 1.0 + 1.0)


def test_upward_ranks_and_topological_order() -> None:
    ranks = upward_ranks(TASK, [2.0, 1.0, 3.0])
    assert ranks == [3.0, 1.0, 3.0]
    order = topological_order(TASK)
    assert order.index(0) < order.index(1) and sorted(order) == [0, 1, 2]
