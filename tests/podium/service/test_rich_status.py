"""podium.service.rich_status: the BadRequest status it builds."""

from __future__ import annotations

import pytest
from google.rpc import code_pb2, error_details_pb2

from podium.service.rich_status import bad_request_status


def test_bad_request_status_lists_every_violation() -> None:
    status = bad_request_status("two problems", [("a.b", "empty"), ("c", "too large")])
    assert status.code == code_pb2.INVALID_ARGUMENT and status.message == "two problems"
    (detail,) = status.details
    bad = error_details_pb2.BadRequest()
    assert detail.Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("a.b", "empty"),
        ("c", "too large"),
    ]


def test_a_bad_request_names_a_field() -> None:
    with pytest.raises(ValueError, match="at least one field violation"):
        bad_request_status("vague", [])
