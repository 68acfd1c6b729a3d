"""Episodes of the swarm environment as the learner sees them, and their wire form.

An :class:`Episode` holds, per decision, the observation trimmed to the task's own subtasks
(padding slots carry nothing), the action mask, the action, its log-probability and value under
the acting policy and the environment's reward. The orchestrator records the same data in each
``Decision`` of the ``Trajectory`` it publishes (``observation_tensor``, ``action_mask``), so
the learner can train on a trajectory that travelled through Kafka and reward_svc exactly as on
one collected in process. :func:`episode_to_decisions` and :func:`episode_from_trajectory` are
that encoding; nothing is pickled.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from podium.errors import DecodeError
from podium.v1 import trajectory_pb2


@dataclass(slots=True)
class Episode:
    """One session's decisions, trimmed to its ``n`` subtasks (time-major, length T)."""

    n: int
    """Subtasks of the task (slots used)."""
    slots: NDArray[np.float32]
    """Per-slot features ``[T, n, F]``."""
    globals_: NDArray[np.float32]
    """Global features incl. the running table ``[T, G]``."""
    masks: NDArray[np.bool_]
    """Valid actions in the trimmed layout ``[T, n·A·3 + 2]``."""
    actions: NDArray[np.int64]
    """Actions in the trimmed layout ``[T]``."""
    log_probs: NDArray[np.float32]
    """log π(a|s) of the acting policy ``[T]``."""
    values: NDArray[np.float32]
    """V(s) of the acting policy ``[T]``."""
    rewards: NDArray[np.float32]
    """Environment rewards ``[T]`` (−Δclock / bound, penalties)."""
    terminated: bool
    """Whether the episode ended in a terminal state (complete or loop) rather than a time limit."""
    info: dict[str, Any] = field(default_factory=dict)
    """The environment's final info (latency, lower_bound, completed, ...)."""
    policy_version: int = 0
    """Version of the policy that acted."""
    teacher: NDArray[np.int64] | None = None
    """What a rule engine would have done in each visited state (trimmed layout), when the
    episode was labelled for DAgger; behaviour cloning trains on these instead of ``actions``."""

    @property
    def length(self) -> int:
        """Number of decisions T."""
        return int(self.actions.shape[0])


def _pack_floats(a: NDArray[np.float32]) -> bytes:
    # Observations are mostly zeros and one-hots: zlib shrinks them ~5x on the wire.
    return zlib.compress(np.ascontiguousarray(a, dtype="<f4").tobytes(), 1)


def _unpack_floats(data: bytes, count: int, what: str) -> NDArray[np.float32]:
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise DecodeError(
            f"{what}: observation_tensor is not zlib-compressed float32 ({exc})"
        ) from exc
    if len(raw) != 4 * count:
        raise DecodeError(
            f"{what}: observation_tensor holds {len(raw) // 4} floats, expected {count}"
        )
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def episode_to_decisions(ep: Episode, traj: trajectory_pb2.Trajectory) -> None:
    """Write the episode's tensors into the decisions of ``traj`` (same length, same order)."""
    if len(traj.decisions) != ep.length:
        raise DecodeError(
            f"trajectory {traj.trajectory_id} has {len(traj.decisions)} decisions, episode {ep.length}"
        )
    for t, d in enumerate(traj.decisions):
        d.observation_tensor = _pack_floats(
            np.concatenate([ep.slots[t].reshape(-1), ep.globals_[t]])
        )
        d.action_mask = np.packbits(ep.masks[t]).tobytes()
        d.log_prob = float(ep.log_probs[t])
        d.value = float(ep.values[t])
        d.env_reward = float(ep.rewards[t])


def episode_from_trajectory(
    traj: trajectory_pb2.Trajectory, slot_features: int, global_features: int, num_agents: int
) -> Episode:
    """Rebuild the learner's :class:`Episode` from a trajectory written by the orchestrator."""
    what = f"trajectory {traj.trajectory_id}"
    n = len(traj.task.subtasks)
    T = len(traj.decisions)
    if T == 0 or n == 0:
        raise DecodeError(f"{what}: no decisions or no subtasks to train on")
    per = n * slot_features + global_features
    n_actions = n * num_agents * 3 + 2
    # START indices are the same in the padded and the trimmed layout (slot-major); WAIT and
    # FINISH sit right after the task's own slots in the trimmed layout.
    actions = []
    for t, d in enumerate(traj.decisions):
        kind = d.action.type
        if kind == trajectory_pb2.ACTION_TYPE_START:
            actions.append(int(d.action.index))
        elif kind == trajectory_pb2.ACTION_TYPE_WAIT:
            actions.append(n_actions - 2)
        elif kind == trajectory_pb2.ACTION_TYPE_FINISH:
            actions.append(n_actions - 1)
        else:
            raise DecodeError(f"{what} decision {t}: action type {kind} cannot be trained on")
    slots = np.empty((T, n, slot_features), dtype=np.float32)
    globals_ = np.empty((T, global_features), dtype=np.float32)
    masks = np.empty((T, n_actions), dtype=bool)
    for t, d in enumerate(traj.decisions):
        flat = _unpack_floats(d.observation_tensor, per, f"{what} decision {t}")
        slots[t] = flat[: n * slot_features].reshape(n, slot_features)
        globals_[t] = flat[n * slot_features :]
        bits = np.unpackbits(np.frombuffer(d.action_mask, dtype=np.uint8))
        if bits.shape[0] < n_actions:
            raise DecodeError(f"{what} decision {t}: action_mask too short")
        masks[t] = bits[:n_actions].astype(bool)
    acts = np.asarray(actions, dtype=np.int64)
    if acts.max() >= n_actions:
        raise DecodeError(f"{what}: an action addresses a slot past the task's {n} subtasks")
    if not masks[np.arange(T), acts].all():
        raise DecodeError(f"{what}: an action is outside its recorded mask")
    return Episode(
        n=n,
        slots=slots,
        globals_=globals_,
        masks=masks,
        actions=acts,
        log_probs=np.array([d.log_prob for d in traj.decisions], dtype=np.float32),
        values=np.array([d.value for d in traj.decisions], dtype=np.float32),
        rewards=np.array([d.env_reward for d in traj.decisions], dtype=np.float32),
        terminated=traj.completed or traj.loop_detected,
        info={
            "latency": traj.latency,
            "lower_bound": traj.lower_bound,
            "completed": traj.completed,
            "loop_detected": traj.loop_detected,
            "task": traj.task.name,
        },
        policy_version=int(traj.policy_version or 0),
    )
