"""The orchestrator's action space: the codec between a flat action index and a decision, and
the valid-action mask.

For ``S`` subtask slots and ``A`` agents the space is ``Discrete(S·A·3 + 2)``::

    index = (slot · A + agent) · 3 + j      START slot on agent with split k = (1, 2, 4)[j]
    index = S · A · 3                        WAIT  for the next completion
    index = S · A · 3 + 1                    FINISH (give up; only when allow_early_finish)

START indices are slot-major, so the codec of a task's own ``n`` slots and the codec of the
``S`` slots an environment pads to share every START index; only WAIT and FINISH move (they
come right after the last slot). :meth:`ActionCodec.translate` and
:meth:`ActionCodec.translate_mask` are that move, in either direction: trimming a padded mask
to the slots a batch uses (attention costs O(S²)), recording a session in its task's own
layout, padding a recorded decision to the largest task of a minibatch. Every consumer (the
environment, the policy, the recorders, the learner) calls them instead of doing the index
arithmetic itself. :meth:`ActionCodec.translate_to` and :meth:`ActionCodec.translate_mask_to`
also change the number of agents (a START then moves: its index depends on ``A``), for a
learner's minibatch that mixes pools and pads every decision to its most agents.

:class:`ActionMasker` keeps the mask of a running environment up to date incrementally (only
the slots whose state changed are re-derived); :func:`valid_action_mask` derives it from the
state's rules from scratch, as the reference the incremental one is tested against.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.spec import SPLIT_FACTORS
from podium.envs.swarm.state import InvalidActionError, SwarmState

_T = TypeVar("_T", bound=np.generic)

START, WAIT, FINISH = 1, 2, 3
"""Action types (same numbering as podium.v1.ActionType)."""

SPLIT_CHOICES = len(SPLIT_FACTORS)
"""START entries per (slot, agent): one per split factor k in SPLIT_FACTORS."""

CONTROL_ACTIONS = 2
"""Actions after the START block: WAIT and FINISH."""


@dataclass(frozen=True, slots=True)
class ActionCodec:
    """Flat action index <-> (type, slot, agent, k) for ``max_subtasks`` slots and
    ``num_agents`` agents; see the module docstring for the layout."""

    max_subtasks: int
    """Number of subtask slots S."""
    num_agents: int
    """Number of agents A."""
    # Derived once: the environment reads them on every step.
    per_slot: int = field(init=False)
    """START entries per slot: A × the split choices."""
    wait: int = field(init=False)
    """Index of WAIT (= the number of START entries, S · A · 3)."""
    finish: int = field(init=False)
    """Index of FINISH."""
    size: int = field(init=False)
    """Number of actions."""

    def __post_init__(self) -> None:
        per_slot = self.num_agents * SPLIT_CHOICES
        object.__setattr__(self, "per_slot", per_slot)
        object.__setattr__(self, "wait", self.max_subtasks * per_slot)
        object.__setattr__(self, "finish", self.wait + 1)
        object.__setattr__(self, "size", self.wait + CONTROL_ACTIONS)

    def start(self, slot: int, agent: int, k: int = 1) -> int:
        """Index of START(slot, agent, k)."""
        return (slot * self.num_agents + agent) * SPLIT_CHOICES + SPLIT_FACTORS.index(k)

    def decode(self, action: int) -> tuple[int, int, int, int]:
        """(type, slot, agent, k); slot/agent/k are -1/-1/0 for WAIT and FINISH."""
        if action < 0 or action >= self.size:
            raise InvalidActionError(f"action {action} outside [0, {self.size})")
        if action == self.wait:
            return WAIT, -1, -1, 0
        if action == self.finish:
            return FINISH, -1, -1, 0
        slot, rem = divmod(action, self.per_slot)
        agent, j = divmod(rem, SPLIT_CHOICES)
        return START, slot, agent, SPLIT_FACTORS[j]

    def with_slots(self, n: int) -> ActionCodec:
        """The codec of the same agents for ``n`` slots (a task's own, or a batch's largest)."""
        return ActionCodec(n, self.num_agents)

    def translate(self, action: int, target: ActionCodec) -> int:
        """``action`` of this layout as an index of ``target``'s: a START keeps its index,
        WAIT and FINISH move to ``target``'s. The action must exist in both (a START on a slot
        ``target`` lacks has no translation)."""
        self._check_agents(target)
        wait = self.wait
        return action if action < wait else target.wait + (action - wait)

    def translate_many(self, actions: NDArray[np.int64], target: ActionCodec) -> NDArray[np.int64]:
        """:meth:`translate` of a whole array of actions (a new array)."""
        self._check_agents(target)
        out = actions.copy()
        control = actions >= self.wait
        out[control] = target.wait + (actions[control] - self.wait)
        return out

    def translate_mask(
        self,
        mask: NDArray[_T],
        target: ActionCodec,
        out: NDArray[_T] | None = None,
    ) -> NDArray[_T]:
        """Masks ``[..., self.size]`` as masks ``[..., target.size]``: the START entries of
        the slots both have, then WAIT and FINISH. Slots only ``target`` has are invalid
        (padding: zero); slots only this layout has are dropped, which is lossless when they
        are padding (always masked). ``out`` receives the result when given. Any dtype (per-
        action logits translate the same way)."""
        self._check_agents(target)
        starts = min(self.wait, target.wait)
        if out is None and target.wait <= self.wait:
            # Trimming (the common case): one concatenation, no zero fill.
            return np.concatenate([mask[..., :starts], mask[..., self.wait :]], axis=mask.ndim - 1)
        if out is None:
            out = np.zeros((*mask.shape[:-1], target.size), dtype=mask.dtype)
        else:
            out[..., starts : target.wait] = 0
        out[..., :starts] = mask[..., :starts]
        out[..., target.wait :] = mask[..., self.wait :]
        return out

    def translate_to(self, actions: NDArray[np.int64], target: ActionCodec) -> NDArray[np.int64]:
        """:meth:`translate_many` between layouts of any slot *and agent* counts (a new array).

        A minibatch mixing pools pads every decision to its most agents as well as its most
        slots: START(slot, agent, k) keeps its slot, agent and k, at ``target``'s index of
        them; WAIT and FINISH move to ``target``'s. A START on a slot or agent ``target``
        lacks has no translation (ValueError)."""
        if target.num_agents == self.num_agents:
            return self.translate_many(actions, target)
        out = actions.copy()
        control = actions >= self.wait
        slot, rem = np.divmod(actions[~control], self.per_slot)
        agent, j = np.divmod(rem, SPLIT_CHOICES)
        if (slot >= target.max_subtasks).any() or (agent >= target.num_agents).any():
            raise ValueError(
                f"a START of the {self.max_subtasks}-slot, {self.num_agents}-agent layout has "
                f"no place in the {target.max_subtasks}-slot, {target.num_agents}-agent one"
            )
        out[~control] = (slot * target.num_agents + agent) * SPLIT_CHOICES + j
        out[control] = target.wait + (actions[control] - self.wait)
        return out

    def translate_mask_to(
        self,
        mask: NDArray[_T],
        target: ActionCodec,
        out: NDArray[_T] | None = None,
    ) -> NDArray[_T]:
        """:meth:`translate_mask` between layouts of any slot *and agent* counts: the START
        entries of the (slot, agent) pairs both have, then WAIT and FINISH. Slots and agents
        only ``target`` has are invalid (padding: zero); those only this layout has are
        dropped, which is lossless when they are padding. ``out`` receives the result when
        given. Any dtype, like :meth:`translate_mask` (the serving layer pads masks and trims
        logits with it)."""
        if target.num_agents == self.num_agents:
            return self.translate_mask(mask, target, out)
        lead = mask.shape[:-1]
        slots = min(self.max_subtasks, target.max_subtasks)
        agents = min(self.num_agents, target.num_agents)
        starts = np.zeros(
            (*lead, target.max_subtasks, target.num_agents, SPLIT_CHOICES), dtype=mask.dtype
        )
        starts[..., :slots, :agents, :] = mask[..., : self.wait].reshape(
            *lead, self.max_subtasks, self.num_agents, SPLIT_CHOICES
        )[..., :slots, :agents, :]
        if out is None:
            out = np.empty((*lead, target.size), dtype=mask.dtype)
        out[..., : target.wait] = starts.reshape(*lead, target.wait)
        out[..., target.wait :] = mask[..., self.wait :]
        return out

    def _check_agents(self, target: ActionCodec) -> None:
        if target.num_agents != self.num_agents:
            raise ValueError(
                f"action layouts of {self.num_agents} and {target.num_agents} agents do not "
                "translate into each other"
            )


def valid_action_mask(
    state: SwarmState, codec: ActionCodec, *, allow_early_finish: bool = False
) -> NDArray[np.bool_]:
    """The action mask computed directly from the state's rules (slow, obviously correct).

    For callers without an environment and as the reference the environment's incremental
    mask (:class:`ActionMasker`) is tested against.
    """
    m = np.zeros(codec.size, dtype=bool)
    for slot in range(min(state.num_slots, codec.max_subtasks)):
        for agent in range(codec.num_agents):
            for k in SPLIT_FACTORS:
                m[codec.start(slot, agent, k)] = state.start_error(slot, agent, k) is None
    m[codec.wait] = bool(state.running)
    m[codec.finish] = allow_early_finish or state.all_done or state.stalled
    return m


class ActionMasker:
    """The valid-action mask of one environment, kept up to date incrementally.

    Per slot it keeps which START(slot, agent, k) entries the slot's own state allows
    (``[S, A, 3]``: the agent can do the kind, and for k = 1 a unit is runnable, for k > 1
    the slot can be split now); :meth:`mask` combines them with the free capacity, which
    changes every step for every slot, and WAIT/FINISH. Only the slots the state marks dirty
    are re-derived, so a step costs a few numpy calls whatever the task's size.
    """

    def __init__(self, codec: ActionCodec, *, allow_early_finish: bool) -> None:
        self.codec = codec
        self.allow_early_finish = allow_early_finish
        S, A = codec.max_subtasks, codec.num_agents
        self._start_ok = np.zeros((S, A, SPLIT_CHOICES), dtype=bool)
        self._start_ok_flat = self._start_ok.reshape(-1)
        # Row r = 2·runnable + splittable-now: which split factors the slot's state allows.
        self._flags = np.array(
            [[False, False, False], [False, True, True], [True, False, False], [True, True, True]]
        )
        # For free capacity f (capped at 4, the largest k): which START entries it allows.
        self._cap_vec = [
            np.tile([k <= f for k in SPLIT_FACTORS], S * A) for f in range(max(SPLIT_FACTORS) + 1)
        ]
        self._mask: NDArray[np.bool_] | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> ActionMasker:
        # The flat START block is a view of the [S, A, 3] one: a plain deepcopy would copy the
        # two separately, and the copy's mask would stop following its own updates.
        new = copy.copy(self)
        memo[id(self)] = new
        new._start_ok = self._start_ok.copy()
        new._start_ok_flat = new._start_ok.reshape(-1)
        new._mask = None if self._mask is None else self._mask.copy()
        return new

    def reset(self) -> None:
        """Forget every slot (a new episode; its slots are all dirty)."""
        self._start_ok[:] = False
        self._mask = None

    def update(self, state: SwarmState, can: NDArray[np.bool_]) -> None:
        """Re-derive the START entries of the state's dirty slots; ``can[slot, agent, j]`` is
        the task's static capability mask (agent can do the kind; k > 1 only if splittable)."""
        start_ok, flags, runnable = self._start_ok, self._flags, state.runnable
        for i in state.dirty:
            np.logical_and(
                can[i], flags[2 * (runnable[i] > 0) + state.can_split(i)], out=start_ok[i]
            )
        self._mask = None

    def mask(self, state: SwarmState) -> NDArray[np.bool_]:
        """Boolean mask over the action space: True where the action is valid now.

        Cached until the next :meth:`update`; treat it as read-only (copy it to modify it).
        """
        if self._mask is not None:
            return self._mask
        running = len(state.running)
        free = state.max_parallel - running
        wait = self.codec.wait
        m = np.empty(self.codec.size, dtype=bool)
        np.logical_and(
            self._start_ok_flat,
            self._cap_vec[max(min(free, max(SPLIT_FACTORS)), 0)],
            out=m[:wait],
        )
        m[wait] = running > 0
        # Stalled (a withdrawn subtask blocks the rest): FINISH is the one way left to end.
        m[wait + 1] = self.allow_early_finish or state.all_done or state.stalled
        self._mask = m
        return m

    def invalid_reason(self, state: SwarmState, action: int) -> str | None:
        """Why ``action`` is not allowed in ``state``, or None if it is (the message an
        invalid action raises with or is reported under)."""
        codec = self.codec
        if action < 0 or action >= codec.size:
            return f"action {action} outside [0, {codec.size})"
        kind, slot, agent, k = codec.decode(action)
        if kind == START:
            if slot >= state.num_slots:
                return f"slot {slot} is padding (task has {state.num_slots} subtasks)"
            return state.start_error(slot, agent, k)
        if kind == WAIT:
            return None if state.running else "WAIT with nothing running"
        if self.allow_early_finish or state.all_done or state.stalled:
            return None
        return "FINISH before every subtask succeeded (allow_early_finish is off)"
