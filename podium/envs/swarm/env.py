"""The swarm environment (Gymnasium API): one orchestrator session on simulated sub-agents.

:class:`SwarmEnv` ties the parts together and owns the episode's bookkeeping:

* the **action space** and its mask are :mod:`podium.envs.swarm.actions` (``env.codec``,
  ``env.action_masks()``);
* the **observation** is :mod:`podium.envs.swarm.observation` (``env.layout`` names every
  column; an :class:`~podium.envs.swarm.observation.ObservationEncoder` writes it);
* the **dynamics** are the simulator's (:mod:`podium.envs.swarm.simulator`: the scheduling
  state machine of :mod:`podium.envs.swarm.state` plus sampled durations on an event clock);
* a finished episode becomes a ``Trajectory`` through :mod:`podium.envs.swarm.trajectory`.

Slots past a task's size are padding and always masked, so one policy handles tasks of several
sizes. An invalid action is never silently ignored: it raises (``invalid_action="raise"``) or
is charged a decision, a penalty and reported in ``info["invalid_action"]`` (``"penalize"``,
the default, which keeps generic tools such as Gymnasium's env checker usable); repeating
invalid actions past a limit is a loop and ends the episode.

Reward: −Δclock / lower bound per step (so a completed episode returns −latency / bound),
minus ``invalid_action_penalty`` per invalid action, and at a non-completed end
``incomplete_penalty`` × remaining fraction (+ ``loop_penalty`` for a loop).

A *true pool* (``SwarmEnv(..., true_pool=)``, or a pool spec carrying ``true:`` profiles)
makes the sub-agents behave otherwise than the pool spec says: outcomes are sampled from it
while the observation, the action layout, the mask, the lower bound and the rule engines keep
reading the advertised ``pool`` (sub-agents that drifted, :mod:`podium.envs.swarm.drift`, or
that never were what they advertise, under a spec the planners still believe). Without one,
outcomes come from ``pool`` as always.

A *statistics store* (``SwarmEnv(..., stats=)``, :class:`~podium.observed.AgentStats`) is what
has been observed of the agents in recent sessions: the observation's estimate columns read it
at every reset, the rule engine's advice may plan on its estimated pool
(``EnvConfig.advice="online"``), and with ``EnvConfig.feed_stats`` every finished episode's
executions are recorded into it (each unit's exact work, its duration and outcome), so a store
shared by an environment's episodes (or a bench's, or a training run's replicas) holds recent
sessions as production's does.

:meth:`SwarmEnv.clone` (and ``copy.deepcopy``) copies an episode in flight: the copy continues
exactly as the original would (same state, same luck, same future resets) and the two never
affect each other, which shadow twins and planners rely on. The copy *reads* the original's
store (shared, not copied: it is the same knowledge) but never *feeds* it — a planner's
imagined rollouts and a shadow twin's replays are not observations of the sub-agents.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.actions import ActionCodec, ActionMasker
from podium.envs.swarm.baselines import CplsPolicy, estimated_pool
from podium.envs.swarm.bound import LowerBound
from podium.envs.swarm.observation import ObservationEncoder, ObservationLayout
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.precompute import TaskStatic, precompute_task
from podium.envs.swarm.simulator.executor import SwarmSimulator
from podium.envs.swarm.spec import PoolSpec, TaskSpec, default_pool, split_truth
from podium.envs.swarm.state import MERGE_PART, InvalidActionError, StateConfig, SwarmState
from podium.errors import ConfigError

if TYPE_CHECKING:
    from podium.observed import AgentStats

DecisionRecord = tuple[int, float, int, int, int, int, int, int]
"""What :attr:`SwarmEnv.decisions` keeps per step: (action, clock, units, ready, running, done,
failures, valid actions), as the orchestrator saw the state when it decided. A plain tuple:
recording it is on every step's path."""


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
    :mod:`podium.envs.swarm.observation`). Policies are trained and served with it on; off,
    the columns are zero and each step is a little cheaper (speed benchmarks of the bare
    simulator)."""
    session_seeds: bool = False
    """Seed the simulator with ``reset``'s ``seed`` itself, as the orchestrator seeds a
    session's sub-agents with the session seed, rather than with a draw from the environment's
    generator: an episode reset with a live session's seed meets that session's sub-agent luck
    (shadow twins, :mod:`podium.rollout.twins`). Off, ``reset(seed=s)`` stays a Gymnasium seed."""
    feed_stats: bool = True
    """With a statistics store (``SwarmEnv(..., stats=)``), record each finished episode's
    executions into it at the episode's end (terminated or truncated), so the store holds
    recent sessions as production's does. Turn it off where something else feeds the store
    from the same sessions (the orchestrator, whose trajectories a follower records)."""
    advice: Literal["advertised", "online"] = "online"
    """Which pool the advice columns' rule engine (cpls) plans on: the advertised one, or the
    store's estimated pool (``stats.estimated_pool(spec)``, read at each reset; the advertised
    pool while there is no store). Online by default, for training, benchmarks and the
    orchestrator alike (one default, so a policy is served with the advice it was trained
    on): the advice is then cpls-online, the strongest rule engine a deployment can run, and
    a policy cloned from it starts where the rules are best when agents do not behave as they
    advertise (on the misadvertised pool 0.72x cpls-advertised before any PPO; where they do,
    the estimates converge to the advertisement and it is cpls, 1.000x measured)."""


_Shared = tuple[dict[str, TaskSpec], dict[str, TaskStatic]]
"""Tasks by name and their precomputation, shared by replicas (see SwarmEnv.replicas)."""


class SwarmEnv(gym.Env[NDArray[np.float32], np.int64]):
    """Orchestrate one task on a simulated pool of frozen sub-agents.

    ``tasks`` is one task or several (one is drawn per reset, or chosen with
    ``reset(options={"task": name_or_TaskSpec})``); all share the encoding, padded to
    ``max_subtasks``.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(
        self,
        tasks: TaskSpec | Sequence[TaskSpec],
        pool: PoolSpec | SubagentPool | None = None,
        config: EnvConfig | None = None,
        *,
        true_pool: PoolSpec | SubagentPool | None = None,
        stats: AgentStats | None = None,
        _shared: _Shared | None = None,
    ) -> None:
        super().__init__()
        self.config = config or EnvConfig()
        if self.config.advice not in ("advertised", "online"):
            raise ConfigError(
                f"EnvConfig.advice must be 'advertised' or 'online', got {self.config.advice!r}"
            )
        self.pool, self.true_pool = _pools(default_pool() if pool is None else pool, true_pool)
        """``pool``: the advertised pool every planner reads; ``true_pool``: the pool outcomes
        are sampled from when it is not ``pool`` (see the module docstring); None: ``pool``."""
        self.stats = stats
        """The statistics store the estimates are read from (and fed, see
        ``EnvConfig.feed_stats``); None: estimates are the advertised profiles."""
        self._feeds = self.config.feed_stats and stats is not None
        """Whether this environment records its episodes into :attr:`stats` (never a copy's)."""
        self._fed = True
        """Whether the current episode was recorded already (or needs no recording)."""
        self._advice_key: tuple[int, int] | None = None
        self.tasks: tuple[TaskSpec, ...] = (tasks,) if isinstance(tasks, TaskSpec) else tuple(tasks)
        self._check_sizes()
        S = self.config.max_subtasks
        self.codec = ActionCodec(S, self.pool.num_agents)
        self.layout = ObservationLayout.for_pool(self.pool, S, self.config.max_running_obs)
        self.observation_space = gym.spaces.Box(
            # Every feature is a count, flag or time ratio: never negative; times are unbounded.
            low=0.0,
            high=np.inf,
            shape=(self.layout.size,),
            dtype=np.float32,
        )
        self.action_space = gym.spaces.Discrete(self.codec.size)
        # Per task, precomputed once: bound, ranks, agent capability mask.
        self._by_name, self._static = _shared or (
            {t.name: t for t in self.tasks},
            {t.name: precompute_task(t, self.pool) for t in self.tasks},
        )
        advisor = CplsPolicy() if self.config.rule_advice else None
        self._encoder = ObservationEncoder(self.layout, self.pool, advisor=advisor)
        self._masker = ActionMasker(self.codec, allow_early_finish=self.config.allow_early_finish)
        self.sim: SwarmSimulator | None = None
        self.task: TaskSpec = self.tasks[0]
        self.decisions: list[DecisionRecord] = []
        """Per step, what the orchestrator saw when it decided (see DecisionRecord)."""
        self._task_static = self._static[self.task.name]
        self._n = len(self.task.subtasks)
        self._scale = 1.0
        self._max_steps = 1
        self._steps = 0
        self._invalid_run = 0
        self.invalid_actions = 0

    def _check_sizes(self) -> None:
        """ConfigError for no task, or a task with more subtasks than the encoding's slots."""
        if not self.tasks:
            raise ConfigError("SwarmEnv needs at least one task")
        S = self.config.max_subtasks
        for t in self.tasks:
            if len(t.subtasks) > S:
                raise ConfigError(
                    f"task {t.name!r} has {len(t.subtasks)} subtasks, more than "
                    f"EnvConfig.max_subtasks={S}"
                )

    @classmethod
    def replicas(
        cls,
        n: int,
        tasks: TaskSpec | Sequence[TaskSpec],
        pool: PoolSpec | SubagentPool | None = None,
        config: EnvConfig | None = None,
        *,
        true_pool: PoolSpec | SubagentPool | None = None,
        stats: AgentStats | None = None,
    ) -> list[SwarmEnv]:
        """``n`` environments over the same tasks for lock-step rollouts.

        They share one :class:`SubagentPool` and the per-task precomputation (bound, ranks,
        capability masks: read-only after set-up; tasks passed to ``reset`` later are added
        once for all), which otherwise dominates start-up: 32 environments × 350 tasks took
        ≈ 20 s of bound computations, now one environment's. They share ``stats`` too (each
        feeds it its finished episodes, as sessions of one deployment do).
        """
        if n < 1:
            raise ConfigError(f"replicas needs n >= 1, got {n}")
        first = cls(tasks, pool, config, true_pool=true_pool, stats=stats)
        rest = [
            cls(
                tasks,
                first.pool,
                config,
                true_pool=first.true_pool,
                stats=stats,
                _shared=(first._by_name, first._static),
            )
            for _ in range(n - 1)
        ]
        if first.config.advice == "advertised":
            # The rule engine's caches (ranks, agent orders) too; an online advisor is each
            # environment's own, rebuilt whenever the estimated pool changes.
            for env in rest:
                env._encoder.advisor = first._encoder.advisor
        return [first, *rest]

    # ---------------------------------------------------------------- copies

    def clone(self) -> SwarmEnv:
        """An independent copy of this environment, episode in flight included.

        The copy continues exactly as the original would (same state, same pending
        completions and sub-agent luck, same seeds for later resets) and neither affects the
        other. Read-only set-up is shared, not copied: the pool, the tasks and their
        precomputation, the layouts and the rule engine's caches.
        """
        return copy.deepcopy(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> SwarmEnv:
        shared: list[object] = [
            self.pool,
            self.true_pool,
            self.stats,
            self._encoder.advice_pool,
            self.tasks,
            self._by_name,
            self._static,
            self.config,
            self.codec,
            self.layout,
            *self._by_name.values(),
            *self._static.values(),
        ]
        if self._encoder.advisor is not None:
            shared.append(self._encoder.advisor)
        for obj in shared:  # deepcopy reuses what its memo already maps
            memo.setdefault(id(obj), obj)
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in vars(self).items():
            # The decision records are tuples of numbers (immutable): a list copy suffices.
            setattr(new, name, list(value) if name == "decisions" else copy.deepcopy(value, memo))
        # Imagined futures are not observations (see the module docstring).
        new._feeds, new._fed = False, True
        return new

    # ---------------------------------------------------------------- episode

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
        self.task = self._choose_task((options or {}).get("task"))
        self._task_static = self._static[self.task.name]
        session_seed = seed if self.config.session_seeds and seed is not None else None
        sim = SwarmSimulator(
            self.task,
            self.pool,
            seed=int(self.np_random.integers(2**63 - 1)) if session_seed is None else session_seed,
            config=StateConfig(loop_retry_limit=self.config.loop_retry_limit),
            outcomes=self.true_pool,
        )
        return self.use_simulator(sim), self._info()

    def _choose_task(self, chosen: object) -> TaskSpec:
        """The task ``reset`` runs: a TaskSpec (added to the shared set if new), a name, or
        (None) one drawn from ``tasks``."""
        if isinstance(chosen, TaskSpec):
            if chosen.name not in self._static or self._by_name.get(chosen.name) != chosen:
                if len(chosen.subtasks) > self.config.max_subtasks:
                    raise ConfigError(f"task {chosen.name!r} exceeds max_subtasks")
                self._by_name[chosen.name] = chosen
                self._static[chosen.name] = precompute_task(chosen, self.pool)
            return chosen
        if isinstance(chosen, str):
            if chosen not in self._by_name:
                raise ConfigError(f"unknown task {chosen!r}; known: {sorted(self._by_name)}")
            return self._by_name[chosen]
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    def use_simulator(self, sim: SwarmSimulator) -> NDArray[np.float32]:
        """Run the episode just reset on ``sim``, a fresh simulator of the same task (the
        orchestrator's, whose outcomes come over the bus); returns the observation.

        The encoding starts over from ``sim``'s state, so the policy sees exactly what the
        simulated episode would have shown it.
        """
        if sim.state.task is not self.task or sim.state.executions:
            raise ConfigError("use_simulator needs a fresh simulator of the task just reset")
        self.sim = sim
        n = len(self.task.subtasks)
        self._n = n
        self._scale = 1.0 / self._task_static.bound.value
        self._max_steps = self.config.max_steps or 50 * n + 100
        self._steps = 0
        self._invalid_run = 0
        self.invalid_actions = 0
        self.decisions = []
        self._fed = not self._feeds
        if self.config.advice == "online":
            self._use_estimated_pool()
        self._encoder.reset(self.task, self._task_static, self._scale, self.stats)
        self._masker.reset()
        self._refresh()
        return self._encoder.obs.copy()

    def _use_estimated_pool(self) -> None:
        """Point the advice's rule engine at the store's estimated pool (rebuilt only when the
        store changed since the last reset; a fresh engine then, since its caches, the
        upward ranks above all, are per task and would keep the old pool's numbers)."""
        if self.stats is None or self._encoder.advisor is None:
            return
        key = (id(self.stats), self.stats.version)
        if key == self._advice_key:
            return
        self._encoder.advice_pool = estimated_pool(self.stats, self.pool)
        self._encoder.advisor = CplsPolicy()
        self._advice_key = key

    def _feed_stats(self) -> None:
        """Record the finished episode's executions into the store, once: each completed
        execution's agent, kind, exact work (a chunk's or merge's own, as planned), duration
        and outcome, merges flagged (the store keeps them apart), in start order (executions
        cut off by the end say nothing and are skipped)."""
        if self._fed:
            return
        self._fed = True
        stats, state = self.stats, self.state
        assert stats is not None
        names = self.pool.agent_names
        for rec in state.executions:
            if rec.success is not None:
                stats.record(
                    names[rec.agent],
                    state.kind_of(rec.slot),
                    state.u_work[rec.unit],
                    rec.end - rec.start,
                    rec.success,
                    merge=state.u_part[rec.unit] == MERGE_PART,
                )

    def _refresh(self) -> None:
        """Re-encode the observation and the mask after the state changed."""
        state = self.sim.state  # type: ignore[union-attr]
        self._encoder.update(state, self._task_static, self._steps / self._max_steps)
        self._masker.update(state, self._task_static.can)
        state.dirty.clear()

    def refresh(self) -> None:
        """Re-encode the observation and the mask after the state changed between steps: the
        orchestrator's review gate releases or withdraws a held subtask
        (:meth:`~podium.envs.swarm.state.SwarmState.hold`) while no decision is being made."""
        self._refresh()

    def observation(self) -> NDArray[np.float32]:
        """The current observation (what the last ``reset``/``step`` returned), read-only view."""
        view = self._encoder.obs.view()
        view.flags.writeable = False
        return view

    def action_masks(self) -> NDArray[np.bool_]:
        """Boolean mask over the action space: True where the action is valid now.

        Cached until the next step; treat it as read-only (copy it to modify it).
        """
        return self._masker.mask(self.state)

    def valid_action_count(self) -> int:
        """Number of valid actions now."""
        return int(np.count_nonzero(self.action_masks()))

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
        mask = self._masker.mask(state)
        # The mask is the authority (start() re-checks and raises if they ever disagreed);
        # the reason string is only built for an invalid action.
        invalid = None
        if not (0 <= a < self.codec.size and mask[a]):
            invalid = self._masker.invalid_reason(state, a) or f"action {a} is masked"
            if self.config.invalid_action == "raise":
                raise InvalidActionError(invalid)  # refused: not a decision of the episode
        self._steps += 1
        self._record_decision(state, a, mask)
        finished = self._apply(sim, a) if invalid is None else self._apply_invalid(sim, invalid)
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
        info: dict[str, Any] = {}
        if terminated or truncated:
            info = self._info()
            self._feed_stats()
        if invalid is not None:
            info["invalid_action"] = invalid
        return self._encoder.obs.copy(), reward, terminated, truncated, info

    def _record_decision(self, state: SwarmState, action: int, mask: NDArray[np.bool_]) -> None:
        """What the orchestrator saw when it decided, for the trajectory's observation summary."""
        self.decisions.append(
            (
                action,
                state.clock,
                len(state.u_slot) - state.splits,
                sum(1 for r in state.runnable if r > 0),
                len(state.running),
                state.done_slots,
                state.failures,
                int(np.count_nonzero(mask)),
            )
        )

    def _apply(self, sim: SwarmSimulator, action: int) -> bool:
        """Carry out a valid action; True if it ends the episode (FINISH)."""
        self._invalid_run = 0
        codec = self.codec
        if action < codec.wait:
            _, slot, agent, k = codec.decode(action)
            sim.decide()
            sim.start(slot, agent, k)
            sim.deliver_due()
            return False
        if action == codec.wait:
            sim.wait()
            return False
        return True

    def _apply_invalid(self, sim: SwarmSimulator, reason: str) -> bool:
        """Charge an invalid action a decision; past the limit in a row it is a loop."""
        self.invalid_actions += 1
        self._invalid_run += 1
        sim.decide()
        sim.deliver_due()
        if self._invalid_run >= self.config.invalid_action_loop_limit:
            sim.state.loop_reason = (
                f"invalid-action loop: {self._invalid_run} invalid actions in a row "
                f"(last: {reason})"
            )
        return False

    def _info(self) -> dict[str, Any]:
        """The episode's outcome so far (``reset``'s info, and ``step``'s at the end)."""
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


def _pools(
    pool: PoolSpec | SubagentPool, true_pool: PoolSpec | SubagentPool | None
) -> tuple[SubagentPool, SubagentPool | None]:
    """(the advertised pool, the true pool or None) of ``SwarmEnv``'s arguments: a pool spec
    that carries true profiles is split into its advertisement (what every planner reads) and
    its truth (what outcomes are drawn from); ConfigError when a true pool is given as well
    (the truth given two ways is ambiguous)."""
    spec = pool.spec if isinstance(pool, SubagentPool) else pool
    true_spec = true_pool.spec if isinstance(true_pool, SubagentPool) else true_pool
    if not (spec.has_truth or spec.drift is not None):
        # Nothing to split: keep the caller's pools (SubagentPools are shared by replicas).
        advertised = pool if isinstance(pool, SubagentPool) else SubagentPool(pool)
        if true_pool is None or isinstance(true_pool, SubagentPool):
            return advertised, true_pool
        return advertised, SubagentPool(true_pool)
    planned, truth = split_truth(spec, true_spec)
    return SubagentPool(planned), None if truth is None else SubagentPool(truth)
