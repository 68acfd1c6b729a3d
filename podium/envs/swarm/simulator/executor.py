"""The event-driven clock: samples executions from the pool and delivers their completions.

:class:`SwarmSimulator` wraps a :class:`~podium.envs.swarm.state.SwarmState`. Each started
execution gets its own seed drawn from the session's generator and its outcome from
:meth:`SubagentPool.sample` — the same pure function ``subagent_svc`` calls with the seed it
receives in ``SubtaskAssigned`` — so a simulated session can be replayed over the bus.
Completions wait in a heap ordered by (end time, execution id); the id breaks ties so equal
end times resolve deterministically.
"""

from __future__ import annotations

import heapq
import random

from podium.envs.swarm.pool import SubagentPool, sample_execution
from podium.envs.swarm.spec import TaskSpec
from podium.envs.swarm.state import ExecutionRecord, StateConfig, SwarmState


class SwarmSimulator:
    """A session in simulated time: state + sampled durations + event queue."""

    def __init__(
        self,
        task: TaskSpec,
        pool: SubagentPool,
        seed: int | None = None,
        config: StateConfig | None = None,
    ) -> None:
        self.pool = pool
        self.state = SwarmState.new(task, pool, config)
        self.rng = random.Random(seed)
        self.step_cost = pool.spec.main_step_cost
        self._events: list[tuple[float, int, bool]] = []
        self.seeds: dict[int, int] = {}
        """Execution id -> the seed its outcome was sampled with (for replay over the bus)."""

    def decide(self) -> None:
        """Charge one orchestrator decision: the clock advances by main_step_cost."""
        self.state.clock += self.step_cost

    def start(self, slot: int, agent: int, k: int = 1) -> list[ExecutionRecord]:
        """Start executions at the current clock and schedule their completions."""
        st = self.state
        recs = st.start(slot, agent, k)
        if recs:
            prof = self.pool.profile(agent, st.kind_of(slot))
            assert prof is not None  # start() checked can_do
            for rec in recs:
                seed = self.rng.getrandbits(63)
                self.seeds[rec.id] = seed
                # Same draw as SubagentPool.sample(agent, kind, work, seed), without the lookup.
                out = sample_execution(prof, st.u_work[rec.unit], seed)
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
