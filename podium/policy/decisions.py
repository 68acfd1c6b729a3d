"""Episodes of the swarm environment as the learner sees them, and their wire form.

An :class:`Episode` holds, per decision, the observation trimmed to the task's own subtasks
(padding slots carry nothing) — slot rows, global token and (slot, agent) pair rows —, the
pool's agent names (the agent axis), the action mask, the action, its log-probability and value
under the acting policy and the environment's reward. :class:`EpisodeRecorder` collects one
while a session runs (the in-process rollouts and the orchestrator's learned sessions both use
it, so they record exactly the same thing), and the ``Decision`` messages of the session's
``Trajectory`` carry the same tensors (``observation_tensor``, ``action_mask``), so the learner
can train on a trajectory that travelled through Kafka and reward_svc exactly as on one
collected in process. Nothing is pickled.

The wire encoding is documented on ``podium.v1.Decision`` in
``protos/podium/v1/trajectory.proto``; the functions below are its only implementation:

* ``observation_tensor`` (:func:`encode_observation`): zlib (RFC 1950) of the observation's
  values as little-endian float32. For a swarm task of ``n`` subtasks on a pool of ``A``
  agents (:func:`encode_swarm_observation`) the values are the task's ``n`` slot rows,
  row-major (``n × F``), then the global token (the globals, then the running table: ``G'``),
  then the task's pair rows (``n × A × P``, slot-major, then agent), i.e. the environment's
  observation without its padding slots. ``F`` and ``P`` are pool-independent constants of
  :mod:`podium.envs.swarm.observation`; ``A`` is the length of ``Trajectory.agents`` (the
  agents' names in action order; when empty, the decoder's configured pool);
* ``action_mask`` (:func:`encode_mask`): one bit per action, packed 8 per byte, the first
  action in the most significant bit of the first byte (``numpy.packbits``), the last byte
  padded with zeros. For a swarm task, the mask of the task's own action layout (``n·A·3``
  START entries, then WAIT, then FINISH: ``n·A·3 + 2`` bits).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.actions import ActionCodec
from podium.envs.swarm.observation import PAIR_FEATURES, ObservationLayout
from podium.envs.swarm.trajectory import DecisionData
from podium.errors import DecodeError
from podium.policy.versions import policy_version_number
from podium.v1 import trajectory_pb2


@dataclass(slots=True)
class Episode:
    """One session's decisions, trimmed to its ``n`` subtasks (time-major, length T)."""

    n: int
    """Subtasks of the task (slots used)."""
    slots: NDArray[np.float32]
    """Per-slot features ``[T, n, F]``."""
    globals_: NDArray[np.float32]
    """Global features incl. the running table ``[T, G']``."""
    pairs: NDArray[np.float32]
    """Per-(slot, agent) features ``[T, n, A, P]``."""
    agents: tuple[str, ...]
    """The pool's agent names in action order (A); empty when the episode was decoded from a
    trajectory that did not name them and the caller gave only their number."""
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

    @property
    def num_agents(self) -> int:
        """Agents A of the episode's pool (the pair rows' and START indices' agent axis)."""
        return int(self.pairs.shape[2])


# ------------------------------------------------------------------------------ wire encoding


def encode_observation(values: NDArray[np.float32]) -> bytes:
    """``Decision.observation_tensor`` of an observation (flattened in C order)."""
    # Observations are mostly zeros and one-hots: zlib shrinks them ~5x on the wire.
    return zlib.compress(np.ascontiguousarray(values, dtype="<f4").tobytes(), 1)


def decode_observation(data: bytes, count: int, what: str) -> NDArray[np.float32]:
    """The ``count`` float32 values of an ``observation_tensor`` (flat); DecodeError naming
    ``what`` if it is not that, or if a value is not finite.

    The bytes come off the bus: decompression stops one byte past what ``count`` floats need
    (a small record must not inflate into gigabytes), and a NaN or infinity is refused (one
    in a batch turns every trained weight into NaN).
    """
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(data, 4 * count + 1)
    except zlib.error as exc:
        raise DecodeError(
            f"{what}: observation_tensor is not zlib-compressed float32 ({exc})"
        ) from exc
    if len(raw) > 4 * count or inflate.unconsumed_tail:
        raise DecodeError(f"{what}: observation_tensor holds more than the {count} floats expected")
    if not inflate.eof:
        raise DecodeError(f"{what}: observation_tensor is a truncated zlib stream")
    if inflate.unused_data:
        raise DecodeError(f"{what}: observation_tensor has bytes after its zlib stream")
    if len(raw) != 4 * count:
        raise DecodeError(
            f"{what}: observation_tensor holds {len(raw) // 4} floats, expected {count}"
        )
    values = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not np.isfinite(values).all():
        raise DecodeError(f"{what}: observation_tensor holds a non-finite value (NaN or inf)")
    return values


def encode_swarm_observation(
    slots: NDArray[np.float32], global_token: NDArray[np.float32], pairs: NDArray[np.float32]
) -> bytes:
    """A swarm observation's ``observation_tensor``: slot rows ``[n, F]``, then the global
    token ``[G']``, then the pair rows ``[n, A, P]``."""
    return encode_observation(
        np.concatenate([slots.reshape(-1), global_token.reshape(-1), pairs.reshape(-1)])
    )


def decode_swarm_observation(
    data: bytes,
    n: int,
    num_agents: int,
    slot_features: int,
    global_features: int,
    what: str,
    pair_features: int = PAIR_FEATURES,
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
    """(slot rows ``[n, F]``, global token ``[G']``, pair rows ``[n, A, P]``) of a swarm
    ``observation_tensor`` of ``n`` subtasks on ``num_agents`` agents; DecodeError naming
    ``what`` when it does not hold exactly that many values."""
    slot_end = n * slot_features
    token_end = slot_end + global_features
    flat = decode_observation(data, token_end + n * num_agents * pair_features, what)
    return (
        flat[:slot_end].reshape(n, slot_features),
        flat[slot_end:token_end],
        flat[token_end:].reshape(n, num_agents, pair_features),
    )


def encode_mask(mask: NDArray[np.bool_]) -> bytes:
    """``Decision.action_mask`` of a mask in the task's own action layout."""
    return np.packbits(mask).tobytes()


def decode_mask(data: bytes, size: int, what: str) -> NDArray[np.bool_]:
    """The ``size`` entries of an ``action_mask``; DecodeError naming ``what`` if too short."""
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    if bits.shape[0] < size:
        raise DecodeError(f"{what}: action_mask too short")
    mask: NDArray[np.bool_] = bits[:size].astype(bool)
    return mask


# ------------------------------------------------------------------------------ recording


class EpisodeRecorder:
    """Collects one session's decisions in the learner's form (:class:`Episode`).

    Everything is stored in the task's own layout: the observation's first ``n`` slot rows, its
    global token and its first ``n`` slots' pair rows (:meth:`ObservationLayout.trim`), the
    mask and the actions translated from the environment's ``S`` slots to the task's ``n``
    (:meth:`ActionCodec.translate`).
    """

    def __init__(self, layout: ObservationLayout, codec: ActionCodec, n: int) -> None:
        self.layout = layout
        self.codec = codec
        """The environment's action layout."""
        self.n = n
        self.task_codec = codec.with_slots(n)
        """The task's own action layout (what everything is recorded in)."""
        self.slots: list[NDArray[np.float32]] = []
        self.globals_: list[NDArray[np.float32]] = []
        self.pairs: list[NDArray[np.float32]] = []
        self.masks: list[NDArray[np.bool_]] = []
        self.actions: list[int] = []
        self.log_probs: list[float] = []
        self.values: list[float] = []
        self.rewards: list[float] = []
        self.teacher: list[int] = []

    def __len__(self) -> int:
        """Decisions recorded."""
        return len(self.actions)

    def record(
        self,
        obs: NDArray[np.float32],
        mask: NDArray[np.bool_],
        action: int,
        log_prob: float = 0.0,
        value: float = 0.0,
        teacher: int | None = None,
    ) -> None:
        """One decision: the environment's observation and (guarded) mask it was made on, the
        action (environment layout), the acting policy's outputs and a DAgger label."""
        slots, global_token, pairs = self.layout.trim(obs, self.n)
        self.slots.append(slots)
        self.globals_.append(global_token)
        self.pairs.append(pairs)
        self.masks.append(self.codec.translate_mask(mask, self.task_codec))
        self.actions.append(self.codec.translate(action, self.task_codec))
        if teacher is not None:
            self.teacher.append(self.codec.translate(teacher, self.task_codec))
        self.log_probs.append(float(log_prob))
        self.values.append(float(value))

    def reward(self, reward: float) -> None:
        """The environment's reward for the last decision."""
        self.rewards.append(float(reward))

    def episode(
        self, *, terminated: bool, info: dict[str, Any] | None = None, policy_version: int = 0
    ) -> Episode:
        """The recorded decisions as an :class:`Episode` (rewards as recorded)."""
        return Episode(
            n=self.n,
            slots=np.stack(self.slots),
            globals_=np.stack(self.globals_),
            pairs=np.stack(self.pairs),
            agents=self.layout.agents,
            masks=np.stack(self.masks),
            actions=np.asarray(self.actions, dtype=np.int64),
            log_probs=np.asarray(self.log_probs, dtype=np.float32),
            values=np.asarray(self.values, dtype=np.float32),
            rewards=np.asarray(self.rewards, dtype=np.float32),
            terminated=terminated,
            info=dict(info or {}),
            policy_version=policy_version,
            teacher=np.asarray(self.teacher, dtype=np.int64) if self.teacher else None,
        )

    def decision_data(self, rewards: Sequence[float] | None = None) -> DecisionData:
        """The recorded decisions as a trajectory carries them: exactly
        ``decision_data(self.episode(...))``, without building the episode. ``rewards``
        replaces the recorded rewards (a recorder inside a policy never sees them)."""
        return DecisionData(
            log_probs=_as_float32(self.log_probs),
            values=_as_float32(self.values),
            rewards=_as_float32(self.rewards if rewards is None else rewards),
            observation_tensors=[
                encode_swarm_observation(s, g, p)
                for s, g, p in zip(self.slots, self.globals_, self.pairs, strict=True)
            ],
            action_masks=[encode_mask(m) for m in self.masks],
        )


# ------------------------------------------------------------------------------ trajectories


def _as_float32(values: Sequence[float] | NDArray[np.float32]) -> list[float]:
    """Values as the learner holds them (float32, like an :class:`Episode`'s arrays), so a
    trajectory says exactly what an in-process episode of the same session says."""
    return [float(x) for x in np.asarray(values, dtype=np.float32)]


def decision_data(ep: Episode) -> DecisionData:
    """The episode's per-decision data as a trajectory records it (for
    :func:`podium.envs.swarm.trajectory.episode_trajectory`): the acting policy's outputs, the
    environment's rewards and the training tensors."""
    return DecisionData(
        log_probs=_as_float32(ep.log_probs),
        values=_as_float32(ep.values),
        rewards=_as_float32(ep.rewards),
        observation_tensors=[
            encode_swarm_observation(ep.slots[t], ep.globals_[t], ep.pairs[t])
            for t in range(ep.length)
        ],
        action_masks=[encode_mask(ep.masks[t]) for t in range(ep.length)],
    )


def episode_to_decisions(ep: Episode, traj: trajectory_pb2.Trajectory) -> None:
    """Write the episode's tensors into the decisions of ``traj`` (same length, same order).

    For a trajectory built elsewhere; one built from the episode's environment gets the same
    through ``episode_trajectory(env, data=decision_data(ep))``.
    """
    if len(traj.decisions) != ep.length:
        raise DecodeError(
            f"trajectory {traj.trajectory_id} has {len(traj.decisions)} decisions, episode {ep.length}"
        )
    if ep.agents:
        if traj.agents and tuple(traj.agents) != ep.agents:
            raise DecodeError(
                f"trajectory {traj.trajectory_id} names agents {list(traj.agents)}, the episode "
                f"{list(ep.agents)}"
            )
        traj.agents[:] = ep.agents
    data = decision_data(ep)
    assert data.observation_tensors is not None and data.action_masks is not None
    assert data.log_probs is not None and data.values is not None and data.rewards is not None
    for t, d in enumerate(traj.decisions):
        d.observation_tensor = data.observation_tensors[t]
        d.action_mask = data.action_masks[t]
        d.log_prob = data.log_probs[t]
        d.value = data.values[t]
        d.env_reward = data.rewards[t]


def _trimmed_actions(traj: trajectory_pb2.Trajectory, codec: ActionCodec, what: str) -> list[int]:
    """Each decision's action in the task's own layout ``codec``: a START's index is the same
    in every layout (slot-major); WAIT and FINISH are the layout's own."""
    actions = []
    for t, d in enumerate(traj.decisions):
        kind = d.action.type
        if kind == trajectory_pb2.ACTION_TYPE_START:
            actions.append(int(d.action.index))
        elif kind == trajectory_pb2.ACTION_TYPE_WAIT:
            actions.append(codec.wait)
        elif kind == trajectory_pb2.ACTION_TYPE_FINISH:
            actions.append(codec.finish)
        else:
            raise DecodeError(f"{what} decision {t}: action type {kind} cannot be trained on")
    return actions


def trajectory_agents(
    traj: trajectory_pb2.Trajectory, agents: Sequence[str] | int, what: str
) -> tuple[tuple[str, ...], int]:
    """(names, A) of the pool a trajectory's tensors were recorded on: its own
    ``Trajectory.agents``, or, when it names none (written before pools were mixed), the
    caller's ``agents`` (the configured pool's names, or just their number). DecodeError when
    the names repeat or nothing says how many agents there are."""
    if traj.agents:
        names = tuple(traj.agents)
        if len(set(names)) != len(names) or not all(names):
            raise DecodeError(f"{what}: agents {list(names)} are not distinct non-empty names")
        return names, len(names)
    names = () if isinstance(agents, int) else tuple(agents)
    count = agents if isinstance(agents, int) else len(names)
    if count < 1:
        raise DecodeError(f"{what}: names no agents and the caller's pool has none")
    return names, count


def _check_start_agents(
    traj: trajectory_pb2.Trajectory, names: tuple[str, ...], codec: ActionCodec, what: str
) -> None:
    """DecodeError when a START's agent name is not the agent its index addresses (the
    trajectory's tensors and actions would then be read in another pool's agent order)."""
    if not names:
        return
    for t, d in enumerate(traj.decisions):
        a = d.action
        if a.type != trajectory_pb2.ACTION_TYPE_START or not a.agent or a.index >= codec.wait:
            continue
        agent = codec.decode(int(a.index))[2]
        if names[agent] != a.agent:
            raise DecodeError(
                f"{what} decision {t}: action {a.index} addresses agent {names[agent]!r} of "
                f"agents {list(names)}, but names {a.agent!r}"
            )


def episode_from_trajectory(
    traj: trajectory_pb2.Trajectory,
    slot_features: int,
    global_features: int,
    agents: Sequence[str] | int,
) -> Episode:
    """Rebuild the learner's :class:`Episode` from a trajectory written by the orchestrator.

    ``global_features`` is the width of the global token
    (:attr:`ObservationLayout.global_token_features`). The agent axis A is the trajectory's
    own (``Trajectory.agents``); ``agents`` (the caller's configured pool: names, or their
    number) stands in for a trajectory that names none. DecodeError naming the problem for
    anything that does not fit (tensor sizes, masks, actions, agent names).
    """
    what = f"trajectory {traj.trajectory_id}"
    n = len(traj.task.subtasks)
    T = len(traj.decisions)
    if T == 0 or n == 0:
        raise DecodeError(f"{what}: no decisions or no subtasks to train on")
    names, A = trajectory_agents(traj, agents, what)
    codec = ActionCodec(n, A)
    actions = _trimmed_actions(traj, codec, what)
    slots = np.empty((T, n, slot_features), dtype=np.float32)
    globals_ = np.empty((T, global_features), dtype=np.float32)
    pairs = np.empty((T, n, A, PAIR_FEATURES), dtype=np.float32)
    masks = np.empty((T, codec.size), dtype=bool)
    for t, d in enumerate(traj.decisions):
        where = f"{what} decision {t}"
        slots[t], globals_[t], pairs[t] = decode_swarm_observation(
            d.observation_tensor, n, A, slot_features, global_features, where
        )
        masks[t] = decode_mask(d.action_mask, codec.size, where)
    acts = np.asarray(actions, dtype=np.int64)
    if acts.max() >= codec.size:
        raise DecodeError(
            f"{what}: an action addresses a slot past the task's {n} subtasks on {A} agents"
        )
    _check_start_agents(traj, names, codec, what)
    if not masks[np.arange(T), acts].all():
        raise DecodeError(f"{what}: an action is outside its recorded mask")
    return Episode(
        n=n,
        slots=slots,
        globals_=globals_,
        pairs=pairs,
        agents=names,
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
        policy_version=policy_version_number(traj.policy_version),
    )
