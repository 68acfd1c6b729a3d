"""The lower bound of expected latency for a task on a pool.

``max(critical path at best achievable expected durations, total best work / max_parallel)``.
It leaves out ``main_step_cost`` and failures, and E[max] ≥ max E (Jensen) turns the
expected-duration critical path into a bound on the expected makespan, so it is a true lower
bound: no policy's mean latency can be below it. Every benchmark reports latency against it.
"""

from __future__ import annotations

from dataclasses import dataclass

from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import PoolSpec, TaskSpec, check_task_against_pool


@dataclass(frozen=True, slots=True)
class LowerBound:
    """The bound and its two terms."""

    critical_path: float
    """Longest dependency path, each subtask at its best expected duration (best agent, best k)."""
    work: float
    """Σ work / best speed for its kind, divided by max_parallel."""
    max_parallel: int
    """Concurrency cap used (task override, else pool)."""

    @property
    def value(self) -> float:
        """The bound: the larger of the two terms."""
        return max(self.critical_path, self.work)


def effective_max_parallel(task: TaskSpec, pool: PoolSpec) -> int:
    """The task's max_parallel if set, else the pool's."""
    return task.max_parallel if task.max_parallel is not None else pool.max_parallel


def upward_ranks(task: TaskSpec, durations: list[float]) -> list[float]:
    """HEFT upward rank: rank(i) = d(i) + max over dependents j of rank(j).

    ``durations[i]`` is subtask i's duration estimate; subtasks are in task order.
    """
    idx = task.index()
    children: list[list[int]] = [[] for _ in task.subtasks]
    for i, s in enumerate(task.subtasks):
        for d in s.deps:
            children[idx[d]].append(i)
    order = topological_order(task)
    rank = [0.0] * len(task.subtasks)
    for i in reversed(order):
        rank[i] = durations[i] + max((rank[j] for j in children[i]), default=0.0)
    return rank


def topological_order(task: TaskSpec) -> list[int]:
    """Subtask indices in a dependency order (Kahn; ties in file order). Task must be acyclic."""
    idx = task.index()
    indeg = [len(s.deps) for s in task.subtasks]
    children: list[list[int]] = [[] for _ in task.subtasks]
    for i, s in enumerate(task.subtasks):
        for d in s.deps:
            children[idx[d]].append(i)
    ready = [i for i, n in enumerate(indeg) if n == 0]
    out: list[int] = []
    while ready:
        i = ready.pop(0)
        out.append(i)
        for j in children[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return out


def lower_bound(task: TaskSpec, pool: PoolSpec | SubagentPool) -> LowerBound:
    """Compute the bound (raises SpecError if some kind cannot be done by the pool)."""
    sp = pool if isinstance(pool, SubagentPool) else SubagentPool(pool)
    check_task_against_pool(task, sp.spec)
    best = [sp.best_split_duration(s)[0] for s in task.subtasks]
    cp = max(upward_ranks(task, best))
    mp = effective_max_parallel(task, sp.spec)
    total = sum(s.work / sp.best_speed(s.kind) for s in task.subtasks)
    return LowerBound(critical_path=cp, work=total / mp, max_parallel=mp)
