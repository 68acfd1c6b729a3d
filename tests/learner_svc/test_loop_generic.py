"""The learning loop with generic PPO on the in-process bus: exactly-once across a crash,
staleness, DLQ, checkpoint atomicity. (The same crash with the swarm algorithm, as a real
process against a real Kafka broker: test_crash_kafka.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from loop_helpers import (
    N_ACTIONS,
    OBS_DIM,
    behaviour_policy,
    publish_trajectories,
    scored_trajectory,
)

from learner_svc.algorithm import policy_lag, version_number
from learner_svc.algorithms.ppo import GenericPPO, GenericPPOConfig, episode_from_scored
from learner_svc.checkpoint import LearnerState, load_checkpoint, save_checkpoint
from learner_svc.loop import LearningLoop, LoopConfig
from podium import codec, topics
from podium.bus import InProcBus
from podium.bus.base import TopicSpec
from podium.bus.consumer import DLQ_ERROR, DLQ_SOURCE_OFFSET
from podium.errors import ArtifactError, ProcessingError
from podium.policy.artifacts import load_weights, path_from_uri
from podium.policy.signing import TrustedKeys, ensure_key_pair
from podium.v1 import reward_pb2

TOPIC = "test.scored"
POLICY_TOPIC = "test.policy"


class Killed(Exception):
    """Stands in for SIGKILL in-process: raised between the checkpoint and the commit."""


def _config(tmp_path: Path, **kw: object) -> LoopConfig:
    settings: dict[str, object] = {
        "checkpoint_dir": tmp_path / "ckpt",
        "topic": TOPIC,
        "policy_topic": POLICY_TOPIC,
        "batch_trajectories": 8,
        "fetch_timeout_s": 0.05,
        "idle_flush_s": 0.2,
    }
    settings.update(kw)
    return LoopConfig(**settings)  # type: ignore[arg-type]


def _learner(config: LoopConfig, bus: InProcBus, **kw: object) -> LearningLoop[object]:
    algorithm = GenericPPO(
        GenericPPOConfig(
            obs_dim=OBS_DIM,
            n_actions=N_ACTIONS,
            artifacts_dir=config.checkpoint_dir.parent / "artifacts",
            signing_key=str(ensure_key_pair(config.checkpoint_dir.parent / "keys").private_path),
            minibatch_size=20,
        )
    )
    return LearningLoop(config, algorithm, bus, **kw)  # type: ignore[arg-type]


async def _policy_events(bus: InProcBus) -> list[reward_pb2.PolicyUpdated]:
    sub = bus.subscriber([POLICY_TOPIC], "test-reader")
    await sub.start()
    out = []
    try:
        while records := await sub.fetch(100, 0.05):
            out += [codec.decode_event(r.value, reward_pb2.PolicyUpdated)[1] for r in records]
    finally:
        await sub.stop()
    return out


async def test_killed_between_checkpoint_and_commit_trains_each_trajectory_once(
    tmp_path: Path,
) -> None:
    bus = InProcBus()
    await bus.start()
    await bus.create_topics([TopicSpec(TOPIC, partitions=3)])
    ids = [f"traj-{k:03d}" for k in range(40)]
    await publish_trajectories(bus, TOPIC, ids, behaviour_policy(), version=0)

    def kill_at_second(step: int) -> None:
        if step == 2:
            raise Killed

    # All 40 come from version 0 while the learner reaches version 5: η is lifted here so the
    # test is about delivery alone (staleness has its own test below).
    config = _config(tmp_path, max_policy_lag=100)
    first = _learner(config, bus, after_checkpoint=kill_at_second)
    with pytest.raises(Killed):
        await first.run(until_trained=len(ids))
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt is not None and ckpt.state.trained == 16 and ckpt.state.step == 2
    # The group's committed offsets trail the checkpoint's: the second batch was never committed.
    committed = bus.committed("learner", TOPIC)
    assert sum(committed.values()) == 8
    assert sum(ckpt.state.offsets[TOPIC].values()) == 16

    second = _learner(config, bus)
    restored = second.algorithm.model.state_dict()
    before = first.algorithm.model.state_dict()
    assert all(torch.equal(restored[k], before[k]) for k in before)  # weights restored
    state = await second.run(until_trained=len(ids))

    assert state.trained == len(ids)
    assert sorted(state.ledger) == ids  # every id, none twice
    assert state.skipped_redelivered == 8  # the uncommitted batch came back and was skipped
    assert state.policy_version == 5 and state.step == 5
    assert sum(bus.committed("learner", TOPIC).values()) == len(ids)

    events = await _policy_events(bus)
    versions = sorted({e.version for e in events})
    assert versions == [0, 1, 2, 3, 4, 5]  # 0: the starting weights, announced on start
    trusted = TrustedKeys.load(str(ensure_key_pair(tmp_path / "keys").public_path))
    for e in events:  # every announced version is signed and verifies against its hash
        trusted.verify(e)
        assert load_weights(path_from_uri(e.uri), e.sha256).metadata["version"] == str(e.version)


async def test_run_ends_at_the_step_that_reaches_until_trained(tmp_path: Path) -> None:
    """Records fetched together with the last batch are left to the next run: the returned
    state is the checkpoint's, nothing past it is committed, and nothing is lost."""
    bus = InProcBus()
    await bus.start()
    await bus.create_topics([TopicSpec(TOPIC, partitions=1)])
    ids = [f"t-{k:02d}" for k in range(12)]
    await publish_trajectories(bus, TOPIC, ids, behaviour_policy(), version=0)
    config = _config(tmp_path)  # one fetch brings all 12 (fetch_max 100)
    state = await _learner(config, bus).run(until_trained=8)
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt is not None
    assert state.offsets == ckpt.state.offsets == {TOPIC: {0: 8}}
    assert state.trained == ckpt.state.trained == 8
    assert bus.committed("learner", TOPIC) == {0: 8}

    # The other 4 come back to the next run (a partial batch, trained after idle_flush_s).
    state = await _learner(config, bus).run(until_trained=12)
    assert sorted(state.ledger) == ids and state.skipped_redelivered == 0
    assert bus.committed("learner", TOPIC) == {0: 12}


async def test_stale_trajectories_are_dropped_not_trained(tmp_path: Path) -> None:
    bus = InProcBus()
    await bus.start()
    await bus.create_topics([TopicSpec(TOPIC, partitions=1)])  # one partition: a known order
    policy = behaviour_policy()
    fresh = [f"v0-{k}" for k in range(8)]
    stale = [f"late-{k}" for k in range(8)]
    current = [f"v1-{k}" for k in range(8)]
    await publish_trajectories(bus, TOPIC, fresh, policy, version=0)
    # Published after the learner reached version 1, by a policy still at version 0: lag 1 > η=0.
    await publish_trajectories(bus, TOPIC, stale, policy, version=0, seed0=100)
    await publish_trajectories(bus, TOPIC, current, policy, version=1, seed0=200)
    learner = _learner(_config(tmp_path, max_policy_lag=0), bus)
    state = await learner.run(until_trained=16)
    assert state.dropped_stale == 8
    assert sorted(state.ledger) == sorted(fresh + current)
    assert not set(stale) & set(state.ledger)
    assert sum(bus.committed("learner", TOPIC).values()) == 24  # dropped records are consumed


def test_policy_lag_parsing() -> None:
    assert version_number("orchestrator:12") == 12 and version_number("v3") == 3
    assert version_number("rules:cpls") == 0
    assert policy_lag(5, "orchestrator:3") == 2 and policy_lag(1, "orchestrator:4") == 0


async def test_malformed_trajectory_goes_to_dead_letter_and_stream_continues(
    tmp_path: Path,
) -> None:
    bus = InProcBus()
    await bus.start()
    await bus.create_topics([TopicSpec(TOPIC, partitions=1)])
    policy = behaviour_policy()
    bad = scored_trajectory("bad", policy, 0)
    bad.trajectory.decisions[2].observation_tensor = b"\x00" * 7
    _, data = codec.encode_event(bad, producer="test", key="bad")
    await bus.publish(TOPIC, data, key="bad")
    await bus.publish(TOPIC, b"not a protobuf envelope", key="junk")
    ids = [f"ok-{k}" for k in range(8)]
    await publish_trajectories(bus, TOPIC, ids, policy, version=0)
    state = await _learner(_config(tmp_path), bus).run(until_trained=8)
    assert state.dead_lettered == 2 and sorted(state.ledger) == ids

    sub = bus.subscriber([topics.dead_letter(TOPIC)], "dlq-reader")
    await sub.start()
    dead = await sub.fetch(10, 0.2)
    await sub.stop()
    by_offset = {r.header(DLQ_SOURCE_OFFSET): r for r in dead}
    assert set(by_offset) == {b"0", b"1"}  # both, each named by its source offset
    assert b"decision 2: observation_tensor is not zlib" in (
        by_offset[b"0"].header(DLQ_ERROR) or b""
    )
    assert b"not a podium.v1.Envelope" in (by_offset[b"1"].header(DLQ_ERROR) or b"")


def test_episode_validation_names_the_field() -> None:
    policy = behaviour_policy()
    ok = scored_trajectory("t", policy, 0, steps=3)
    ep = episode_from_scored(ok, OBS_DIM, N_ACTIONS)
    assert ep.obs.shape == (3, OBS_DIM) and float(ep.rewards[-1]) >= ok.total
    wrong = scored_trajectory("t", policy, 0, steps=3)
    wrong.trajectory.decisions[1].action.index = N_ACTIONS
    with pytest.raises(ProcessingError, match=r"decision 1: action\.index 4 outside"):
        episode_from_scored(wrong, OBS_DIM, N_ACTIONS)
    masked = scored_trajectory("t", policy, 0, steps=3)
    masked.trajectory.decisions[0].action.index = 1  # step 0 masks action 1 out
    with pytest.raises(ProcessingError, match="masked out"):
        episode_from_scored(masked, OBS_DIM, N_ACTIONS)


def test_checkpoint_round_trip_and_atomicity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = behaviour_policy()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.value(torch.randn(4, OBS_DIM)).sum().backward()  # type: ignore[no-untyped-call]
    opt.step()
    gen = torch.Generator().manual_seed(5)
    state = LearnerState(
        step=3, policy_version=2, offsets={"t": {0: 7, 2: 1}}, trained=9, ledger=["a"]
    )
    save_checkpoint(tmp_path, state, model, opt, gen)
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None
    assert loaded.state == state
    opt2 = torch.optim.Adam(behaviour_policy(1).parameters(), lr=1e-3)
    opt2.load_state_dict(loaded.optimizer)
    before, after = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert sorted(before) == sorted(after) and before
    for key, entry in before.items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(entry[name], after[key][name]), (key, name)
    assert torch.equal(loaded.rng_state, gen.get_state())

    # A crash while committing the next checkpoint leaves the previous one whole.
    real_replace = os.replace

    def crash_on_pointer(src: str, dst: str) -> None:
        if str(dst).endswith("checkpoint.json"):
            raise OSError("simulated crash")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_pointer)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, LearnerState(step=4), model, opt, gen)
    monkeypatch.undo()
    again = load_checkpoint(tmp_path)
    assert again is not None and again.state.step == 3

    # A tampered tensor file is refused by hash.
    tensor_file = next(tmp_path.glob("state-*.safetensors"))
    blob = bytearray(tensor_file.read_bytes())
    blob[-1] ^= 0xFF
    tensor_file.write_bytes(bytes(blob))
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        load_checkpoint(tmp_path)
