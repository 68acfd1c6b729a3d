"""Frozen rule-engine schedulers: the references every learned policy is measured against.

Each baseline is a :class:`~podium.envs.swarm.scheduling.SchedulingPolicy`:
``act(env, rng)`` returns the decision for the environment's current state as a
:class:`~podium.envs.swarm.scheduling.PolicyStep`, so the same object drives the Gymnasium env
in training, the benchmark, and the orchestrator service in production (cold start).
``decide(state, rng)`` is the same decision as a :class:`Command`, from a bare
:class:`~podium.envs.swarm.state.SwarmState` (the environment's advice features ask it at every
step). All are deterministic: the ``rng`` argument is accepted for interface uniformity and
only :class:`RandomPolicy` draws from it.

* ``sequential`` — one subtask at a time on the generalist (the single-agent reference).
* ``greedy`` — while a slot is free, start the first ready subtask (file order) on the
  fastest agent for its kind; no splitting.
* ``cpls`` — critical-path list scheduling, HEFT style (Topcuoglu et al., 2002): priority
  by upward rank with expected time-to-success durations, the agent with the least expected
  time to success, split a critical subtask when spare capacity lets the chunks run in
  parallel, retry failures.
* ``cpls-online`` — cpls planning on what has been *observed* of the agents rather than on
  what they advertise: the environment's statistics store's estimated pool
  (:class:`~podium.observed.AgentStats`), taken at each episode's start. The strongest rule
  engine a careful team would write without learning.

All of them avoid re-starting a unit on an agent where loop detection would fire.
"""

from __future__ import annotations

import logging
import math
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.actions import FINISH, START, WAIT, ActionCodec, valid_action_mask
from podium.envs.swarm.bound import upward_ranks
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.scheduling import PolicyStep, Rng
from podium.envs.swarm.spec import SPLIT_FACTORS
from podium.envs.swarm.state import SwarmState
from podium.errors import ConfigError

K = TypeVar("K")
V = TypeVar("V")

if TYPE_CHECKING:
    from podium.envs.swarm.env import SwarmEnv
    from podium.observed import AgentStats

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Command:
    """A decision in structured form."""

    type: int
    """START, WAIT or FINISH (podium.v1.ActionType numbering)."""
    slot: int = -1
    """Subtask slot (START only)."""
    agent: int = -1
    """Agent index (START only)."""
    k: int = 1
    """Split factor (START only)."""

    def encode(self, codec: ActionCodec) -> int:
        """Flat action index under ``codec``."""
        if self.type == START:
            return codec.start(self.slot, self.agent, self.k)
        return codec.wait if self.type == WAIT else codec.finish


class RuleEngine:
    """Shared plumbing: the policy interface, loop-safe agent choice."""

    name = "rule"

    @property
    def version(self) -> str:
        """``"rules:<name>"``: what decisions and trajectories of a rule engine are stamped with."""
        return f"rules:{self.name}"

    def decide(self, state: SwarmState, rng: Rng = None) -> Command:
        """The decision as a :class:`Command`."""
        raise NotImplementedError

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        """The decision for ``env``'s state as an action of its codec (log π = 0: the rule
        engines are deterministic, and they have no critic)."""
        return PolicyStep(self.decide(env.state, rng).encode(env.codec))

    @staticmethod
    def _allowed(state: SwarmState, slot: int, agent: int) -> bool:
        """Whether starting ``slot``'s next unit on ``agent`` keeps clear of loop detection."""
        unit = state.next_unit(slot)
        return unit < 0 or state.u_fails_on[unit][agent] < state.config.loop_retry_limit

    @staticmethod
    def _pick(state: SwarmState, slot: int, order: list[int]) -> int:
        """First agent in ``order`` that can do the slot's kind and is not loop-blocked.

        When every capable agent is loop-blocked (a kind only the generalist covers, failed
        ``loop_retry_limit`` times there), the first capable one: the environment's loop
        detection then ends the session as incomplete, which is what happened; a rule engine
        that raised instead would take the whole training run down with one unlucky session.
        """
        kind = state.kind_of(slot)
        capable = []
        for a in order:
            prof = state.pool.profile(a, kind)
            if prof is not None and prof.success > 0:
                if RuleEngine._allowed(state, slot, a):
                    return a
                capable.append(a)
        if capable:
            return capable[0]
        raise ConfigError(f"no agent can run subtask {state.task.subtasks[slot].id!r}")

    @staticmethod
    def _idle(state: SwarmState) -> Command:
        if state.running:
            return Command(WAIT)
        return Command(FINISH)


def _agents_by(state: SwarmState, kind: str, key: str) -> list[int]:
    """Agents ordered best-first by ``key``: "speed" (fastest) or "ets" (expected time to
    success, speed × success); ties keep pool order."""
    pool = state.pool

    def score(a: int) -> tuple[float, float]:
        p = pool.profile(a, kind)
        if p is None or p.success <= 0:
            return (-math.inf, -math.inf)
        return (p.speed, p.success) if key == "speed" else (p.speed * p.success, p.speed)

    return sorted(range(pool.num_agents), key=lambda a: score(a), reverse=True)


class SequentialPolicy(RuleEngine):
    """One subtask at a time, in dependency order, on the generalist.

    Without a ``"*"`` agent in the pool it uses the most efficient agent per kind (still one
    at a time). After the generalist reaches the loop limit on a unit it falls back likewise.
    """

    name = "sequential"

    def decide(self, state: SwarmState, rng: Rng = None) -> Command:
        if state.running:
            return Command(WAIT)
        gen = state.pool.generalist()
        for slot in range(state.num_slots):
            if state.runnable[slot] > 0:
                kind = state.kind_of(slot)
                order = _agents_by(state, kind, "ets")
                if gen is not None:
                    order = [gen, *[a for a in order if a != gen]]
                return Command(START, slot, self._pick(state, slot, order), 1)
        return Command(FINISH)


class GreedyPolicy(RuleEngine):
    """While a slot is free, start the first ready subtask on the fastest agent for it."""

    name = "greedy"

    def decide(self, state: SwarmState, rng: Rng = None) -> Command:
        if state.free > 0:
            for slot in range(state.num_slots):
                if state.runnable[slot] > 0:
                    order = _agents_by(state, state.kind_of(slot), "speed")
                    return Command(START, slot, self._pick(state, slot, order), 1)
        return self._idle(state)


def _memo(cache: dict[K, tuple[object, V]], key: K, owner: object, make: Callable[[], V]) -> V:
    """``make()``, cached in ``cache`` under ``key`` for as long as ``owner`` is the object
    stored with it (keys are ``id``s, which a dead object's successor may reuse)."""
    hit = cache.get(key)
    if hit is not None and hit[0] is owner:
        return hit[1]
    value = make()
    cache[key] = (owner, value)
    return value


class CplsPolicy(RuleEngine):
    """Critical-path list scheduling (HEFT-style).

    Priority: upward rank where each subtask's weight is its least expected time to success
    (work / (speed × success), minimised over agents) — the HEFT mean-cost weight adapted
    to unreliable agents. Agent: the one achieving it. Split: a ready subtask whose rank is
    the largest among unstarted work is split into the largest k ∈ {4, 2} whose extra
    chunks fit in capacity not needed by other ready subtasks, since then the chunks run in
    parallel and the critical path shortens by (1 − 1/k − split_overhead) × its duration.
    """

    name = "cpls"

    def __init__(self) -> None:
        # Keyed by id(task) / id(pool) and holding the object, so a recycled id never aliases.
        self._ranks: dict[int, tuple[object, list[float]]] = {}
        self._weights: dict[int, tuple[object, list[float]]] = {}
        self._priority: dict[int, tuple[object, list[int]]] = {}
        self._orders: dict[tuple[int, str], tuple[object, list[int]]] = {}

    def agent_order(self, state: SwarmState, kind: str) -> list[int]:
        """Agents for ``kind`` best-first by expected time to success (cached per pool: the
        environment asks for it at every step when it computes its advice features)."""
        return _memo(
            self._orders, (id(state.pool), kind), state.pool, lambda: _agents_by(state, kind, "ets")
        )

    def weights(self, state: SwarmState) -> list[float]:
        """Each subtask's least expected time to success over the agents: the weights of the
        upward ranks (cached per task object)."""
        pool = state.pool
        return _memo(
            self._weights,
            id(state.task),
            state.task,
            lambda: [
                min(
                    pool.expected_time_to_success(a, s.kind, s.work) for a in range(pool.num_agents)
                )
                for s in state.task.subtasks
            ],
        )

    def ranks(self, state: SwarmState) -> list[float]:
        """Upward ranks of the state's task (cached per task object)."""
        return _memo(
            self._ranks,
            id(state.task),
            state.task,
            lambda: upward_ranks(state.task, self.weights(state)),
        )

    def priority(self, state: SwarmState) -> list[int]:
        """Slots by decreasing upward rank, ties by slot (cached per task object)."""

        def order() -> list[int]:
            ranks = self.ranks(state)
            return sorted(range(state.num_slots), key=lambda s: (-ranks[s], s))

        return _memo(self._priority, id(state.task), state.task, order)

    def decide(self, state: SwarmState, rng: Rng = None) -> Command:
        free = state.free
        if free <= 0:
            return self._idle(state)
        runnable = state.runnable
        # The most critical ready subtask: the first runnable one in priority order (the
        # environment asks at every step for its advice features, so no per-step sort).
        slot = next((s for s in self.priority(state) if runnable[s] > 0), -1)
        if slot < 0:
            return self._idle(state)
        ranks = self.ranks(state)
        agent = self._pick(state, slot, self.agent_order(state, state.kind_of(slot)))
        if state.can_split(slot):
            # Unstarted work competing for capacity: the most critical one must be this slot.
            top = max(
                (ranks[s] for s in range(state.num_slots) if state.attempts_of[s] == 0),
                default=0.0,
            )
            ready = sum(1 for r in runnable if r > 0)
            spare = free - ready  # slots not claimed by the other ready subtasks
            if ranks[slot] >= top:
                for k in SPLIT_FACTORS[:0:-1]:
                    if k - 1 <= spare:
                        return Command(START, slot, agent, k)
        return Command(START, slot, agent, 1)


def estimated_pool(stats: AgentStats, pool: SubagentPool) -> SubagentPool:
    """``pool`` with every profile replaced by ``stats``' estimate (the same agents in the same
    order, so decisions on it index the real pool's agents); ConfigError if they differ."""
    estimated = SubagentPool(stats.estimated_pool(pool.spec))
    if estimated.agent_names != pool.agent_names:
        raise ConfigError(
            f"the estimated pool's agents {estimated.agent_names} are not the pool's "
            f"{pool.agent_names}"
        )
    return estimated


def decide_on_pool(engine: RuleEngine, state: SwarmState, pool: SubagentPool) -> Command:
    """``engine``'s decision for ``state`` as if its agents were ``pool`` (same agents in the
    same order: an estimated pool): the state's pool is swapped for the call, so every
    per-agent count of the state still lines up, and restored whatever happens. Cheaper than
    copying the state at every step. ``engine`` must hold nothing derived from another pool
    (cpls caches ranks per task: give each pool its own engine)."""
    own = state.pool
    state.pool = pool
    try:
        return engine.decide(state)
    finally:
        state.pool = own


@dataclass(frozen=True, slots=True)
class _Plan:
    """The pool one episode of :class:`CplsOnlinePolicy` plans on, with its own cpls."""

    stats: AgentStats
    """The store it was estimated from..."""
    version: int
    """... at this version of it..."""
    advertised: SubagentPool
    """... for this advertised pool (the environment's)."""
    pool: SubagentPool
    """The estimated pool: the same agents in the same order."""
    engine: CplsPolicy
    """A cpls of its own (its caches hold ranks on this pool)."""

    def matches(self, stats: AgentStats, advertised: SubagentPool) -> bool:
        """Whether it is the estimate ``stats`` gives of ``advertised`` now."""
        return (
            self.stats is stats and self.version == stats.version and self.advertised is advertised
        )


class CplsOnlinePolicy(CplsPolicy):
    """cpls on the agents' profiles as estimated online: the environment's statistics store
    (``env.stats``, an :class:`~podium.observed.AgentStats`) gives the estimated pool of the
    advertised spec (``stats.estimated_pool(spec)``), and cpls ranks, orders agents and splits
    on it exactly as it would on the spec.

    Each episode plans on the estimate taken at its first decision (right after its reset) and
    keeps it to its end, so evidence recorded meanwhile (by the episode's own end, or by other
    sessions sharing the store) changes only later episodes, never a plan half carried out.
    Estimates are cached by the store's version: episodes between two records share one
    estimated pool and its cpls caches. One object may drive many environments at once (lock-
    step rollouts, the orchestrator's sessions): each episode is pinned to its own estimate.

    Without a store it is plain cpls on the advertised profiles, and says so once.
    """

    name = "cpls-online"

    MAX_EPISODES = 1024
    """Episodes in flight whose estimate is remembered (the oldest are forgotten first)."""

    def __init__(self) -> None:
        super().__init__()
        self._latest: _Plan | None = None
        self._episodes: OrderedDict[int, tuple[SwarmState, _Plan | None]] = OrderedDict()
        self._warned = False

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        state = env.state
        plan = self._episode_plan(state, getattr(env, "stats", None))
        cmd = (
            super().decide(state) if plan is None else decide_on_pool(plan.engine, state, plan.pool)
        )
        return PolicyStep(cmd.encode(env.codec))

    def decide(self, state: SwarmState, rng: Rng = None) -> Command:
        """The decision for a bare state: on the estimate of the episode it belongs to when
        :meth:`act` has seen it, else on the newest estimate of its pool, else as cpls."""
        hit = self._episodes.get(id(state))
        plan = hit[1] if hit is not None and hit[0] is state else self._latest
        if plan is None or plan.advertised is not state.pool:
            return super().decide(state)
        return decide_on_pool(plan.engine, state, plan.pool)

    def estimated(self, state: SwarmState) -> SubagentPool | None:
        """The pool the episode of ``state`` plans on (None: the advertised one, no store)."""
        hit = self._episodes.get(id(state))
        return hit[1].pool if hit is not None and hit[0] is state and hit[1] else None

    def episode_estimate(
        self, state: SwarmState, stats: AgentStats
    ) -> tuple[SubagentPool, CplsPolicy]:
        """The estimated pool ``state``'s episode plans on under ``stats`` (fixed at its first
        call for the episode) and the cpls that plans on it (its ranks are cpls-online's)."""
        plan = self._episode_plan(state, stats)
        if plan is None:  # only without a store, which the signature rules out
            raise ConfigError("cpls-online has no statistics store to estimate the pool from")
        return plan.pool, plan.engine

    def _episode_plan(self, state: SwarmState, stats: AgentStats | None) -> _Plan | None:
        """The plan of ``state``'s episode: fixed the first time its state is seen."""
        hit = self._episodes.get(id(state))
        if hit is not None and hit[0] is state:
            return hit[1]
        plan = self._plan(state.pool, stats)
        self._episodes[id(state)] = (state, plan)
        while len(self._episodes) > self.MAX_EPISODES:
            self._episodes.popitem(last=False)
        return plan

    def _plan(self, pool: SubagentPool, stats: AgentStats | None) -> _Plan | None:
        """The estimated pool of ``pool``'s spec under ``stats`` now (cached by version)."""
        if stats is None:
            if not self._warned:
                self._warned = True
                _log.warning(
                    "cpls-online has no statistics store (env.stats is None): it plans on the "
                    "advertised profiles, exactly as cpls. Give the environment one: "
                    "SwarmEnv(..., stats=AgentStats()) (podium.observed); the orchestrator "
                    "keeps one with PODIUM_AGENT_STATS=on"
                )
            return None
        if self._latest is not None and self._latest.matches(stats, pool):
            return self._latest
        estimated = estimated_pool(stats, pool)
        self._latest = _Plan(stats, stats.version, pool, estimated, CplsPolicy())
        return self._latest


class RandomPolicy(RuleEngine):
    """Uniform over valid actions (the speed benchmark's policy and a sanity floor).

    Draws from the ``rng`` passed to :meth:`act`, or from its own generator seeded with
    ``seed`` when none is passed, so it is deterministic either way.
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        return PolicyStep(self._draw(env.action_masks(), rng))

    def decide(self, state: SwarmState, rng: Rng = None) -> Command:
        # Without an environment: the mask derived from the state's rules, in a codec sized
        # to the task.
        codec = ActionCodec(state.num_slots, state.pool.num_agents)
        kind, slot, agent, k = codec.decode(self._draw(valid_action_mask(state, codec), rng))
        return Command(kind, slot, agent, k if kind == START else 1)

    def _draw(self, mask: NDArray[np.bool_], rng: Rng) -> int:
        """A uniform valid action: from ``rng`` when given, else from the policy's own."""
        valid = np.flatnonzero(mask)
        if isinstance(rng, np.random.Generator):
            return int(valid[int(rng.integers(len(valid)))])
        r = rng if isinstance(rng, random.Random) else self._rng
        return int(valid[int(r.random() * len(valid))])


BASELINES: dict[str, type[RuleEngine]] = {
    "sequential": SequentialPolicy,
    "greedy": GreedyPolicy,
    "cpls": CplsPolicy,
    "cpls-online": CplsOnlinePolicy,
    "random": RandomPolicy,
}
"""Baseline policies by name."""


def make_policy(name: str) -> RuleEngine:
    """A fresh baseline by name; raises ConfigError listing the known names."""
    try:
        return BASELINES[name]()
    except KeyError:
        raise ConfigError(
            f"unknown policy {name!r}; known: {', '.join(sorted(BASELINES))}"
        ) from None
