"""``verify_onnx_export``: what a served backend checks of a ``PolicyUpdated`` before it asks
the server to load anything (no server needed)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from podium.errors import ArtifactError
from podium.serving.backends import verify_onnx_export
from podium.v1.reward_pb2 import PolicyUpdated


def _file(root: Path, model: str, version: str, data: bytes) -> Path:
    path = root / model / version / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return path


def _event(path: Path, model: str, version: int, digest: str) -> PolicyUpdated:
    return PolicyUpdated(
        model_name=model, version=version, onnx_uri=path.as_uri(), onnx_sha256=digest
    )


def test_accepts_the_announced_file_and_refuses_anything_else(tmp_path: Path) -> None:
    data = b"onnx bytes stand-in"
    digest = hashlib.sha256(data).hexdigest()
    path = _file(tmp_path, "swarm_policy", "3", data)
    assert verify_onnx_export(_event(path, "swarm_policy", 3, digest)) == path
    assert verify_onnx_export(_event(path, "swarm_policy", 3, digest.upper())) == path

    with pytest.raises(ArtifactError, match="sha256 mismatch") as info:
        verify_onnx_export(_event(path, "swarm_policy", 3, "ab" * 32))
    assert str(path) in str(info.value) and digest in str(info.value)
    # The server loads version N of model M from <repository>/M/N/: another place is refused.
    with pytest.raises(ArtifactError, match="loads that version from"):
        verify_onnx_export(_event(path, "swarm_policy", 4, digest))
    with pytest.raises(ArtifactError, match="loads that version from"):
        verify_onnx_export(_event(path, "other_policy", 3, digest))
    missing = tmp_path / "swarm_policy" / "5" / "model.onnx"
    with pytest.raises(ArtifactError, match="mount the model repository"):
        verify_onnx_export(_event(missing, "swarm_policy", 5, digest))
    with pytest.raises(ArtifactError, match="no onnx_uri"):
        verify_onnx_export(PolicyUpdated(model_name="swarm_policy", version=3, onnx_sha256=digest))
