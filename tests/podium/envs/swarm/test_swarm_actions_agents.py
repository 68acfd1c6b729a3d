"""The action codec between layouts of different agent counts (a learner's minibatch mixing
pools pads every decision to its most slots *and* agents)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from podium.envs.swarm.actions import FINISH, WAIT, ActionCodec
from podium.envs.swarm.spec import SPLIT_FACTORS


def test_translate_to_keeps_slot_agent_and_split_across_agent_counts() -> None:
    own, padded = ActionCodec(3, 5), ActionCodec(7, 9)
    every = np.arange(own.size, dtype=np.int64)
    moved = own.translate_to(every, padded)
    for a, b in zip(every.tolist(), moved.tolist(), strict=True):
        kind, slot, agent, k = own.decode(a)
        assert padded.decode(b) == (kind, slot, agent, k)
    assert padded.decode(int(moved[own.wait]))[0] == WAIT
    assert padded.decode(int(moved[own.finish]))[0] == FINISH
    # And back: the padded layout's START entries of real (slot, agent) pairs return home.
    np.testing.assert_array_equal(padded.translate_to(moved, own), every)
    # Same agent count: exactly translate_many (the one slot-only translation).
    same = ActionCodec(7, 5)
    np.testing.assert_array_equal(own.translate_to(every, same), own.translate_many(every, same))


def test_translate_to_refuses_a_start_the_target_lacks() -> None:
    big, small = ActionCodec(4, 9), ActionCodec(4, 5)
    with pytest.raises(ValueError, match="no place"):
        big.translate_to(np.array([big.start(0, 7, 1)], dtype=np.int64), small)
    with pytest.raises(ValueError, match="no place"):
        big.translate_to(np.array([big.start(3, 0, 1)], dtype=np.int64), ActionCodec(2, 5))


def test_translate_mask_to_pads_agents_and_slots_losslessly() -> None:
    own, padded = ActionCodec(3, 5), ActionCodec(6, 9)
    rng = np.random.default_rng(1)
    masks = rng.random((4, own.size)) > 0.5
    out = own.translate_mask_to(masks, padded)
    assert out.shape == (4, padded.size)
    for slot, agent, k in itertools.product(range(6), range(9), SPLIT_FACTORS):
        want = (
            masks[:, own.start(slot, agent, k)]
            if slot < 3 and agent < 5
            else np.zeros(4, bool)  # padding slots and agents are never valid
        )
        np.testing.assert_array_equal(out[:, padded.start(slot, agent, k)], want)
    np.testing.assert_array_equal(out[:, padded.wait :], masks[:, own.wait :])
    np.testing.assert_array_equal(padded.translate_mask_to(out, own), masks)
    row = np.ones(padded.size, dtype=bool)  # into a caller's row, overwriting what was there
    own.translate_mask_to(masks[2], padded, out=row)
    np.testing.assert_array_equal(row, out[2])
    # A valid action stays valid where translate_to puts it.
    valid = np.flatnonzero(masks[0])
    assert out[0, own.translate_to(valid.astype(np.int64), padded)].all()
