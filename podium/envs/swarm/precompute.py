"""Per-task constants an environment computes once and reads at every step.

The lower bound (the reward's unit), the best expected durations and upward ranks (static
observation columns) and the agent-capability mask (static part of the action mask) depend
only on the task and the pool. Computing them is the expensive part of setting an environment
up (the bound's critical path), so :class:`~podium.envs.swarm.env.SwarmEnv` does it once per
task and its replicas and clones share the result (read-only after construction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.actions import SPLIT_CHOICES
from podium.envs.swarm.bound import LowerBound, lower_bound, upward_ranks
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import TaskSpec


@dataclass(frozen=True, slots=True)
class TaskStatic:
    """What an environment needs of a task beyond its spec, computed once."""

    bound: LowerBound
    """Lower bound of the task's expected latency."""
    best: list[float]
    """Per subtask: best expected duration (best agent, best split)."""
    ranks: list[float]
    """Per subtask: upward rank on the least expected time to success."""
    can: NDArray[np.bool_]
    """``[n, A, 3]``: START(slot, agent, k) is possible at all (agent can do the kind; k > 1
    only for a splittable subtask)."""
    splittable: list[float]
    """Per subtask: 1.0 if splittable."""
    sensitive: list[float]
    """Per subtask: 1.0 if sensitive (human review)."""


def precompute_task(task: TaskSpec, pool: SubagentPool) -> TaskStatic:
    """The :class:`TaskStatic` of ``task`` on ``pool``."""
    bound = lower_bound(task, pool)
    best = [pool.best_split_duration(s)[0] for s in task.subtasks]
    # Upward rank on the least expected time to *success* (retries included), the priority the
    # cpls rule engine schedules by: the policy sees the critical path as it really is with
    # unreliable agents, and cloning cpls needs no guess about its ordering.
    ets = [
        min(pool.expected_time_to_success(a, s.kind, s.work) for a in range(pool.num_agents))
        for s in task.subtasks
    ]
    ranks = upward_ranks(task, ets)
    can = np.zeros((len(task.subtasks), pool.num_agents, SPLIT_CHOICES), dtype=bool)
    for i, s in enumerate(task.subtasks):
        for a in range(pool.num_agents):
            if pool.can_do(a, s.kind):
                can[i, a, 0] = True
                can[i, a, 1:] = s.splittable
    return TaskStatic(
        bound=bound,
        best=best,
        ranks=ranks,
        can=can,
        splittable=[1.0 if s.splittable else 0.0 for s in task.subtasks],
        sensitive=[1.0 if s.sensitive else 0.0 for s in task.subtasks],
    )
