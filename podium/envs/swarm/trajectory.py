"""The one place a swarm session becomes a ``podium.v1.Trajectory`` (what reward_svc scores
and learner_svc trains on), and task specs to and from their protobuf form (what
``TaskSubmitted`` carries).

:func:`episode_trajectory` builds the trajectory of an environment's episode. Whoever ran the
episode adds what only it knows through arguments, never by editing the message afterwards:

* the acting policy's per-decision outputs and, for training, the decisions' tensors
  (:class:`DecisionData`: in-process rollouts and the orchestrator's learned sessions);
* what the bus saw of each execution (:class:`BusOutcomes`: the orchestrator's sessions, whose
  outcomes come from real sub-agent workers; each execution then also records the worker's
  wall-clock span, the executor and its runner);
* ids, labels, wall-clock times, a rollout baseline.

:func:`decision_message` is the same builder for one decision, for whoever streams decisions
as they are made; a trajectory built later from the same episode repeats them exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING

from podium.envs.swarm.actions import FINISH, START, WAIT
from podium.envs.swarm.spec import Subtask, TaskSpec, parse_task, task_to_dict
from podium.envs.swarm.state import ExecutionRecord, SwarmState
from podium.errors import ConfigError
from podium.tokens import count_tokens
from podium.v1 import subtask_pb2, task_pb2, trajectory_pb2

if TYPE_CHECKING:
    from podium.envs.swarm.env import SwarmEnv

ENV_NAME = "swarm"
"""``Trajectory.env`` of swarm sessions."""
ACTIONS_LABEL = "actions"
"""Trajectory label saying how a learned policy chose its actions: :data:`SAMPLED` (an
on-policy sample PPO may train on) or :data:`ARGMAX`."""
SAMPLED = "sampled"
ARGMAX = "argmax"

_ACTION_TYPE = {
    START: trajectory_pb2.ACTION_TYPE_START,
    WAIT: trajectory_pb2.ACTION_TYPE_WAIT,
    FINISH: trajectory_pb2.ACTION_TYPE_FINISH,
}
_OUTCOME = {True: subtask_pb2.OUTCOME_SUCCESS, False: subtask_pb2.OUTCOME_FAILURE}


@dataclass(frozen=True, slots=True)
class DecisionData:
    """What the acting policy (and a recorder, for training) attaches to each decision.

    Every field holds one entry per decision of the episode, or None when not recorded (the
    field then keeps its default: 0, the trajectory's version, empty bytes).
    """

    log_probs: Sequence[float] | None = None
    """log π(a|s) under the acting policy."""
    values: Sequence[float] | None = None
    """V(s) under the acting policy."""
    rewards: Sequence[float] | None = None
    """The environment's step rewards."""
    versions: Sequence[str] | None = None
    """Version of the policy that made each decision (a served policy may change mid-session)."""
    observation_tensors: Sequence[bytes] | None = None
    """``Decision.observation_tensor`` of each decision (wire encoding in trajectory.proto)."""
    action_masks: Sequence[bytes] | None = None
    """``Decision.action_mask`` of each decision."""

    def check(self, decisions: int) -> None:
        """Raise ConfigError naming the first field whose length is not ``decisions``."""
        for f in fields(self):
            seq = getattr(self, f.name)
            if seq is not None and len(seq) != decisions:
                raise ConfigError(f"{f.name} has {len(seq)} entries for {decisions} decisions")


@dataclass(frozen=True, slots=True)
class BusOutcomes:
    """What a session over the bus knows of its executions, by execution number: the
    assignment each was sent with (its public id and exact context) and the result that came
    back (outcome, MALFORMED included; verification; tool calls)."""

    assigned: Mapping[int, subtask_pb2.SubtaskAssigned]
    results: Mapping[int, subtask_pb2.SubtaskResult]


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


_output_tokens = lru_cache(maxsize=1024)(count_tokens)
"""A dependency's output is counted once, not again for every dependent and for the
trajectory (a merge after 16 searches reads all 16: counting was a sixth of a session's
CPU on the wide-search tasks)."""


def execution_context(
    state: SwarmState, unit: int, deps: Sequence[int]
) -> subtask_pb2.ExecutionContext:
    """The isolated context an execution of ``unit`` gets: the unit's own spec (a chunk has
    work/k, a merge split_overhead × work) and its dependencies' outputs, nothing else; its
    size in :func:`~podium.tokens.count_tokens` tokens (at least 1)."""
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
    # What the sub-agent reads, counted as every token budget in Podium is counted.
    tokens = count_tokens(spec.description) + count_tokens(spec.id)
    tokens += sum(_output_tokens(r.output) + count_tokens(r.subtask_id) for r in results)
    return subtask_pb2.ExecutionContext(
        subtask=spec, dependency_results=results, context_tokens=max(1, tokens)
    )


def decision_message(
    env: SwarmEnv,
    step: int,
    *,
    policy_version: str = "",
    log_prob: float = 0.0,
    value: float = 0.0,
    env_reward: float = 0.0,
    observation_tensor: bytes = b"",
    action_mask: bytes = b"",
) -> trajectory_pb2.Decision:
    """Decision ``step`` of ``env``'s episode (from :attr:`SwarmEnv.decisions`) as a message."""
    state, codec = env.state, env.codec
    a, clock, units, ready, running, done, failures, valid = env.decisions[step]
    kind, slot, agent, k = codec.decode(a) if 0 <= a < codec.size else (0, -1, -1, 0)
    action = trajectory_pb2.Action(
        type=_ACTION_TYPE.get(kind, trajectory_pb2.ACTION_TYPE_UNSPECIFIED), index=max(a, 0)
    )
    names = state.pool.agent_names
    if kind == START and slot < state.num_slots and agent < len(names):
        action.subtask_id = state.task.subtasks[slot].id
        action.agent = names[agent]
        action.split_k = k
    return trajectory_pb2.Decision(
        step=step,
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
        log_prob=log_prob,
        value=value,
        action_mask_size=codec.size,
        valid_actions=valid,
        policy_version=policy_version,
        env_reward=env_reward,
        observation_tensor=observation_tensor,
        action_mask=action_mask,
    )


def _decision_messages(
    env: SwarmEnv, data: DecisionData, policy_version: str
) -> list[trajectory_pb2.Decision]:
    """Every decision of the episode, with ``data``'s entry for each."""
    out = []
    for i in range(len(env.decisions)):
        out.append(
            decision_message(
                env,
                i,
                policy_version=policy_version if data.versions is None else data.versions[i],
                log_prob=0.0 if data.log_probs is None else data.log_probs[i],
                value=0.0 if data.values is None else data.values[i],
                env_reward=0.0 if data.rewards is None else data.rewards[i],
                observation_tensor=(
                    b"" if data.observation_tensors is None else data.observation_tensors[i]
                ),
                action_mask=b"" if data.action_masks is None else data.action_masks[i],
            )
        )
    return out


def execution_message(
    state: SwarmState, rec: ExecutionRecord, trajectory_id: str, bus: BusOutcomes | None = None
) -> trajectory_pb2.Execution:
    """One execution as the trajectory records it (as the bus saw it, when ``bus`` is given:
    the public id and context sent, the result's outcome, tool calls, wall span, executor and
    runner)."""
    end = rec.end if rec.success is not None else state.clock
    ex = trajectory_pb2.Execution(
        execution_id=f"{trajectory_id}-{rec.id}",
        subtask_id=state.unit_id(rec.unit),
        agent=state.pool.agent_names[rec.agent],
        kind=state.kind_of(rec.slot),
        start_time=rec.start,
        # Still running when the episode ended (loop, give-up): cancelled at the end.
        end_time=end,
        outcome=_OUTCOME[rec.success] if rec.success is not None else subtask_pb2.OUTCOME_CANCELLED,
        context=execution_context(state, rec.unit, rec.context_units),
        attempt=rec.attempt,
        split_k=rec.split_k,
    )
    if bus is None:
        return ex
    assigned = bus.assigned.get(rec.id)
    if assigned is not None:
        # What was really sent: the public execution id and the context on the wire.
        ex.execution_id = assigned.execution_id
        ex.context.CopyFrom(assigned.context)
    result = bus.results.get(rec.id)
    if result is not None and rec.success is not None:
        ex.outcome = result.outcome
        ex.verified = result.verified
        ex.tool_calls.extend(result.tool_calls)
        # Who really ran it and when, beside the simulated clock the policy schedules on.
        ex.wall_start, ex.wall_end = result.wall_start, result.wall_end
        ex.executor, ex.runner = result.executor, result.runner
    return ex


def episode_trajectory(
    env: SwarmEnv,
    *,
    policy_version: str = "",
    trajectory_id: str = "",
    session_id: str = "",
    labels: Mapping[str, str] | None = None,
    data: DecisionData | None = None,
    bus: BusOutcomes | None = None,
    truncated: bool = False,
    started_at: datetime | None = None,
    ended_at: datetime | None = None,
    baseline: trajectory_pb2.RolloutBaseline | None = None,
    reviews: Sequence[trajectory_pb2.ReviewRecord] = (),
    review_wait_s: float = 0.0,
) -> trajectory_pb2.Trajectory:
    """The current (usually finished) episode of ``env`` as a ``Trajectory``: the pool's agent
    names (``agents``, the action layout's agent axis), every decision and every execution
    with its context, plus what the caller knows (see the module doc).

    ``trajectory_id`` defaults to a fresh uuid and ``session_id`` to it; ``truncated`` marks a
    session cut off by a decision limit, which the trajectory records as a loop (it did not
    end by itself). ``reviews`` and ``review_wait_s`` are the human reviews of its sensitive
    subtasks and the wall-clock seconds they were waited for (the orchestrator's review gate).
    Raises ConfigError when ``data`` does not hold one entry per decision.
    """
    data = data or DecisionData()
    data.check(len(env.decisions))
    state = env.state
    tid = trajectory_id or uuid.uuid4().hex
    traj = trajectory_pb2.Trajectory(
        trajectory_id=tid,
        session_id=session_id or tid,
        env=ENV_NAME,
        task=task_to_proto(state.task),
        latency=state.clock,
        lower_bound=env.bound.value,
        completed=state.all_done,
        loop_detected=state.loop_detected or truncated,
        policy_version=policy_version,
        claimed_success=state.all_done,
        test_coverage=-1.0,
        labels=dict(labels or {}),
        # The agent axis of the decisions' tensors and START indices: a learner mixing pools
        # needs it to decode them (podium.policy.decisions).
        agents=list(env.pool.agent_names),
        decisions=_decision_messages(env, data, policy_version),
        executions=[execution_message(state, rec, tid, bus) for rec in state.executions],
        baseline=baseline,
        reviews=reviews,
        review_wait_s=review_wait_s,
    )
    if started_at is not None:
        traj.started_at.FromDatetime(started_at)
    if ended_at is not None:
        traj.ended_at.FromDatetime(ended_at)
    return traj


__all__ = [
    "ENV_NAME",
    "BusOutcomes",
    "DecisionData",
    "decision_message",
    "episode_trajectory",
    "execution_context",
    "execution_message",
    "task_from_proto",
    "task_to_dict",
    "task_to_proto",
]
