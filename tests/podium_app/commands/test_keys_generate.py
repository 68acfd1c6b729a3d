"""``podium keys generate``: a usable pair, the settings printed, never an overwrite."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.policy.signing import SigningKey, TrustedKeys
from podium.v1.reward_pb2 import PolicyUpdated
from podium_app.cli import main


def test_generates_a_pair_that_signs_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "generate", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    private, public = tmp_path / "policy-signing.pem", tmp_path / "policy-signing.pub"
    assert f"PODIUM_POLICY_SIGNING_KEY={private}" in out
    assert f"PODIUM_POLICY_TRUSTED_KEYS={public}" in out
    signer = SigningKey.load(private)
    assert f"key id {signer.key_id}" in out
    event = signer.sign(PolicyUpdated(model_name="m", version=1, sha256="c" * 64))
    TrustedKeys.load(str(public)).verify(event)

    # Rotation makes a second pair under a new name; the first is never overwritten.
    assert main(["keys", "generate", "--out", str(tmp_path), "--name", "next"]) == 0
    assert main(["keys", "generate", "--out", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert SigningKey.load(private).key_id == signer.key_id
