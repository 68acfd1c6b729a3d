"""Scouting: trying an untried agent where the schedule has room for it.

A scheduler that plans on the statistics store's estimates (cpls-online, a learned policy that
reads the store) never learns what an agent it never routes to can do: an agent that is better
than it advertises stays at its advertisement forever, because nothing ever runs on it (the
misadvertised pool's ``qa-fast``: truly reliable, advertised flaky). Learning that needs
exploration, and exploring on the critical path costs latency on every pool that tells the
truth (Thompson sampling over the store's posterior: 1.3-2.2 % slower on the truthful default
pool, docs/training.md).

:class:`Scouting` explores only where it is free. Around any scheduling policy, it takes the
policy's decision and, when that decision starts a subtask unsplit, checks whether another
capable agent of that kind is *untried* (fewer than :attr:`ScoutConfig.min_observations`
executions of the kind observed in the store) and whether the subtask's *slack* can absorb
that agent's expected time to success :attr:`ScoutConfig.margin` times over. If so, the
subtask goes to the least-observed such agent instead. The slack is the cpls upward rank of
the most critical unfinished subtask (a running one counted as if it ended now: the slack is
never overestimated by the time it has left) less this subtask's rank, on the episode's
estimated pool (:class:`~podium.envs.swarm.baselines.CplsOnlinePolicy`'s estimate of it).

Once an agent has been tried ``min_observations`` times, the store's estimate of it speaks for
itself and the wrapped policy decides alone, so scouting stops by itself: 24 scouting starts
in 300 measured sessions of the misadvertised pool. Without a statistics store there is
nothing to learn from a scout, so the wrapper passes the policy's decisions through (and says
so once).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from podium.envs.swarm.actions import START
from podium.envs.swarm.baselines import CplsOnlinePolicy, RuleEngine
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.scheduling import PolicyStep, Rng, SchedulingPolicy
from podium.envs.swarm.state import COMPLETE, SwarmState
from podium.errors import ConfigError

if TYPE_CHECKING:
    from podium.envs.swarm.env import SwarmEnv
    from podium.observed import AgentStats

_log = logging.getLogger(__name__)

SCOUT_SUFFIX = "+scout"
"""Appended to a policy's name for the policy with scouting (``learned+scout``)."""


@dataclass(frozen=True, slots=True)
class ScoutConfig:
    """When :class:`Scouting` sends a subtask to an untried agent."""

    min_observations: float = 2.0
    """An agent is untried on a kind while the store has observed fewer (decayed) executions
    of that kind on it than this. Two are enough for the store's blend to move an agent
    that is much better than it advertises past the one the policy prefers."""
    margin: float = 2.0
    """The scout's expected time to success (on the estimated pool), times this, must fit in
    the time the subtask may take without lengthening the estimated critical path: room for
    one failed attempt and its retry, so a truthful advertisement costs nothing."""

    def __post_init__(self) -> None:
        if self.min_observations <= 0:
            raise ConfigError(f"min_observations must be > 0, got {self.min_observations}")
        if self.margin < 1:
            raise ConfigError(f"margin must be >= 1, got {self.margin}")


def slack(state: SwarmState, ranks: list[float], weights: list[float], slot: int) -> float:
    """How much longer than its rank assumes ``slot`` may take, started now, before it becomes
    the critical path: the largest upward rank among unfinished subtasks (a running one less
    its own weight, as if it ended now) minus ``slot``'s. Never more than the true slack under
    the ranks' model, since running work is taken to end now."""
    critical = max(
        (
            ranks[u] - (weights[u] if state.running_of[u] > 0 else 0.0)
            for u in range(state.num_slots)
            if state.phase[u] != COMPLETE and u not in state.withdrawn
        ),
        default=ranks[slot],
    )
    return critical - ranks[slot]


def scout_agent(
    state: SwarmState,
    pool: SubagentPool,
    stats: AgentStats,
    ranks: list[float],
    weights: list[float],
    slot: int,
    chosen: int,
    config: ScoutConfig,
) -> int | None:
    """The agent to try on ``slot`` instead of ``chosen``, or None. ``pool`` is the estimated
    pool (the state's agents in the same order), ``ranks`` and ``weights`` cpls's upward ranks
    and their weights on it."""
    kind = state.kind_of(slot)
    work = state.task.subtasks[slot].work
    room = slack(state, ranks, weights, slot) + weights[slot]
    best: tuple[float, int] | None = None
    for agent in range(pool.num_agents):
        if agent == chosen:
            continue
        profile = pool.profile(agent, kind)
        if profile is None or profile.success <= 0 or not RuleEngine._allowed(state, slot, agent):
            continue
        seen = stats.observed(pool.agent_names[agent], kind)
        if seen >= config.min_observations:
            continue
        if config.margin * pool.expected_time_to_success(agent, kind, work) <= room and (
            best is None or seen < best[0]
        ):
            best = (seen, agent)
    return None if best is None else best[1]


class Scouting:
    """``policy`` with scouting (see the module doc): a :class:`SchedulingPolicy` named
    ``<policy>+scout`` that stamps ``policy``'s version on its decisions.

    A scouting decision is the wrapper's own, not the policy's: its step carries no
    log-probability or value (a learner must not read it as the policy's sample)."""

    def __init__(self, policy: SchedulingPolicy, config: ScoutConfig | None = None) -> None:
        self.policy = policy
        self.config = config or ScoutConfig()
        self.scouted = 0
        """Decisions changed so far (reports and tests)."""
        self._estimates = CplsOnlinePolicy()  # each episode's estimated pool and its ranks
        self._warned = False

    @property
    def name(self) -> str:
        return f"{self.policy.name}{SCOUT_SUFFIX}"

    @property
    def version(self) -> str:
        return self.policy.version

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        return self.revise(env, self.policy.act(env, rng))

    async def act_async(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        """:meth:`act` for a policy that decides remotely (it has ``act_async``: a served
        network's round trip stays off the event loop); any other is called directly."""
        act_async = getattr(self.policy, "act_async", None)
        step = await act_async(env, rng) if act_async is not None else self.policy.act(env, rng)
        return self.revise(env, step)

    def revise(self, env: SwarmEnv, step: PolicyStep) -> PolicyStep:
        """``step`` (the wrapped policy's decision on ``env`` now), or a start of the same
        subtask on an untried agent where the slack allows (see the module doc)."""
        stats = getattr(env, "stats", None)
        if stats is None:
            if not self._warned:
                self._warned = True
                _log.warning(
                    "%s: no statistics store (env.stats is None), so nothing is scouted. Give "
                    "the environment one: SwarmEnv(..., stats=AgentStats()) (podium.observed)",
                    self.name,
                )
            return step
        kind, slot, chosen, k = env.codec.decode(step.action)
        if kind != START or k != 1:
            return step
        state = env.state
        pool, engine = self._estimates.episode_estimate(state, stats)
        own = state.pool
        state.pool = pool  # ranks on the estimate, as cpls-online computes them
        try:
            ranks, weights = engine.ranks(state), engine.weights(state)
        finally:
            state.pool = own
        scout = scout_agent(state, pool, stats, ranks, weights, slot, chosen, self.config)
        if scout is None:
            return step
        self.scouted += 1
        return PolicyStep(env.codec.start(slot, scout, 1))


def base_policy(name: str) -> str:
    """``name`` without its scouting suffix (``learned+scout`` -> ``learned``)."""
    return name.removesuffix(SCOUT_SUFFIX)


__all__ = ["SCOUT_SUFFIX", "ScoutConfig", "Scouting", "base_policy", "scout_agent", "slack"]
