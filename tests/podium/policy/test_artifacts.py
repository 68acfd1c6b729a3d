"""Weights as safetensors + sha256: round trip, tamper detection, immutability."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from podium.errors import ArtifactError
from podium.policy.artifacts import (
    WEIGHTS_FILE,
    load_weights,
    policy_updated_event,
    publish_weights,
)
from podium.policy.holder import build_actor_critic
from podium.rl.networks import ActorCritic


def _model(seed: int) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(4, 3, (16, 16))


def test_round_trip(tmp_path: Path) -> None:
    model = _model(0)
    ref = publish_weights(
        model.state_dict(), tmp_path, "orchestrator", 7, metadata=model.architecture()
    )
    assert ref.path == tmp_path.resolve() / "orchestrator" / "7" / WEIGHTS_FILE
    assert ref.sha256 == hashlib.sha256(ref.path.read_bytes()).hexdigest()
    sidecar = ref.path.with_name(WEIGHTS_FILE + ".sha256").read_text()
    assert sidecar == f"{ref.sha256}  {WEIGHTS_FILE}\n"  # sha256sum -c format

    loaded = load_weights(ref.path)
    assert loaded.sha256 == ref.sha256
    assert loaded.metadata["version"] == "7" and loaded.metadata["name"] == "orchestrator"
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.tensors[name], tensor)
    rebuilt = build_actor_critic(loaded)
    obs = torch.randn(5, 4)
    assert torch.equal(rebuilt.logits(obs), model.logits(obs))

    event = policy_updated_event(ref, {"return": 500.0})
    assert (event.version, event.sha256, event.metrics["return"]) == (7, ref.sha256, 500.0)
    assert event.uri == ref.path.as_uri()


def test_flipped_byte_is_rejected_naming_file_and_hashes(tmp_path: Path) -> None:
    ref = publish_weights(_model(0).state_dict(), tmp_path, "m", 1)
    data = bytearray(ref.path.read_bytes())
    data[-3] ^= 0x01  # one bit of one weight: still parses as safetensors
    ref.path.write_bytes(bytes(data))
    actual = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(ArtifactError) as err:
        load_weights(ref.path)
    message = str(err.value)
    assert str(ref.path) in message
    assert f"expected {ref.sha256}" in message and f"actual {actual}" in message
    # Trusting the announced hash (from the event) catches a tamperer who rewrote the sidecar.
    ref.path.with_name(WEIGHTS_FILE + ".sha256").write_text(f"{actual}  {WEIGHTS_FILE}\n")
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        load_weights(ref.path, ref.sha256)


def test_garbage_with_matching_hash_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / WEIGHTS_FILE
    path.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00nope!")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ArtifactError, match="not valid safetensors"):
        load_weights(path, digest)


def test_missing_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="cannot read hash file"):
        load_weights(tmp_path / "absent.safetensors")
    with pytest.raises(ArtifactError, match="cannot read weights"):
        load_weights(tmp_path / "absent.safetensors", "0" * 64)


def test_versions_are_immutable(tmp_path: Path) -> None:
    first = publish_weights(_model(0).state_dict(), tmp_path, "m", 1)
    again = publish_weights(_model(0).state_dict(), tmp_path, "m", 1)
    assert again.sha256 == first.sha256
    with pytest.raises(ArtifactError, match="immutable"):
        publish_weights(_model(1).state_dict(), tmp_path, "m", 1)
    assert load_weights(first.path).sha256 == first.sha256


def test_weights_that_do_not_fit_the_architecture(tmp_path: Path) -> None:
    model = _model(0)
    meta = model.architecture() | {"hidden_sizes": "32,32"}
    ref = publish_weights(model.state_dict(), tmp_path, "m", 1, metadata=meta)
    with pytest.raises(ArtifactError, match="do not fit"):
        build_actor_critic(load_weights(ref.path))


def test_loader_never_unpickles(tmp_path: Path) -> None:
    # A torch.save pickle that would run code on load: whatever its hash, it is refused.
    path = tmp_path / WEIGHTS_FILE
    torch.save({"w": torch.zeros(1)}, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ArtifactError, match="not valid safetensors"):
        load_weights(path, digest)
