"""The swarm environment (Gymnasium API) and its action/observation encoding.

Action space: ``Discrete(S·A·3 + 2)`` for S = ``max_subtasks`` slots and A agents::

    index = (slot · A + agent) · 3 + j      START slot on agent with split k = (1, 2, 4)[j]
    index = S · A · 3                        WAIT  for the next completion
    index = S · A · 3 + 1                    FINISH (give up; only when allow_early_finish)

Slots past the task's size are padding and always masked, so one policy handles tasks of
several sizes. :meth:`SwarmEnv.action_masks` gives the valid actions; an invalid action is
never silently ignored: it raises (``invalid_action="raise"``) or is charged a decision, a
penalty and reported in ``info["invalid_action"]`` (``"penalize"``, the default, which keeps
generic tools such as Gymnasium's env checker usable); repeating invalid actions past a
limit is a loop and ends the episode.

Observation: a flat float32 ``Box`` (see :class:`ObservationLayout`): per slot
``[present, kind one-hot (pool kinds + other), work, best expected duration, upward rank,
blocked, deps met, runnable, running count, done, failed, attempts, splittable, split k,
sensitive, running count per agent, advised, advised agent one-hot, advised split one-hot]``,
then globals ``[clock, running, free, done fraction, max_parallel, failures, step fraction,
running per agent, advised WAIT, advised FINISH]``, then a table of up to
``max_running_obs`` running executions ``[present, slot, agent one-hot, elapsed, expected
duration, is chunk, is merge]``. Times are divided by the task's lower bound so features
are scale-free across tasks.

The *advice* features carry the cpls rule engine's decision for the current state (one slot
row flagged with the agent and split it would start, or the WAIT / FINISH flag). A learned
policy therefore starts from the rule engine's judgement and only has to learn where to depart
from it (residual policy learning, Silver et al. 2018): behaviour cloning converges in a pass,
and PPO spends its samples on the decisions where the heuristic is wrong. With
``EnvConfig.rule_advice=False`` the columns stay in the layout but are always zero.

Reward: −Δclock / lower bound per step (so a completed episode returns −latency / bound),
minus ``invalid_action_penalty`` per invalid action, and at a non-completed end
``incomplete_penalty`` × remaining fraction (+ ``loop_penalty`` for a loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.bound import LowerBound, lower_bound, upward_ranks
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.simulator.executor import SwarmSimulator
from podium.envs.swarm.spec import SPLIT_FACTORS, PoolSpec, TaskSpec, default_pool
from podium.envs.swarm.state import (
    COMPLETE,
    MERGE_PART,
    ExecutionRecord,
    InvalidActionError,
    StateConfig,
    SwarmState,
)
from podium.errors import ConfigError

if TYPE_CHECKING:
    from podium.envs.swarm.baselines import CplsPolicy

START, WAIT, FINISH = 1, 2, 3
"""Action types (same numbering as podium.v1.ActionType)."""


@dataclass(frozen=True, slots=True)
class EnvConfig:
    """Settings of :class:`SwarmEnv` that are not part of the task or pool."""

    max_subtasks: int = 64
    """Slots in the action/observation encoding; tasks may have at most this many subtasks."""
    max_running_obs: int = 8
    """Rows of the running-executions table in the observation."""
    max_steps: int = 0
    """Decisions before truncation; 0 means 50 × subtasks + 100."""
    invalid_action: Literal["penalize", "raise"] = "penalize"
    """What an action outside the mask does: charged and reported, or InvalidActionError."""
    invalid_action_penalty: float = 0.1
    """Reward subtracted per invalid action (in units of the lower bound)."""
    invalid_action_loop_limit: int = 10
    """Consecutive invalid actions after which the episode ends as a loop."""
    allow_early_finish: bool = False
    """Whether FINISH is valid before every subtask succeeded (giving up)."""
    incomplete_penalty: float = 10.0
    """Reward subtracted × remaining fraction of subtasks when an episode ends incomplete."""
    loop_penalty: float = 1.0
    """Extra reward subtracted when loop detection ends the episode."""
    loop_retry_limit: int = 4
    """Failures of a unit on one agent after which starting it there again is a loop."""
    rule_advice: bool = True
    """Whether the observation's advice columns carry the cpls rule engine's decision (see
    the module docstring). Policies are trained and served with it on; off, the columns are
    zero and each step is a little cheaper (speed benchmarks of the bare simulator)."""


@dataclass(frozen=True, slots=True)
class ActionCodec:
    """Flat action index <-> (type, slot, agent, k). See the module docstring for the layout."""

    max_subtasks: int
    """Number of subtask slots S."""
    num_agents: int
    """Number of agents A."""

    @property
    def wait(self) -> int:
        """Index of WAIT."""
        return self.max_subtasks * self.num_agents * 3

    @property
    def finish(self) -> int:
        """Index of FINISH."""
        return self.wait + 1

    @property
    def size(self) -> int:
        """Number of actions."""
        return self.wait + 2

    def start(self, slot: int, agent: int, k: int = 1) -> int:
        """Index of START(slot, agent, k)."""
        return (slot * self.num_agents + agent) * 3 + SPLIT_FACTORS.index(k)

    def decode(self, action: int) -> tuple[int, int, int, int]:
        """(type, slot, agent, k); slot/agent/k are -1/-1/0 for WAIT and FINISH."""
        if action < 0 or action >= self.size:
            raise InvalidActionError(f"action {action} outside [0, {self.size})")
        if action == self.wait:
            return WAIT, -1, -1, 0
        if action == self.finish:
            return FINISH, -1, -1, 0
        slot, rem = divmod(action, self.num_agents * 3)
        agent, j = divmod(rem, 3)
        return START, slot, agent, SPLIT_FACTORS[j]


def valid_action_mask(
    state: SwarmState, codec: ActionCodec, *, allow_early_finish: bool = False
) -> NDArray[np.bool_]:
    """The action mask computed directly from the state's rules (slow, obviously correct).

    For callers without an env (the orchestrator service) and as the reference the env's
    incremental mask is tested against.
    """
    m = np.zeros(codec.size, dtype=bool)
    for slot in range(min(state.num_slots, codec.max_subtasks)):
        for agent in range(codec.num_agents):
            for k in SPLIT_FACTORS:
                m[codec.start(slot, agent, k)] = state.start_error(slot, agent, k) is None
    m[codec.wait] = bool(state.running)
    m[codec.finish] = allow_early_finish or state.all_done
    return m


@dataclass(frozen=True, slots=True)
class ObservationLayout:
    """Where each feature block sits in the flat observation vector."""

    max_subtasks: int
    """Slots S."""
    slot_features: int
    """Features per slot F."""
    global_features: int
    """Global features G."""
    running_rows: int
    """Rows R of the running-executions table."""
    running_features: int
    """Features per running row."""
    kinds: tuple[str, ...]
    """Kind vocabulary of the one-hot (last entry: "other")."""
    agents: tuple[str, ...]
    """Agent names in action order."""

    @property
    def slots_end(self) -> int:
        """End of the per-slot block (S × F, row-major)."""
        return self.max_subtasks * self.slot_features

    @property
    def globals_end(self) -> int:
        """End of the global block."""
        return self.slots_end + self.global_features

    @property
    def size(self) -> int:
        """Length of the observation vector."""
        return self.globals_end + self.running_rows * self.running_features


class SwarmEnv(gym.Env[NDArray[np.float32], np.int64]):
    """Orchestrate one task on a simulated pool of frozen sub-agents.

    ``tasks`` is one task or several (one is drawn per reset, or chosen with
    ``reset(options={"task": name})``); all share the encoding, padded to ``max_subtasks``.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(
        self,
        tasks: TaskSpec | Sequence[TaskSpec],
        pool: PoolSpec | SubagentPool | None = None,
        config: EnvConfig | None = None,
        *,
        _shared: tuple[dict[str, TaskSpec], dict[str, _TaskStatic]] | None = None,
    ) -> None:
        super().__init__()
        self.config = config or EnvConfig()
        spec = default_pool() if pool is None else pool
        self.pool = spec if isinstance(spec, SubagentPool) else SubagentPool(spec)
        self.tasks: tuple[TaskSpec, ...] = (tasks,) if isinstance(tasks, TaskSpec) else tuple(tasks)
        if not self.tasks:
            raise ConfigError("SwarmEnv needs at least one task")
        S = self.config.max_subtasks
        for t in self.tasks:
            if len(t.subtasks) > S:
                raise ConfigError(
                    f"task {t.name!r} has {len(t.subtasks)} subtasks, more than "
                    f"EnvConfig.max_subtasks={S}"
                )
        self._by_name = {t.name: t for t in self.tasks} if _shared is None else _shared[0]
        A = self.pool.num_agents
        self.codec = ActionCodec(S, A)
        kinds = (*self.pool.spec.kinds, "other")
        self._kind_index = {k: i for i, k in enumerate(kinds)}
        K = len(kinds)
        self._F = 1 + K + 3 + 7 + 3 + A + (1 + A + 3)
        self._RF = 2 + A + 4
        self.layout = ObservationLayout(
            max_subtasks=S,
            slot_features=self._F,
            global_features=9 + A,
            running_rows=self.config.max_running_obs,
            running_features=self._RF,
            kinds=kinds,
            agents=self.pool.agent_names,
        )
        self.observation_space = gym.spaces.Box(
            # Every feature is a count, flag or time ratio: never negative; times are unbounded.
            low=0.0,
            high=np.inf,
            shape=(self.layout.size,),
            dtype=np.float32,
        )
        self.action_space = gym.spaces.Discrete(self.codec.size)
        # Per task, precomputed once: bound, ranks, agent capability mask.
        self._static: dict[str, _TaskStatic] = (
            {t.name: self._precompute(t) for t in self.tasks} if _shared is None else _shared[1]
        )
        self._obs = np.zeros(self.layout.size, dtype=np.float32)
        self._slots = self._obs[: self.layout.slots_end].reshape(S, self._F)
        self._start_ok = np.zeros((S, A, 3), dtype=bool)
        # Row r = 2·runnable + splittable-now: which split factors the slot's state allows.
        self._flags = np.array(
            [[False, False, False], [False, True, True], [True, False, False], [True, True, True]]
        )
        self._start_ok_flat = self._start_ok.reshape(-1)
        # For free capacity f (capped at 4, the largest k): which START entries it allows.
        self._cap_vec = [np.tile([k <= f for k in SPLIT_FACTORS], S * A) for f in range(5)]
        self._wait = self.codec.wait
        self._size = self.codec.size
        self._base = 4 + K
        # Advice columns: [advised, agent one-hot (A), split one-hot (3)] at the end of a row.
        self._advice_col = 14 + K + A
        # ... and [advised WAIT, advised FINISH] at the end of the globals.
        self._advice_global = self.layout.globals_end - 2
        self._advised_slot = -1
        self._advisor: CplsPolicy | None = None
        if self.config.rule_advice:
            # Imported here: the rule engines are written against this module.
            from podium.envs.swarm.baselines import CplsPolicy

            self._advisor = CplsPolicy()
        self._elapsed_col = 2 + A
        self._table_len = self.layout.running_rows * self._RF
        self._running_rows: dict[int, list[float]] = {}
        self._mask: NDArray[np.bool_] | None = None
        self.sim: SwarmSimulator | None = None
        self.task: TaskSpec = self.tasks[0]
        self.decisions: list[tuple[int, float, int, int, int, int, int, int]] = []
        """Per step: (action, clock, units, ready, running, done, failures, valid actions)."""
        self._steps = 0
        self._invalid_run = 0
        self.invalid_actions = 0

    @classmethod
    def replicas(
        cls,
        n: int,
        tasks: TaskSpec | Sequence[TaskSpec],
        pool: PoolSpec | SubagentPool | None = None,
        config: EnvConfig | None = None,
    ) -> list[SwarmEnv]:
        """``n`` environments over the same tasks for lock-step rollouts.

        They share one :class:`SubagentPool` and the per-task precomputation (bound, ranks,
        capability masks: read-only after set-up; tasks passed to ``reset`` later are added
        once for all), which otherwise dominates start-up: 32 environments × 350 tasks took
        ≈ 20 s of bound computations, now one environment's.
        """
        if n < 1:
            raise ConfigError(f"replicas needs n >= 1, got {n}")
        first = cls(tasks, pool, config)
        rest = [
            cls(tasks, first.pool, config, _shared=(first._by_name, first._static))
            for _ in range(n - 1)
        ]
        for env in rest:  # the rule engine's caches (ranks, agent orders) too
            env._advisor = first._advisor
        return [first, *rest]

    # ---------------------------------------------------------------- set-up

    def _precompute(self, task: TaskSpec) -> _TaskStatic:
        bound = lower_bound(task, self.pool)
        best = [self.pool.best_split_duration(s)[0] for s in task.subtasks]
        # Upward rank on the least expected time to *success* (retries included), the priority
        # the cpls rule engine schedules by: the policy sees the critical path as it really is
        # with unreliable agents, and cloning cpls needs no guess about its ordering.
        ets = [
            min(
                self.pool.expected_time_to_success(a, s.kind, s.work)
                for a in range(self.pool.num_agents)
            )
            for s in task.subtasks
        ]
        ranks = upward_ranks(task, ets)
        A = self.pool.num_agents
        can = np.zeros((len(task.subtasks), A, 3), dtype=bool)
        for i, s in enumerate(task.subtasks):
            for a in range(A):
                if self.pool.can_do(a, s.kind):
                    can[i, a, 0] = True
                    can[i, a, 1:] = s.splittable
        return _TaskStatic(
            bound=bound,
            best=best,
            ranks=ranks,
            can=can,
            splittable=[1.0 if s.splittable else 0.0 for s in task.subtasks],
            sensitive=[1.0 if s.sensitive else 0.0 for s in task.subtasks],
        )

    @property
    def state(self) -> SwarmState:
        """The scheduling state of the current episode."""
        if self.sim is None:
            raise InvalidActionError("call reset() before using the environment")
        return self.sim.state

    @property
    def bound(self) -> LowerBound:
        """Lower bound of the current task."""
        return self._static[self.task.name].bound

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[NDArray[np.float32], dict[str, Any]]:
        """Start an episode; ``options={"task": name_or_TaskSpec}`` picks the task."""
        super().reset(seed=seed)
        chosen = (options or {}).get("task")
        if isinstance(chosen, TaskSpec):
            if chosen.name not in self._static or self._by_name.get(chosen.name) != chosen:
                if len(chosen.subtasks) > self.config.max_subtasks:
                    raise ConfigError(f"task {chosen.name!r} exceeds max_subtasks")
                self._by_name[chosen.name] = chosen
                self._static[chosen.name] = self._precompute(chosen)
            self.task = chosen
        elif isinstance(chosen, str):
            if chosen not in self._by_name:
                raise ConfigError(f"unknown task {chosen!r}; known: {sorted(self._by_name)}")
            self.task = self._by_name[chosen]
        else:
            self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        st = self._static[self.task.name]
        self.sim = SwarmSimulator(
            self.task,
            self.pool,
            seed=int(self.np_random.integers(2**63 - 1)),
            config=StateConfig(loop_retry_limit=self.config.loop_retry_limit),
        )
        n = len(self.task.subtasks)
        self._n = n
        self._scale = 1.0 / st.bound.value
        self._max_steps = self.config.max_steps or 50 * n + 100
        self._steps = 0
        self._invalid_run = 0
        self.invalid_actions = 0
        self._returned = 0.0
        self.decisions = []
        self._mask = None
        self._advised_slot = -1
        self._running_rows = {}
        self._start_ok[:] = False
        self._obs[:] = 0.0
        self._write_static(st)
        self._refresh()
        return self._obs.copy(), self._info()

    def _write_static(self, st: _TaskStatic) -> None:
        K = len(self.layout.kinds)
        rows = self._slots
        sc = self._scale
        for i, s in enumerate(self.task.subtasks):
            rows[i, 0] = 1.0
            rows[i, 1 + self._kind_index.get(s.kind, K - 1)] = 1.0
            rows[i, 1 + K] = s.work * sc
            rows[i, 2 + K] = st.best[i] * sc
            rows[i, 3 + K] = st.ranks[i] * sc

    # ---------------------------------------------------------------- encoding

    def _refresh(self) -> None:
        """Rewrite the rows of dirty slots, the globals and the running table."""
        state = self.sim.state  # type: ignore[union-attr]
        static = self._static[self.task.name]
        can = static.can
        rows = self._slots
        inv_mp = 1.0 / state.max_parallel
        base = self._base
        flags = self._flags
        runnable_of = state.runnable
        for i in state.dirty:
            unmet = state.unmet[i]
            runnable = runnable_of[i] > 0
            k = state.split_k[i]
            rows[i, base : self._advice_col] = (
                1.0 if unmet > 0 else 0.0,
                1.0 if unmet == 0 else 0.0,
                1.0 if runnable else 0.0,
                state.running_of[i] * inv_mp,
                1.0 if state.phase[i] == COMPLETE else 0.0,
                1.0 if state.failed_idle[i] > 0 else 0.0,
                min(state.attempts_of[i], 8) * 0.125,
                k * 0.25 if k > 1 else 0.0,
                static.splittable[i],
                static.sensitive[i],
                *[c * inv_mp for c in state.running_agents[i]],
            )
            # START(i, a, k) is allowed iff the agent can do the kind (static) and, for k = 1,
            # a unit is runnable, for k > 1, the slot can be split now; free capacity is
            # applied in action_masks().
            np.logical_and(can[i], flags[2 * runnable + state.can_split(i)], out=self._start_ok[i])
        state.dirty.clear()
        self._write_dynamic_globals(state)
        self._write_advice(state)
        self._mask = None

    def _write_advice(self, state: SwarmState) -> None:
        """The advice columns: the cpls rule engine's decision for this state."""
        if self._advisor is None:
            return
        rows = self._slots
        col = self._advice_col
        if self._advised_slot >= 0:
            rows[self._advised_slot, col:] = 0.0
            self._advised_slot = -1
        g = self._advice_global
        self._obs[g : g + 2] = 0.0
        try:
            cmd = self._advisor.decide(state)
        except ConfigError:  # no agent of the pool can run a kind of this task: no advice
            return
        if cmd.type == START:
            row = rows[cmd.slot]
            row[col] = 1.0
            row[col + 1 + cmd.agent] = 1.0
            row[col + 1 + self.codec.num_agents + SPLIT_FACTORS.index(cmd.k)] = 1.0
            self._advised_slot = cmd.slot
        else:
            self._obs[g + (0 if cmd.type == WAIT else 1)] = 1.0

    def _write_dynamic_globals(self, state: SwarmState) -> None:
        obs = self._obs
        g = self.layout.slots_end
        mp = state.max_parallel
        inv_mp = 1.0 / mp
        sc = self._scale
        running = len(state.running)
        per_agent = [0.0] * self.pool.num_agents
        clock = state.clock
        flat: list[float] = []
        rows_left = self.layout.running_rows
        cache = self._running_rows
        for r in state.running.values():
            per_agent[r.agent] += inv_mp
            if rows_left:
                rows_left -= 1
                row = cache.get(r.id)
                if row is None:
                    row = self._running_row(state, r)
                    cache[r.id] = row
                row[self._elapsed_col] = (clock - r.start) * sc
                flat.extend(row)
        if len(cache) > 4 * self.layout.running_rows:
            for eid in [e for e in cache if e not in state.running]:
                del cache[eid]
        obs[g : g + self.layout.global_features] = (
            clock * sc,
            running * inv_mp,
            (mp - running) * inv_mp,
            state.done_slots / self._n,
            mp / 8.0,
            min(state.failures, self._n) / self._n,
            self._steps / self._max_steps,
            *per_agent,
            0.0,  # advice (WAIT, FINISH): _write_advice
            0.0,
        )
        t0 = self.layout.globals_end
        n = len(flat)
        if n:
            obs[t0 : t0 + n] = flat
        if n < self._table_len:
            obs[t0 + n : t0 + self._table_len] = 0.0

    def _running_row(self, state: SwarmState, r: ExecutionRecord) -> list[float]:
        """The static part of a running-table row: [present, slot, agent one-hot, elapsed,
        expected duration, is chunk, is merge]."""
        A = self.pool.num_agents
        row = [0.0] * self._RF
        row[0] = 1.0
        row[1] = (r.slot + 1) / self.config.max_subtasks
        row[2 + r.agent] = 1.0
        row[3 + A] = (
            self.pool.expected_duration(r.agent, state.kind_of(r.slot), state.u_work[r.unit])
            * self._scale
        )
        part = state.u_part[r.unit]
        row[4 + A] = 1.0 if part >= 0 else 0.0
        row[5 + A] = 1.0 if part == MERGE_PART else 0.0
        return row

    def observation(self) -> NDArray[np.float32]:
        """The current observation (what the last ``reset``/``step`` returned), read-only view."""
        view = self._obs.view()
        view.flags.writeable = False
        return view

    def action_masks(self) -> NDArray[np.bool_]:
        """Boolean mask over the action space: True where the action is valid now.

        Cached until the next step; treat it as read-only (copy it to modify it).
        """
        if self._mask is not None:
            return self._mask
        state = self.state
        running = len(state.running)
        free = state.max_parallel - running
        m = np.empty(self._size, dtype=bool)
        np.logical_and(
            self._start_ok_flat, self._cap_vec[max(min(free, 4), 0)], out=m[: self._wait]
        )
        m[self._wait] = running > 0
        m[self._wait + 1] = self.config.allow_early_finish or state.all_done
        self._mask = m
        return m

    # ---------------------------------------------------------------- dynamics

    def step(
        self, action: int | np.integer[Any]
    ) -> tuple[NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        """Apply one orchestrator decision; see the module docstring for the reward."""
        sim = self.sim
        if sim is None:
            raise InvalidActionError("call reset() before step()")
        state = sim.state
        a = int(action)
        before = state.clock
        self._steps += 1
        mask = self.action_masks()
        # The mask is the authority (start() re-checks and raises if they ever disagreed);
        # the reason string is only built for an invalid action.
        invalid = None
        if not (0 <= a < self._size and mask[a]):
            invalid = self._invalid_reason(state, a) or f"action {a} is masked"
        # What the orchestrator saw when it decided, for the trajectory's observation summary.
        self.decisions.append(
            (
                a,
                before,
                len(state.u_slot) - state.splits,
                sum(1 for r in state.runnable if r > 0),
                len(state.running),
                state.done_slots,
                state.failures,
                int(np.count_nonzero(mask)),
            )
        )
        finished = False
        if invalid is not None:
            if self.config.invalid_action == "raise":
                self._steps -= 1
                raise InvalidActionError(invalid)
            self.invalid_actions += 1
            self._invalid_run += 1
            sim.decide()
            sim.deliver_due()
            if self._invalid_run >= self.config.invalid_action_loop_limit:
                state.loop_reason = (
                    f"invalid-action loop: {self._invalid_run} invalid actions in a row "
                    f"(last: {invalid})"
                )
        else:
            self._invalid_run = 0
            if a < self._wait:
                slot, rem = divmod(a, self.codec.num_agents * 3)
                agent, j = divmod(rem, 3)
                sim.decide()
                sim.start(slot, agent, SPLIT_FACTORS[j])
                sim.deliver_due()
            elif a == self._wait:
                sim.wait()
            else:
                finished = True
        reward = -(state.clock - before) * self._scale
        if invalid is not None:
            reward -= self.config.invalid_action_penalty
        terminated = finished or state.all_done or state.loop_detected
        truncated = not terminated and self._steps >= self._max_steps
        if (terminated or truncated) and not state.all_done:
            reward -= self.config.incomplete_penalty * (1.0 - state.done_slots / self._n)
            if state.loop_detected:
                reward -= self.config.loop_penalty
        self._refresh()
        info = self._info() if (terminated or truncated) else {}
        if invalid is not None:
            info["invalid_action"] = invalid
        return self._obs.copy(), reward, terminated, truncated, info

    def _invalid_reason(self, state: SwarmState, a: int) -> str | None:
        codec = self.codec
        if a < 0 or a >= codec.size:
            return f"action {a} outside [0, {codec.size})"
        if a < codec.wait:
            slot, rem = divmod(a, codec.num_agents * 3)
            agent, j = divmod(rem, 3)
            if slot >= self._n:
                return f"slot {slot} is padding (task has {self._n} subtasks)"
            return state.start_error(slot, agent, SPLIT_FACTORS[j])
        if a == codec.wait:
            return None if state.running else "WAIT with nothing running"
        if self.config.allow_early_finish or state.all_done:
            return None
        return "FINISH before every subtask succeeded (allow_early_finish is off)"

    def _info(self) -> dict[str, Any]:
        state = self.state
        return {
            "task": self.task.name,
            "latency": state.clock,
            "lower_bound": self.bound.value,
            "completed": state.all_done,
            "loop_detected": state.loop_detected,
            "loop_reason": state.loop_reason,
            "steps": self._steps,
            "executions": len(state.executions),
            "failures": state.failures,
            "invalid_actions": self.invalid_actions,
        }

    def valid_action_count(self) -> int:
        """Number of valid actions now."""
        return int(np.count_nonzero(self.action_masks()))


@dataclass(frozen=True, slots=True)
class _TaskStatic:
    """Per-task values computed once per environment."""

    bound: LowerBound
    best: list[float]
    ranks: list[float]
    can: NDArray[np.bool_]
    splittable: list[float]
    sensitive: list[float]
