"""podium.policy.signing: what a signature covers, how keys load, rotate and fail by name."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from podium.errors import ConfigError
from podium.policy.signing import (
    RefusedAnnouncement,
    SigningKey,
    TrustedKeys,
    announcement_payload,
    ensure_key_pair,
    generate_key_pair,
    verify_announcement,
)
from podium.v1.reward_pb2 import PolicyUpdated

H1, H2 = "a" * 64, "b" * 64


def _event(**changes: object) -> PolicyUpdated:
    event = PolicyUpdated(
        model_name="swarm_policy", version=3, uri="file:///w", sha256=H1, metrics={"x": 1.0}
    )
    for name, value in changes.items():
        setattr(event, name, value)
    return event


def _reason(event: PolicyUpdated, trusted: TrustedKeys | None, serving: int | None = None) -> str:
    with pytest.raises(RefusedAnnouncement) as info:
        verify_announcement(event, trusted, serving)
    assert not info.value.retriable
    return info.value.reason


def test_signature_covers_model_version_and_both_hashes(tmp_path: Path) -> None:
    pair = generate_key_pair(tmp_path)
    signer, trusted = SigningKey.load(pair.private_path), TrustedKeys.load(str(pair.public_path))
    assert signer.key_id == pair.key_id and list(trusted.keys) == [pair.key_id]
    good = signer.sign(_event(onnx_uri="file:///m", onnx_sha256=H2))
    verify_announcement(good, trusted, None)
    verify_announcement(good, trusted, 2)
    for field, value in (
        ("model_name", "other"),
        ("version", 4),
        ("version", 2**62),
        ("sha256", H2),
        ("onnx_sha256", H1),
    ):
        altered = PolicyUpdated()
        altered.CopyFrom(good)
        setattr(altered, field, value)
        assert _reason(altered, trusted) == "bad-signature", field
    # Not covered: where the files are (their hashes are) and the learner's figures.
    moved = PolicyUpdated()
    moved.CopyFrom(good)
    moved.uri, moved.metrics["x"] = "file:///elsewhere", 2.0
    verify_announcement(moved, trusted, None)


def test_payload_is_canonical_and_domain_separated() -> None:
    with_figures = _event()
    with_figures.metrics["y"] = 2.0
    a = announcement_payload(with_figures)
    assert a == announcement_payload(_event(uri="file:///other"))
    assert a.startswith(b"podium.policy-announcement.v1\n")
    # A name cannot smuggle another field in: the encoding is JSON, not joined strings.
    assert announcement_payload(_event(model_name='m","version":9')) != announcement_payload(
        _event(model_name="m", version=9)
    )


def test_refusal_reasons(tmp_path: Path) -> None:
    pair = generate_key_pair(tmp_path)
    signer, trusted = SigningKey.load(pair.private_path), TrustedKeys.load(str(pair.public_path))
    assert _reason(signer.sign(_event(sha256="")), trusted) == "hashless"
    assert _reason(signer.sign(_event(sha256="xyz")), trusted) == "hashless"
    assert _reason(signer.sign(_event(onnx_uri="file:///m")), trusted) == "hashless"
    assert _reason(_event(), trusted) == "unsigned"
    other = generate_key_pair(tmp_path, "other")
    assert _reason(SigningKey.load(other.private_path).sign(_event()), trusted) == "untrusted-key"
    assert _reason(signer.sign(_event()), None) == "no-trusted-keys"
    assert _reason(signer.sign(_event(version=3)), trusted, serving=3) == "out-of-sequence"
    assert _reason(signer.sign(_event(version=2)), trusted, serving=3) == "out-of-sequence"


def test_rotation_trusts_a_directory_of_public_keys(tmp_path: Path) -> None:
    keys = tmp_path / "trusted"
    old = generate_key_pair(tmp_path / "learner", "old")
    new = generate_key_pair(tmp_path / "learner", "new")
    keys.mkdir()
    for pair in (old, new):
        (keys / pair.public_path.name).write_bytes(pair.public_path.read_bytes())
    # A mounted Secret's bookkeeping entries (..data, ..2026_...) are not keys.
    (keys / "..data").mkdir()
    (keys / "..data" / "junk").write_text("not a key")
    trusted = TrustedKeys.load(str(keys))
    assert set(trusted.keys) == {old.key_id, new.key_id}
    for pair in (old, new):
        verify_announcement(SigningKey.load(pair.private_path).sign(_event()), trusted, None)


def test_key_files_fail_by_name(tmp_path: Path) -> None:
    pair = generate_key_pair(tmp_path)
    assert stat.S_IMODE(pair.private_path.stat().st_mode) == 0o600
    with pytest.raises(ConfigError, match="already exists"):
        generate_key_pair(tmp_path)
    with pytest.raises(ConfigError, match=r"PODIUM_POLICY_SIGNING_KEY is not set.*keys generate"):
        SigningKey.load("")
    with pytest.raises(ConfigError, match=r"PODIUM_POLICY_SIGNING_KEY=.*cannot read"):
        SigningKey.load(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        SigningKey.load(pair.public_path)
    with pytest.raises(ConfigError, match="PODIUM_POLICY_TRUSTED_KEYS is not set"):
        TrustedKeys.load(" , ")
    with pytest.raises(ConfigError, match="never put the private key here"):
        TrustedKeys.load(str(pair.private_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no key files"):
        TrustedKeys.load(str(tmp_path / "empty"))


def test_ensure_key_pair_reuses_a_run_pair(tmp_path: Path) -> None:
    first = ensure_key_pair(tmp_path / "keys")
    assert ensure_key_pair(tmp_path / "keys") == first
    other = generate_key_pair(tmp_path / "other")
    first.public_path.write_bytes(other.public_path.read_bytes())
    with pytest.raises(ConfigError, match="not one key pair"):
        ensure_key_pair(tmp_path / "keys")
