"""The action codec and the named observation layout: one encoding, read by name everywhere."""

from __future__ import annotations

import random
from dataclasses import fields

import numpy as np
import pytest

from podium.envs.swarm.actions import FINISH, START, WAIT, ActionCodec
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.observation import (
    DURATION_CAP,
    GLOBAL_FEATURES,
    PAIR_FEATURES,
    RUNNING_FEATURES,
    SLOT_FEATURES,
    Columns,
    GlobalColumns,
    PairColumns,
    RunningColumns,
    SlotColumns,
)
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import SPLIT_FACTORS, default_pool
from podium.envs.swarm.state import COMPLETE, MERGE_PART


def test_codec_translates_between_the_padded_and_a_task_layout() -> None:
    full, own = ActionCodec(10, 4), ActionCodec(3, 4)
    assert full.with_slots(3) == own and own.size == 3 * 4 * 3 + 2
    for slot, agent, k in [(0, 0, 1), (2, 3, 4), (1, 2, 2)]:
        a = full.start(slot, agent, k)
        assert full.translate(a, own) == own.start(slot, agent, k) == a
        assert own.decode(own.translate(a, own)) == (START, slot, agent, k)
    assert full.translate(full.wait, own) == own.wait
    assert full.translate(full.finish, own) == own.finish
    assert own.decode(own.wait)[0] == WAIT and own.decode(own.finish)[0] == FINISH
    actions = np.array([0, full.start(2, 1, 2), full.wait, full.finish], dtype=np.int64)
    trimmed = full.translate_many(actions, own)
    np.testing.assert_array_equal(own.translate_many(trimmed, full), actions)
    with pytest.raises(ValueError, match="agents"):
        full.translate(0, ActionCodec(3, 2))


def test_codec_trims_and_pads_masks_losslessly() -> None:
    full, own = ActionCodec(6, 2), ActionCodec(4, 2)
    rng = np.random.default_rng(0)
    masks = rng.random((5, own.size)) > 0.5
    padded = own.translate_mask(masks, full)
    assert padded.shape == (5, full.size)
    assert not padded[:, own.wait : full.wait].any()  # the padding slots are invalid
    np.testing.assert_array_equal(padded[:, full.wait :], masks[:, own.wait :])
    np.testing.assert_array_equal(full.translate_mask(padded, own), masks)
    out = np.ones(full.size, dtype=bool)  # into a caller's row, overwriting what was there
    own.translate_mask(masks[0], full, out=out)
    np.testing.assert_array_equal(out, padded[0])


@pytest.mark.parametrize(
    "columns",
    [SlotColumns.build(), GlobalColumns.build(), RunningColumns.build(), PairColumns.build()],
)
def test_named_columns_tile_the_row_without_gaps_or_overlaps(
    columns: SlotColumns | GlobalColumns | RunningColumns | PairColumns,
) -> None:
    taken: list[int] = []
    for f in fields(columns):
        value = getattr(columns, f.name)
        taken += list(range(value.start, value.stop)) if isinstance(value, Columns) else [value]
    assert sorted(taken) == list(range(columns.width))


def test_layout_blocks_and_the_network_split() -> None:
    env = SwarmEnv(generate_task("chain", 5, 0), default_pool(), EnvConfig(max_subtasks=8))
    lay = env.layout
    A = lay.num_agents
    assert lay.agents == env.pool.agent_names
    assert (lay.slot_features, lay.pair_features) == (SLOT_FEATURES, PAIR_FEATURES)
    assert lay.slot_col.advice.stop == lay.slot_features  # advice ends the row
    assert lay.global_token_features == GLOBAL_FEATURES + lay.running_rows * RUNNING_FEATURES
    assert lay.size == lay.slots_end + lay.global_token_features + 8 * A * PAIR_FEATURES
    assert lay.size == env.observation_space.shape[0]
    assert lay.global_block.start == lay.slots_end and lay.running_block.stop == lay.token_end
    assert lay.pair_block.start == lay.token_end and lay.pair_block.stop == lay.size
    obs, _ = env.reset(seed=0)
    rows, present, token, pairs = lay.split(obs[None], used_slots=6)
    assert rows.shape == (1, 6, lay.slot_features) and token.shape == (1, lay.global_token_features)
    assert pairs.shape == (1, 6, A, PAIR_FEATURES)
    assert present[0].tolist() == [True] * 5 + [False]
    assert np.shares_memory(pairs, obs) and np.shares_memory(token, obs)  # views
    slots, token1, pairs1 = lay.trim(obs, 5)
    np.testing.assert_array_equal(slots, rows[0, :5])
    np.testing.assert_array_equal(token1, token[0])
    np.testing.assert_array_equal(pairs1, pairs[0, :5])
    assert not np.shares_memory(pairs1, obs)  # copies
    assert pairs[0, :5, :, lay.pair_col.can_do].any() and not pairs[0, 5].any()  # padding
    full = lay.split(obs[None])
    assert full[0].shape[1] == full[3].shape[1] == 8


def test_every_named_column_says_what_its_name_says() -> None:
    """Read each feature by name and check it against the state it encodes, at every step of
    a noisy episode with splits, failures and retries."""
    pool = SubagentPool(default_pool())
    task = generate_task("layered", 20, 2, split_p=0.8)
    env = SwarmEnv(task, pool, EnvConfig(max_subtasks=24, max_running_obs=3))
    lay = env.layout
    col, gcol, rcol, pcol = lay.slot_col, lay.global_col, lay.running_col, lay.pair_col
    obs, _ = env.reset(seed=4)
    rng = random.Random(4)
    scale = 1.0 / env.bound.value
    steps = 0
    done = False
    A = lay.num_agents
    while not done:
        st = env.state
        mp = st.max_parallel
        rows = obs[: lay.slots_end].reshape(lay.max_subtasks, lay.slot_features)
        pairs = obs[lay.pair_block.slice].reshape(lay.max_subtasks, A, lay.pair_features)
        for i, s in enumerate(task.subtasks):
            row = rows[i]
            assert row[col.present] == 1.0
            assert row[col.work] == pytest.approx(s.work * scale)
            capable = sum(pool.can_do(a, s.kind) for a in range(A))
            assert row[col.capable] == pytest.approx(capable / A)
            assert row[col.blocked] == (st.unmet[i] > 0) and row[col.deps_met] == (st.unmet[i] == 0)
            assert row[col.runnable] == (st.runnable[i] > 0)
            assert row[col.running] == pytest.approx(st.running_of[i] / mp)
            assert row[col.done] == (st.phase[i] == COMPLETE)
            assert row[col.failed] == (st.failed_idle[i] > 0)
            assert row[col.attempts] == pytest.approx(min(st.attempts_of[i], 8) / 8)
            k = st.split_k[i]
            assert row[col.split_k] == (k / 4 if k > 1 else 0.0)
            assert row[col.splittable] == s.splittable and row[col.sensitive] == s.sensitive
            per_agent = [c / mp for c in st.running_agents[i]]
            np.testing.assert_allclose(pairs[i, :, pcol.running], per_agent, rtol=1e-6)
            unit = st.next_unit(i)
            fails = [0] * A if unit < 0 else st.u_fails_on[unit]
            np.testing.assert_allclose(
                pairs[i, :, pcol.failures], [f / env.config.loop_retry_limit for f in fails]
            )
            for a in range(A):
                assert pairs[i, a, pcol.can_do] == pool.can_do(a, s.kind)
        assert not rows[len(task.subtasks) :].any()  # padding slots carry nothing
        assert not pairs[len(task.subtasks) :].any()
        load = [0.0] * A
        for r in st.running.values():
            load[r.agent] += 1 / mp
        np.testing.assert_allclose(
            pairs[: len(task.subtasks), :, pcol.agent_running],
            np.tile(load, (len(task.subtasks), 1)),
            rtol=1e-6,
        )
        g = obs[lay.global_block.slice]
        assert g[gcol.clock] == pytest.approx(st.clock * scale, rel=1e-6)
        assert g[gcol.running] == pytest.approx(len(st.running) / mp)
        assert g[gcol.free] == pytest.approx((mp - len(st.running)) / mp)
        assert g[gcol.done_fraction] == pytest.approx(st.done_slots / len(task.subtasks))
        assert g[gcol.max_parallel] == pytest.approx(mp / 8)
        n = len(task.subtasks)
        assert g[gcol.failures] == pytest.approx(min(st.failures, n) / n)
        assert g[gcol.step_fraction] == pytest.approx(steps / (50 * len(task.subtasks) + 100))
        table = obs[lay.running_block.slice].reshape(lay.running_rows, lay.running_features)
        running = list(st.running.values())[: lay.running_rows]
        for r, row in zip(running, table, strict=False):
            assert row[rcol.present] == 1.0
            assert row[rcol.slot] == pytest.approx((r.slot + 1) / lay.max_subtasks)
            assert row[rcol.elapsed] == pytest.approx((st.clock - r.start) * scale, rel=1e-5)
            prof = pool.profile(r.agent, st.kind_of(r.slot))
            assert prof is not None
            want = min(st.u_work[r.unit] / prof.speed * scale, DURATION_CAP)
            assert row[rcol.expected_duration] == pytest.approx(want, rel=1e-6)
            assert row[rcol.success] == pytest.approx(prof.success)
            # No store: the estimates are the advertisement, with no confidence.
            assert row[rcol.estimated_duration] == row[rcol.expected_duration]
            assert row[rcol.estimated_success] == row[rcol.success]
            assert row[rcol.confidence] == 0.0
            part = st.u_part[r.unit]
            assert row[rcol.is_chunk] == (part >= 0) and row[rcol.is_merge] == (part == MERGE_PART)
        assert not table[len(running) :].any()
        valid = np.flatnonzero(env.action_masks())
        # Prefer splits, so chunks and merges show up in the running table.
        splits = [a for a in valid if a < env.codec.wait and env.codec.decode(int(a))[3] > 1]
        a = int(rng.choice(splits)) if splits and rng.random() < 0.7 else int(rng.choice(valid))
        obs, _, term, trunc, _ = env.step(a)
        steps += 1
        done = term or trunc
    assert steps > 10 and any(k > 1 for k in env.state.split_k)
    assert any(f > 0 for u in env.state.u_fails_on for f in u), "failures should be seen"
    assert len(SPLIT_FACTORS) == len(col.advised_split)
