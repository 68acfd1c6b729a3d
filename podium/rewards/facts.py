"""What the reward needs to know about a trajectory, computed once and checked for sanity.

Scoring trusts evidence, not claims: a required subtask counts as *done* only when an execution
of it (or, for a split subtask, of its merge ``<id>#merge``) ended in ``OUTCOME_SUCCESS``. The
``completed`` / ``claimed_success`` flags are claims, compared with this evidence by the
fabricated-result detector.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from podium.errors import ProcessingError
from podium.rewards.config import STAGES, MultiStageConfig
from podium.v1 import subtask_pb2, trajectory_pb2

SUCCESS = subtask_pb2.OUTCOME_SUCCESS
MALFORMED = subtask_pb2.OUTCOME_MALFORMED


class InvalidTrajectoryError(ProcessingError):
    """A trajectory cannot be scored (non-finite times, a cyclic task...). The message names
    the field; the service sends such trajectories to the dead-letter topic."""


def base_subtask_id(subtask_id: str) -> str:
    """``"b#2"`` and ``"b#merge"`` belong to subtask ``"b"``."""
    return subtask_id.split("#", 1)[0]


def is_chunk(subtask_id: str) -> bool:
    """Whether ``subtask_id`` names one chunk of a split (``<id>#<i>``), not a merge."""
    _, sep, tail = subtask_id.partition("#")
    return bool(sep) and tail != "merge"


def duration(ex: trajectory_pb2.Execution) -> float:
    """Simulated time an execution ran."""
    return ex.end_time - ex.start_time


@dataclass(frozen=True, slots=True)
class TrajectoryFacts:
    """Evidence extracted from one trajectory."""

    required: tuple[str, ...]
    """Ids of the task's subtasks, in spec order."""
    deps: Mapping[str, tuple[str, ...]]
    """Dependencies of each required subtask."""
    work: Mapping[str, float]
    """Spec work of each required subtask."""
    stage_of: Mapping[str, str]
    """Stage of each required subtask."""
    done: frozenset[str]
    """Required subtasks with a successful (final) execution."""
    verified_done: frozenset[str]
    """Done subtasks whose completing execution was verified."""
    stable_done: frozenset[str]
    """Done subtasks that never had a failed, malformed or cancelled execution."""
    verifier_present: bool
    """Whether a verifier checked the executions (``Trajectory.verifier_present``)."""
    attempted: frozenset[str]
    """Required subtasks with at least one execution."""
    critical: frozenset[str]
    """Required subtasks on a longest dependency chain by spec work (zero slack)."""
    latency: float
    """Makespan: ``trajectory.latency``, or the executions' span when it is 0."""
    max_parallel: int
    """Concurrency cap (task, else the largest observed in decisions; 0 when unknown)."""


def _finite(where: str, value: float) -> None:
    if not math.isfinite(value):
        raise InvalidTrajectoryError(f"{where}: must be finite, got {value}")


def validate(traj: trajectory_pb2.Trajectory) -> None:
    """Reject trajectories no reward can be computed for, naming the field."""
    _finite("latency", traj.latency)
    _finite("lower_bound", traj.lower_bound)
    if traj.latency < 0:
        raise InvalidTrajectoryError(f"latency: must be >= 0, got {traj.latency}")
    if traj.lower_bound < 0:
        raise InvalidTrajectoryError(f"lower_bound: must be >= 0, got {traj.lower_bound}")
    _finite("test_coverage", traj.test_coverage)
    if traj.test_coverage > 1:
        raise InvalidTrajectoryError(
            f"test_coverage: must be in [0, 1] (negative = not applicable), got {traj.test_coverage}"
        )
    for i, ex in enumerate(traj.executions):
        _finite(f"executions[{i}].start_time", ex.start_time)
        _finite(f"executions[{i}].end_time", ex.end_time)
        if ex.end_time < ex.start_time:
            raise InvalidTrajectoryError(
                f"executions[{i}].end_time: {ex.end_time} is before start_time {ex.start_time}"
            )
    ids: set[str] = set()
    for i, st in enumerate(traj.task.subtasks):
        if not st.id:
            raise InvalidTrajectoryError(f"task.subtasks[{i}].id: empty")
        if st.id in ids:
            raise InvalidTrajectoryError(f"task.subtasks[{i}].id: duplicate id {st.id!r}")
        ids.add(st.id)
        _finite(f"task.subtasks[{i}].work", st.work)
        if st.work < 0:
            raise InvalidTrajectoryError(f"task.subtasks[{i}].work: must be >= 0, got {st.work}")
    for i, st in enumerate(traj.task.subtasks):
        for dep in st.deps:
            if dep not in ids:
                raise InvalidTrajectoryError(f"task.subtasks[{i}].deps: unknown subtask {dep!r}")


def _topological(required: tuple[str, ...], deps: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Kahn's algorithm in spec order (deterministic); raises on a cycle."""
    indegree = {s: len(set(deps[s])) for s in required}
    children: dict[str, list[str]] = {s: [] for s in required}
    for s in required:
        for d in set(deps[s]):
            children[d].append(s)
    order: list[str] = []
    ready = [s for s in required if indegree[s] == 0]
    while ready:
        s = ready.pop(0)
        order.append(s)
        for c in children[s]:
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    if len(order) != len(required):
        cyclic = sorted(s for s in required if indegree[s] > 0)
        raise InvalidTrajectoryError(f"task.subtasks: dependency cycle through {cyclic}")
    return order


def critical_subtasks(
    required: tuple[str, ...], deps: Mapping[str, tuple[str, ...]], work: Mapping[str, float]
) -> frozenset[str]:
    """Subtasks with zero slack on the longest dependency chain (CPM forward/backward pass)."""
    if not required:
        return frozenset()
    order = _topological(required, deps)
    earliest_finish: dict[str, float] = {}
    for s in order:
        earliest_finish[s] = max((earliest_finish[d] for d in deps[s]), default=0.0) + work[s]
    length = max(earliest_finish.values())
    tail: dict[str, float] = {}  # longest chain starting at s, s included
    children: dict[str, list[str]] = {s: [] for s in required}
    for s in required:
        for d in deps[s]:
            children[d].append(s)
    for s in reversed(order):
        tail[s] = work[s] + max((tail[c] for c in children[s]), default=0.0)
    eps = 1e-9 * max(1.0, length)
    return frozenset(s for s in required if earliest_finish[s] - work[s] + tail[s] >= length - eps)


def _stage(kind: str, tags: list[str], cfg: MultiStageConfig) -> str:
    """Stage tag of the executions if any (the first valid one), else by kind."""
    for tag in tags:
        if tag in STAGES:
            return tag
    if kind in cfg.design_kinds:
        return "design"
    if kind in cfg.verify_kinds:
        return "verify"
    return "implement"


def extract_facts(traj: trajectory_pb2.Trajectory, stage_cfg: MultiStageConfig) -> TrajectoryFacts:
    """Validate ``traj`` and gather the evidence every component and detector uses."""
    validate(traj)
    required = tuple(st.id for st in traj.task.subtasks)
    deps = {st.id: tuple(st.deps) for st in traj.task.subtasks}
    work = {st.id: st.work for st in traj.task.subtasks}
    req = set(required)
    done: set[str] = set()
    verified: set[str] = set()
    attempted: set[str] = set()
    tags: dict[str, list[str]] = {s: [] for s in required}
    for ex in traj.executions:
        base = base_subtask_id(ex.subtask_id)
        if base not in req:
            continue
        attempted.add(base)
        if ex.stage:
            tags[base].append(ex.stage)
        # A split subtask is done only through its merge; a chunk's success is partial work.
        if ex.outcome == SUCCESS and not is_chunk(ex.subtask_id):
            done.add(base)
            if ex.verified:
                verified.add(base)
    unstable = {base_subtask_id(ex.subtask_id) for ex in traj.executions if ex.outcome != SUCCESS}
    stage_of = {st.id: _stage(st.kind, tags[st.id], stage_cfg) for st in traj.task.subtasks}
    latency = traj.latency
    if latency <= 0 and traj.executions:
        latency = max(e.end_time for e in traj.executions) - min(
            e.start_time for e in traj.executions
        )
    max_parallel = traj.task.max_parallel or max(
        (d.observation.max_parallel for d in traj.decisions), default=0
    )
    return TrajectoryFacts(
        required=required,
        deps=deps,
        work=work,
        stage_of=stage_of,
        done=frozenset(done),
        verified_done=frozenset(verified),
        stable_done=frozenset(done - unstable),
        verifier_present=traj.verifier_present,
        attempted=frozenset(attempted),
        critical=critical_subtasks(required, deps, work),
        latency=latency,
        max_parallel=max_parallel,
    )
