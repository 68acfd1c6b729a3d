"""The rollout planner: Monte-Carlo policy improvement over cpls on a model of the pool.

Two models (:attr:`PlannerConfig.model`):

* ``truth`` (``planner``): the sub-agents' true profiles (``env.true_pool``, i.e. what a pool
  spec's ``true:`` says), which no production scheduler has. A reference line, not a policy
  to deploy: "how much better could a scheduler do that knew exactly how the agents behave
  and looked ahead?", read in ``podium bench scheduling --policies ...,planner``.
* ``estimates`` (``planner-online``): the statistics store's estimate of the advertised pool
  (what cpls-online plans on) with merges at their observed cost
  (:meth:`~podium.observed.AgentStats.estimated_world`: what the rollout controller's twins
  draw from too), fixed for the episode. It reads nothing a deployment lacks; its
  rollouts simulate the estimate, never the truth. It is the teacher the learned policy is
  cloned from (``podium train --teacher planner-online``): one step of policy improvement over
  cpls-online, which the network then makes cheap enough to serve.

At each decision with a choice (Bertsekas' rollout algorithm, one-step lookahead):

1. candidates: cpls's own choice first (cpls on the model's profiles), then the other valid
   START actions ranked by cpls's priority (slot by upward rank, agent by expected time to
   success, split factor 1, 2, 4), the first ``candidates`` in all, and WAIT when valid;
2. each candidate is applied to a copy of the session (:class:`SwarmSimulator` deep copy,
   which shares nothing mutable with the original) and cpls runs it to the end, ``rollouts``
   times, each with *fresh* sub-agent luck (:meth:`SwarmSimulator.fresh_luck`: new seeds for
   later executions, the executions in flight redrawn given only that they are still
   running), so the real session's luck is never peeked at. Rollout m uses the same luck for
   every candidate (common random numbers: the comparison is paired);
3. the least mean cost wins among the candidates that beat cpls's significantly (paired
   saving above ``z`` standard errors, :attr:`PlannerConfig.z`) (cost = the environment's negative return: latency / bound, plus
   its penalties when a rollout ends incomplete); ties keep cpls's choice.

The rollouts step the simulator directly, not the environment: the observation encoding
would cost more than the rest of a step and no rollout reads it.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.actions import FINISH, START, WAIT
from podium.envs.swarm.baselines import Command, CplsPolicy, make_policy
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.scheduling import PolicyStep, Rng, SchedulingPolicy
from podium.envs.swarm.spec import SPLIT_FACTORS
from podium.errors import ConfigError

if TYPE_CHECKING:
    from podium.envs.swarm.env import SwarmEnv
    from podium.envs.swarm.state import SwarmState
    from podium.observed import AgentStats


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Settings of :class:`RolloutPlanner`."""

    candidates: int = 4
    """K: actions evaluated per decision (cpls's first), plus WAIT when it is valid."""
    rollouts: int = 16
    """M: rollouts of cpls to the end per candidate, each with fresh sub-agent luck."""
    z: float = 2.0
    """A candidate replaces cpls's choice only when its mean saving over cpls's, paired by
    rollout, exceeds ``z`` standard errors: with few noisy rollouts the least mean alone is
    often a lucky draw (the winner's curse), and following it made the planner worse than
    cpls. 0 follows the least mean."""
    seed: int = 0
    """Seed of the planner's own generator (used when ``act`` is given no ``random.Random``)."""
    model: str = "truth"
    """What the rollouts simulate: ``"truth"`` (the sub-agents' true profiles, a reference
    line no deployment can run) or ``"estimates"`` (the environment's statistics store's
    estimate of the advertised pool, fixed at the episode's first decision: a planner a
    deployment could run, and the teacher ``podium train --teacher planner-online`` clones)."""


MODELS = ("truth", "estimates")
"""Values of :attr:`PlannerConfig.model`."""

MAX_ENGINES = 64
"""cpls engines kept, one per model pool (each caches ranks for its pool)."""

MAX_EPISODES = 1024
"""Episodes in flight whose estimated pool is remembered (one planner may drive many
environments in lockstep: training runs 32)."""


class RolloutPlanner:
    """Monte-Carlo policy improvement over cpls on a model of the pool (see the module
    docstring). With the ``truth`` model it is a reference line, never a policy to deploy."""

    name = "planner"

    def __init__(self, config: PlannerConfig | None = None) -> None:
        self.config = config or PlannerConfig()
        if self.config.model not in MODELS:
            raise ConfigError(
                f"planner model must be one of {', '.join(MODELS)}, got {self.config.model!r}"
            )
        if self.config.candidates < 1 or self.config.rollouts < 1:
            raise ConfigError(
                f"planner needs candidates >= 1 and rollouts >= 1, got {self.config.candidates} "
                f"and {self.config.rollouts}"
            )
        # A cpls per true pool, shown only that pool: cpls caches upward ranks per task, so
        # one engine shown two pools would plan the second on the first's numbers.
        self._engines: dict[int, tuple[SubagentPool, CplsPolicy]] = {}
        self._rng = random.Random(self.config.seed)
        # The estimated pool of each episode in progress, by its state (one planner may drive
        # several environments in lockstep), so every decision of one episode plans on one
        # model, as cpls-online's do.
        self._episodes: OrderedDict[int, tuple[SwarmState, SubagentPool]] = OrderedDict()
        # (store, its version, advertised pool, the estimate): held, not keyed by id, so a
        # store that dies cannot hand its estimate to a new one at the same address.
        self._latest: tuple[AgentStats, int, SubagentPool, SubagentPool] | None = None

    @property
    def version(self) -> str:
        """``"reference:planner"`` for the planner that reads the truth;
        ``"rules:planner-online"`` for the one that reads only the statistics store."""
        return "reference:planner" if self.config.model == "truth" else "rules:planner-online"

    def model(self, env: SwarmEnv) -> SubagentPool:
        """The pool the rollouts simulate for ``env``'s episode (see :attr:`PlannerConfig.model`)."""
        if self.config.model == "truth":
            return env.true_pool or env.pool
        state = env.state
        hit = self._episodes.get(id(state))
        if hit is None or hit[0] is not state:
            hit = (state, self._estimate(env))
            self._episodes[id(state)] = hit
            while len(self._episodes) > MAX_EPISODES:
                self._episodes.popitem(last=False)
        return hit[1]

    def _estimate(self, env: SwarmEnv) -> SubagentPool:
        """The store's estimated world for ``env``'s pool now (agents and merges as
        observed): one object per store version, so the
        episodes that start between two records share it and its cpls engine's caches."""
        stats = getattr(env, "stats", None)
        if stats is None:
            return env.pool
        latest = self._latest
        if (
            latest is None
            or latest[0] is not stats
            or latest[1] != stats.version
            or latest[2] is not env.pool
        ):
            latest = self._latest = (
                stats,
                stats.version,
                env.pool,
                SubagentPool(stats.estimated_world(env.pool.spec)),
            )
        return latest[3]

    def cpls(self, model: SubagentPool) -> CplsPolicy:
        """The cpls engine that plans on ``model`` (the last few models' engines are kept)."""
        hit = self._engines.get(id(model))
        if hit is None or hit[0] is not model:
            hit = (model, CplsPolicy())
            self._engines[id(model)] = hit
            while len(self._engines) > MAX_ENGINES:  # estimated pools come and go
                del self._engines[next(iter(self._engines))]
        return hit[1]

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        """cpls's choice on the model, unless a candidate's rollouts beat it clearly (see the
        module docstring)."""
        assert env.sim is not None
        model = self.model(env)
        cpls = self.cpls(model)
        mask = env.action_masks()
        valid = np.flatnonzero(mask)
        own = cpls.decide(_viewed(env.sim.state, model)).encode(env.codec)
        if len(valid) == 1 or own == env.codec.finish:
            return PolicyStep(own)
        candidates = _candidates(cpls, env, model, own, mask, self.config.candidates)
        if len(candidates) == 1:
            return PolicyStep(own)
        r = rng if isinstance(rng, random.Random) else self._rng
        seeds = [r.getrandbits(63) for _ in range(self.config.rollouts)]
        # The rollouts end where the episode would be truncated.
        limit = (env.config.max_steps or 50 * len(env.task.subtasks) + 100) - len(env.decisions)
        costs = [[_rollout(cpls, env, model, a, s, limit) for s in seeds] for a in candidates]
        return PolicyStep(candidates[_choose(costs, self.config.z)])


def _candidates(
    cpls: CplsPolicy,
    env: SwarmEnv,
    model: SubagentPool,
    own: int,
    mask: NDArray[np.bool_],
    k_max: int,
) -> list[int]:
    """cpls's choice, then valid STARTs by cpls's priority up to K, then WAIT if valid."""
    state = _viewed(env.state, model)
    out = [own]
    codec = env.codec
    for slot in cpls.priority(state):
        if state.runnable[slot] <= 0:
            continue
        for agent in cpls.agent_order(state, state.kind_of(slot)):
            for k in SPLIT_FACTORS:
                if len(out) >= k_max:
                    break
                a = codec.start(slot, agent, k)
                if mask[a] and a not in out:
                    out.append(a)
    if mask[codec.wait] and codec.wait not in out:
        out.append(codec.wait)
    return out


def _rollout(
    cpls: CplsPolicy, env: SwarmEnv, model: SubagentPool, action: int, seed: int, limit: int
) -> float:
    """Cost of ``action`` then cpls to the end, on a copy of ``env``'s session with fresh
    luck (the simulator alone: no rollout reads an observation)."""
    twin = copy.deepcopy(env.sim)
    assert twin is not None
    # The copy's cpls plans on the model and its executions are drawn from it (the estimate
    # must never draw the model's luck); the original is untouched.
    twin.state.pool = model
    twin.outcomes = model
    twin.fresh_luck(seed)
    state = twin.state
    kind, slot, agent, k = env.codec.decode(action)
    command = Command(kind, slot, agent, k if kind == START else 1)
    steps = 0
    while True:
        steps += 1
        if command.type == FINISH:
            break
        if command.type == WAIT:
            twin.wait()
        else:
            twin.decide()
            twin.start(command.slot, command.agent, command.k)
            twin.deliver_due()
        if state.all_done or state.loop_detected or steps >= limit:
            break
        command = cpls.decide(state)
    return _cost(state, env)


def _choose(costs: list[list[float]], z: float) -> int:
    """Index of the candidate to take: the least mean cost among those whose paired saving
    over candidate 0 (cpls's) is significant at ``z`` standard errors; 0 when none is."""
    best, best_mean = 0, statistics.fmean(costs[0])
    m = len(costs[0])
    for i in range(1, len(costs)):
        saving = [c0 - c for c0, c in zip(costs[0], costs[i], strict=True)]
        mean = statistics.fmean(saving)
        se = statistics.pstdev(saving) / math.sqrt(m - 1) if m > 1 else 0.0
        cost = best_mean if best == 0 else statistics.fmean(costs[best])
        if mean > z * se and statistics.fmean(costs[i]) < cost:
            best = i
    return best


def _viewed(state: SwarmState, model: SubagentPool) -> SwarmState:
    """``state`` as seen through ``model`` (a shallow copy: cpls only reads it)."""
    if state.pool is model:
        return state
    view = copy.copy(state)
    view.pool = model
    return view


def _cost(state: SwarmState, env: SwarmEnv) -> float:
    """The environment's negative return for an episode ending in ``state``."""
    cost = state.clock / env.bound.value
    if not state.all_done:
        n = state.num_slots
        cost += env.config.incomplete_penalty * (1.0 - state.done_slots / n)
        if state.loop_detected:
            cost += env.config.loop_penalty
    return cost


__all__ = ["PlannerConfig", "RolloutPlanner"]


PLANNERS = {"planner": "truth", "planner-online": "estimates"}
"""The planners by name, with the model each plans on."""


def make_scheduler(name: str) -> SchedulingPolicy:
    """A fresh policy by name: a planner (:data:`PLANNERS`) or a rule engine
    (:func:`~podium.envs.swarm.baselines.make_policy`, whose ConfigError lists the names)."""
    if name in PLANNERS:
        return RolloutPlanner(PlannerConfig(model=PLANNERS[name]))
    return make_policy(name)
