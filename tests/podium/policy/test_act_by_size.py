"""Decisions cut into forward passes by task size decide exactly as one padded pass."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from podium.envs.swarm import EnvConfig, SwarmEnv, TaskSpec, default_pool
from podium.envs.swarm.generator import generate_task
from podium.policy import rollout
from podium.policy.agent import ActResult, SwarmAgent, act_by_size, size_buckets
from podium.policy.rollout import Job, run_episodes

MAX = 40


def _tasks() -> list[TaskSpec]:
    """Tasks of very different sizes: one pass over all of them pays for 40 slots per row."""
    shapes = (("chain", 5, 1), ("fanout", 40, 2), ("diamond", 6, 3), ("layered", 35, 4))
    return [generate_task(shape, n, seed) for shape, n, seed in shapes]


def _cost(passes: list[list[int]], sizes: list[int], overhead: int) -> int:
    return sum(overhead + len(p) * max(sizes[r] for r in p) for p in passes)


def _brute_force(sizes: list[int], overhead: int) -> int:
    """The cheapest cut of the rows (sorted by size) into consecutive runs, by enumeration."""
    order = sorted(range(len(sizes)), key=lambda r: sizes[r])
    best = None
    for cuts in itertools.product((False, True), repeat=len(sizes) - 1):
        passes, cur = [], [order[0]]
        for r, cut in zip(order[1:], cuts, strict=True):
            if cut:
                passes.append(cur)
                cur = []
            cur.append(r)
        passes.append(cur)
        cost = _cost(passes, sizes, overhead)
        best = cost if best is None else min(best, cost)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(6))
def test_size_buckets_is_the_cheapest_cut(seed: int) -> None:
    """Every row lands in exactly one pass, a pass never splits one size, and the passes cost
    what the cheapest grouping of rows by size costs (checked by enumeration)."""
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(1, 61, size=9)]
    overhead = int(rng.integers(0, 200))
    passes = size_buckets(sizes, overhead)
    assert sorted(r for p in passes for r in p) == list(range(len(sizes)))
    for p in passes:
        assert p == sorted(p)
    spans = [(min(sizes[r] for r in p), max(sizes[r] for r in p)) for p in passes]
    assert all(hi < lo for (_, hi), (lo, _) in itertools.pairwise(spans))
    assert _cost(passes, sizes, overhead) == _brute_force(sizes, overhead)


def test_size_buckets_edges() -> None:
    """No overhead: one pass per size; a huge one: one pass; bad input is named."""
    assert size_buckets([5, 60, 5, 30], overhead=0) == [[0, 2], [3], [1]]
    assert size_buckets([5, 60, 5, 30], overhead=10_000) == [[0, 1, 2, 3]]
    assert size_buckets([]) == []
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        size_buckets([3, 0])


def _batch(seed: int) -> tuple[SwarmAgent, np.ndarray, np.ndarray, list[int]]:
    """Observations of 8 sessions part-way through tasks of 5 to 40 subtasks."""
    tasks = _tasks()
    envs = SwarmEnv.replicas(8, tasks, default_pool(), EnvConfig(max_subtasks=MAX))
    torch.manual_seed(seed)
    agent = SwarmAgent(envs[0].layout, d_model=32, layers=1)
    obs, masks, sizes = [], [], []
    for i, env in enumerate(envs):
        task = tasks[i % len(tasks)]
        o, _ = env.reset(seed=seed + i, options={"task": task})
        for _ in range(i % 3):  # some sessions a few decisions in
            o, *_ = env.step(int(np.flatnonzero(env.action_masks())[0]))
        obs.append(o)
        masks.append(env.action_masks())
        sizes.append(len(task.subtasks))
    return agent, np.stack(obs), np.stack(masks), sizes


def _same(got: ActResult, want: ActResult) -> None:
    np.testing.assert_array_equal(got.actions, want.actions)
    np.testing.assert_allclose(got.log_probs, want.log_probs, atol=1e-5)
    np.testing.assert_allclose(got.values, want.values, atol=1e-5)


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_act_by_size_decides_as_one_padded_pass(greedy: bool, seed: int) -> None:
    """Cut into passes by size (more than one here), the batch gets the same actions (the
    same generator draws), log-probs and values as one pass padded to its largest task."""
    agent, obs, masks, sizes = _batch(seed)
    assert len(size_buckets(sizes)) > 1
    whole = agent.act(
        obs, masks, max(sizes), greedy=greedy, generator=torch.Generator().manual_seed(seed)
    )
    cut = act_by_size(
        agent, obs, masks, sizes, greedy=greedy, generator=torch.Generator().manual_seed(seed)
    )
    _same(cut, whole)
    # Every chosen action is valid in the session's own mask (nothing leaked from padding).
    assert all(masks[i, a] for i, a in enumerate(cut.actions))


def test_act_by_size_refuses_mismatched_sizes() -> None:
    agent, obs, masks, sizes = _batch(0)
    with pytest.raises(ValueError, match="8 observations but 7 sizes"):
        act_by_size(agent, obs, masks, sizes[:7])


def test_run_episodes_samples_as_with_one_padded_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole sampled sessions in lock-step: the size-cut decisions give the same actions,
    log-probs and latencies as the same run deciding with one padded pass per step."""
    tasks = _tasks()
    config = EnvConfig(max_subtasks=MAX, invalid_action="raise")
    torch.manual_seed(5)
    agent = SwarmAgent(SwarmEnv(tasks, default_pool(), config).layout, d_model=32, layers=1)
    jobs = [Job(t, seed) for seed in (11, 12) for t in tasks]

    def sessions() -> list[tuple[list[int], np.ndarray, float]]:
        envs = SwarmEnv.replicas(len(jobs), tasks, default_pool(), config)
        eps, _ = run_episodes(envs, jobs, agent=agent, generator=torch.Generator().manual_seed(7))
        return [(list(e.actions), e.log_probs, float(e.info["latency"])) for e in eps]

    passes: list[int] = []
    real = act_by_size

    def counting(*args: object, **kwargs: object) -> ActResult:
        passes.append(len(size_buckets(args[3])))  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rollout, "act_by_size", counting)
    cut = sessions()
    assert max(passes) > 1  # the size cut did happen

    def one_pass(
        agent: SwarmAgent,
        obs: np.ndarray,
        masks: np.ndarray,
        sizes: list[int],
        *,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> ActResult:
        return agent.act(obs, masks, max(sizes), greedy=greedy, generator=generator)

    monkeypatch.setattr(rollout, "act_by_size", one_pass)
    padded = sessions()
    for (a1, lp1, lat1), (a2, lp2, lat2) in zip(cut, padded, strict=True):
        assert a1 == a2
        np.testing.assert_allclose(lp1, lp2, atol=1e-5)
        assert lat1 == lat2
