"""The swarm environment's observation: a named layout, and the encoder that writes it.

No width depends on the pool: a policy reads each agent by its *features* (what it advertises,
what has been observed of it), never by its position, so one policy decides on any pool —
agents added or renamed after training are just more rows. The observation is one flat
float32 vector of four blocks:

* **slot rows**, one row of :class:`SlotColumns` per subtask slot (``S × F``, padded):
  ``present``, ``work``, ``best_duration`` (best agent, best split), ``upward_rank``,
  ``capable`` (share of the pool that can do its kind), then the columns that change with the
  slot's state (``blocked`` … ``sensitive``), then the rule engine's advice (``advised``,
  ``advised_split`` one-hot);
* **globals** (:class:`GlobalColumns`, ``G``): ``clock``, ``running``, ``free``,
  ``done_fraction``, ``max_parallel``, ``failures``, ``step_fraction``, and the advice
  ``advised_wait`` / ``advised_finish``;
* **running table**: up to ``running_rows`` in-flight executions (:class:`RunningColumns`,
  ``W`` each: ``present``, ``slot``, ``elapsed``, the advertised and estimated expected
  duration and success of its agent on its unit, ``confidence``, ``is_chunk``, ``is_merge``),
  zero rows after the last;
* **pair block** ``[S, A, P]``, one row of :class:`PairColumns` per (slot, agent): what the
  agent advertises for the slot's work (``can_do``, ``duration``, ``success``, ``noise``,
  ``time_to_success``, ``relative`` efficiency among the pool), what the statistics store
  estimates of it (``estimated_*``, ``confidence``), and what changes as the session runs
  (executions of the slot on the agent in flight, all executions on the agent, failures of the
  slot's next unit there, and the advice ``advised_agent``).

Estimates come from the environment's :class:`~podium.observed.AgentStats` (``env.stats``),
read once per episode at reset (an episode sees the store as it was when it started, as a
production session does); without a store they equal the advertised profile with
``confidence`` 0. Only ``A`` (the pool's size, a free dimension like ``S``) changes from pool
to pool; ``F``, ``G``, ``W`` and ``P`` are the module constants :data:`SLOT_FEATURES`,
:data:`GLOBAL_FEATURES`, :data:`RUNNING_FEATURES` and :data:`PAIR_FEATURES`.

Times are divided by the task's lower bound so features are scale-free across tasks (expected
durations clipped to :data:`DURATION_CAP`: a hopeless agent is just "very slow"); counts of
running executions by ``max_parallel``. Every consumer reads columns by name
(``layout.slot_col.work``, ``layout.pair_col.confidence``, ``layout.global_col.clock`` …), never
by offset; the offsets follow from the declaration order of the column classes, in one place.

The *advice* columns carry the cpls rule engine's decision for the current state (one slot
row flagged with the split it would start and its pair row with the agent, or the WAIT /
FINISH flag). A learned policy therefore starts from the rule engine's judgement and only has
to learn where to depart from it (residual policy learning, Silver et al. 2018). The rule
engine reads the advertised pool, or the store's estimated pool
(``EnvConfig.advice="online"``, :attr:`ObservationEncoder.advice_pool`). With the advisor off
(``EnvConfig.rule_advice=False``) the columns stay in the layout but are always zero.

A policy network reads the slot rows as tokens, the globals plus the running table as one
global token and the pair rows per (slot, agent) (:meth:`ObservationLayout.split`); recorders
keep only a task's own slot and pair rows (:meth:`ObservationLayout.trim`), since padding rows
carry nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.actions import START, WAIT
from podium.envs.swarm.baselines import decide_on_pool
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import SPLIT_FACTORS, TaskSpec
from podium.envs.swarm.state import COMPLETE, MERGE_PART, ExecutionRecord, SwarmState
from podium.errors import ConfigError

if TYPE_CHECKING:
    from podium.envs.swarm.baselines import Command, CplsPolicy
    from podium.envs.swarm.precompute import TaskStatic
    from podium.observed import AgentStats

PRESENT = 0
"""Column of ``present`` in a slot row: 1 for a subtask, 0 for a padding slot. Fixed, so a
batch of trimmed or padded rows tells its padding apart without knowing the layout."""

MAX_PARALLEL_SCALE = 8.0
"""``max_parallel`` is observed divided by this (a typical pool's cap)."""
ATTEMPTS_CAP = 8
"""Attempts of a slot are observed as min(attempts, ATTEMPTS_CAP) / ATTEMPTS_CAP."""
_PER_ATTEMPT = 1.0 / ATTEMPTS_CAP
DURATION_CAP = 32.0
"""Expected durations and times to success, in units of the task's lower bound, are clipped
to [0, DURATION_CAP]: an agent 30× slower than the bound (or one that never succeeds) is
simply hopeless, and an unbounded feature would dominate a network's input scale."""


@dataclass(frozen=True, slots=True)
class Columns:
    """A contiguous group of columns ``[start, stop)`` (a one-hot, a block)."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def slice(self) -> slice:
        """The group as a slice (a numpy view when indexing)."""
        return slice(self.start, self.stop)

    def at(self, i: int) -> int:
        """Column of member ``i`` (e.g. split choice ``i`` of a one-hot)."""
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
    work: int
    best_duration: int
    upward_rank: int
    capable: int
    """Agents of the pool that can do the slot's kind / agents of the pool."""
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
    advised: int
    """1 on the one slot the rule engine would start now (its agent: the pair block's
    ``advised_agent``)."""
    advised_split: Columns
    """One-hot over SPLIT_FACTORS."""

    @classmethod
    def build(cls) -> SlotColumns:
        """The row (the same for every pool)."""
        c = _Cursor()
        # Keyword arguments are evaluated in source order: this order *is* the row layout.
        return cls(
            present=c.one(),
            work=c.one(),
            best_duration=c.one(),
            upward_rank=c.one(),
            capable=c.one(),
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
            advised=c.one(),
            advised_split=c.many(len(SPLIT_FACTORS)),
        )

    @property
    def state(self) -> Columns:
        """``blocked`` … ``sensitive``: what changes with the slot's state, rewritten together
        whenever the slot is dirty."""
        return Columns(self.blocked, self.sensitive + 1)

    @property
    def advice(self) -> Columns:
        """``advised``, ``advised_split``: the last columns of the row."""
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
    advised_wait: int
    advised_finish: int

    @classmethod
    def build(cls) -> GlobalColumns:
        """The globals (the same for every pool)."""
        c = _Cursor()
        return cls(
            clock=c.one(),
            running=c.one(),
            free=c.one(),
            done_fraction=c.one(),
            max_parallel=c.one(),
            failures=c.one(),
            step_fraction=c.one(),
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
    """Columns of one row of the running-executions table, in order. The agent is described
    by its features on the execution's unit, not named."""

    present: int
    slot: int
    """(slot + 1) / S."""
    elapsed: int
    expected_duration: int
    """Advertised expected duration of the unit on its agent (clipped)."""
    success: int
    """Advertised success probability of its agent on the kind."""
    estimated_duration: int
    """Estimated expected duration (the store's; = advertised without one)."""
    estimated_success: int
    confidence: int
    """Confidence of the estimate (0: nothing observed)."""
    is_chunk: int
    is_merge: int

    @classmethod
    def build(cls) -> RunningColumns:
        """The row (the same for every pool)."""
        c = _Cursor()
        return cls(
            present=c.one(),
            slot=c.one(),
            elapsed=c.one(),
            expected_duration=c.one(),
            success=c.one(),
            estimated_duration=c.one(),
            estimated_success=c.one(),
            confidence=c.one(),
            is_chunk=c.one(),
            is_merge=c.one(),
        )

    @property
    def width(self) -> int:
        """Features per running row W."""
        return self.is_merge + 1


@dataclass(frozen=True, slots=True)
class PairColumns:
    """Columns of one (slot, agent) row of the pair block, in order. Durations are of the
    slot's whole work (k = 1) in units of the lower bound, clipped; all zero where the agent
    cannot do the slot's kind."""

    can_do: int
    """1 if the agent may be given the slot's kind."""
    duration: int
    """Advertised expected duration: work / speed."""
    success: int
    """Advertised success probability."""
    noise: int
    """Advertised σ of the duration's lognormal factor."""
    time_to_success: int
    """Advertised expected time to success with retries: duration / success (capped)."""
    relative: int
    """Advertised efficiency (speed × success) / the pool's best for the kind: 1 for the
    agent cpls would pick, less for worse ones (START logits are computed per pair, so the
    comparison across agents is given, not left to be inferred)."""
    estimated_duration: int
    """Estimated expected duration (the store's estimate; = advertised without one)."""
    estimated_success: int
    estimated_time_to_success: int
    estimated_relative: int
    confidence: int
    """Confidence of the estimate in [0, 1): 0 when nothing was observed."""
    running: int
    """Executions of the slot in flight on the agent / max_parallel."""
    failures: int
    """Failures of the slot's next unit on the agent / loop_retry_limit (1: starting it
    there again is a loop)."""
    agent_running: int
    """All executions in flight on the agent / max_parallel."""
    advised_agent: int
    """1 on the (slot, agent) the rule engine would start now."""

    @classmethod
    def build(cls) -> PairColumns:
        """The row (the same for every pool)."""
        c = _Cursor()
        return cls(
            can_do=c.one(),
            duration=c.one(),
            success=c.one(),
            noise=c.one(),
            time_to_success=c.one(),
            relative=c.one(),
            estimated_duration=c.one(),
            estimated_success=c.one(),
            estimated_time_to_success=c.one(),
            estimated_relative=c.one(),
            confidence=c.one(),
            running=c.one(),
            failures=c.one(),
            agent_running=c.one(),
            advised_agent=c.one(),
        )

    @property
    def static(self) -> Columns:
        """``can_do`` … ``confidence``: written once per episode at reset."""
        return Columns(self.can_do, self.confidence + 1)

    @property
    def width(self) -> int:
        """Features per pair row P."""
        return self.advised_agent + 1


SLOT_COLUMNS = SlotColumns.build()
"""The slot row's columns."""
GLOBAL_COLUMNS = GlobalColumns.build()
"""The globals' columns."""
RUNNING_COLUMNS = RunningColumns.build()
"""A running-table row's columns."""
PAIR_COLUMNS = PairColumns.build()
"""A pair row's columns."""
SLOT_FEATURES = SLOT_COLUMNS.width
"""Features per slot row F (pool-independent)."""
GLOBAL_FEATURES = GLOBAL_COLUMNS.width
"""Global features G, without the running table (pool-independent)."""
RUNNING_FEATURES = RUNNING_COLUMNS.width
"""Features per running-table row W (pool-independent)."""
PAIR_FEATURES = PAIR_COLUMNS.width
"""Features per (slot, agent) pair row P (pool-independent)."""


@dataclass(frozen=True, slots=True)
class ObservationLayout:
    """Where every feature sits in the flat observation vector (see the module docstring).

    Build with :meth:`for_pool`; the column groups (``slot_col``, ``global_col``,
    ``running_col``, ``pair_col``: the module's, the same for every layout) and blocks
    (``slot_block``, ``global_block``, ``running_block``, ``pair_block``) follow.
    """

    max_subtasks: int
    """Slots S."""
    agents: tuple[str, ...]
    """Agent names in action order (A = the pair block's agent axis)."""
    running_rows: int
    """Rows R of the running-executions table."""

    def __post_init__(self) -> None:
        if self.max_subtasks < 1 or self.running_rows < 0:
            raise ConfigError(
                f"observation layout needs max_subtasks >= 1 and running_rows >= 0, got "
                f"{self.max_subtasks} and {self.running_rows}"
            )
        if not self.agents or len(set(self.agents)) != len(self.agents):
            raise ConfigError(f"observation layout needs distinct agent names, got {self.agents}")

    @classmethod
    def for_pool(
        cls, pool: SubagentPool, max_subtasks: int, running_rows: int
    ) -> ObservationLayout:
        """The layout of an environment over ``pool`` with ``max_subtasks`` slots."""
        return cls(max_subtasks=max_subtasks, agents=pool.agent_names, running_rows=running_rows)

    @property
    def slot_col(self) -> SlotColumns:
        """Columns of a slot row."""
        return SLOT_COLUMNS

    @property
    def global_col(self) -> GlobalColumns:
        """Columns of the globals, relative to ``global_block.start``."""
        return GLOBAL_COLUMNS

    @property
    def running_col(self) -> RunningColumns:
        """Columns of a running-table row, relative to the row's start."""
        return RUNNING_COLUMNS

    @property
    def pair_col(self) -> PairColumns:
        """Columns of a pair row, relative to the row's start."""
        return PAIR_COLUMNS

    @property
    def num_agents(self) -> int:
        """Agents A."""
        return len(self.agents)

    @property
    def slot_features(self) -> int:
        """Features per slot F (= SLOT_FEATURES)."""
        return SLOT_FEATURES

    @property
    def global_features(self) -> int:
        """Global features G, without the running table (= GLOBAL_FEATURES)."""
        return GLOBAL_FEATURES

    @property
    def running_features(self) -> int:
        """Features per running-table row W (= RUNNING_FEATURES)."""
        return RUNNING_FEATURES

    @property
    def pair_features(self) -> int:
        """Features per pair row P (= PAIR_FEATURES)."""
        return PAIR_FEATURES

    @property
    def slot_block(self) -> Columns:
        """The S × F slot rows, row-major, at the start of the vector."""
        return Columns(0, self.max_subtasks * SLOT_FEATURES)

    @property
    def global_block(self) -> Columns:
        """The globals, right after the slot rows."""
        start = self.slot_block.stop
        return Columns(start, start + GLOBAL_FEATURES)

    @property
    def running_block(self) -> Columns:
        """The running table (R rows), after the globals."""
        start = self.global_block.stop
        return Columns(start, start + self.running_rows * RUNNING_FEATURES)

    @property
    def pair_block(self) -> Columns:
        """The S × A × P pair rows (slot-major, then agent), at the end of the vector."""
        start = self.running_block.stop
        return Columns(start, start + self.max_subtasks * self.num_agents * PAIR_FEATURES)

    @property
    def slots_end(self) -> int:
        """End of the slot rows (= start of the global token)."""
        return self.slot_block.stop

    @property
    def globals_end(self) -> int:
        """End of the globals (= start of the running table)."""
        return self.global_block.stop

    @property
    def token_end(self) -> int:
        """End of the global token (= start of the pair block)."""
        return self.running_block.stop

    @property
    def size(self) -> int:
        """Length of the observation vector."""
        return self.pair_block.stop

    @property
    def global_token_features(self) -> int:
        """Width G' of what a policy reads as one global token: the globals and the running
        table, G + R·W (pool-independent)."""
        return GLOBAL_FEATURES + self.running_rows * RUNNING_FEATURES

    def split(
        self, obs: NDArray[np.float32], used_slots: int | None = None
    ) -> tuple[NDArray[np.float32], NDArray[np.bool_], NDArray[np.float32], NDArray[np.float32]]:
        """``obs [B, size]`` → (slot rows [B, S', F], present [B, S'], global token [B, G'],
        pair rows [B, S', A, P]).

        ``used_slots`` keeps the first S' slots only (trailing padding cut off) so that
        attention costs what the largest task in a batch needs, not the padded maximum.
        Everything but ``present`` is a view of ``obs``.
        """
        b, S = obs.shape[0], self.max_subtasks
        s = S if used_slots is None else used_slots
        rows = obs[:, : self.slots_end].reshape(b, S, SLOT_FEATURES)[:, :s]
        pairs = obs[:, self.token_end :].reshape(b, S, self.num_agents, PAIR_FEATURES)[:, :s]
        return rows, subtask_present(rows), obs[:, self.slots_end : self.token_end], pairs

    def trim(
        self, obs: NDArray[np.float32], n: int
    ) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
        """One observation ``[size]`` → copies of its first ``n`` slot rows ``[n, F]``, of its
        global token ``[G']`` and of its first ``n`` slots' pair rows ``[n, A, P]``: what a
        recorder keeps of a task with ``n`` subtasks."""
        rows = obs[: self.slots_end].reshape(self.max_subtasks, SLOT_FEATURES)
        pairs = obs[self.token_end :].reshape(self.max_subtasks, self.num_agents, PAIR_FEATURES)
        return rows[:n].copy(), obs[self.slots_end : self.token_end].copy(), pairs[:n].copy()


def subtask_present(rows: NDArray[np.float32]) -> NDArray[np.bool_]:
    """Which of the slot rows ``[..., n, F]`` hold a subtask (``[..., n]``)."""
    present: NDArray[np.bool_] = rows[..., PRESENT] > 0.5
    return present


# ------------------------------------------------------------------------------ agent profiles


(
    _CAN,
    _INV_SPEED,
    _SUCCESS,
    _NOISE,
    _RELATIVE,
    _EST_INV_SPEED,
    _EST_SUCCESS,
    _EST_RELATIVE,
    _CONF,
) = range(9)
"""Columns of :attr:`KindProfiles.table`."""


@dataclass(frozen=True, slots=True)
class KindProfiles:
    """What the observation knows of every agent of a pool on one kind: the advertised
    profile and the store's estimate (= advertised, confidence 0, without a store)."""

    table: NDArray[np.float64]
    """``[A, 9]``: can (1.0 where the agent can do the kind), 1 / advertised speed, success,
    noise, relative (speed × success / the best agent's), then 1 / estimated speed,
    estimated success, estimated relative, confidence; all 0 where the agent cannot."""
    running: tuple[tuple[float, float, float, float, float], ...]
    """Per agent (1 / speed, success, 1 / estimated speed, estimated success, confidence):
    the running table's per-execution reads, as Python floats."""
    capable: float
    """Agents that can do the kind / agents."""


def _relative(
    can: NDArray[np.float64], inv_speed: NDArray[np.float64], success: NDArray[np.float64]
) -> NDArray[np.float64]:
    """speed × success / its maximum over agents (0 where the agent cannot or never succeeds)."""
    eff = np.divide(success, inv_speed, out=np.zeros_like(success), where=inv_speed > 0) * can
    best = float(eff.max()) if eff.size else 0.0
    return eff / best if best > 0 else np.zeros_like(eff)


def kind_profiles(pool: SubagentPool, kind: str, stats: AgentStats | None) -> KindProfiles:
    """The :class:`KindProfiles` of ``kind`` on ``pool``, estimates read from ``stats``."""
    table = np.zeros((pool.num_agents, 9))
    for i, name in enumerate(pool.agent_names):
        prof = pool.profile(i, kind)
        if prof is None:
            continue
        est = stats.estimate(name, kind, prof) if stats is not None else None
        speed, success, confidence = (
            (prof.speed, prof.success, 0.0)
            if est is None
            else (est.speed, est.success, est.confidence)
        )
        table[i, [_CAN, _INV_SPEED, _SUCCESS, _NOISE, _EST_INV_SPEED, _EST_SUCCESS, _CONF]] = (
            1.0,
            1.0 / prof.speed,
            prof.success,
            prof.noise,
            1.0 / speed,
            success,
            confidence,
        )
    can = table[:, _CAN]
    table[:, _RELATIVE] = _relative(can, table[:, _INV_SPEED], table[:, _SUCCESS])
    table[:, _EST_RELATIVE] = _relative(can, table[:, _EST_INV_SPEED], table[:, _EST_SUCCESS])
    running = table[:, [_INV_SPEED, _SUCCESS, _EST_INV_SPEED, _EST_SUCCESS, _CONF]].tolist()
    return KindProfiles(
        table=table,
        running=tuple((r[0], r[1], r[2], r[3], r[4]) for r in running),
        capable=float(can.mean()),
    )


def _durations(
    work: NDArray[np.float64], inv_speed: NDArray[np.float64], success: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Clipped expected durations and times to success ``[n, A]`` of ``work [n, 1]`` (scaled)
    on agents ``[n, A]`` (0 where the agent cannot: inv_speed 0)."""
    dur = work * inv_speed
    ets = np.divide(dur, success, out=np.full_like(dur, DURATION_CAP), where=success > 0)
    ets[inv_speed == 0] = 0.0
    return np.minimum(dur, DURATION_CAP), np.minimum(ets, DURATION_CAP)


def pair_rows(
    task: TaskSpec, profiles: dict[str, KindProfiles], scale: float
) -> NDArray[np.float64]:
    """The static pair columns (``PairColumns.static``) of ``task``'s slots ``[n, A, 11]``."""
    t = np.stack([profiles[s.kind].table for s in task.subtasks])  # [n, A, 9]
    work = np.array([[s.work * scale] for s in task.subtasks])
    duration, ets = _durations(work, t[..., _INV_SPEED], t[..., _SUCCESS])
    est_duration, est_ets = _durations(work, t[..., _EST_INV_SPEED], t[..., _EST_SUCCESS])
    out = np.empty((*t.shape[:2], len(PAIR_COLUMNS.static)))
    # In PairColumns order, can_do … confidence.
    out[..., 0] = t[..., _CAN]
    out[..., 1] = duration
    out[..., 2] = t[..., _SUCCESS]
    out[..., 3] = t[..., _NOISE]
    out[..., 4] = ets
    out[..., 5] = t[..., _RELATIVE]
    out[..., 6] = est_duration
    out[..., 7] = t[..., _EST_SUCCESS]
    out[..., 8] = est_ets
    out[..., 9] = t[..., _EST_RELATIVE]
    out[..., 10] = t[..., _CONF]
    return out


# ------------------------------------------------------------------------------ the encoder


class ObservationEncoder:
    """Writes a :class:`SwarmState` into one environment's observation vector.

    Incremental, because a step must cost microseconds: the static columns of a task (slot
    rows' and pair rows' alike) are written once per episode (:meth:`reset`), and
    :meth:`update` rewrites only the rows of the slots the state marks dirty, the globals, the
    running table, the per-agent load and the advice.
    """

    def __init__(
        self, layout: ObservationLayout, pool: SubagentPool, *, advisor: CplsPolicy | None
    ) -> None:
        if layout.agents != pool.agent_names:
            raise ConfigError(
                f"layout agents {layout.agents} are not the pool's {pool.agent_names}"
            )
        self.layout = layout
        self.pool = pool
        self.advisor = advisor
        """The rule engine whose decision the advice columns carry (None: advice off)."""
        self.advice_pool: SubagentPool | None = None
        """The pool the advisor reads instead of the state's (the store's estimated pool,
        ``EnvConfig.advice="online"``); None: the state's own (advertised) pool. Same agents
        in the same order."""
        self.obs = np.zeros(layout.size, dtype=np.float32)
        """The vector (owned; callers copy or view it read-only)."""
        self._bind(self.obs)
        self._written_running: list[list[int]] = []
        self._written_fails: list[list[int]] = []
        self._written_load: list[float] = []
        """Per slot, the in-flight counts and failures per agent last written into the pair
        rows, and the per-agent load: a strided write costs a microsecond or two, and most
        dirty slots and most steps leave these unchanged."""
        self._profiles: dict[str, KindProfiles] = {}
        """Per kind, the agents' profiles this episode reads (see :meth:`reset`)."""
        self._profiles_key: tuple[int, int] | None = None
        self._running_rows: dict[int, list[float]] = {}
        """Execution id -> its running-table row (only ``elapsed`` changes while it runs)."""
        self._advised: tuple[int, int] = (-1, -1)
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

    def _bind(self, obs: NDArray[np.float32]) -> None:
        """The views of ``obs`` the writers use: slot rows ``[S, F]``, pair rows
        ``[S, A, P]`` and the pair block's per-step columns ``[S, A]`` (indexing a prepared
        view is cheaper than a three-axis index at every step)."""
        lay, pcol = self.layout, self.layout.pair_col
        self._rows = obs[: lay.slots_end].reshape(lay.max_subtasks, SLOT_FEATURES)
        self._pairs = pairs = obs[lay.token_end :].reshape(
            lay.max_subtasks, lay.num_agents, PAIR_FEATURES
        )
        self._p_running = pairs[:, :, pcol.running]
        self._p_failures = pairs[:, :, pcol.failures]
        self._p_load = pairs[:, :, pcol.agent_running]
        self._p_advised = pairs[:, :, pcol.advised_agent]

    def __deepcopy__(self, memo: dict[int, Any]) -> ObservationEncoder:
        # The slot and pair rows are views of the vector: a plain deepcopy would copy them
        # separately and the copy would write its rows into arrays nobody reads.
        new = copy.copy(self)
        memo[id(self)] = new
        new.obs = self.obs.copy()
        new._bind(new.obs)
        new._running_rows = {eid: list(row) for eid, row in self._running_rows.items()}
        new._written_running = [list(r) for r in self._written_running]
        new._written_fails = [list(r) for r in self._written_fails]
        new._written_load = list(self._written_load)
        return new  # the profiles are read-only, replaced (not mutated) at a reset

    def reset(
        self,
        task: TaskSpec,
        static: TaskStatic,
        scale: float,
        stats: AgentStats | None = None,
    ) -> None:
        """Start an episode of ``task``: clear the vector and write the static columns.
        ``scale`` is 1 / the task's lower bound (times are observed in its units); the
        estimates are read from ``stats`` now, once for the episode."""
        self._n = n = len(task.subtasks)
        self._scale = scale
        self._advised = (-1, -1)
        self._running_rows = {}
        a = self.layout.num_agents
        self._written_running = [[0] * a for _ in range(n)]
        self._written_fails = [[0] * a for _ in range(n)]
        self._written_load = [0.0] * a
        self._read_profiles(task, stats)
        self.obs[:] = 0.0
        col = self.layout.slot_col
        rows = self._rows
        for i, s in enumerate(task.subtasks):
            rows[i, col.present] = 1.0
            rows[i, col.work] = s.work * scale
            rows[i, col.best_duration] = min(static.best[i] * scale, DURATION_CAP)
            rows[i, col.upward_rank] = static.ranks[i] * scale
            rows[i, col.capable] = self._profiles[s.kind].capable
        self._pairs[:n, :, self.layout.pair_col.static.slice] = pair_rows(
            task, self._profiles, scale
        )

    def _read_profiles(self, task: TaskSpec, stats: AgentStats | None) -> None:
        """Per kind of ``task``, the agents' profiles (cached while the store is unchanged)."""
        key = None if stats is None else (id(stats), stats.version)
        if key != self._profiles_key:
            self._profiles, self._profiles_key = {}, key
        for s in task.subtasks:
            if s.kind not in self._profiles:
                self._profiles = {
                    **self._profiles,
                    s.kind: kind_profiles(self.pool, s.kind, stats),
                }

    def update(self, state: SwarmState, static: TaskStatic, step_fraction: float) -> None:
        """Re-encode what changed: the dirty slots' rows (the caller clears ``state.dirty``),
        the globals, the running table, the agents' load and the advice. ``step_fraction`` is
        decisions taken / the step limit."""
        self._write_dirty_rows(state, static)
        self._write_globals(state, step_fraction)
        self._write_advice(state)

    def _write_dirty_rows(self, state: SwarmState, static: TaskStatic) -> None:
        rows = self._rows
        cols = self._state_cols
        inv_mp = 1.0 / state.max_parallel
        inv_limit = 1.0 / state.config.loop_retry_limit
        written_running, written_fails = self._written_running, self._written_fails
        zeros = [0] * self.layout.num_agents
        for i in state.dirty:
            unmet = state.unmet[i]
            k = state.split_k[i]
            # In SlotColumns order, blocked … sensitive (one numpy call per row).
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
            )
            running = state.running_agents[i]
            if running != written_running[i]:
                self._p_running[i] = [c * inv_mp for c in running]
                written_running[i] = list(running)
            # The next unit is a FAILED one only while the slot has one waiting; otherwise it
            # is NEW (never failed) or there is none: no failures, no next_unit() call.
            unit = state.next_unit(i) if state.failed_idle[i] > 0 else -1
            fails = zeros if unit < 0 else state.u_fails_on[unit]
            if fails != written_fails[i]:
                self._p_failures[i] = [f * inv_limit for f in fails]
                written_fails[i] = list(fails)

    def _write_globals(self, state: SwarmState, step_fraction: float) -> None:
        """The globals, the running table and the agents' load (they share the loop over
        running executions)."""
        layout = self.layout
        mp = state.max_parallel
        inv_mp = 1.0 / mp
        sc = self._scale
        n = self._n
        running = len(state.running)
        per_agent = [0.0] * layout.num_agents
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
            0.0,
            0.0,
        )
        if per_agent != self._written_load:
            self._p_load[:n] = per_agent
            self._written_load = per_agent
        t = self._table
        used = t.start + len(table)
        if table:
            self.obs[t.start : used] = table
        if used < t.stop:
            self.obs[used : t.stop] = 0.0

    def _running_row(self, state: SwarmState, r: ExecutionRecord) -> list[float]:
        """The static part of a running-table row (all but ``elapsed``)."""
        col = self.layout.running_col
        inv_speed, success, est_inv_speed, est_success, confidence = self._profiles[
            state.kind_of(r.slot)
        ].running[r.agent]
        work = state.u_work[r.unit] * self._scale
        row = [0.0] * col.width
        row[col.present] = 1.0
        row[col.slot] = (r.slot + 1) / self.layout.max_subtasks
        row[col.expected_duration] = min(work * inv_speed, DURATION_CAP)
        row[col.success] = success
        row[col.estimated_duration] = min(work * est_inv_speed, DURATION_CAP)
        row[col.estimated_success] = est_success
        row[col.confidence] = confidence
        part = state.u_part[r.unit]
        row[col.is_chunk] = 1.0 if part >= 0 else 0.0
        row[col.is_merge] = 1.0 if part == MERGE_PART else 0.0
        return row

    def _write_advice(self, state: SwarmState) -> None:
        """The advice columns: the rule engine's decision for this state (globals zeroed)."""
        if self.advisor is None:
            return
        slot, agent = self._advised
        if slot >= 0:
            self._rows[slot, self._advice_cols] = 0.0
            self._p_advised[slot, agent] = 0.0
            self._advised = (-1, -1)
        try:
            cmd = self._advise(state)
        except ConfigError:  # no agent of the pool can run a kind of this task: no advice
            return
        if cmd.type == START:
            col = self.layout.slot_col
            row = self._rows[cmd.slot]
            row[col.advised] = 1.0
            row[col.advised_split.at(SPLIT_FACTORS.index(cmd.k))] = 1.0
            self._p_advised[cmd.slot, cmd.agent] = 1.0
            self._advised = (cmd.slot, cmd.agent)
        else:
            self.obs[self._advice_flags[0 if cmd.type == WAIT else 1]] = 1.0

    def _advise(self, state: SwarmState) -> Command:
        """The advisor's decision, on :attr:`advice_pool` when set."""
        assert self.advisor is not None
        if self.advice_pool is None:
            return self.advisor.decide(state)
        return decide_on_pool(self.advisor, state, self.advice_pool)
