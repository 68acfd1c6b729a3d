"""The swarm environment's observation: a named layout, and the encoder that writes it.

The observation is one flat float32 vector of three blocks:

* **slot rows**, one row of :class:`SlotColumns` per subtask slot (``S`` rows, padded):
  ``present``, the ``kind`` one-hot (the pool's kinds, then "other"), ``work``,
  ``best_duration`` (best agent, best split), ``upward_rank``, then the columns that change
  with the slot's state (``blocked`` … ``sensitive``, ``running_per_agent``), then the rule
  engine's advice (``advised``, ``advised_agent`` one-hot, ``advised_split`` one-hot);
* **globals** (:class:`GlobalColumns`): ``clock``, ``running``, ``free``, ``done_fraction``,
  ``max_parallel``, ``failures``, ``step_fraction``, ``running_per_agent``, and the advice
  ``advised_wait`` / ``advised_finish``;
* **running table**: up to ``running_rows`` in-flight executions (:class:`RunningColumns`:
  ``present``, ``slot``, ``agent`` one-hot, ``elapsed``, ``expected_duration``, ``is_chunk``,
  ``is_merge``), zero rows after the last.

Times are divided by the task's lower bound so features are scale-free across tasks; counts
of running executions by ``max_parallel``. Every consumer reads columns by name
(``layout.slot_col.work``, ``layout.slot_col.advice``, ``layout.global_col.clock`` …), never by
offset; the offsets follow from the declaration order of the column classes, in one place.

The *advice* columns carry the cpls rule engine's decision for the current state (one slot
row flagged with the agent and split it would start, or the WAIT / FINISH flag). A learned
policy therefore starts from the rule engine's judgement and only has to learn where to depart
from it (residual policy learning, Silver et al. 2018): behaviour cloning converges in a pass,
and PPO spends its samples on the decisions where the heuristic is wrong. With the advisor off
(``EnvConfig.rule_advice=False``) the columns stay in the layout but are always zero.

A policy network reads the slot rows as tokens and the globals plus the running table as one
global token (:meth:`ObservationLayout.split`); recorders keep only a task's own slot rows
(:meth:`ObservationLayout.trim`), since padding rows carry nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.actions import START, WAIT
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import SPLIT_FACTORS, TaskSpec
from podium.envs.swarm.state import COMPLETE, MERGE_PART, ExecutionRecord, SwarmState
from podium.errors import ConfigError

if TYPE_CHECKING:
    from podium.envs.swarm.baselines import CplsPolicy
    from podium.envs.swarm.precompute import TaskStatic

PRESENT = 0
"""Column of ``present`` in a slot row: 1 for a subtask, 0 for a padding slot. Fixed, so a
batch of trimmed or padded rows tells its padding apart without knowing the layout."""

MAX_PARALLEL_SCALE = 8.0
"""``max_parallel`` is observed divided by this (a typical pool's cap)."""
ATTEMPTS_CAP = 8
"""Attempts of a slot are observed as min(attempts, ATTEMPTS_CAP) / ATTEMPTS_CAP."""
_PER_ATTEMPT = 1.0 / ATTEMPTS_CAP


@dataclass(frozen=True, slots=True)
class Columns:
    """A contiguous group of columns ``[start, stop)`` (a one-hot, a per-agent count)."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def slice(self) -> slice:
        """The group as a slice (a numpy view when indexing)."""
        return slice(self.start, self.stop)

    def at(self, i: int) -> int:
        """Column of member ``i`` (e.g. agent ``i`` of a one-hot)."""
        return self.start + i


class _Cursor:
    """Hands out consecutive columns in declaration order: the only place offsets arise."""

    def __init__(self, start: int = 0) -> None:
        self.next = start

    def one(self) -> int:
        col = self.next
        self.next += 1
        return col

    def many(self, n: int) -> Columns:
        cols = Columns(self.next, self.next + n)
        self.next += n
        return cols


@dataclass(frozen=True, slots=True)
class SlotColumns:
    """Columns of one slot row (see the module docstring), in row order."""

    present: int
    kind: Columns
    """One-hot over the layout's kinds (the pool's, then "other")."""
    work: int
    best_duration: int
    upward_rank: int
    blocked: int
    """1 while some dependency has not succeeded."""
    deps_met: int
    runnable: int
    """1 while a unit of the slot may start (k = 1)."""
    running: int
    """Executions of the slot in flight / max_parallel."""
    done: int
    failed: int
    """1 while a failed unit waits for a retry."""
    attempts: int
    split_k: int
    """k / 4 once split, else 0."""
    splittable: int
    sensitive: int
    running_per_agent: Columns
    """Executions of the slot in flight on each agent / max_parallel."""
    advised: int
    """1 on the one slot the rule engine would start now."""
    advised_agent: Columns
    advised_split: Columns
    """One-hot over SPLIT_FACTORS."""

    @classmethod
    def build(cls, kinds: int, agents: int) -> SlotColumns:
        """The row for ``kinds`` kinds (incl. "other") and ``agents`` agents."""
        c = _Cursor()
        # Keyword arguments are evaluated in source order: this order *is* the row layout.
        return cls(
            present=c.one(),
            kind=c.many(kinds),
            work=c.one(),
            best_duration=c.one(),
            upward_rank=c.one(),
            blocked=c.one(),
            deps_met=c.one(),
            runnable=c.one(),
            running=c.one(),
            done=c.one(),
            failed=c.one(),
            attempts=c.one(),
            split_k=c.one(),
            splittable=c.one(),
            sensitive=c.one(),
            running_per_agent=c.many(agents),
            advised=c.one(),
            advised_agent=c.many(agents),
            advised_split=c.many(len(SPLIT_FACTORS)),
        )

    @property
    def state(self) -> Columns:
        """``blocked`` … ``running_per_agent``: what changes with the slot's state, rewritten
        together whenever the slot is dirty."""
        return Columns(self.blocked, self.running_per_agent.stop)

    @property
    def advice(self) -> Columns:
        """``advised``, ``advised_agent``, ``advised_split``: the last columns of the row."""
        return Columns(self.advised, self.advised_split.stop)

    @property
    def width(self) -> int:
        """Features per slot row F."""
        return self.advised_split.stop


@dataclass(frozen=True, slots=True)
class GlobalColumns:
    """Columns of the globals block, relative to its start, in order."""

    clock: int
    running: int
    """Executions in flight / max_parallel."""
    free: int
    done_fraction: int
    max_parallel: int
    failures: int
    """min(failures, n) / n."""
    step_fraction: int
    """Decisions taken / the episode's step limit."""
    running_per_agent: Columns
    advised_wait: int
    advised_finish: int

    @classmethod
    def build(cls, agents: int) -> GlobalColumns:
        """The globals for ``agents`` agents."""
        c = _Cursor()
        return cls(
            clock=c.one(),
            running=c.one(),
            free=c.one(),
            done_fraction=c.one(),
            max_parallel=c.one(),
            failures=c.one(),
            step_fraction=c.one(),
            running_per_agent=c.many(agents),
            advised_wait=c.one(),
            advised_finish=c.one(),
        )

    @property
    def advice(self) -> Columns:
        """``advised_wait``, ``advised_finish``."""
        return Columns(self.advised_wait, self.advised_finish + 1)

    @property
    def width(self) -> int:
        """Global features G (without the running table)."""
        return self.advised_finish + 1


@dataclass(frozen=True, slots=True)
class RunningColumns:
    """Columns of one row of the running-executions table, in order."""

    present: int
    slot: int
    """(slot + 1) / S."""
    agent: Columns
    elapsed: int
    expected_duration: int
    is_chunk: int
    is_merge: int

    @classmethod
    def build(cls, agents: int) -> RunningColumns:
        """The row for ``agents`` agents."""
        c = _Cursor()
        return cls(
            present=c.one(),
            slot=c.one(),
            agent=c.many(agents),
            elapsed=c.one(),
            expected_duration=c.one(),
            is_chunk=c.one(),
            is_merge=c.one(),
        )

    @property
    def width(self) -> int:
        """Features per running row."""
        return self.is_merge + 1


@dataclass(frozen=True, slots=True)
class ObservationLayout:
    """Where every feature sits in the flat observation vector (see the module docstring).

    Build with :meth:`for_pool`; the column groups (``slot_col``, ``global_col``,
    ``running_col``) and blocks (``slot_block``, ``global_block``, ``running_block``) follow.
    """

    max_subtasks: int
    """Slots S."""
    kinds: tuple[str, ...]
    """Kind vocabulary of the one-hot (last entry: "other")."""
    agents: tuple[str, ...]
    """Agent names in action order."""
    running_rows: int
    """Rows R of the running-executions table."""
    slot_col: SlotColumns = field(init=False)
    """Columns of a slot row."""
    global_col: GlobalColumns = field(init=False)
    """Columns of the globals, relative to ``global_block.start``."""
    running_col: RunningColumns = field(init=False)
    """Columns of a running-table row, relative to the row's start."""

    def __post_init__(self) -> None:
        if self.kinds[-1:] != ("other",):
            raise ConfigError(f"the kind vocabulary must end with 'other', got {self.kinds}")
        agents = len(self.agents)
        object.__setattr__(self, "slot_col", SlotColumns.build(len(self.kinds), agents))
        object.__setattr__(self, "global_col", GlobalColumns.build(agents))
        object.__setattr__(self, "running_col", RunningColumns.build(agents))

    @classmethod
    def for_pool(
        cls, pool: SubagentPool, max_subtasks: int, running_rows: int
    ) -> ObservationLayout:
        """The layout of an environment over ``pool`` with ``max_subtasks`` slots."""
        return cls(
            max_subtasks=max_subtasks,
            kinds=(*pool.spec.kinds, "other"),
            agents=pool.agent_names,
            running_rows=running_rows,
        )

    @property
    def slot_features(self) -> int:
        """Features per slot F."""
        return self.slot_col.width

    @property
    def global_features(self) -> int:
        """Global features G (without the running table)."""
        return self.global_col.width

    @property
    def running_features(self) -> int:
        """Features per running-table row."""
        return self.running_col.width

    @property
    def slot_block(self) -> Columns:
        """The S × F slot rows, row-major, at the start of the vector."""
        return Columns(0, self.max_subtasks * self.slot_features)

    @property
    def global_block(self) -> Columns:
        """The globals, right after the slot rows."""
        start = self.slot_block.stop
        return Columns(start, start + self.global_features)

    @property
    def running_block(self) -> Columns:
        """The running table (R rows), at the end of the vector."""
        start = self.global_block.stop
        return Columns(start, start + self.running_rows * self.running_features)

    @property
    def slots_end(self) -> int:
        """End of the slot rows (= start of the global token)."""
        return self.slot_block.stop

    @property
    def globals_end(self) -> int:
        """End of the globals (= start of the running table)."""
        return self.global_block.stop

    @property
    def size(self) -> int:
        """Length of the observation vector."""
        return self.running_block.stop

    @property
    def global_token_features(self) -> int:
        """Width of what a policy reads as one global token: the globals and the running
        table (everything after the slot rows)."""
        return self.size - self.slots_end

    def split(
        self, obs: NDArray[np.float32], used_slots: int | None = None
    ) -> tuple[NDArray[np.float32], NDArray[np.bool_], NDArray[np.float32]]:
        """``obs [B, size]`` → (slot rows [B, S', F], present [B, S'], global token [B, G']).

        ``used_slots`` keeps the first S' slot rows only (trailing padding cut off) so that
        attention costs what the largest task in a batch needs, not the padded maximum.
        The slot rows and the global token are views of ``obs``.
        """
        s = self.max_subtasks if used_slots is None else used_slots
        rows = obs[:, : self.slots_end].reshape(obs.shape[0], self.max_subtasks, self.slot_features)
        rows = rows[:, :s]
        return rows, subtask_present(rows), obs[:, self.slots_end :]

    def trim(
        self, obs: NDArray[np.float32], n: int
    ) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        """One observation ``[size]`` → copies of its first ``n`` slot rows ``[n, F]`` and of
        its global token ``[G']``: what a recorder keeps of a task with ``n`` subtasks."""
        rows = obs[: self.slots_end].reshape(self.max_subtasks, self.slot_features)
        return rows[:n].copy(), obs[self.slots_end :].copy()


def subtask_present(rows: NDArray[np.float32]) -> NDArray[np.bool_]:
    """Which of the slot rows ``[..., n, F]`` hold a subtask (``[..., n]``)."""
    present: NDArray[np.bool_] = rows[..., PRESENT] > 0.5
    return present


class ObservationEncoder:
    """Writes a :class:`SwarmState` into one environment's observation vector.

    Incremental, because a step must cost microseconds: the static columns of a task are
    written once per episode (:meth:`reset`), and :meth:`update` rewrites only the rows of the
    slots the state marks dirty, the globals, the running table and the advice.
    """

    def __init__(
        self, layout: ObservationLayout, pool: SubagentPool, *, advisor: CplsPolicy | None
    ) -> None:
        self.layout = layout
        self.pool = pool
        self.advisor = advisor
        """The rule engine whose decision the advice columns carry (None: advice off)."""
        self.obs = np.zeros(layout.size, dtype=np.float32)
        """The vector (owned; callers copy or view it read-only)."""
        self._rows = self.obs[: layout.slots_end].reshape(layout.max_subtasks, layout.slot_features)
        self._kind_index = {k: i for i, k in enumerate(layout.kinds)}
        self._running_rows: dict[int, list[float]] = {}
        """Execution id -> its running-table row (only ``elapsed`` changes while it runs)."""
        self._advised_slot = -1
        self._scale = 1.0
        self._n = 1
        # Column positions the per-step writers use, resolved once (a step costs microseconds).
        self._state_cols = layout.slot_col.state.slice
        self._advice_cols = layout.slot_col.advice.slice
        self._globals = layout.global_block.slice
        self._advice_flags = (
            layout.global_block.at(layout.global_col.advised_wait),
            layout.global_block.at(layout.global_col.advised_finish),
        )
        self._table = layout.running_block
        self._elapsed = layout.running_col.elapsed

    def __deepcopy__(self, memo: dict[int, Any]) -> ObservationEncoder:
        # The slot rows are a view of the vector: a plain deepcopy would copy them separately
        # and the copy would write its rows into an array nobody reads.
        new = copy.copy(self)
        memo[id(self)] = new
        new.obs = self.obs.copy()
        new._rows = new.obs[: self.layout.slots_end].reshape(self._rows.shape)
        new._running_rows = {eid: list(row) for eid, row in self._running_rows.items()}
        return new

    def reset(self, task: TaskSpec, static: TaskStatic, scale: float) -> None:
        """Start an episode of ``task``: clear the vector and write the static columns.
        ``scale`` is 1 / the task's lower bound (times are observed in its units)."""
        self._n = len(task.subtasks)
        self._scale = scale
        self._advised_slot = -1
        self._running_rows = {}
        self.obs[:] = 0.0
        col = self.layout.slot_col
        other = len(self.layout.kinds) - 1
        rows = self._rows
        for i, s in enumerate(task.subtasks):
            rows[i, col.present] = 1.0
            rows[i, col.kind.at(self._kind_index.get(s.kind, other))] = 1.0
            rows[i, col.work] = s.work * scale
            rows[i, col.best_duration] = static.best[i] * scale
            rows[i, col.upward_rank] = static.ranks[i] * scale

    def update(self, state: SwarmState, static: TaskStatic, step_fraction: float) -> None:
        """Re-encode what changed: the dirty slots' rows (the caller clears ``state.dirty``),
        the globals, the running table and the advice. ``step_fraction`` is decisions taken
        / the step limit."""
        self._write_dirty_rows(state, static)
        self._write_globals(state, step_fraction)
        self._write_advice(state)

    def _write_dirty_rows(self, state: SwarmState, static: TaskStatic) -> None:
        rows = self._rows
        cols = self._state_cols
        inv_mp = 1.0 / state.max_parallel
        for i in state.dirty:
            unmet = state.unmet[i]
            k = state.split_k[i]
            # In SlotColumns order, blocked … running_per_agent (one numpy call per row).
            rows[i, cols] = (
                1.0 if unmet > 0 else 0.0,
                1.0 if unmet == 0 else 0.0,
                1.0 if state.runnable[i] > 0 else 0.0,
                state.running_of[i] * inv_mp,
                1.0 if state.phase[i] == COMPLETE else 0.0,
                1.0 if state.failed_idle[i] > 0 else 0.0,
                min(state.attempts_of[i], ATTEMPTS_CAP) * _PER_ATTEMPT,
                k * 0.25 if k > 1 else 0.0,
                static.splittable[i],
                static.sensitive[i],
                *[c * inv_mp for c in state.running_agents[i]],
            )

    def _write_globals(self, state: SwarmState, step_fraction: float) -> None:
        """The globals and the running table (they share the loop over running executions)."""
        layout = self.layout
        mp = state.max_parallel
        inv_mp = 1.0 / mp
        sc = self._scale
        n = self._n
        running = len(state.running)
        per_agent = [0.0] * len(layout.agents)
        clock = state.clock
        table: list[float] = []
        rows_left = layout.running_rows
        cache = self._running_rows
        elapsed = self._elapsed
        for r in state.running.values():
            per_agent[r.agent] += inv_mp
            if rows_left:
                rows_left -= 1
                row = cache.get(r.id)
                if row is None:
                    row = self._running_row(state, r)
                    cache[r.id] = row
                row[elapsed] = (clock - r.start) * sc
                table.extend(row)
        if len(cache) > 4 * layout.running_rows:
            for eid in [e for e in cache if e not in state.running]:
                del cache[eid]
        # In GlobalColumns order; the advice flags are written by _write_advice.
        self.obs[self._globals] = (
            clock * sc,
            running * inv_mp,
            (mp - running) * inv_mp,
            state.done_slots / n,
            mp / MAX_PARALLEL_SCALE,
            min(state.failures, n) / n,
            step_fraction,
            *per_agent,
            0.0,
            0.0,
        )
        t = self._table
        used = t.start + len(table)
        if table:
            self.obs[t.start : used] = table
        if used < t.stop:
            self.obs[used : t.stop] = 0.0

    def _running_row(self, state: SwarmState, r: ExecutionRecord) -> list[float]:
        """The static part of a running-table row (all but ``elapsed``)."""
        col = self.layout.running_col
        row = [0.0] * col.width
        row[col.present] = 1.0
        row[col.slot] = (r.slot + 1) / self.layout.max_subtasks
        row[col.agent.at(r.agent)] = 1.0
        row[col.expected_duration] = (
            self.pool.expected_duration(r.agent, state.kind_of(r.slot), state.u_work[r.unit])
            * self._scale
        )
        part = state.u_part[r.unit]
        row[col.is_chunk] = 1.0 if part >= 0 else 0.0
        row[col.is_merge] = 1.0 if part == MERGE_PART else 0.0
        return row

    def _write_advice(self, state: SwarmState) -> None:
        """The advice columns: the rule engine's decision for this state (globals zeroed)."""
        if self.advisor is None:
            return
        if self._advised_slot >= 0:
            self._rows[self._advised_slot, self._advice_cols] = 0.0
            self._advised_slot = -1
        try:
            cmd = self.advisor.decide(state)
        except ConfigError:  # no agent of the pool can run a kind of this task: no advice
            return
        if cmd.type == START:
            col = self.layout.slot_col
            row = self._rows[cmd.slot]
            row[col.advised] = 1.0
            row[col.advised_agent.at(cmd.agent)] = 1.0
            row[col.advised_split.at(SPLIT_FACTORS.index(cmd.k))] = 1.0
            self._advised_slot = cmd.slot
        else:
            self.obs[self._advice_flags[0 if cmd.type == WAIT else 1]] = 1.0
