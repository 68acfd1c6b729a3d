"""``buf breaking`` against the previous release (scripts/contract.sh, run by scripts/lint.sh):
real buf on copies of protos/ with the committed release images, so a break is shown caught,
not only configured."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "scripts" / "contract.sh"
RELEASES = ROOT / "protos" / "releases"
SESSION_PROTO = Path("podium/v1/session_service.proto")


def contract(
    *args: str, protos: Path | None = None, releases: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if protos is not None:
        env["PODIUM_PROTOS"] = str(protos)
    if releases is not None:
        env["PODIUM_PROTO_RELEASES"] = str(releases)
    return subprocess.run(
        ["bash", str(CONTRACT), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )


@pytest.fixture
def protos(tmp_path: Path) -> Path:
    """A copy of protos/ (without the release images) to mutate."""
    copy = tmp_path / "protos"
    shutil.copytree(ROOT / "protos", copy, ignore=shutil.ignore_patterns("releases"))
    return copy


def _edit(protos: Path, old: str, new: str) -> None:
    path = protos / SESSION_PROTO
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_the_previous_release_is_the_newest_committed_image() -> None:
    images = sorted(RELEASES.glob("v*.binpb"))
    assert images, "protos/releases/ holds the contract of every release"
    done = contract("previous")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == RELEASES / "v0.1.0.binpb"
    # Each image is a buf image of Podium's contract (wire-compatible with FileDescriptorSet).
    for image in images:
        files = {
            f.name for f in descriptor_pb2.FileDescriptorSet.FromString(image.read_bytes()).file
        }
        assert str(SESSION_PROTO) in files


def test_the_tree_passes_and_additions_pass(protos: Path) -> None:
    assert contract("breaking").returncode == 0
    _edit(
        protos,
        "  uint64 seed = 4;\n}",
        "  uint64 seed = 4;\n  // A new field.\n  string note = 5;\n}",
    )
    done = contract("breaking", protos=protos)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "against v0.1.0.binpb (the previous release)" in done.stderr


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "  uint64 seed = 4;\n",
            "",
            'Previously present field "4" with name "seed" on message "SubmitTaskRequest" was deleted',
        ),
        ("  uint64 seed = 4;\n", "  uint64 seed = 5;\n", 'field "4" with name "seed"'),
        ("  uint64 seed = 4;\n", "  string seed = 4;\n", 'changed type from "uint64" to "string"'),
    ],
    ids=["deleted", "renumbered", "retyped"],
)
def test_a_break_fails_naming_it(protos: Path, old: str, new: str, message: str) -> None:
    _edit(protos, old, new)
    done = contract("breaking", protos=protos)
    assert done.returncode != 0
    assert message in done.stdout + done.stderr


def test_release_images_are_written_once_and_chosen_by_version(
    protos: Path, tmp_path: Path
) -> None:
    releases = tmp_path / "releases"
    # The project is at 0.1.0: releases up to it count; a newer image is a mistake.
    for version in ("0.0.9", "0.0.10"):
        done = contract("release", version, protos=protos, releases=releases)
        assert done.returncode == 0, done.stderr
    assert (releases / "v0.0.10.binpb").is_file()
    assert (
        Path(contract("previous", releases=releases).stdout.strip()) == releases / "v0.0.10.binpb"
    )
    again = contract("release", "0.0.9", protos=protos, releases=releases)
    assert again.returncode == 1 and "never changes" in again.stderr
    assert contract("release", "latest", releases=releases).returncode == 2
    shutil.copy(releases / "v0.0.9.binpb", releases / "v9.0.0.binpb")
    ahead = contract("previous", releases=releases)
    assert ahead.returncode == 1 and "newer than the project's version 0.1.0" in ahead.stderr
    empty = contract("previous", releases=tmp_path / "none")
    assert empty.returncode == 1 and "no released contract" in empty.stderr
