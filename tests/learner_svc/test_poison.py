"""One bad record never stops the learner, and it never trains twice on a trajectory (issue 12).

Seen: a scored trajectory with ``policy_version="²"`` crash-looped the swarm learner
(``"²".isdigit()`` is True, ``int("²")`` raises ValueError, which the loop did not expect).
Now every record that cannot become training data goes to the dead-letter topic with its
error, and the stream goes on: through the real swarm loop on both buses, and through the
deployed learner process on Kafka. And the learner drops a trajectory id it already trained
on, also after a restart (the ids of its last updates live in the checkpoint).
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from kafka_helpers import config_for, kafka_url
from loop_helpers import (
    N_ACTIONS,
    OBS_DIM,
    behaviour_policy,
    publish_scored,
    publish_trajectories,
    swarm_trajectories,
)
from signing_helpers import key_pair

from learner_svc.algorithms.ppo import GenericPPO, GenericPPOConfig
from learner_svc.algorithms.swarm import SwarmPPO, SwarmSample, SwarmSettings, swarm_layout
from learner_svc.checkpoint import LearnerState, load_checkpoint
from learner_svc.config import LoopSettings
from learner_svc.loop import LearningLoop, LoopConfig
from podium import topics
from podium.bus import Bus, KafkaBus, Record
from podium.bus.base import TopicSpec
from podium.bus.consumer import DLQ_ERROR, DLQ_ERROR_TYPE, DLQ_SOURCE_OFFSET
from podium.config import from_env
from podium.envs.swarm import default_pool
from podium.errors import ConfigError
from podium.policy.agent import SwarmAgent
from podium.policy.decisions import encode_observation
from podium.policy.signing import SIGNING_KEY_VAR
from podium.policy.swarm import save_policy
from podium.v1 import reward_pb2, trajectory_pb2

Names = Callable[[str], str]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MAX_SUBTASKS = 16
BATCH = 4


async def make_topics(bus: Bus, *names: str) -> None:
    """One partition each (records keep their order) and the scored topic's dead letters."""
    await bus.create_topics(
        [TopicSpec(n, 1) for n in names] + [TopicSpec(topics.dead_letter(names[0]), 1)]
    )


async def dead_letters(bus: Bus, topic: str, group: str, want: int) -> list[Record]:
    member = bus.subscriber([topics.dead_letter(topic)], group)
    await member.start()
    try:
        out: list[Record] = []
        deadline = asyncio.get_running_loop().time() + 30
        while len(out) < want and asyncio.get_running_loop().time() < deadline:
            out += await member.fetch(100, 0.2)
        return out
    finally:
        await member.stop()


def observation_size(decision: trajectory_pb2.Decision) -> int:
    """How many floats a decision's observation holds."""
    return len(zlib.decompress(decision.observation_tensor)) // 4


def loop_config(tmp_path: Path, topic: str, policy_topic: str, group: str) -> LoopConfig:
    return LoopConfig(
        checkpoint_dir=tmp_path / "ckpt",
        topic=topic,
        policy_topic=policy_topic,
        group_id=group,
        batch_trajectories=BATCH,
        max_policy_lag=1000,
        fetch_timeout_s=0.2,
    )


def swarm_learner(
    tmp_path: Path, config: LoopConfig, bus: Bus, init: Path
) -> LearningLoop[SwarmSample]:
    settings = SwarmSettings(
        artifacts_dir=str(tmp_path / "artifacts"),
        init=str(init),
        max_subtasks=MAX_SUBTASKS,
        critic_warmup_updates=0,
        signing_key=str(key_pair(tmp_path / "keys").private_path),
    )
    return LearningLoop(config, SwarmPPO.from_settings(settings), bus)


def init_policy(tmp_path: Path) -> tuple[SwarmAgent, Path]:
    layout = swarm_layout(default_pool(), MAX_SUBTASKS)
    torch.manual_seed(7)
    agent = SwarmAgent(layout)
    ref = save_policy(
        agent.net, tmp_path / "init", 0, tuple(layout.agents), max_subtasks=str(MAX_SUBTASKS)
    )
    return agent, ref.path


async def test_superscript_policy_version_is_dead_lettered_not_a_crash(
    bus: Bus, unique: Names, tmp_path: Path
) -> None:
    topic, policy_topic = unique("scored"), unique("policy")
    await make_topics(bus, topic, policy_topic)
    agent, init = init_policy(tmp_path)
    good = swarm_trajectories(agent, [f"good-{k}" for k in range(BATCH)], "0")
    [bad] = swarm_trajectories(agent, ["superscript"], "²", seed0=9)
    landed = await publish_scored(bus, topic, [*good[:2], bad, *good[2:]])

    loop = swarm_learner(
        tmp_path, loop_config(tmp_path, topic, policy_topic, unique("g")), bus, init
    )
    state = await asyncio.wait_for(loop.run(until_trained=BATCH), 180)

    assert (state.trained, state.dead_lettered) == (BATCH, 1)
    assert sorted(state.ledger) == [t.trajectory_id for t in good]
    [dead] = await dead_letters(bus, topic, unique("inspect"), 1)
    assert dead.header(DLQ_SOURCE_OFFSET) == str(landed[2].offset).encode()
    assert dead.header(DLQ_ERROR_TYPE) == b"DecodeError"
    assert "policy_version '²' is not printable ASCII" in (dead.header(DLQ_ERROR) or b"").decode()


async def test_every_kind_of_bad_training_record_is_dead_lettered(
    inproc_bus: Bus, unique: Names, tmp_path: Path
) -> None:
    """Versions int() refuses (4300+ digits) or reads non-strictly (Arabic-Indic "٣" was
    accepted as 3), a control character, tensors cut short, a garbage mask, a NaN (which
    used to turn every weight into NaN), an observation that inflates past its size: each one
    parked with an error naming it, and the good records around them trained."""
    bus = inproc_bus
    topic, policy_topic = unique("scored"), unique("policy")
    await make_topics(bus, topic, policy_topic)
    agent, init = init_policy(tmp_path)
    good = swarm_trajectories(agent, [f"good-{k}" for k in range(BATCH)], "0")
    bad = swarm_trajectories(agent, [f"bad-{k}" for k in range(10)], "0", seed0=20)
    bad[0].policy_version = "1" * 5000
    bad[1].policy_version = "٣"
    bad[2].policy_version = "0\x00"
    bad[3].decisions[0].observation_tensor = bad[3].decisions[0].observation_tensor[:7]
    bad[4].decisions[-1].action_mask = b"\x01\x02garbage"
    bad[5].policy_version = "v" + "9" * 40
    bad[6].decisions[2].log_prob = math.nan
    # bad[7]: its total is NaN (below)
    bad[8].decisions[1].observation_tensor = encode_observation(
        np.full(observation_size(bad[8].decisions[1]), np.inf, dtype=np.float32)
    )
    bad[9].decisions[0].observation_tensor = zlib.compress(bytes(50_000_000), 9)
    await publish_scored(bus, topic, [good[0], *bad, *good[1:]], totals={"bad-7": math.nan})

    loop = swarm_learner(
        tmp_path, loop_config(tmp_path, topic, policy_topic, unique("g")), bus, init
    )
    state = await asyncio.wait_for(loop.run(until_trained=BATCH), 180)

    assert (state.trained, state.dead_lettered) == (BATCH, 10)
    assert all(torch.isfinite(p).all() for p in loop.algorithm.model.parameters())
    assert sorted(state.ledger) == [t.trajectory_id for t in good]
    dead = await dead_letters(bus, topic, unique("inspect"), 10)
    errors = [(d.header(DLQ_ERROR) or b"").decode() for d in dead]
    assert "policy_version of 5000 characters" in errors[0]
    assert "'٣' is not printable ASCII" in errors[1]
    assert "is not printable ASCII" in errors[2]
    assert "observation_tensor" in errors[3] and "action_mask" in errors[4]
    assert "a number of 40 digits" in errors[5]
    assert "decision 2: log_prob is nan" in errors[6]
    assert "bad-7: total is nan" in errors[7]
    assert "observation_tensor holds a non-finite value" in errors[8]
    assert "observation_tensor holds more than" in errors[9]
    assert all(d.header(DLQ_ERROR_TYPE) == b"DecodeError" for d in dead), errors


def _deployed_learner(
    bootstrap: str, run: str, tmp: Path, init: Path, until_trained: int
) -> subprocess.CompletedProcess[str]:
    """``python -m learner_svc``'s swarm loop as a process (learner_until.py), on Kafka."""
    env = os.environ | {
        "PODIUM_LEARNER_IN_TOPIC": f"test.scored.{run}",
        "PODIUM_LEARNER_POLICY_TOPIC": f"test.policy.{run}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
        "PODIUM_BUS": kafka_url(bootstrap, session_timeout_ms=6000, heartbeat_interval_ms=250),
        "PODIUM_LEARNER_MODE": "swarm",
        "PODIUM_GROUP_ID": f"poison-learner-{run}",
        "PODIUM_LEARNER_CHECKPOINT_DIR": str(tmp / "ckpt"),
        "PODIUM_LEARNER_ARTIFACTS": str(tmp / "artifacts"),
        "PODIUM_LEARNER_INIT": str(init),
        "PODIUM_LEARNER_BATCH": str(BATCH),
        "PODIUM_LEARNER_MAX_LAG": "1000",
        "PODIUM_LEARNER_MAX_SUBTASKS": str(MAX_SUBTASKS),
        SIGNING_KEY_VAR: str(key_pair(tmp / "keys").private_path),
    }
    cmd = [sys.executable, str(HERE / "learner_until.py"), str(until_trained)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.kafka
@pytest.mark.slow
async def test_deployed_learner_survives_a_superscript_record(
    kafka_bootstrap: str, unique: Names, tmp_path: Path
) -> None:
    """The seen crash loop, as deployed: the process used to exit with ValueError on the
    record (and again on every restart); now it dead-letters it and trains on the rest."""
    run = unique("run").replace(".", "-")
    topic, policy_topic = f"test.scored.{run}", f"test.policy.{run}"
    bus = KafkaBus(config_for(kafka_bootstrap, client_id="test-admin"))
    await bus.start()
    try:
        await make_topics(bus, topic, policy_topic)
        agent, init = init_policy(tmp_path)
        good = swarm_trajectories(agent, [f"good-{k}" for k in range(BATCH)], "0")
        [bad] = swarm_trajectories(agent, ["superscript"], "²", seed0=9)
        await publish_scored(bus, topic, [bad, *good])
        done = await asyncio.to_thread(
            _deployed_learner, kafka_bootstrap, run, tmp_path, init, BATCH
        )
        assert done.returncode == 0, done.stderr[-3000:]
        ckpt = load_checkpoint(tmp_path / "ckpt")
        assert ckpt is not None
        assert (ckpt.state.trained, ckpt.state.dead_lettered) == (BATCH, 1)
        [dead] = await dead_letters(bus, topic, unique("inspect"), 1)
        assert b"policy_version" in (dead.header(DLQ_ERROR) or b"")
    finally:
        await bus.stop()


def generic_learner(config: LoopConfig, bus: Bus, signing_key: Path) -> LearningLoop[object]:
    algorithm = GenericPPO(
        GenericPPOConfig(
            obs_dim=OBS_DIM,
            n_actions=N_ACTIONS,
            artifacts_dir=config.checkpoint_dir.parent / "artifacts",
            minibatch_size=20,
            signing_key=str(signing_key),
        )
    )
    return LearningLoop(config, algorithm, bus)  # type: ignore[arg-type]


async def test_duplicate_trajectory_is_not_trained_twice_across_a_restart(
    bus: Bus, unique: Names, tmp_path: Path
) -> None:
    """Upstream re-sends trajectory "b" (a new record, a new event id: a re-scoring reward
    replica) after the learner trained on it and restarted, and sends "e" twice in one batch:
    each is trained on once, the copies dropped and counted."""
    topic, policy_topic = unique("scored"), unique("policy")
    await make_topics(bus, topic, policy_topic)
    config = loop_config(tmp_path, topic, policy_topic, unique("g"))
    policy = behaviour_policy()
    key = key_pair(tmp_path / "keys").private_path
    await publish_trajectories(bus, topic, ["a", "b", "c", "d"], policy, 0)
    first = await asyncio.wait_for(generic_learner(config, bus, key).run(until_trained=4), 120)
    assert sorted(first.ledger) == ["a", "b", "c", "d"]

    await publish_trajectories(bus, topic, ["b", "e", "e", "f", "g", "h"], policy, 0, seed0=10)
    restarted = generic_learner(config, bus, key)  # a new process: state from the checkpoint only
    state = await asyncio.wait_for(restarted.run(until_trained=8), 120)

    assert state.trained == 8
    assert sorted(state.ledger) == ["a", "b", "c", "d", "e", "f", "g", "h"]  # once each
    assert state.skipped_duplicate == 2
    saved = load_checkpoint(tmp_path / "ckpt")
    assert saved is not None and saved.state.skipped_duplicate == 2


async def test_an_algorithm_that_raises_anything_on_a_record_does_not_stop_the_loop(
    inproc_bus: Bus, unique: Names, tmp_path: Path
) -> None:
    """``Algorithm.decode`` is a plug-in point: whatever it raises on a record (here a bare
    ValueError, as int() would) parks that record, error type and text in the headers."""

    class Picky(GenericPPO):
        def decode(self, scored: reward_pb2.ScoredTrajectory, lag: int) -> Any:
            if scored.trajectory.trajectory_id == "boom":
                raise ValueError("invalid literal for int() with base 10: '²'")
            return super().decode(scored, lag)

    bus = inproc_bus
    topic, policy_topic = unique("scored"), unique("policy")
    await make_topics(bus, topic, policy_topic)
    config = loop_config(tmp_path, topic, policy_topic, unique("g"))
    await publish_trajectories(bus, topic, ["a", "boom", "b", "c", "d"], behaviour_policy(), 0)
    algorithm = Picky(
        GenericPPOConfig(
            obs_dim=OBS_DIM,
            n_actions=N_ACTIONS,
            artifacts_dir=tmp_path / "artifacts",
            signing_key=str(key_pair(tmp_path / "keys").private_path),
        )
    )
    loop = LearningLoop(config, algorithm, bus)
    state = await asyncio.wait_for(loop.run(until_trained=4), 120)
    assert (state.trained, state.dead_lettered) == (4, 1)
    [dead] = await dead_letters(bus, topic, unique("inspect"), 1)
    assert dead.header(DLQ_ERROR_TYPE) == b"ValueError"
    assert "'²'" in (dead.header(DLQ_ERROR) or b"").decode()


def test_memory_of_trained_ids_is_bounded_and_checkpointed() -> None:
    state = LearnerState()
    for k in range(5):
        state.remember_update([f"u{k}-a", f"u{k}-b"], keep=3)
    assert state.recent_trained == [["u2-a", "u2-b"], ["u3-a", "u3-b"], ["u4-a", "u4-b"]]
    assert state.trained_ids() == {"u2-a", "u2-b", "u3-a", "u3-b", "u4-a", "u4-b"}
    again = LearnerState.from_json(state.to_json())
    assert again.recent_trained == state.recent_trained
    # A checkpoint from before this memory existed: its ledger is what was trained.
    legacy = state.to_json()
    del legacy["recent_trained"], legacy["skipped_duplicate"]
    legacy["ledger"] = ["x", "y"]
    assert LearnerState.from_json(legacy).trained_ids() == {"x", "y"}


def test_dedupe_window_setting(tmp_path: Path) -> None:
    env = {"PODIUM_LEARNER_CHECKPOINT_DIR": str(tmp_path)}
    assert from_env(LoopSettings, env).dedupe_updates == 64
    settings = from_env(LoopSettings, env | {"PODIUM_LEARNER_DEDUPE_UPDATES": "8"})
    assert settings.dedupe_updates == 8
    with pytest.raises(ConfigError, match="PODIUM_LEARNER_DEDUPE_UPDATES"):
        from_env(LoopSettings, env | {"PODIUM_LEARNER_DEDUPE_UPDATES": "0"})
    with pytest.raises(ConfigError, match="dedupe_updates"):
        LoopConfig(checkpoint_dir=tmp_path, dedupe_updates=0)


def test_on_policy_sample_needs_a_bare_ascii_version() -> None:
    """The swarm algorithm's own check (a learned version is a bare ASCII decimal)."""
    from learner_svc.algorithms.swarm import is_on_policy_sample

    labels = {"actions": "sampled"}
    assert is_on_policy_sample(labels, "12")
    for text in ("²", "٣", "", "+1", " 1", "1" * 19):
        assert not is_on_policy_sample(labels, text), text
