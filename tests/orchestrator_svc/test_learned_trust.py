"""The weight trust chain of a learned-policy orchestrator (issue 12, "What was seen"):

* a flipped byte in the weights with a rewritten ``.sha256`` sidecar is refused, whatever the
  announcement (unsigned with the new hash, the genuine signed one, one signed by another key);
* an announcement with an empty hash is refused (never resolved through the sidecar);
* a forged version 2^62 (unsigned, signed by an untrusted key, or a real signature moved onto
  it) is refused and the next real version loads;
* key rotation (two trusted keys), a wrong signature, an old signed version replayed.

Every refusal leaves the previous version serving, is consumed (the next event is handled),
and is logged naming why. The orchestrator runs as in production: events on the bus, the
``PolicyUpdated`` consumer, sessions through sub-agents.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from signing_helpers import key_pair, signed

from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from podium import topics
from podium.bus import InProcBus
from podium.bus.consumer import EventPublisher
from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.errors import ConfigError
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import ArtifactRef, sha256_file
from podium.policy.signing import KeyPair, RefusedAnnouncement, announcement_event_id
from podium.policy.swarm import MODEL_NAME, save_policy, swarm_policy_updated
from podium.v1 import reward_pb2
from subagent_svc import SubagentApp, SubagentConfig


@pytest.fixture
def keys(tmp_path: Path) -> tuple[KeyPair, KeyPair, KeyPair]:
    """(the learner's key, the key it rotates to, a key nobody trusts)."""
    return (
        key_pair(tmp_path / "keys", "old"),
        key_pair(tmp_path / "keys", "new"),
        key_pair(tmp_path / "attacker", "policy-signing"),
    )


@pytest.fixture
async def orch(
    keys: tuple[KeyPair, KeyPair, KeyPair],
) -> AsyncIterator[tuple[InProcBus, OrchestratorApp]]:
    old, new, _ = keys
    bus = InProcBus()
    await bus.start()
    app = OrchestratorApp(
        OrchestratorConfig(
            bus_url="embedded",
            group_id="trust.orchestrator",
            policy="learned",
            # Both halves of a rotation, as files (a comma-separated setting).
            policy_trusted_keys=f"{old.public_path},{new.public_path}",
            session_timeout_s=20.0,
            shutdown_timeout_s=5.0,
        ),
        bus,
        serve_grpc=False,
    )
    worker = SubagentApp(
        SubagentConfig(bus_url="embedded", group_id="trust.subagent", shutdown_timeout_s=5.0),
        bus,
    )
    await worker.start()
    await app.start()
    try:
        yield bus, app
    finally:
        await app.stop()
        await worker.stop()
        await bus.stop()


def publish_version(root: Path, version: int) -> ArtifactRef:
    env = SwarmEnv(generate_suite(2, seed=3, sizes=(4, 6)), default_pool(), EnvConfig())
    torch.manual_seed(version)
    agent = SwarmAgent(env.layout)
    return save_policy(agent.net, root, version, tuple(env.layout.agents), max_subtasks="64")


def event_for(ref: ArtifactRef, **changes: object) -> reward_pb2.PolicyUpdated:
    event = swarm_policy_updated(ref)
    for field, value in changes.items():
        setattr(event, field, value)
    return event


async def send(
    bus: InProcBus, event: reward_pb2.PolicyUpdated, event_id: str | None = None
) -> None:
    await EventPublisher(bus, producer_name="test").publish(
        topics.POLICY_UPDATES, event, key=MODEL_NAME, event_id=event_id
    )


async def refused(app: OrchestratorApp, event: reward_pb2.PolicyUpdated, bus: InProcBus) -> str:
    """Send ``event``; wait until the orchestrator has refused it; the refusal's text."""
    assert app.learned is not None
    app.learned.holder.last_error = None
    before = app.learned.version
    await send(bus, event)
    for _ in range(200):
        if app.learned.holder.last_error is not None:
            assert app.learned.version == before, "a refused version was served"
            return str(app.learned.holder.last_error)
        await asyncio.sleep(0.02)
    raise AssertionError(f"v{event.version} was neither refused nor served (serving {before})")


async def serves(app: OrchestratorApp, version: int) -> None:
    assert app.learned is not None
    for _ in range(200):
        if app.learned.version == version:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"serving {app.learned.version}, expected {version}")


def reason(app: OrchestratorApp) -> str:
    assert app.learned is not None
    err = app.learned.holder.last_error
    assert isinstance(err, RefusedAnnouncement), err
    return err.reason


async def test_flipped_byte_with_rewritten_sidecar_is_refused_and_v1_keeps_serving(
    orch: tuple[InProcBus, OrchestratorApp],
    keys: tuple[KeyPair, KeyPair, KeyPair],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus, app = orch
    old, _, attacker = keys
    v1 = publish_version(tmp_path / "artifacts", 1)
    await send(bus, signed(event_for(v1), old))
    await serves(app, 1)

    v2 = publish_version(tmp_path / "artifacts", 2)
    genuine = signed(event_for(v2), old)
    data = bytearray(v2.path.read_bytes())
    data[len(data) // 2] ^= 0x01
    v2.path.write_bytes(bytes(data))
    forged_hash = sha256_file(v2.path)
    v2.path.with_name(v2.path.name + ".sha256").write_text(f"{forged_hash}  {v2.path.name}\n")

    caplog.set_level(logging.INFO, logger="orchestrator_svc.learned")
    text = await refused(app, event_for(v2, sha256=forged_hash), bus)
    assert reason(app) == "unsigned" and "unsigned" in text
    assert "refused swarm_policy v2: unsigned" in caplog.text and "v1 keeps serving" in caplog.text
    await refused(app, signed(event_for(v2, sha256=forged_hash), attacker), bus)
    assert reason(app) == "untrusted-key"
    # The learner's genuine announcement names the hash it wrote: the file no longer has it.
    text = await refused(app, genuine, bus)
    assert "sha256 mismatch" in text and str(v2.path) in text
    assert app.learned is not None and app.learned.version == 1


async def test_empty_hash_is_refused_even_when_signed(
    orch: tuple[InProcBus, OrchestratorApp],
    keys: tuple[KeyPair, KeyPair, KeyPair],
    tmp_path: Path,
) -> None:
    bus, app = orch
    old, _, _ = keys
    v1 = publish_version(tmp_path / "artifacts", 1)
    text = await refused(app, event_for(v1, sha256=""), bus)
    assert reason(app) == "hashless" and "hashless" in text
    await refused(app, signed(event_for(v1, sha256=""), old), bus)
    assert reason(app) == "hashless"
    assert app.learned is not None and app.learned.version is None  # cpls still decides
    await send(bus, signed(event_for(v1), old))
    await serves(app, 1)


async def test_forged_version_2_62_is_refused_and_the_next_real_version_loads(
    orch: tuple[InProcBus, OrchestratorApp],
    keys: tuple[KeyPair, KeyPair, KeyPair],
    tmp_path: Path,
) -> None:
    bus, app = orch
    old, _, attacker = keys
    v1 = publish_version(tmp_path / "artifacts", 1)
    await send(bus, signed(event_for(v1), old))
    await serves(app, 1)
    v2 = publish_version(tmp_path / "artifacts", 2)
    huge = 2**62
    # The real v2 file and hash, with a forged version: unsigned, an untrusted key, and the
    # learner's genuine v2 signature carried over (it covers the version, so it fails).
    await refused(app, event_for(v2, version=huge), bus)
    assert reason(app) == "unsigned"
    await refused(app, signed(event_for(v2, version=huge), attacker), bus)
    assert reason(app) == "untrusted-key"
    moved = signed(event_for(v2), old)
    moved.version = huge
    text = await refused(app, moved, bus)
    assert reason(app) == "bad-signature" and "does not verify" in text
    await send(bus, signed(event_for(v2), old))
    await serves(app, 2)


async def test_key_rotation_wrong_signature_and_replayed_old_versions(
    orch: tuple[InProcBus, OrchestratorApp],
    keys: tuple[KeyPair, KeyPair, KeyPair],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus, app = orch
    old, new, _ = keys
    refs = {v: publish_version(tmp_path / "artifacts", v) for v in (1, 2, 3)}
    await send(bus, signed(event_for(refs[1]), old))
    await serves(app, 1)
    await send(bus, signed(event_for(refs[2]), new))  # the learner moved to the new key
    await serves(app, 2)

    wrong = signed(event_for(refs[3]), new)
    wrong.signature = bytes([wrong.signature[0] ^ 0x01]) + wrong.signature[1:]
    await refused(app, wrong, bus)
    assert reason(app) == "bad-signature"
    # A key id that is trusted, with another trusted key's signature: wrong signature too.
    swapped = signed(event_for(refs[3]), old)
    swapped.signing_key_id = new.key_id
    await refused(app, swapped, bus)
    assert reason(app) == "bad-signature"

    caplog.set_level(logging.INFO, logger="orchestrator_svc.learned")
    text = await refused(app, signed(event_for(refs[1]), old), bus)  # replayed, genuinely signed
    assert reason(app) == "out-of-sequence" and "not greater than the serving version 2" in text
    assert "v2 keeps serving" in caplog.text
    await send(bus, signed(event_for(refs[3]), new))
    await serves(app, 3)


async def test_learned_mode_without_trusted_keys_fails_start_up_naming_the_setting() -> None:
    bus = InProcBus()
    with pytest.raises(ConfigError) as info:
        OrchestratorApp(
            OrchestratorConfig(bus_url="embedded", policy="learned"), bus, serve_grpc=False
        )
    assert "PODIUM_POLICY_TRUSTED_KEYS" in str(info.value)
    assert "podium keys generate" in str(info.value)


async def test_a_private_key_or_a_missing_file_is_not_a_trusted_key(tmp_path: Path) -> None:
    pair = key_pair(tmp_path)
    for spec, message in (
        (str(pair.private_path), "not a PEM public key"),
        (str(tmp_path / "nope.pub"), "does not exist"),
    ):
        with pytest.raises(ConfigError, match=message):
            OrchestratorApp(
                OrchestratorConfig(bus_url="embedded", policy="learned", policy_trusted_keys=spec),
                InProcBus(),
                serve_grpc=False,
            )


async def test_junk_under_the_next_versions_event_id_cannot_shadow_the_signed_one(
    orch: tuple[InProcBus, OrchestratorApp],
    keys: tuple[KeyPair, KeyPair, KeyPair],
    tmp_path: Path,
) -> None:
    """Consumers dedupe by event id: junk published first under ``<model>:<version>`` must not
    make the genuine announcement a "duplicate". Its id carries its signature, which nobody
    can predict without the key, and which a restarted learner reproduces exactly."""
    bus, app = orch
    old, _, _ = keys
    v1 = publish_version(tmp_path / "artifacts", 1)
    genuine = signed(event_for(v1), old)
    assert announcement_event_id(genuine) == announcement_event_id(signed(event_for(v1), old))
    for guess in (f"{MODEL_NAME}:1", f"{MODEL_NAME}:1:{'0' * 16}"):
        await send(bus, event_for(v1), event_id=guess)  # unsigned junk, refused
    await send(bus, genuine, event_id=announcement_event_id(genuine))
    await serves(app, 1)
