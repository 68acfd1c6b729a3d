"""The simulator's hand-written deepcopy: equal to the session it copies, independent of it,
and continuing exactly as it does (planners copy it for every rollout)."""

from __future__ import annotations

import copy
import random
from dataclasses import fields

import numpy as np

from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.actions import START, WAIT
from podium.envs.swarm.baselines import CplsPolicy
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.simulator import SwarmSimulator
from podium.envs.swarm.state import SwarmState


def _mid_session() -> SwarmSimulator:
    """A session 25 random decisions in: splits, failures and executions in flight."""
    env = SwarmEnv(generate_task("layered", 30, 6), default_pool(), EnvConfig(max_subtasks=32))
    env.reset(seed=13)
    rng = random.Random(1)
    for _ in range(25):
        env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
    assert env.sim is not None and env.state.running and env.sim.seeds
    return env.sim


def _snapshot(sim: SwarmSimulator) -> tuple[object, ...]:
    """Everything that evolves in a session, as plain values."""
    st: SwarmState = sim.state
    state = tuple(repr(getattr(st, f.name)) for f in fields(st) if f.name not in SwarmState._SHARED)
    return state, sorted(sim._events), dict(sim.seeds), sim._seed_base


def _play(sim: SwarmSimulator) -> None:
    """cpls to the end of the session, as a planner's rollout plays a copy."""
    cpls = CplsPolicy()
    state = sim.state
    while not (state.all_done or state.loop_detected):
        command = cpls.decide(state)
        if command.type == WAIT:
            sim.wait()
        else:
            assert command.type == START
            sim.decide()
            sim.start(command.slot, command.agent, command.k)
            sim.deliver_due()


def test_a_copy_equals_the_session_shares_the_pools_and_copies_the_rest() -> None:
    sim = _mid_session()
    twin = copy.deepcopy(sim)
    assert _snapshot(twin) == _snapshot(sim)
    assert twin.pool is sim.pool and twin.outcomes is sim.outcomes
    assert twin.state.task is sim.state.task  # the static graph is shared too
    assert twin._events is not sim._events and twin.seeds is not sim.seeds
    # the running table points at the copy's own execution records
    assert all(twin.state.running[e] is twin.state.executions[e] for e in twin.state.running)


def test_a_copy_continues_exactly_as_the_original_and_leaves_it_alone() -> None:
    sim = _mid_session()
    before = _snapshot(sim)
    twin = copy.deepcopy(sim)
    _play(twin)
    assert _snapshot(sim) == before
    assert _snapshot(twin) != before
    _play(sim)
    assert _snapshot(sim) == _snapshot(twin)
