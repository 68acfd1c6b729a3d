"""The event-driven clock: samples executions from the pool and delivers their completions.

:class:`SwarmSimulator` wraps a :class:`~podium.envs.swarm.state.SwarmState`. Each started
execution gets its own seed and its outcome from :meth:`SubagentPool.sample` — the same pure
function ``subagent_svc`` calls with the seed it receives in ``SubtaskAssigned`` — so a
simulated session can be replayed over the bus.

The seed is a hash of the session's seed and *what* runs — (subtask, chunk, attempt) — not of
the order things were started in (:meth:`SwarmSimulator.execution_seed`). Two policies given
the same session seed therefore meet the same luck on every unit of work whatever order they
schedule it in (common random numbers): the third attempt of chunk 2 of ``build-api`` draws the
same uniforms under both, only scaled by the agent each chose. Comparing policies, and the
rollout baseline of the trainer, rely on it.
Completions wait in a heap ordered by (end time, execution id); the id breaks ties so equal
end times resolve deterministically.

Outcomes may come from a *true* pool other than the one the state, the masks and the policies
read (``outcomes``): sub-agents whose behaviour drifted (:mod:`podium.envs.swarm.drift`) while
the spec the planners see stays nominal. The seed of an execution does not depend on either
pool, so the same session under the nominal and the drifted pool meets the same luck. A merge
is planned at the state's pool's ``split_overhead`` and drawn at the true pool's
(:func:`~podium.envs.swarm.pool.merge_work_factor`).
"""

from __future__ import annotations

import copy
import heapq
import math
import random
from statistics import NormalDist
from typing import Any

from podium.envs.swarm.pool import (
    SubagentPool,
    merge_work_factor,
    mix64,
    sample_execution,
    splitmix64_uniforms,
)
from podium.envs.swarm.spec import TaskSpec
from podium.envs.swarm.state import MERGE_PART, ExecutionRecord, StateConfig, SwarmState
from podium.errors import ConfigError, SpecError

_COPIED_BY_HAND = frozenset(
    {"pool", "outcomes", "state", "_events", "seeds", "_seed_base", "step_cost"}
)
"""Attributes :meth:`SwarmSimulator.__deepcopy__` copies (or shares, or are immutable)
itself; any other (a subclass's) is deep-copied."""


class SwarmSimulator:
    """A session in simulated time: state + sampled durations + event queue."""

    def __init__(
        self,
        task: TaskSpec,
        pool: SubagentPool,
        seed: int | None = None,
        config: StateConfig | None = None,
        outcomes: SubagentPool | None = None,
    ) -> None:
        self.pool = pool
        self.outcomes = pool if outcomes is None else outcomes
        """The pool executions are sampled from: ``pool`` itself unless a true pool was given
        (see the module docstring); it must have the same agents in the same order."""
        if self.outcomes.agent_names != pool.agent_names:
            raise ConfigError(
                f"true pool {self.outcomes.spec.name!r} has agents {list(self.outcomes.agent_names)}"
                f", the nominal pool {pool.spec.name!r} has {list(pool.agent_names)}; a true pool "
                "changes how agents behave, never which agents there are"
            )
        self.state = SwarmState.new(task, pool, config)
        # The seed's only draw: every execution's luck is a hash of this base (not a stream),
        # so no generator is kept, and a copy (a planner's twin) has none to copy.
        self._seed_base = random.Random(seed).getrandbits(64)
        self.step_cost = pool.spec.main_step_cost
        self._events: list[tuple[float, int, bool]] = []
        self.seeds: dict[int, int] = {}
        """Execution id -> the seed its outcome was sampled with (for replay over the bus)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> SwarmSimulator:
        """An independent copy of the session in flight (state, pending completions, seeds),
        sharing the read-only pools; subclasses' attributes are deep-copied too.

        Written out because planners copy the simulator for every rollout: the pending
        completions are tuples of numbers and the seeds a dict of ints, so shallow copies of
        the containers are exact copies, where a generic deepcopy walks every element."""
        memo.setdefault(id(self.pool), self.pool)
        memo.setdefault(id(self.outcomes), self.outcomes)
        new = copy.copy(self)
        memo[id(self)] = new
        new.state = copy.deepcopy(self.state, memo)
        new._events = list(self._events)
        new.seeds = dict(self.seeds)
        for name, value in vars(self).items():
            if name not in _COPIED_BY_HAND:
                setattr(new, name, copy.deepcopy(value, memo))
        return new

    def execution_seed(self, rec: ExecutionRecord) -> int:
        """The seed of an execution: a hash of the session seed, the subtask slot, the chunk
        (or merge) and the attempt number; see the module docstring."""
        part = self.state.u_part[rec.unit]
        x = mix64(self._seed_base ^ rec.slot)
        x = mix64(x ^ (part & 0xFFFF_FFFF))
        return mix64(x ^ rec.attempt) >> 1  # 63 bits: the wire's int64 stays non-negative

    def decide(self) -> None:
        """Charge one orchestrator decision: the clock advances by main_step_cost."""
        self.state.clock += self.step_cost

    def start(self, slot: int, agent: int, k: int = 1) -> list[ExecutionRecord]:
        """Start executions at the current clock and schedule their completions."""
        st = self.state
        recs = st.start(slot, agent, k)
        if recs:
            prof = self.outcomes.profile(agent, st.kind_of(slot))
            if prof is None:  # start() checked the nominal pool; the true one must agree
                raise SpecError(
                    f"true pool {self.outcomes.spec.name!r}: agent "
                    f"{self.pool.agent_names[agent]!r} cannot do kind {st.kind_of(slot)!r}"
                )
            for rec in recs:
                seed = self.execution_seed(rec)
                self.seeds[rec.id] = seed
                work = st.u_work[rec.unit]
                if st.u_part[rec.unit] == MERGE_PART:
                    work *= merge_work_factor(st.pool.spec, self.outcomes.spec)
                # Same draw as SubagentPool.sample(agent, kind, work, seed), without the lookup.
                out = sample_execution(prof, work, seed)
                heapq.heappush(self._events, (rec.start + out.duration, rec.id, out.success))
        return recs

    def deliver_due(self) -> int:
        """Deliver every completion whose end time is <= the clock; returns how many."""
        ev, st, n = self._events, self.state, 0
        clock = st.clock
        while ev and ev[0][0] <= clock:
            end, eid, ok = heapq.heappop(ev)
            st.complete(eid, ok, end)
            n += 1
        return n

    def wait(self) -> int:
        """One WAIT decision: charge it, then block until the next completion if none is due.

        With nothing running this is an idle wait, which loop detection counts.
        """
        st = self.state
        st.clock += self.step_cost
        ev = self._events
        if not ev:
            st.note_idle_wait()
            return 0
        if ev[0][0] > st.clock:
            st.clock = ev[0][0]
        return self.deliver_due()

    def next_completion(self) -> float | None:
        """End time of the next completion, or None with nothing running."""
        return self._events[0][0] if self._events else None

    def fresh_luck(self, seed: int) -> None:
        """Forget this session's luck and draw new luck from ``seed`` (for planners that
        simulate possible futures from a copy, :mod:`podium.envs.swarm.planner`).

        Executions started from now on draw from a new seed base. Executions in flight get
        a new outcome drawn from the outcome pool *given what is known at the clock*: they
        are still running, so the new duration is drawn from the lognormal conditioned on
        exceeding the time already elapsed, and the success anew. The outcome the session
        had already drawn for them is never revealed to the planner.
        """
        self._seed_base = mix64(seed & 0xFFFF_FFFF_FFFF_FFFF)
        st, events = self.state, []
        for rec in st.running.values():
            prof = self.outcomes.profile(rec.agent, st.kind_of(rec.slot))
            assert prof is not None  # it was started on this pool
            u1, _, u3 = splitmix64_uniforms(mix64(self._seed_base ^ (rec.id + 1)))
            mean = st.u_work[rec.unit] / prof.speed
            duration = _duration_beyond(mean, prof.noise, st.clock - rec.start, u1)
            events.append((rec.start + duration, rec.id, u3 < prof.success))
        heapq.heapify(events)
        self._events = events


_STD_NORMAL = NormalDist()


def _duration_beyond(mean: float, sigma: float, elapsed: float, u: float) -> float:
    """A duration of mean ``mean`` (lognormal factor of σ ``sigma``, as
    :func:`~podium.envs.swarm.pool.sample_execution` draws) conditioned on exceeding
    ``elapsed``, by inverting the truncated normal's CDF at the uniform ``u``."""
    if sigma <= 0 or elapsed <= 0:
        if sigma <= 0:
            return mean
        z = _STD_NORMAL.inv_cdf(min(max(u, 1e-12), 1.0 - 1e-12))
        return mean * math.exp(sigma * z - 0.5 * sigma * sigma)
    z0 = (math.log(elapsed / mean) + 0.5 * sigma * sigma) / sigma
    lo = _STD_NORMAL.cdf(z0)
    p = min(max(lo + u * (1.0 - lo), 1e-12), 1.0 - 1e-12)
    # Past the far tail the CDF saturates: the execution ends now, as late as known.
    return max(elapsed, mean * math.exp(sigma * _STD_NORMAL.inv_cdf(p) - 0.5 * sigma * sigma))
