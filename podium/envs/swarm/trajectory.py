"""Turn a swarm episode into a ``podium.v1.Trajectory`` (what reward_svc scores) and convert
task specs to and from their protobuf form (what ``TaskSubmitted`` carries)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from podium.envs.swarm.simulator.env import FINISH, START, WAIT, ActionCodec, SwarmEnv
from podium.envs.swarm.spec import Subtask, TaskSpec, parse_task, task_to_dict
from podium.envs.swarm.state import SwarmState
from podium.errors import ConfigError
from podium.v1 import subtask_pb2, task_pb2, trajectory_pb2

_ACTION_TYPE = {
    START: trajectory_pb2.ACTION_TYPE_START,
    WAIT: trajectory_pb2.ACTION_TYPE_WAIT,
    FINISH: trajectory_pb2.ACTION_TYPE_FINISH,
}

Decision = tuple[int, float, int, int, int, int, int, int]
"""(action, clock, units, ready, running, done, failures, valid actions) — SwarmEnv.decisions."""


def subtask_to_proto(s: Subtask) -> task_pb2.SubtaskSpec:
    """A :class:`Subtask` as ``podium.v1.SubtaskSpec``."""
    return task_pb2.SubtaskSpec(
        id=s.id,
        kind=s.kind,
        work=s.work,
        deps=list(s.deps),
        splittable=s.splittable,
        sensitive=s.sensitive,
        description=s.description,
    )


def task_to_proto(task: TaskSpec) -> task_pb2.TaskSpec:
    """A :class:`TaskSpec` as ``podium.v1.TaskSpec`` (max_parallel 0 = the pool's)."""
    return task_pb2.TaskSpec(
        name=task.name,
        max_parallel=task.max_parallel or 0,
        subtasks=[subtask_to_proto(s) for s in task.subtasks],
    )


def task_from_proto(msg: task_pb2.TaskSpec) -> TaskSpec:
    """Validate a ``podium.v1.TaskSpec`` exactly as a file would be (raises SpecError)."""
    data: dict[str, object] = {
        "name": msg.name,
        "subtasks": [
            {
                "id": s.id,
                "kind": s.kind,
                "work": s.work,
                "deps": list(s.deps),
                "splittable": s.splittable,
                "sensitive": s.sensitive,
                "description": s.description,
            }
            for s in msg.subtasks
        ],
    }
    if msg.max_parallel:
        data["max_parallel"] = msg.max_parallel
    return parse_task(data, source=f"TaskSpec {msg.name!r}")


def execution_context(
    state: SwarmState, unit: int, deps: Sequence[int]
) -> subtask_pb2.ExecutionContext:
    """The isolated context an execution of ``unit`` gets: the unit's own spec (a chunk has
    work/k, a merge split_overhead × work) and its dependencies' outputs, nothing else."""
    slot = state.u_slot[unit]
    base = state.task.subtasks[slot]
    spec = task_pb2.SubtaskSpec(
        id=state.unit_id(unit),
        kind=base.kind,
        work=state.u_work[unit],
        sensitive=base.sensitive,
        description=base.description,
    )
    results = [
        subtask_pb2.DependencyResult(subtask_id=state.unit_id(u), output=state.output_of(u))
        for u in deps
    ]
    # Rough token count (4 characters per token) of what the sub-agent reads.
    chars = (
        len(spec.description)
        + len(spec.id)
        + sum(len(r.output) + len(r.subtask_id) for r in results)
    )
    return subtask_pb2.ExecutionContext(
        subtask=spec, dependency_results=results, context_tokens=max(1, chars // 4)
    )


def build_trajectory(
    state: SwarmState,
    decisions: Sequence[Decision],
    codec: ActionCodec,
    *,
    lower_bound: float,
    policy_version: str = "",
    log_probs: Sequence[float] | None = None,
    values: Sequence[float] | None = None,
    rewards: Sequence[float] | None = None,
    trajectory_id: str = "",
    session_id: str = "",
    labels: Mapping[str, str] | None = None,
) -> trajectory_pb2.Trajectory:
    """A ``Trajectory`` of a session: every decision and every execution with its context."""
    n = len(decisions)
    for name, seq in (("log_probs", log_probs), ("values", values), ("rewards", rewards)):
        if seq is not None and len(seq) != n:
            raise ConfigError(f"{name} has {len(seq)} entries for {n} decisions")
    tid = trajectory_id or uuid.uuid4().hex
    traj = trajectory_pb2.Trajectory(
        trajectory_id=tid,
        session_id=session_id or tid,
        env="swarm",
        task=task_to_proto(state.task),
        latency=state.clock,
        lower_bound=lower_bound,
        completed=state.all_done,
        loop_detected=state.loop_detected,
        policy_version=policy_version,
        claimed_success=state.all_done,
        test_coverage=-1.0,
        labels=dict(labels or {}),
    )
    names = state.pool.agent_names
    for i, (a, clock, units, ready, running, done, failures, valid) in enumerate(decisions):
        kind, slot, agent, k = codec.decode(a) if 0 <= a < codec.size else (0, -1, -1, 0)
        action = trajectory_pb2.Action(
            type=_ACTION_TYPE.get(kind, trajectory_pb2.ACTION_TYPE_UNSPECIFIED), index=max(a, 0)
        )
        if kind == START and slot < state.num_slots and agent < len(names):
            action.subtask_id = state.task.subtasks[slot].id
            action.agent = names[agent]
            action.split_k = k
        traj.decisions.append(
            trajectory_pb2.Decision(
                step=i,
                observation=trajectory_pb2.ObservationSummary(
                    clock=clock,
                    num_subtasks=units,
                    ready=ready,
                    running=running,
                    done=done,
                    failed=failures,
                    max_parallel=state.max_parallel,
                ),
                action=action,
                log_prob=log_probs[i] if log_probs is not None else 0.0,
                value=values[i] if values is not None else 0.0,
                action_mask_size=codec.size,
                valid_actions=valid,
                policy_version=policy_version,
                env_reward=rewards[i] if rewards is not None else 0.0,
            )
        )
    outcome = {True: subtask_pb2.OUTCOME_SUCCESS, False: subtask_pb2.OUTCOME_FAILURE}
    for rec in state.executions:
        traj.executions.append(
            trajectory_pb2.Execution(
                execution_id=f"{tid}-{rec.id}",
                subtask_id=state.unit_id(rec.unit),
                agent=names[rec.agent],
                kind=state.kind_of(rec.slot),
                start_time=rec.start,
                # Still running when the episode ended (loop, give-up): cancelled at the end.
                end_time=rec.end if rec.success is not None else state.clock,
                outcome=outcome[rec.success]
                if rec.success is not None
                else subtask_pb2.OUTCOME_CANCELLED,
                context=execution_context(state, rec.unit, rec.context_units),
                attempt=rec.attempt,
                split_k=rec.split_k,
            )
        )
    return traj


def episode_trajectory(
    env: SwarmEnv,
    *,
    policy_version: str = "",
    log_probs: Sequence[float] | None = None,
    values: Sequence[float] | None = None,
    rewards: Sequence[float] | None = None,
    trajectory_id: str = "",
    session_id: str = "",
    labels: Mapping[str, str] | None = None,
) -> trajectory_pb2.Trajectory:
    """The current (usually finished) episode of ``env`` as a ``Trajectory``."""
    return build_trajectory(
        env.state,
        env.decisions,
        env.codec,
        lower_bound=env.bound.value,
        policy_version=policy_version,
        log_probs=log_probs,
        values=values,
        rewards=rewards,
        trajectory_id=trajectory_id,
        session_id=session_id,
        labels=labels,
    )


__all__ = [
    "build_trajectory",
    "episode_trajectory",
    "execution_context",
    "task_from_proto",
    "task_to_dict",
    "task_to_proto",
]
