"""Trajectories that fit the broker's message limit by design.

A session's Trajectory is one Kafka record; the broker refuses records over its
``message.max.bytes`` (1 MiB by default), and a refused trajectory used to crash the session
at its very end, leaving its stream open for ever. :func:`fit_trajectory` trims a trajectory
over the budget, cheapest loss first, and labels what it dropped (``trimmed``):

1. ``tensors``: the recorded observation tensors and action masks of the decisions (by far
   the largest part of a learned session's trajectory). The decisions themselves (actions,
   log-probs, values, rewards, policy versions) stay, so reward_svc scores the session as
   before; the learner cannot rebuild the observations and refuses the trajectory as
   untrainable (its DecodeError names the missing tensors; it is dead-lettered, not retried);
2. ``contexts``: execution contexts (dependency outputs) and tool calls;
3. ``decisions``: the decisions past the longest prefix that fits (the trajectory is then
   also labelled ``truncated``: the episode record is incomplete);
4. ``executions``: likewise for the executions;
5. ``task``: the task's subtask list (only a pathological task spec gets here).

The outcome fields (latency, completed, loop_detected, ids, labels) are never dropped, so
every session still ends with a trajectory and a terminal stream message.
"""

from __future__ import annotations

from collections.abc import Callable

from podium.v1 import trajectory_pb2

TRIMMED_LABEL = "trimmed"
"""Label listing what :func:`fit_trajectory` dropped, comma-separated, in order."""
TRUNCATED_LABEL = "truncated"
"""Label set to ``"true"`` when decisions or executions were dropped."""
_LABEL_HEADROOM = 256
"""Bytes kept free for the labels the trimming itself adds."""

Trim = Callable[[trajectory_pb2.Trajectory, int], None]


def _drop_tensors(traj: trajectory_pb2.Trajectory, limit: int) -> None:
    for d in traj.decisions:
        d.ClearField("observation_tensor")
        d.ClearField("action_mask")


def _drop_contexts(traj: trajectory_pb2.Trajectory, limit: int) -> None:
    for x in traj.executions:
        x.ClearField("context")
        del x.tool_calls[:]


def _encoded(size: int) -> int:
    """Bytes one element of size ``size`` takes in a repeated message field (fields 5 and 6
    of Trajectory: a one-byte tag, the varint length, the element)."""
    length, rest = 1, size
    while rest >= 0x80:
        rest >>= 7
        length += 1
    return 1 + length + size


def _prefix_that_fits(traj: trajectory_pb2.Trajectory, field: str, limit: int) -> None:
    """Keep the longest prefix of the repeated ``field`` with which ``traj`` fits ``limit``."""
    items = getattr(traj, field)
    traj.labels[TRUNCATED_LABEL] = "true"
    sizes = [_encoded(i.ByteSize()) for i in items]
    budget, keep = limit - (traj.ByteSize() - sum(sizes)), 0
    for size in sizes:
        budget -= size
        if budget < 0:
            break
        keep += 1
    del items[keep:]


def _drop_decisions(traj: trajectory_pb2.Trajectory, limit: int) -> None:
    _prefix_that_fits(traj, "decisions", limit)


def _drop_executions(traj: trajectory_pb2.Trajectory, limit: int) -> None:
    _prefix_that_fits(traj, "executions", limit)


def _drop_task(traj: trajectory_pb2.Trajectory, limit: int) -> None:
    del traj.task.subtasks[:]


TRIMS: tuple[tuple[str, Trim], ...] = (
    ("tensors", _drop_tensors),
    ("contexts", _drop_contexts),
    ("decisions", _drop_decisions),
    ("executions", _drop_executions),
    ("task", _drop_task),
)
"""The trims in the order they are tried (cheapest loss first)."""


def fit_trajectory(traj: trajectory_pb2.Trajectory, limit: int) -> trajectory_pb2.Trajectory:
    """``traj`` if its serialised size is at most ``limit`` bytes, else a trimmed copy that is
    (see the module docstring); ``traj`` itself is never modified."""
    if traj.ByteSize() <= limit:
        return traj
    out = trajectory_pb2.Trajectory()
    out.CopyFrom(traj)
    budget = max(limit - _LABEL_HEADROOM, 0)
    done: list[str] = []
    for name, trim in TRIMS:
        trim(out, budget)
        done.append(name)
        if out.ByteSize() <= budget:
            break
    out.labels[TRIMMED_LABEL] = ",".join(done)
    if out.ByteSize() > limit:
        # Only huge labels or ids are left: keep the outcome, nothing else.
        skeleton = trajectory_pb2.Trajectory(
            trajectory_id=out.trajectory_id,
            session_id=out.session_id,
            env=out.env,
            latency=out.latency,
            lower_bound=out.lower_bound,
            completed=out.completed,
            loop_detected=out.loop_detected,
            policy_version=out.policy_version[:256],
        )
        skeleton.labels[TRIMMED_LABEL] = "all"
        skeleton.labels[TRUNCATED_LABEL] = "true"
        return skeleton
    return out
