"""The scheduling state machine of one swarm session.

:class:`SwarmState` knows the task, which subtasks (and split chunks and merges) are blocked,
runnable, running, failed or done, which executions are in flight and what context each one
was given. It does not know where durations come from: the simulator
(:mod:`podium.envs.swarm.simulator`) samples them from the pool, and the orchestrator service
feeds it results arriving from the bus. Both call the same :meth:`SwarmState.start` and
:meth:`SwarmState.complete`, so a policy sees the same state in training and in production.

Vocabulary:

* a **slot** is one subtask of the task spec (index in file order); the action space addresses
  slots;
* a **unit** is something an agent can execute: the whole subtask, one of k chunks
  (``"<id>#<i>"``), or the merge (``"<id>#merge"``) that depends on all chunks;
* an **execution** is one attempt of one unit on one agent.

Everything is kept in flat Python lists indexed by slot or unit and updated incrementally,
because an environment step must cost a few microseconds (see ``bench/``); the set of slots
whose features changed is kept in :attr:`SwarmState.dirty` for the observation encoder.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

from podium.envs.swarm.bound import effective_max_parallel
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import SPLIT_FACTORS, TaskSpec, check_task_against_pool
from podium.errors import PodiumError


class InvalidActionError(PodiumError):
    """An action the current state does not allow (the mask would have excluded it)."""


# Unit status.
NEW, RUNNING, FAILED, DONE, SUPERSEDED = 0, 1, 2, 3, 4
# Slot phase.
WHOLE, CHUNKS, MERGE, COMPLETE = 0, 1, 2, 3

WHOLE_PART = -1
"""``part`` of a unit that is the whole subtask."""
MERGE_PART = -2
"""``part`` of a merge unit."""
MERGE_SUFFIX = "#merge"
"""How a merge unit's public id ends (:meth:`SwarmState.unit_id`): what a sub-agent or a
trajectory reader knows a merge by."""


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Limits of the state machine that are not part of the task or pool."""

    loop_retry_limit: int = 4
    """Failures of one unit on one agent after which starting it there again is a loop."""
    loop_idle_wait_limit: int = 3
    """Consecutive waits with nothing running after which the session is a loop."""


@dataclass(slots=True)
class ExecutionRecord:
    """One attempt of one unit on one agent, as the trajectory records it."""

    id: int
    """Execution number in the session, from 0."""
    unit: int
    """Unit index in the state."""
    slot: int
    """Slot (subtask) the unit belongs to."""
    agent: int
    """Agent index in the pool."""
    start: float
    """Simulated start time."""
    attempt: int
    """Attempt number of this unit, from 1."""
    split_k: int
    """Split factor of the parent subtask (1 = not split)."""
    context_units: tuple[int, ...]
    """Units whose outputs this execution was given (its dependencies), and nothing else."""
    end: float = -1.0
    """Simulated end time (-1 while running)."""
    success: bool | None = None
    """Outcome (None while running)."""


@dataclass(slots=True)
class SwarmState:
    """Scheduling state of one session. Build with :meth:`SwarmState.new`.

    Per slot: ``unmet`` dependencies not yet succeeded, ``phase`` (WHOLE, CHUNKS, MERGE,
    COMPLETE), ``split_k``, ``units_of`` (its units; after a split the chunks then the
    merge), ``final_unit`` (whose output dependents receive), ``runnable`` (idle units that
    may start now), ``running_of``, ``failed_idle``, ``attempts_of``, ``chunks_done`` and
    ``running_agents`` (running executions per agent). Per unit (``u_*``): slot, part
    (WHOLE_PART, chunk index or MERGE_PART), work, status, attempts and failures per agent.
    ``executions`` is every attempt in start order; ``running`` those in flight by id.
    """

    task: TaskSpec
    pool: SubagentPool
    max_parallel: int
    config: StateConfig
    # --- static, per slot
    children: list[list[int]]
    dep_slots: list[list[int]]
    # --- per slot, dynamic
    unmet: list[int]
    phase: list[int]
    split_k: list[int]
    units_of: list[list[int]]
    final_unit: list[int]
    runnable: list[int]
    running_of: list[int]
    failed_idle: list[int]
    attempts_of: list[int]
    chunks_done: list[int]
    running_agents: list[list[int]]
    # --- per unit
    u_slot: list[int] = field(default_factory=list)
    u_part: list[int] = field(default_factory=list)
    u_work: list[float] = field(default_factory=list)
    u_status: list[int] = field(default_factory=list)
    u_attempts: list[int] = field(default_factory=list)
    u_fails_on: list[list[int]] = field(default_factory=list)
    outputs: dict[int, str] = field(default_factory=dict)
    # --- executions
    executions: list[ExecutionRecord] = field(default_factory=list)
    running: dict[int, ExecutionRecord] = field(default_factory=dict)
    # --- session
    clock: float = 0.0
    done_slots: int = 0
    failures: int = 0
    splits: int = 0
    idle_waits: int = 0
    loop_reason: str = ""
    dirty: set[int] = field(default_factory=set)
    # --- human review (the orchestrator's gate; the simulator never holds anything)
    held: set[int] = field(default_factory=set)
    """Slots whose start is held for a review: not runnable until released or withdrawn."""
    withdrawn: set[int] = field(default_factory=set)
    """Slots that will never run (their review was rejected); their dependents never either."""

    @classmethod
    def new(
        cls, task: TaskSpec, pool: SubagentPool, config: StateConfig | None = None
    ) -> SwarmState:
        """Fresh state at clock 0; raises SpecError if the pool cannot do some kind."""
        check_task_against_pool(task, pool.spec)
        idx = task.index()
        n = len(task.subtasks)
        a = pool.num_agents
        dep_slots = [[idx[d] for d in s.deps] for s in task.subtasks]
        children: list[list[int]] = [[] for _ in range(n)]
        for i, ds in enumerate(dep_slots):
            for d in ds:
                children[d].append(i)
        st = cls(
            task=task,
            pool=pool,
            max_parallel=effective_max_parallel(task, pool.spec),
            config=config or StateConfig(),
            children=children,
            dep_slots=dep_slots,
            unmet=[len(ds) for ds in dep_slots],
            phase=[WHOLE] * n,
            split_k=[1] * n,
            units_of=[[i] for i in range(n)],
            final_unit=list(range(n)),
            runnable=[1 if not ds else 0 for ds in dep_slots],
            running_of=[0] * n,
            failed_idle=[0] * n,
            attempts_of=[0] * n,
            chunks_done=[0] * n,
            running_agents=[[0] * a for _ in range(n)],
        )
        # Units 0..n-1 are the whole subtasks, so unit index == slot index until a split.
        for i, s in enumerate(task.subtasks):
            st._add_unit(i, WHOLE_PART, s.work)
        st.dirty = set(range(n))
        return st

    _SHARED = frozenset({"task", "pool", "config", "children", "dep_slots"})
    """Fields that never change after :meth:`new`: a copy shares them."""

    def __deepcopy__(self, memo: dict[int, Any]) -> SwarmState:
        """An independent copy (planners and shadow twins continue a session from one): every
        mutable list, dict and execution record is copied, the task, pool and static graph
        shared. Much faster than a generic deepcopy, which would copy the task and the pool."""
        new = copy.copy(self)
        memo[id(self)] = new
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self._SHARED or not isinstance(value, list | dict | set):
                continue
            if isinstance(value, list) and value and isinstance(value[0], list):
                value = [list(v) for v in value]  # per slot or unit: lists of ints
            else:
                value = value.copy()
            setattr(new, f.name, value)
        # Execution records change when they complete: copy them, keeping ``running`` (and
        # anything else the memo maps, e.g. a bus executor's outbox) pointing at the copies.
        new.executions = [copy.copy(r) for r in self.executions]
        for old, rec in zip(self.executions, new.executions, strict=True):
            memo[id(old)] = rec
        new.running = {eid: new.executions[eid] for eid in self.running}
        return new

    def _add_unit(self, slot: int, part: int, work: float) -> int:
        self.u_slot.append(slot)
        self.u_part.append(part)
        self.u_work.append(work)
        self.u_status.append(NEW)
        self.u_attempts.append(0)
        self.u_fails_on.append([0] * self.pool.num_agents)
        return len(self.u_slot) - 1

    # ------------------------------------------------------------------ queries

    @property
    def num_slots(self) -> int:
        """Number of subtasks in the task spec."""
        return len(self.task.subtasks)

    @property
    def free(self) -> int:
        """Execution slots free under max_parallel."""
        return self.max_parallel - len(self.running)

    @property
    def all_done(self) -> bool:
        """Whether every subtask has succeeded (the session is complete)."""
        return self.done_slots == len(self.task.subtasks)

    @property
    def loop_detected(self) -> bool:
        """Whether loop detection fired (see :attr:`loop_reason`)."""
        return bool(self.loop_reason)

    def kind_of(self, slot: int) -> str:
        """Kind of work of a slot (chunks and merges share it)."""
        return self.task.subtasks[slot].kind

    def unit_id(self, unit: int) -> str:
        """Public id of a unit: ``"<id>"``, ``"<id>#<i>"`` or ``"<id>#merge"``."""
        sid = self.task.subtasks[self.u_slot[unit]].id
        part = self.u_part[unit]
        if part == WHOLE_PART:
            return sid
        if part == MERGE_PART:
            return f"{sid}{MERGE_SUFFIX}"
        return f"{sid}#{part}"

    def next_unit(self, slot: int) -> int:
        """The unit a k = 1 start on ``slot`` would run, or -1 if none is runnable."""
        if self.runnable[slot] <= 0:
            return -1
        for u in self.units_of[slot]:
            st = self.u_status[u]
            if st in (NEW, FAILED) and (self.u_part[u] != MERGE_PART or self.phase[slot] == MERGE):
                return u
        return -1

    def can_split(self, slot: int) -> bool:
        """Whether ``slot`` may be split now (ignoring free capacity)."""
        return (
            self.phase[slot] == WHOLE
            and self.task.subtasks[slot].splittable
            and self.unmet[slot] == 0
            # A slot held for review (or withdrawn) has nothing runnable, so no split either.
            and self.runnable[slot] > 0
            and self.u_status[slot] in (NEW, FAILED)
        )

    def start_error(self, slot: int, agent: int, k: int) -> str | None:
        """Why START(slot, agent, k) is not allowed now, or None if it is."""
        if not 0 <= slot < len(self.task.subtasks):
            return f"no subtask in slot {slot}"
        if not 0 <= agent < self.pool.num_agents:
            return f"no agent {agent}"
        if k not in SPLIT_FACTORS:
            return f"split factor {k} not in {SPLIT_FACTORS}"
        if not self.pool.can_do(agent, self.kind_of(slot)):
            return f"agent {self.pool.agent_names[agent]!r} cannot do kind {self.kind_of(slot)!r}"
        if self.free < k:
            return f"{len(self.running)} of max_parallel={self.max_parallel} running, {k} needed"
        sid = self.task.subtasks[slot].id
        if k == 1:
            if self.runnable[slot] <= 0:
                return f"subtask {sid!r} has nothing runnable"
            return None
        if not self.can_split(slot):
            return f"subtask {sid!r} cannot be split now"
        return None

    # ------------------------------------------------------------------ transitions

    def start(self, slot: int, agent: int, k: int = 1) -> list[ExecutionRecord]:
        """Start ``slot`` on ``agent``, split into ``k`` chunks if k > 1, at the current clock.

        k = 1 runs the slot's next runnable unit (the whole subtask, a failed chunk, or the
        merge). k > 1 splits: k chunks of work/k start at once on ``agent`` and a merge of work
        split_overhead × work waits for them. Returns the executions started (empty if loop
        detection fired instead). Raises :class:`InvalidActionError` if not allowed.
        """
        err = self.start_error(slot, agent, k)
        if err is not None:
            raise InvalidActionError(err)
        if k == 1:
            unit = self.next_unit(slot)
            if self.u_fails_on[unit][agent] >= self.config.loop_retry_limit:
                self.loop_reason = (
                    f"retry loop: {self.unit_id(unit)!r} failed {self.u_fails_on[unit][agent]} "
                    f"times on {self.pool.agent_names[agent]!r} and was started there again"
                )
                return []
            if self.u_status[unit] == FAILED:
                self.failed_idle[slot] -= 1
            self.runnable[slot] -= 1
            return [self._launch(unit, agent)]
        # Split: the whole unit is superseded by k chunks plus a merge.
        whole = self.units_of[slot][0]
        if self.u_status[whole] == FAILED:
            self.failed_idle[slot] -= 1
        self.u_status[whole] = SUPERSEDED
        self.runnable[slot] -= 1
        work = self.task.subtasks[slot].work
        chunks = [self._add_unit(slot, i, work / k) for i in range(k)]
        merge = self._add_unit(slot, MERGE_PART, self.pool.spec.split_overhead * work)
        self.units_of[slot] = [*chunks, merge]
        self.final_unit[slot] = merge
        self.phase[slot] = CHUNKS
        self.split_k[slot] = k
        self.splits += 1
        return [self._launch(u, agent) for u in chunks]

    def _launch(self, unit: int, agent: int) -> ExecutionRecord:
        slot = self.u_slot[unit]
        part = self.u_part[unit]
        if part == MERGE_PART:
            ctx = tuple(self.units_of[slot][:-1])
        else:
            ctx = tuple(self.final_unit[d] for d in self.dep_slots[slot])
        self.u_status[unit] = RUNNING
        self.u_attempts[unit] += 1
        rec = ExecutionRecord(
            id=len(self.executions),
            unit=unit,
            slot=slot,
            agent=agent,
            start=self.clock,
            attempt=self.u_attempts[unit],
            split_k=self.split_k[slot],
            context_units=ctx,
        )
        self.executions.append(rec)
        self.running[rec.id] = rec
        self.running_of[slot] += 1
        self.running_agents[slot][agent] += 1
        self.attempts_of[slot] += 1
        self.idle_waits = 0
        self.dirty.add(slot)
        return rec

    def complete(
        self, execution_id: int, success: bool, end_time: float, output: str | None = None
    ) -> None:
        """Record that an execution finished (``output`` is what dependents will be given)."""
        try:
            rec = self.running.pop(execution_id)
        except KeyError:
            raise InvalidActionError(f"execution {execution_id} is not running") from None
        rec.end = end_time
        rec.success = success
        if end_time > self.clock:
            self.clock = end_time
        unit, slot = rec.unit, rec.slot
        self.running_of[slot] -= 1
        self.running_agents[slot][rec.agent] -= 1
        self.idle_waits = 0
        self.dirty.add(slot)
        if not success:
            self.u_status[unit] = FAILED
            self.u_fails_on[unit][rec.agent] += 1
            self.failed_idle[slot] += 1
            self.runnable[slot] += 1
            self.failures += 1
            return
        self.u_status[unit] = DONE
        if output is not None:
            self.outputs[unit] = output
        part = self.u_part[unit]
        if part >= 0:
            self.chunks_done[slot] += 1
            if self.chunks_done[slot] == self.split_k[slot]:
                self.phase[slot] = MERGE
                self.runnable[slot] += 1
            return
        self.phase[slot] = COMPLETE
        self.done_slots += 1
        for c in self.children[slot]:
            self.unmet[c] -= 1
            if self.unmet[c] == 0:
                self.runnable[c] += 1
                self.dirty.add(c)

    def hold(self, slot: int) -> None:
        """Hold ``slot`` out of scheduling (a START of it waits for a human review): it stops
        being runnable until :meth:`release` or :meth:`withdraw`; nothing else changes."""
        if self.runnable[slot] <= 0 or slot in self.held:
            raise InvalidActionError(f"subtask {self.task.subtasks[slot].id!r} cannot be held now")
        self.runnable[slot] -= 1
        self.held.add(slot)
        self.dirty.add(slot)

    def release(self, slot: int) -> None:
        """End the hold of ``slot``: it is runnable again (its review was approved)."""
        self.held.remove(slot)
        self.runnable[slot] += 1
        self.dirty.add(slot)

    def withdraw(self, slot: int) -> None:
        """End the hold of ``slot`` for good: it never runs, so its dependents never become
        runnable (its review was rejected or expired). The session ends, incomplete, once
        nothing else can run (:attr:`stalled`)."""
        self.held.remove(slot)
        self.withdrawn.add(slot)
        self.dirty.add(slot)

    @property
    def stalled(self) -> bool:
        """Whether nothing can ever run again although not every subtask succeeded: a
        withdrawn subtask blocks all that is left (nothing running, runnable or held)."""
        return (
            bool(self.withdrawn)
            and not self.running
            and not self.held
            and not any(r > 0 for r in self.runnable)
        )

    def note_idle_wait(self) -> None:
        """Record a wait with nothing running; past the limit that is a loop."""
        self.idle_waits += 1
        if self.idle_waits >= self.config.loop_idle_wait_limit:
            self.loop_reason = (
                f"idle loop: waited {self.idle_waits} times in a row with nothing running"
            )

    def output_of(self, unit: int) -> str:
        """Output a unit handed to its dependents (synthesised in simulation)."""
        out = self.outputs.get(unit)
        if out is not None:
            return out
        return f"result of {self.unit_id(unit)}"

    def context_of(self, rec: ExecutionRecord) -> list[tuple[str, str]]:
        """(dependency unit id, output) pairs the execution was given."""
        return [(self.unit_id(u), self.output_of(u)) for u in rec.context_units]

    def summary(self) -> dict[str, int]:
        """Counts for an observation summary: units, ready, running, done, failed."""
        return {
            "num_subtasks": len(self.u_slot) - self.splits,
            "ready": sum(1 for r in self.runnable if r > 0),
            "running": len(self.running),
            "done": self.done_slots,
            "failed": self.failures,
            "max_parallel": self.max_parallel,
        }
