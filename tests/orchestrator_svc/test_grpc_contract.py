"""The gRPC/event contract may only grow: lint runs ``buf breaking`` against the previous
release's committed image, which works in any clone (issue 12: "buf breaking is configured but
never run"; issue 15: "against the previous release"). The check itself, run with buf on
mutated copies, is tests/test_contract_releases.py."""

from __future__ import annotations

import re
from pathlib import Path

from google.protobuf import descriptor_pb2

from podium.v1 import session_service_pb2

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "protos" / "releases" / "v0.1.0.binpb"
"""The first release's contract (the version in pyproject.toml; the repository has no tags)."""


def test_lint_runs_buf_breaking_against_the_previous_release() -> None:
    lint = (ROOT / "scripts" / "lint.sh").read_text()
    assert re.search(r"^bash scripts/contract\.sh breaking$", lint, re.M)
    contract = (ROOT / "scripts" / "contract.sh").read_text()
    assert 'buf breaking --against "$against"' in contract


def test_baseline_is_an_image_of_the_podium_contract() -> None:
    # A buf image is wire-compatible with FileDescriptorSet (field 1: the files).
    image = descriptor_pb2.FileDescriptorSet.FromString(BASELINE.read_bytes())
    files = {f.name: f for f in image.file}
    assert "podium/v1/session_service.proto" in files
    services = {s.name for s in files["podium/v1/session_service.proto"].service}
    assert "SessionService" in services
    # Everything released is still in the contract this checkout generates code from, with
    # the same field numbers (what buf breaking checks in full, with the FILE rules).
    baseline_request = next(
        m
        for m in files["podium/v1/session_service.proto"].message_type
        if m.name == "SubmitTaskRequest"
    )
    current = session_service_pb2.SubmitTaskRequest.DESCRIPTOR.fields_by_name
    for field in baseline_request.field:
        assert current[field.name].number == field.number
