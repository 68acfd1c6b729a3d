"""Subtasks held for review, released or withdrawn (SwarmState.hold / release / withdraw):
a held subtask cannot start but the rest goes on; a withdrawn one never runs, nor do its
dependents, and the episode ends by FINISH once nothing else can run (``stalled``)."""

from __future__ import annotations

import numpy as np
import pytest

from podium.envs.swarm import EnvConfig, SwarmEnv
from podium.envs.swarm.actions import valid_action_mask
from podium.envs.swarm.spec import parse_task
from podium.envs.swarm.state import InvalidActionError

TASK = parse_task(
    {
        "name": "hold",
        "subtasks": [
            {"id": "w", "kind": "db", "work": 2.0, "sensitive": True, "splittable": True},
            {"id": "dep", "kind": "api", "work": 1.0, "deps": ["w"]},
            {"id": "other", "kind": "ui", "work": 1.0},
        ],
    }
)


def _env() -> SwarmEnv:
    env = SwarmEnv([TASK], config=EnvConfig(max_subtasks=4, invalid_action="raise"))
    env.reset(seed=3)
    return env


def _startable(env: SwarmEnv, slot: int) -> bool:
    codec, mask = env.codec, env.action_masks()
    return any(mask[codec.start(slot, a, k)] for a in range(codec.num_agents) for k in (1, 2, 4))


def _agrees(env: SwarmEnv) -> None:
    """The incremental mask is the reference mask (nothing stale after a refresh)."""
    reference = valid_action_mask(env.state, env.codec)
    assert np.array_equal(env.action_masks(), reference)


def test_held_slot_cannot_start_but_others_can() -> None:
    env = _env()
    state = env.state
    state.hold(0)
    env.refresh()
    assert not _startable(env, 0)  # neither whole nor split
    assert _startable(env, 2)
    _agrees(env)
    with pytest.raises(InvalidActionError):
        state.hold(0)
    state.release(0)
    env.refresh()
    assert _startable(env, 0)
    _agrees(env)


def test_withdrawn_slot_blocks_its_dependents_and_the_episode_finishes() -> None:
    env = _env()
    state = env.state
    state.hold(0)
    state.withdraw(0)
    env.refresh()
    assert not state.stalled  # "other" can still run
    codec = env.codec
    agent = next(a for a in range(codec.num_agents) if env.action_masks()[codec.start(2, a, 1)])
    env.step(codec.start(2, agent, 1))
    assert not env.action_masks()[codec.finish]
    _, _, terminated, _, _ = env.step(codec.wait)
    assert not terminated and state.stalled
    assert state.unmet[1] == 1 and state.runnable[1] == 0  # the dependent never became runnable
    mask = env.action_masks()
    assert mask[codec.finish] and mask.sum() == 1  # FINISH is the one way left
    _agrees(env)
    _, reward, terminated, _, info = env.step(codec.finish)
    assert terminated and not info["completed"] and not info["loop_detected"]
    assert reward < -1.0  # charged as incomplete


def test_clone_keeps_holds_apart() -> None:
    env = _env()
    env.state.hold(0)
    twin = env.clone()
    twin.state.release(0)
    assert 0 in env.state.held and 0 not in twin.state.held
